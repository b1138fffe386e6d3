"""Core record types shared by every stage."""

from __future__ import annotations

from dataclasses import dataclass

#: query_id -> {doc_id: graded relevance}. Grades <= 0 mean "judged not relevant".
Qrels = dict[str, dict[str, int]]
#: query_id -> {doc_id: score}; higher is better.
Run = dict[str, dict[str, float]]


@dataclass(frozen=True, slots=True)
class Document:
    """A document (a "note"): ScalingNote §2 writes d_i = (t_i, tp_i, c_i)."""

    id: str
    title: str = ""
    topic: str = ""
    content: str = ""

    @property
    def text(self) -> str:
        """Title, topic and content joined by spaces (for lexical models and BERT towers)."""
        return " ".join(p for p in (self.title, self.topic, self.content) if p)

    def to_beir(self) -> dict:
        rec = {"_id": self.id, "title": self.title, "text": self.content}
        if self.topic:
            rec["topic"] = self.topic
        return rec


@dataclass(frozen=True, slots=True)
class Query:
    id: str
    text: str

    def to_beir(self) -> dict:
        return {"_id": self.id, "text": self.text}


@dataclass(frozen=True, slots=True)
class Triplet:
    """A training example <q, d+, d-> (ScalingNote §4.1.1); ``source`` names where it came from
    (click_one_hop, click_multi_hop, relevance_one_hop, relevance_multi_hop, bm25, ...)."""

    query_id: str
    pos_id: str
    neg_id: str | None = None
    source: str = "unknown"

    def to_json(self) -> dict:
        return {"query_id": self.query_id, "pos_id": self.pos_id, "neg_id": self.neg_id, "source": self.source}
