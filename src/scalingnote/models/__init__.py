"""Towers: LLM and BERT query/document encoders (ScalingNote §3.2, §3.3).

Typical use::

    from scalingnote.models import load_tower
    q = load_tower("minilm-l6", role="query")          # zero-shot: no projection, native mean pooling
    d = load_tower("smollm2-135m", role="document", num_layers=4, dim=128)   # trainable W, Matryoshka 16..128
    Q = q.encode_queries(["what causes fractures?"])   # float32, L2-normalised
    D = d.encode_documents(docs)                       # the [EMB] view

Training code uses ``tower.tokenize_queries(texts)`` / ``doc_tower.tokenize_documents(docs)``
and ``tower(batch)`` (a ``[B, out_dim]`` tensor for queries, ``{"title", "content", "emb"}``
for documents). See :mod:`scalingnote.models.towers` for the fingerprint / ``compat_id`` rule.
"""

from scalingnote.models.loading import (
    Backbone,
    ModelSource,
    cached_gguf_dir,
    convert_gguf,
    count_non_embedding_params,
    default_device,
    default_dtype,
    detect_kind,
    load_backbone,
    load_hf_backbone,
    model_cache_root,
    resolve_source,
    select_layers,
    truncate_layers,
)
from scalingnote.models.prefix import FeatureCache, PrefixTower, fill_pooled_depths, freeze_prefix, sub_backbone
from scalingnote.models.prompt import (
    DEFAULT_FIELD_CAPS,
    PAPER_DOCUMENT_PROMPT,
    PLACEHOLDERS,
    SPECIAL_TOKENS,
    VIEWS,
    DocumentPrompt,
    EncodedDocument,
    allocate_budget,
)
from scalingnote.models.registry import PACKAGED_MODELS, packaged_model_path
from scalingnote.models.tiny import build_tiny_model, tiny_bert_config, tiny_llm_config, tiny_tokenizer
from scalingnote.models.towers import (
    DEFAULT_DIM,
    DEFAULT_MATRYOSHKA_DIMS,
    POOLING_MODES,
    DocumentTower,
    PoolingMode,
    QueryTower,
    Tower,
    TowerConfig,
    build_tower,
    check_compatible,
    load_saved_tower,
    load_tower,
    load_tower_pair,
    matryoshka_dims_for,
    orthogonal_projection,
    pair_towers,
    pooling_mode,
    register_pooling,
)

__all__ = [
    "DEFAULT_DIM",
    "DEFAULT_FIELD_CAPS",
    "DEFAULT_MATRYOSHKA_DIMS",
    "PACKAGED_MODELS",
    "POOLING_MODES",
    "PAPER_DOCUMENT_PROMPT",
    "PLACEHOLDERS",
    "SPECIAL_TOKENS",
    "VIEWS",
    "Backbone",
    "DocumentPrompt",
    "DocumentTower",
    "FeatureCache",
    "PrefixTower",
    "PoolingMode",
    "EncodedDocument",
    "ModelSource",
    "QueryTower",
    "Tower",
    "TowerConfig",
    "allocate_budget",
    "build_tiny_model",
    "build_tower",
    "cached_gguf_dir",
    "check_compatible",
    "convert_gguf",
    "count_non_embedding_params",
    "default_device",
    "default_dtype",
    "detect_kind",
    "fill_pooled_depths",
    "freeze_prefix",
    "load_backbone",
    "load_hf_backbone",
    "load_saved_tower",
    "load_tower",
    "load_tower_pair",
    "matryoshka_dims_for",
    "model_cache_root",
    "orthogonal_projection",
    "packaged_model_path",
    "pair_towers",
    "pooling_mode",
    "register_pooling",
    "resolve_source",
    "sub_backbone",
    "tiny_bert_config",
    "tiny_llm_config",
    "tiny_tokenizer",
    "select_layers",
    "truncate_layers",
]
