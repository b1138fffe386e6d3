"""Term-importance planners and tokenisers (English, Chinese)."""

from __future__ import annotations

import math

import pytest

from scalingnote.data.build import PlannerConfig, make_planner
from scalingnote.data.planner import IDFPlanner, TermPlanner, Tokenizer, is_chinese, normalize_text
from scalingnote.errors import ConfigError


def test_english_tokenizer_lowercases_and_drops_stop_words():
    tok = Tokenizer("en")
    assert tok("How to FIX the Espresso grinder?") == ["fix", "espresso", "grinder"]


def test_english_stemming_is_optional():
    assert Tokenizer("en", stem=True)("running shoes") == ["run", "shoe"]
    assert Tokenizer("en", stem=False)("running shoes") == ["running", "shoes"]


def test_chinese_jieba_and_bigrams():
    text = "宝宝十个月没长牙怎么办"
    words = Tokenizer("zh", chinese="jieba")(text)
    assert "宝宝" in words and "怎么办" not in words  # function word dropped
    grams = Tokenizer("zh", chinese="bigram")(text)
    assert grams[:3] == ["宝宝", "宝十", "十个"]
    assert len(grams) == len(text) - 1
    assert Tokenizer("zh", chinese="bigram")("iPhone 电池") == ["iphone", "电池"]


def test_auto_language_detection():
    assert is_chinese("宝宝发烧怎么办") and not is_chinese("baby fever")
    assert Tokenizer("auto")("宝宝发烧") == Tokenizer("zh")("宝宝发烧")
    assert Tokenizer("auto")("Baby fever") == ["baby", "fever"]


def test_idf_planner_max_normalisation():
    texts = ["espresso grinder", "espresso beans", "espresso machine tips", "grinder tips", "pour over tips"]
    p = IDFPlanner(texts, Tokenizer("en"))
    s = p("espresso grinder tips")
    assert max(s.values()) == pytest.approx(1.0)  # the rarest term of the query scores 1
    # df: espresso 3, grinder 2, tips 3 -> grinder is the most important
    assert s["grinder"] == pytest.approx(1.0)
    assert s["espresso"] == pytest.approx(s["tips"])
    assert s["espresso"] < 1.0
    n = len(texts)
    expected = (math.log((1 + n) / (1 + 3)) + 1) / (math.log((1 + n) / (1 + 2)) + 1)
    assert s["espresso"] == pytest.approx(expected)


def test_idf_planner_sum_normalisation_and_min_score():
    texts = ["a b", "a c", "a d", "b"]
    s = IDFPlanner(texts, Tokenizer("en", stop_words=False), normalize="sum")("a b c")
    assert sum(s.values()) == pytest.approx(1.0)
    full = IDFPlanner(texts, Tokenizer("en", stop_words=False))("a c")
    pruned = IDFPlanner(texts, Tokenizer("en", stop_words=False), min_score=0.9)("a c")
    assert set(full) == {"a", "c"} and set(pruned) == {"c"}


def test_unseen_terms_get_the_highest_idf_and_empty_queries_are_empty():
    p = IDFPlanner(["x y", "x z"], Tokenizer("en"))
    s = p("x unseen")
    assert s["unseen"] == 1.0 and s["x"] < 1.0
    assert p("the and of") == {}  # only stop words


def _word_count_factory(texts: list[str]) -> TermPlanner:
    """A user's planner factory (``association.planner.factory``): scores a term by its count in ``texts``."""
    counts: dict[str, float] = {}
    for t in texts:
        for w in t.split():
            counts[w] = counts.get(w, 0.0) + 1.0
    return lambda text: {w: counts.get(w, 0.0) for w in text.split()}


def test_planner_protocol():
    """What TermPlanner promises (``planner(text) -> {term: score}``), kept by the built-in planner
    and by a user's factory named in the build config, which is the planner the build then uses."""
    texts = ["x y", "x z"]
    for planner in (
        IDFPlanner(texts, Tokenizer("en")),
        make_planner(PlannerConfig(factory=f"{__name__}:_word_count_factory"), texts),
    ):
        scores = planner("x z")
        assert set(scores) == {"x", "z"} and all(isinstance(v, float) and math.isfinite(v) for v in scores.values())
    custom = make_planner(PlannerConfig(factory=f"{__name__}:_word_count_factory"), texts)
    assert custom("x z") == {"x": 2.0, "z": 1.0}  # the factory's own scores, not the IDF planner's
    with pytest.raises(ConfigError, match="association.planner.factory"):
        make_planner(PlannerConfig(factory=f"{__name__}:no_such_factory"), ["a"])


def test_normalize_text():
    assert normalize_text("  Best  ESPRESSO, grinder!! ") == "best espresso grinder"
    assert normalize_text("ｅｓｐｒｅｓｓｏ") == "espresso"  # NFKC full-width
