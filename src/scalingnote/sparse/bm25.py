"""BM25 lexical baseline on top of ``bm25s``.

English: lower-casing, bm25s' English stop-word list and the Snowball English
stemmer (PyStemmer). Chinese: overlapping character bigrams over CJK runs (plus
unigrams for single-character runs and whole ASCII words), a standard
dictionary-free tokenisation for Chinese IR. ``language="auto"`` picks Chinese
when more than 30% of the characters of a corpus sample are CJK.

The retriever is reused to mine hard negatives for training (ranks K..T after
dropping the top K, ScalingNote §4.1.1), and is the lexical side of hybrid search: it is
saved beside a dense index (``<index>/bm25/``, :func:`open_or_build_bm25`) with a
fingerprint of the corpus and settings, built once and reloaded while they match.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from scalingnote.data.corpus import iter_corpus, load_beir
from scalingnote.data.types import Document, Run
from scalingnote.errors import ScalingNoteError

Language = Literal["auto", "en", "zh"]

_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_ZH_SPLIT = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+|[a-zA-Z0-9]+")


def detect_language(texts: Iterable[str], sample: int = 2000) -> Literal["en", "zh"]:
    """'zh' if more than 30% of non-space characters in a sample are CJK, else 'en'."""
    cjk = total = 0
    for i, t in enumerate(texts):
        if i >= sample:
            break
        s = "".join(t.split())
        total += len(s)
        cjk += len(_CJK.findall(s))
    return "zh" if total and cjk / total > 0.3 else "en"


def chinese_bigrams(text: str) -> list[str]:
    """Character bigrams of each CJK run (a single character stays a unigram); ASCII words whole."""
    out: list[str] = []
    for run in _ZH_SPLIT.findall(text.lower()):
        if _CJK.match(run):
            if len(run) == 1:
                out.append(run)
            else:
                out.extend(run[i : i + 2] for i in range(len(run) - 1))
        else:
            out.append(run)
    return out


@dataclass
class BM25Config:
    """bm25s defaults (k1=1.5, b=0.75, Lucene scoring): on SciFact test they give nDCG@10 0.686,
    the SPEC reference; Anserini's k1=0.9, b=0.4 gives 0.676 here."""

    language: Language = "auto"
    k1: float = 1.5
    b: float = 0.75
    method: Literal["lucene", "robertson", "atire", "bm25l", "bm25+"] = "lucene"


def _tokenizer(language: str):
    import bm25s.tokenization as tok  # why: bm25s takes ~0.7 s to import; the dense-only paths never need it

    if language == "en":
        import Stemmer  # why: PyStemmer, needed by the English tokenizer only

        return tok.Tokenizer(lower=True, stopwords="en", stemmer=Stemmer.Stemmer("english"))
    return tok.Tokenizer(lower=True, splitter=chinese_bigrams, stopwords=None, stemmer=None)


class BM25Retriever:
    """BM25 over a corpus of :class:`Document` (title + topic + content).

    >>> r = BM25Retriever.fit(docs)            # doctest: +SKIP
    >>> run = r.search({"q1": "text"}, k=100)  # doctest: +SKIP
    """

    def __init__(
        self,
        config: BM25Config,
        language: str,
        retriever,
        tokenizer,
        doc_ids: list[str],
        fingerprint: str | None = None,
    ):
        self.config = config
        self.language = language
        self._retriever = retriever
        self._tokenizer = tokenizer
        self.doc_ids = doc_ids
        self.fingerprint = fingerprint  # corpus_fingerprint(docs, config) of the corpus it was fitted on

    @classmethod
    def fit(
        cls, docs: Iterable[Document], config: BM25Config | None = None, show_progress: bool = True
    ) -> BM25Retriever:
        import bm25s  # why: bm25s takes ~0.7 s to import

        config = config or BM25Config()
        docs = list(docs)
        if not docs:
            raise ScalingNoteError("BM25: the corpus is empty")
        texts = [d.text for d in docs]
        language = detect_language(texts) if config.language == "auto" else config.language
        tokenizer = _tokenizer(language)
        corpus_tokens = tokenizer.tokenize(texts, return_as="tuple", show_progress=show_progress)
        retriever = bm25s.BM25(k1=config.k1, b=config.b, method=config.method)
        _quiet_bm25s()
        retriever.index(corpus_tokens, show_progress=show_progress)
        return cls(config, language, retriever, tokenizer, [d.id for d in docs], corpus_fingerprint(docs, config))

    def search(self, queries: Mapping[str, str], k: int = 1000, show_progress: bool = True) -> Run:
        """Top-``k`` documents per query as a :data:`Run` (queries with no known term get an empty list)."""
        qids = list(queries)
        if not qids:
            return {}
        k = min(k, len(self.doc_ids))
        tokens = self._tokenizer.tokenize(
            [queries[q] for q in qids], update_vocab=False, return_as="tuple", show_progress=False
        )
        vocab_inv = {v: w for w, v in tokens.vocab.items()}
        unk = tokens.vocab.get("")
        token_lists = [[vocab_inv[i] for i in ids if i != unk] for ids in tokens.ids]
        run: Run = {q: {} for q in qids}
        nonempty = [i for i, t in enumerate(token_lists) if t]
        if not nonempty:
            return run
        docs_idx, scores = self._retriever.retrieve(
            [token_lists[i] for i in nonempty], k=k, show_progress=show_progress, n_threads=0
        )
        for row, i in enumerate(nonempty):
            qid = qids[i]
            for j, s in zip(docs_idx[row], scores[row], strict=True):
                if s > 0:
                    run[qid][self.doc_ids[int(j)]] = float(s)
        return run

    # -- persistence ---------------------------------------------------------------------------
    def save(self, directory: str | Path) -> None:
        """Save the index (bm25s arrays + vocab + doc ids) into ``directory`` atomically."""
        directory = Path(directory)
        directory.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
        try:
            self._retriever.save(str(tmp / "bm25s"))
            self._tokenizer.save_vocab(str(tmp / "bm25s"))
            meta = {
                "config": asdict(self.config),
                "language": self.language,
                "fingerprint": self.fingerprint,
                "doc_ids": self.doc_ids,
            }
            (tmp / "bm25.json").write_text(json.dumps(meta, ensure_ascii=False), encoding="utf-8")
            if directory.exists():
                shutil.rmtree(directory)
            tmp.rename(directory)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    @classmethod
    def load(cls, directory: str | Path) -> BM25Retriever:
        import bm25s  # why: bm25s takes ~0.7 s to import

        directory = Path(directory)
        meta_path = directory / "bm25.json"
        if not meta_path.exists():
            raise ScalingNoteError(f"{directory}: not a BM25 index (no bm25.json)")
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            config = BM25Config(**meta["config"])
            language, doc_ids = meta["language"], meta["doc_ids"]
        except json.JSONDecodeError as e:
            raise ScalingNoteError(f"{meta_path}: line {e.lineno}: invalid JSON ({e.msg})") from None
        except (KeyError, TypeError) as e:
            raise ScalingNoteError(f"{meta_path}: missing or bad field {e}") from None
        if language not in ("en", "zh"):
            raise ScalingNoteError(f"{meta_path}: field 'language' is {language!r}, expected 'en' or 'zh'")
        try:
            tokenizer = _tokenizer(language)
            tokenizer.load_vocab(str(directory / "bm25s"))
            retriever = bm25s.BM25.load(str(directory / "bm25s"))
        except (OSError, ValueError, KeyError) as e:
            raise ScalingNoteError(
                f"{directory / 'bm25s'}: cannot read the BM25 index ({type(e).__name__}: {e})"
            ) from None
        return cls(config, language, retriever, tokenizer, doc_ids, meta.get("fingerprint"))


