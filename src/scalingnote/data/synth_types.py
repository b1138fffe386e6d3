"""The synthetic note-search log's settings (:class:`SynthConfig`) and what generating it gives
(:class:`SyntheticLog`); :mod:`scalingnote.data.synth` generates it, :mod:`scalingnote.data.synth_write`
writes it to disk."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scalingnote.data.logs import ClickRecord, RelevanceRecord
from scalingnote.data.types import Document, Qrels, Query


@dataclass
class SynthConfig:
    """Sizes and noise levels of the synthetic log. Defaults keep the quick-start fast."""

    seed: int = 0
    num_docs: int = 3000
    num_queries: int = 1500
    test_fraction: float = 0.2
    secondary_topic_rate: float = 0.15  # notes with a second topic
    multi_intent_rate: float = 0.15  # queries combining two topics
    synonym_rate: float = 0.6  # P(query uses the synonym of a term that has one)
    typo_rate: float = 0.1  # P(a query term is misspelled)
    cross_mention_rate: float = 0.4  # P(a note mentions a term of an unrelated topic)
    sessions: tuple[int, int] = (1, 3)  # impressions sessions per training query
    page_size: int = 10  # results shown per session
    ranker_noise: float = 1.2  # std of the production ranker's noise (impressions)
    click_prob: tuple[float, float, float] = (0.03, 0.35, 0.85)  # P(click | examined, grade 0/1/2)
    relevance_coverage: float = 0.6  # fraction of training queries with ranking-model scores
    relevance_depth: int = 30  # scored candidates per query
    relevance_noise: float = 0.35  # std of the ranking model's noise

    def __post_init__(self):
        if self.num_docs < 50 or self.num_queries < 10:
            raise ValueError("num_docs must be >= 50 and num_queries >= 10")
        if not 0 < self.test_fraction < 1:
            raise ValueError("test_fraction must be in (0, 1)")
        for name in (
            "secondary_topic_rate",
            "multi_intent_rate",
            "synonym_rate",
            "typo_rate",
            "cross_mention_rate",
            "relevance_coverage",
        ):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1]")
        if self.sessions[0] < 1 or self.sessions[1] < self.sessions[0]:
            raise ValueError("sessions must be (min >= 1, max >= min)")


@dataclass
class SyntheticLog:
    config: SynthConfig
    corpus: list[Document]
    queries: list[Query]
    qrels: dict[str, Qrels]  # split -> graded qrels
    clicks: list[ClickRecord]
    relevance: list[RelevanceRecord]
    test_ids: set[str] = field(default_factory=set)  # query ids of the test split
    meta: dict[str, Any] = field(default_factory=dict)  # per-query intents etc. (for inspection)
