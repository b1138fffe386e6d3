"""Data layer: record types, BEIR / TREC / triplet readers and writers with validation;
search logs -> training triplets (one-hop, multi-hop via query association); pseudo-queries
(ICT; LLM-generated ones live in :mod:`scalingnote.augment`); the synthetic note-search log."""

from scalingnote.data.association import Association, associate_scores, find_associations, match_queries
from scalingnote.data.beir import (
    BeirDataset,
    iter_queries,
    load_qrels,
    load_queries,
    write_beir,
    write_corpus,
    write_qrels,
    write_queries,
)
from scalingnote.data.build import BuildConfig, BuildResult, build_triplets, load_build_config, run_build
from scalingnote.data.corpus import (
    FORMATS,
    CorpusFormat,
    iter_corpus,
    load_beir,
    load_corpus,
    open_corpus,
    register_corpus_format,
)
from scalingnote.data.logs import (
    ClickRecord,
    RelevanceRecord,
    click_one_hop,
    read_click_log,
    read_relevance_log,
    relevance_one_hop,
)
from scalingnote.data.planner import IDFPlanner, TermPlanner, Tokenizer
from scalingnote.data.pseudo import ICTConfig, ict_queries
from scalingnote.data.synth import SynthConfig, generate_synthetic, synthesize
from scalingnote.data.trec import read_run, write_run
from scalingnote.data.triplets import iter_triplets, load_triplets, write_triplets
from scalingnote.data.types import Document, Qrels, Query, Run, Triplet

__all__ = [
    "Association",
    "BeirDataset",
    "CorpusFormat",
    "FORMATS",
    "BuildConfig",
    "BuildResult",
    "ClickRecord",
    "Document",
    "ICTConfig",
    "IDFPlanner",
    "RelevanceRecord",
    "SynthConfig",
    "TermPlanner",
    "Tokenizer",
    "associate_scores",
    "build_triplets",
    "click_one_hop",
    "find_associations",
    "generate_synthetic",
    "ict_queries",
    "load_build_config",
    "match_queries",
    "read_click_log",
    "read_relevance_log",
    "relevance_one_hop",
    "run_build",
    "synthesize",
    "Qrels",
    "Query",
    "Run",
    "Triplet",
    "iter_corpus",
    "iter_queries",
    "iter_triplets",
    "load_beir",
    "load_corpus",
    "load_qrels",
    "load_queries",
    "load_triplets",
    "open_corpus",
    "read_run",
    "register_corpus_format",
    "write_beir",
    "write_corpus",
    "write_qrels",
    "write_queries",
    "write_run",
    "write_triplets",
]
