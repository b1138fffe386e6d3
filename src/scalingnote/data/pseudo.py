"""Pseudo-queries from a corpus: the inverse cloze task (LLM query generation, which needs a
model, lives one layer up in :mod:`scalingnote.augment.llm_queries`).

Two of the annotation types compared in "Scaling Laws for Dense Retrieval" §5
(ICT as the weakest supervision, LLM-generated queries as the strongest):

* **ICT** (:func:`ict_queries`): one sentence of a document becomes the query and
  is removed from the document (optionally kept with ``keep_sentence_prob``, as in
  the original ICT). Sentences are split at ``. ! ?`` followed by white space and
  an upper-case letter / digit / bracket / quote, and at Chinese ``。！？；``.
  Sentences shorter than ``min_words`` words (Chinese: ``2 * min_words``
  characters) are not used as queries; documents with fewer than two sentences
  are skipped. Seeded per document.
* **LLM** (:func:`scalingnote.augment.llm_queries.llm_queries`): a causal LM (default: the packaged
  SmolLM2-135M-Instruct) is prompted through its chat template to write one
  search query for each document (one worked example precedes the document);
  batched, greedy or seeded sampling. Progress is appended to
  ``generations.jsonl`` after every batch, so an interrupted run resumes where it
  stopped (already generated doc ids are skipped; a torn last line is dropped).
  ``generation_settings.json`` records the model and decoding settings, and a
  resume with different settings is refused.

Both write a BEIR-style directory: ``queries.jsonl`` (ids ``ict-<doc>`` /
``llm-<doc>``), ``qrels/train.tsv`` (query -> source document, grade 1),
``triplets.jsonl`` (source ``ict`` / ``llm``, no hard negative), ``stats.json``
and ``run.json`` (config + versions); ICT can also write the modified
``corpus.jsonl``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

from scalingnote.data.beir import write_corpus, write_qrels, write_queries
from scalingnote.data.corpus import iter_corpus
from scalingnote.data.triplets import write_triplets
from scalingnote.data.types import Document, Query, Triplet
from scalingnote.utils import run_metadata, write_json

# ----------------------------------------------------------------------------- sentences

_EN_BOUNDARY = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[A-Z0-9\"'(\[])")
_ZH_BOUNDARY = re.compile(r"(?<=[。！？；!?])")
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """Character spans ``[start, end)`` of the sentences of ``text`` (English and Chinese
    punctuation), without surrounding white space."""
    cuts = {0, len(text)}
    for m in _EN_BOUNDARY.finditer(text):
        cuts.add(m.end())
    for m in _ZH_BOUNDARY.finditer(text):
        cuts.add(m.end())
    spans = []
    bounds = sorted(cuts)
    for s, e in pairwise(bounds):
        seg = text[s:e]
        if not seg.strip():
            continue
        lead = len(seg) - len(seg.lstrip())
        trail = len(seg) - len(seg.rstrip())
        spans.append((s + lead, e - trail))
    return spans


def split_sentences(text: str) -> list[str]:
    return [text[s:e] for s, e in sentence_spans(text)]


def _long_enough(sentence: str, min_words: int) -> bool:
    if _CJK.search(sentence):
        return len(_CJK.findall(sentence)) >= 2 * min_words
    return len(sentence.split()) >= min_words


def remove_span(text: str, span: tuple[int, int]) -> str:
    """``text`` without ``span``, joining the neighbours with one space (none between CJK)."""
    s, e = span
    left, right = text[:s].rstrip(), text[e:].lstrip()
    if not left or not right:
        return left + right
    sep = "" if (_CJK.match(left[-1]) or _CJK.match(right[0]) or left[-1] in "。！？；") else " "
    return left + sep + right


# ----------------------------------------------------------------------------- outputs


@dataclass
class PseudoQuery:
    query: Query
    doc_id: str


def write_pseudo_outputs(out: Path, pairs: list[PseudoQuery], source: str, config: Any, stats: dict) -> None:
    write_queries(out / "queries.jsonl", [p.query for p in pairs])
    write_qrels(out / "qrels" / "train.tsv", {p.query.id: {p.doc_id: 1} for p in pairs})
    write_triplets(out / "triplets.jsonl", [Triplet(p.query.id, p.doc_id, None, source) for p in pairs])
    write_json(out / "stats.json", stats)
    write_json(out / "run.json", run_metadata(config))


def select_documents(corpus_path: str | Path, max_docs: int | None, seed: int) -> list[Document]:
    """All documents, or a seeded sample of ``max_docs`` of them (kept in corpus order)."""
    docs = list(iter_corpus(corpus_path))
    return sample_in_order(docs, max_docs, random.Random(seed)) if max_docs is not None else docs


def sample_in_order(items: list, k: int, rng: random.Random) -> list:
    """A random sample of ``k`` of ``items`` (all of them when there are no more), kept in their order."""
    if k >= len(items):
        return items
    keep = set(rng.sample(range(len(items)), k))
    return [x for i, x in enumerate(items) if i in keep]


# ----------------------------------------------------------------------------- ICT


@dataclass
class ICTConfig:
    seed: int = 0
    max_docs: int | None = None
    min_words: int = 4
    keep_sentence_prob: float = 0.0  # original ICT keeps the sentence in 10% of cases
    write_corpus: bool = False

    def __post_init__(self):
        if not 0.0 <= self.keep_sentence_prob <= 1.0:
            raise ValueError("keep_sentence_prob must be in [0, 1]")
        if self.max_docs is not None and self.max_docs < 1:
            raise ValueError("max_docs must be >= 1")


def ict_example(
    doc: Document, rng: random.Random, min_words: int = 4, keep_sentence_prob: float = 0.0
) -> tuple[str, Document] | None:
    """``(query sentence, document without it)`` or None when the document has fewer than
    two sentences or no sentence is long enough."""
    spans = sentence_spans(doc.content)
    if len(spans) < 2:
        return None
    usable = [sp for sp in spans if _long_enough(doc.content[sp[0] : sp[1]], min_words)]
    if not usable:
        return None
    span = rng.choice(usable)
    sentence = doc.content[span[0] : span[1]]
    if keep_sentence_prob > 0 and rng.random() < keep_sentence_prob:
        return sentence, doc
    return sentence, Document(doc.id, doc.title, doc.topic, remove_span(doc.content, span))


def ict_queries(
    corpus_path: str | Path, out: str | Path, cfg: ICTConfig | None = None, progress: bool = True
) -> list[PseudoQuery]:
    """Inverse cloze task over a BEIR corpus; writes the outputs listed in the module docstring."""
    cfg = cfg or ICTConfig()
    out = Path(out)
    docs = select_documents(corpus_path, cfg.max_docs, cfg.seed)
    it: Iterable[Document] = docs
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(docs, desc="ICT", unit="doc")
    pairs: list[PseudoQuery] = []
    modified: dict[str, Document] = {}
    skipped = 0
    for d in it:
        ex = ict_example(d, random.Random(f"{cfg.seed}\x1fict\x1f{d.id}"), cfg.min_words, cfg.keep_sentence_prob)
        if ex is None:
            skipped += 1
            continue
        sentence, new_doc = ex
        pairs.append(PseudoQuery(Query(f"ict-{d.id}", sentence), d.id))
        modified[d.id] = new_doc
    out.mkdir(parents=True, exist_ok=True)
    if cfg.write_corpus:
        write_corpus(out / "corpus.jsonl", (modified.get(d.id, d) for d in iter_corpus(corpus_path)))
    stats = {
        "method": "ict",
        "corpus": str(corpus_path),
        "documents": len(docs),
        "queries": len(pairs),
        "skipped_documents": skipped,
        "mean_query_words": round(sum(len(p.query.text.split()) for p in pairs) / max(1, len(pairs)), 2),
    }
    write_pseudo_outputs(out, pairs, "ict", {"corpus": str(corpus_path), **cfg.__dict__}, stats)
    return pairs


# ----------------------------------------------------------------------------- corpus text


def text_units(d: Document, min_words: int = 3) -> list[tuple[str, str]]:
    """The (id, text) units :func:`corpus_texts` draws from one document: its title and every
    sentence of at least ``min_words`` words (Chinese: ``2 * min_words`` characters)."""
    units = [(f"title-{d.id}", d.title.strip())] if d.title and d.title.strip() else []
    return units + [
        (f"sent-{d.id}-{i}", s) for i, s in enumerate(split_sentences(d.content)) if _long_enough(s, min_words)
    ]


def corpus_texts(
    corpus_path: str | Path, out: str | Path, max_texts: int, seed: int = 0, min_words: int = 3
) -> list[Query]:
    """Unlabelled in-domain text for query distillation: every document title and every sentence
    of at least ``min_words`` words (Chinese: ``2 * min_words`` characters), de-duplicated, then a
    seeded sample of ``max_texts`` of them (kept in corpus order). Writes ``queries.jsonl`` (ids
    ``title-<doc>`` / ``sent-<doc>-<i>``), ``stats.json`` and ``run.json``; no qrels: nothing here is a
    relevance label. A student imitating its teacher's query tower on the data's own vocabulary
    (embedding alignment over unlabelled text, as in query-encoder distillation by embedding
    alignment, 2023) sees far more than the labelled queries it would otherwise imitate."""
    if max_texts < 1:
        raise ValueError(f"max_texts must be >= 1, got {max_texts}")
    out = Path(out)
    texts: list[Query] = []
    seen: set[str] = set()
    docs = 0
    for d in iter_corpus(corpus_path):
        docs += 1
        cands = text_units(d, min_words)
        for qid, t in cands:
            if t not in seen:
                seen.add(t)
                texts.append(Query(qid, t))
    pool = len(texts)
    texts = sample_in_order(texts, max_texts, random.Random(f"{seed}\x1ftexts"))
    out.mkdir(parents=True, exist_ok=True)
    write_queries(out / "queries.jsonl", texts)
    stats = {
        "method": "corpus_texts",
        "corpus": str(corpus_path),
        "documents": docs,
        "distinct_texts": pool,
        "queries": len(texts),
        "titles": sum(q.id.startswith("title-") for q in texts),
    }
    write_json(out / "stats.json", stats)
    write_json(
        out / "run.json",
        run_metadata({"corpus": str(corpus_path), "max_texts": max_texts, "seed": seed, "min_words": min_words}),
    )
    return texts
