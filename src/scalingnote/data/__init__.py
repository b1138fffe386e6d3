"""Data layer: record types, BEIR / TREC / triplet readers and writers with validation."""

from scalingnote.data.beir import (
    BeirDataset,
    iter_corpus,
    iter_queries,
    load_beir,
    load_corpus,
    load_qrels,
    load_queries,
    write_beir,
    write_corpus,
    write_qrels,
    write_queries,
)
from scalingnote.data.trec import read_run, write_run
from scalingnote.data.triplets import iter_triplets, load_triplets, write_triplets
from scalingnote.data.types import Document, Qrels, Query, Run, Triplet

__all__ = [
    "BeirDataset",
    "Document",
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
    "read_run",
    "write_beir",
    "write_corpus",
    "write_qrels",
    "write_queries",
    "write_run",
    "write_triplets",
]
