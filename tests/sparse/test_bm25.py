from __future__ import annotations

import pytest

from scalingnote.data import Document
from scalingnote.errors import ScalingNoteError
from scalingnote.sparse.bm25 import BM25Retriever, chinese_bigrams, detect_language, sample_hard_negatives


def test_chinese_bigrams_and_detection():
    assert chinese_bigrams("宝宝发烧 38度") == ["宝宝", "宝发", "发烧", "38", "度"]
    assert detect_language(["宝宝发烧怎么办"]) == "zh"
    assert detect_language(["the cat sat"]) == "en"


def test_bm25_english_ranks_matching_doc_first_and_round_trips(tmp_path):
    docs = [
        Document("d1", "Running shoes", "", "the best shoes for marathon runners"),
        Document("d2", "Cooking", "", "how to cook pasta with tomatoes"),
        Document("d3", "Gardening", "", "tomatoes grow in the summer garden"),
    ]
    r = BM25Retriever.fit(docs, show_progress=False)
    run = r.search({"q1": "runner shoe", "q2": "tomato pasta", "q3": "the and of"}, k=3, show_progress=False)
    assert max(run["q1"], key=run["q1"].get) == "d1"  # stemming: runner->runner, shoe~shoes
    assert max(run["q2"], key=run["q2"].get) == "d2"
    assert run["q3"] == {}  # only stop words: no match, no crash
    r.save(tmp_path / "bm25")
    r2 = BM25Retriever.load(tmp_path / "bm25")
    assert r2.search({"q2": "tomato pasta"}, k=3, show_progress=False) == {"q2": run["q2"]}


def test_bm25_chinese():
    docs = [Document("d1", "", "", "宝宝发烧怎么办"), Document("d2", "", "", "孕妇可以吃螃蟹吗")]
    r = BM25Retriever.fit(docs, show_progress=False)
    assert r.language == "zh"
    run = r.search({"q": "宝宝发烧"}, k=2, show_progress=False)
    assert list(run["q"]) == ["d1"]


def test_sample_hard_negatives_skips_top_k_and_positives():
    run = {"q": {f"d{i}": 100.0 - i for i in range(50)}}
    negs = {sample_hard_negatives(run, {"q": ["d12"]}, skip_top=10, max_rank=20, seed=s)["q"] for s in range(200)}
    assert negs <= {f"d{i}" for i in range(10, 20)} - {"d12"}
    assert len(negs) > 5
    assert sample_hard_negatives({"q": {"d0": 1.0}}, {}, skip_top=5, max_rank=10)["q"] is None
    with pytest.raises(ScalingNoteError, match="need 0 <= K < T, got K=10, T=5"):
        sample_hard_negatives(run, {}, skip_top=10, max_rank=5)
    with pytest.raises(ScalingNoteError, match="got K=-1, T=5"):
        sample_hard_negatives(run, {}, skip_top=-1, max_rank=5)