def corpus_fingerprint(docs: Iterable[Document], config: BM25Config) -> str:
    """SHA-256 over the settings and every document's id and indexed text, in order."""
    h = hashlib.sha256(json.dumps(asdict(config), sort_keys=True).encode())
    for d in docs:
        h.update(d.id.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
        h.update(d.text.encode("utf-8", "surrogatepass"))
        h.update(b"\x01")
    return h.hexdigest()


BM25_DIR = "bm25"


def open_or_build_bm25(
    index_dir: str | Path,
    documents: str | Path | Iterable[Document] | None = None,
    config: BM25Config | None = None,
    *,
    show_progress: bool = True,
) -> BM25Retriever | None:
    """The BM25 index saved beside the dense index ``index_dir`` (in ``index_dir/bm25``).

    With ``documents`` (a BEIR directory, a corpus file of any registered format, or Documents): reuse the saved index
    when its fingerprint matches these documents and ``config``, else fit it and save it
    (atomically). Without: load the saved index, or return None when there is none."""
    path = Path(index_dir) / BM25_DIR
    if documents is None:
        return BM25Retriever.load(path) if (path / "bm25.json").exists() else None
    if isinstance(documents, (str, Path)):
        documents = iter_corpus(documents)
    docs = list(documents)
    config = config or BM25Config()
    fp = corpus_fingerprint(docs, config)
    if (path / "bm25.json").exists():
        try:
            saved = json.loads((path / "bm25.json").read_text(encoding="utf-8")).get("fingerprint")
        except (OSError, json.JSONDecodeError, AttributeError):
            saved = None
        if saved == fp:
            return BM25Retriever.load(path)
    retriever = BM25Retriever.fit(docs, config, show_progress=show_progress)
    retriever.save(path)
    return retriever


def _quiet_bm25s() -> None:
    logging.getLogger("bm25s").setLevel(logging.WARNING)


def bm25_search(
    data_dir: str | Path,
    split: str = "test",
    k: int = 1000,
    config: BM25Config | None = None,
    show_progress: bool = True,
) -> tuple[Run, BM25Retriever]:
    """Search the queries judged in ``data_dir/qrels/<split>.tsv`` over the corpus of ``data_dir``
    (any registered corpus format)."""
    ds = load_beir(data_dir, split)
    retriever = BM25Retriever.fit(ds.corpus.values(), config, show_progress=show_progress)
    run = retriever.search({q.id: q.text for q in ds.queries.values()}, k=k, show_progress=show_progress)
    return run, retriever


def sample_hard_negatives(
    run: Run,
    positives: Mapping[str, Iterable[str]],
    skip_top: int = 10,
    max_rank: int = 100,
    seed: int = 0,
) -> dict[str, str | None]:
    """One hard negative per query, drawn uniformly from ranks ``skip_top+1 .. max_rank`` of ``run``
    after dropping the top ``skip_top`` to avoid false negatives (ScalingNote §4.1.1: "filter out the
    top-K ... randomly choose a document ranked between top-K and top-T"). Known positives are never
    drawn. Returns ``None`` for a query with no candidate."""
    if not 0 <= skip_top < max_rank:
        raise ScalingNoteError(f"hard negatives: need 0 <= K < T, got K={skip_top}, T={max_rank}")
    rng = np.random.default_rng(seed)
    out: dict[str, str | None] = {}
    for qid in sorted(run):
        ranked = [d for d, _ in sorted(run[qid].items(), key=lambda x: (-x[1], x[0]))]
        pos = set(positives.get(qid, ()))
        cands = [d for d in ranked[skip_top:max_rank] if d not in pos]
        out[qid] = str(cands[rng.integers(len(cands))]) if cands else None
    return out
