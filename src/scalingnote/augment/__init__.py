"""Model-backed data augmentation, one layer above :mod:`scalingnote.models`: LLM pseudo-query
generation (:mod:`scalingnote.augment.llm_queries`). Model-free pseudo-queries (ICT) stay in
:mod:`scalingnote.data.pseudo`."""

from scalingnote.augment.llm_queries import (
    LLMQueryConfig,
    build_prompt,
    clean_generation,
    generate_queries,
    llm_queries,
    load_causal_lm,
)

__all__ = ["LLMQueryConfig", "build_prompt", "clean_generation", "generate_queries", "llm_queries", "load_causal_lm"]
