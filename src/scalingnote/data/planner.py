"""Term-importance "query planners" for query association (ScalingNote §4.1.1, Algorithm 1).

The paper scores the importance of each term of a query with the platform's
query planner and associates queries through their most important terms. A
planner here is anything callable as ``planner(text) -> {term: score}``
(:class:`TermPlanner`). The default, :class:`IDFPlanner`, scores each distinct
term of a query by its inverse document frequency over a reference collection
(the query log or the corpus) and **divides by the query's maximum**, so every
query's most important term scores exactly 1.0 and the others lie in (0, 1].
The default association thresholds (``th_click``/``th_rel`` in
:mod:`scalingnote.data.association`) are chosen for this max-normalisation.

Tokenisation (:class:`Tokenizer`):

* English: Unicode-aware lower-casing, ``\\w+`` tokens, scikit-learn's English
  stop-word list, optional Snowball stemming through PyStemmer.
* Chinese: jieba word segmentation (default) or overlapping character bigrams;
  punctuation and a short list of function words are dropped.
* ``auto`` picks Chinese when at least 30 % of a text's letters are CJK.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable
from typing import Literal, Protocol, runtime_checkable

from scalingnote.utils.registry import RegistryError, import_dotted

Language = Literal["en", "zh", "auto"]
ChineseMode = Literal["jieba", "bigram"]
Normalize = Literal["max", "sum", "none"]


@runtime_checkable
class TermPlanner(Protocol):
    """Scores the importance of the terms of a query: ``planner(text) -> {term: score}``."""

    def __call__(self, text: str) -> dict[str, float]: ...


_WORD = re.compile(r"\w+", re.UNICODE)
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_CJK_RUN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")
# Function words that carry no topical information in short Chinese queries.
ZH_STOP_WORDS = frozenset(
    "的 了 吗 呢 吧 啊 是 在 有 和 与 及 或 就 都 也 还 很 我 你 他 她 它 "
    "我们 这 那 个 一个 什么 怎么 怎么办 如何 为什么 "
    "多少 哪些 可以 能 会 要 得 地 着 过 被 把 对 从 给 让 上 下 中 不 没 没有 啥 么 呀 哦 嗯".split()
)


def _english_stop_words() -> frozenset[str]:
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    return frozenset(ENGLISH_STOP_WORDS)


def normalize_text(text: str) -> str:
    """NFKC, lower-case, punctuation removed, whitespace collapsed: the form used to
    compare query texts (e.g. for leakage checks)."""
    text = unicodedata.normalize("NFKC", text).lower()
    return " ".join(_WORD.findall(text))


def is_chinese(text: str, min_ratio: float = 0.3) -> bool:
    letters = [c for c in text if c.isalnum()]
    if not letters:
        return False
    return sum(1 for c in letters if _CJK.match(c)) / len(letters) >= min_ratio


class Tokenizer:
    """Turns text into index terms for English or Chinese (see the module docstring)."""

    def __init__(
        self,
        language: Language = "en",
        stem: bool = False,
        chinese: ChineseMode = "jieba",
        stop_words: bool = True,
    ):
        if language not in ("en", "zh", "auto"):
            raise ValueError(f"language must be 'en', 'zh' or 'auto', got {language!r}")
        if chinese not in ("jieba", "bigram"):
            raise ValueError(f"chinese must be 'jieba' or 'bigram', got {chinese!r}")
        self.language, self.stem, self.chinese, self.use_stop_words = language, stem, chinese, stop_words
        self._en_stop = _english_stop_words() if stop_words else frozenset()
        self._stemmer = None
        if stem:
            import Stemmer  # PyStemmer

            self._stemmer = Stemmer.Stemmer("english")

    def __call__(self, text: str) -> list[str]:
        text = unicodedata.normalize("NFKC", text).lower()
        zh = self.language == "zh" or (self.language == "auto" and is_chinese(text))
        return self._zh(text) if zh else self._en(text)

    def _en(self, text: str) -> list[str]:
        toks = [t for t in _WORD.findall(text) if t not in self._en_stop]
        if self._stemmer is not None:
            toks = self._stemmer.stemWords(toks)
        return toks

    def _zh(self, text: str) -> list[str]:
        out: list[str] = []
        if self.chinese == "bigram":
            # CJK runs -> overlapping bigrams (a single character stays a unigram);
            # Latin words and numbers inside Chinese text are kept as words.
            pos = 0
            for m in _CJK_RUN.finditer(text):
                out.extend(self._en(text[pos : m.start()]))
                run = m.group()
                out.extend([run] if len(run) == 1 else [run[i : i + 2] for i in range(len(run) - 1)])
                pos = m.end()
            out.extend(self._en(text[pos:]))
            return out
        import jieba

        jieba.setLogLevel(60)  # silence "Building prefix dict" chatter
        for w in jieba.lcut(text):
            w = w.strip()
            if not w or not any(ch.isalnum() for ch in w):
                continue
            if self.use_stop_words and (w in ZH_STOP_WORDS or w in self._en_stop):
                continue
            out.append(w)
        return out


class IDFPlanner:
    """IDF term importance, normalised per query.

    ``score(t, q) = idf(t) / max_{t' in q} idf(t')`` (``normalize="max"``, the
    default), or divided by the sum over the query's terms (``"sum"``), or raw
    (``"none"``). ``idf(t) = ln((1 + N) / (1 + df(t))) + 1`` (the smoothed IDF of
    scikit-learn); a term never seen in the reference collection gets the IDF of
    ``df = 0``. Repeated terms in a query count once. Terms whose normalised score
    is below ``min_score`` are left out of the result (the planner reports only the
    terms it considers important; with short queries this keeps generic words such
    as "tips" out of ``Top4``).
    """

    def __init__(
        self,
        texts: Iterable[str],
        tokenizer: Tokenizer | None = None,
        normalize: Normalize = "max",
        min_score: float = 0.0,
    ):
        if normalize not in ("max", "sum", "none"):
            raise ValueError(f"normalize must be 'max', 'sum' or 'none', got {normalize!r}")
        self.tokenizer = tokenizer or Tokenizer()
        self.normalize = normalize
        self.min_score = min_score
        df: Counter[str] = Counter()
        n = 0
        for text in texts:
            n += 1
            df.update(set(self.tokenizer(text)))
        self.num_texts = n
        self.df = df
        self._idf_unseen = math.log((1 + n) / 1) + 1.0

    def idf(self, term: str) -> float:
        return math.log((1 + self.num_texts) / (1 + self.df.get(term, 0))) + 1.0

    def __call__(self, text: str) -> dict[str, float]:
        terms = dict.fromkeys(self.tokenizer(text))  # distinct, in order of appearance
        raw = {t: self.idf(t) for t in terms}
        if not raw or self.normalize == "none":
            return {t: s for t, s in raw.items() if s >= self.min_score}
        denom = max(raw.values()) if self.normalize == "max" else sum(raw.values())
        return {t: v for t, s in raw.items() if (v := s / denom) >= self.min_score}


def load_planner_factory(spec: str):
    """Import ``"package.module:attribute"`` (a custom planner factory); ValueError when it cannot be."""
    try:
        return import_dotted(spec, None, "planner factory")
    except RegistryError as e:
        raise ValueError(str(e)) from None
