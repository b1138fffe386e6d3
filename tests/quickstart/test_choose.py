"""The quick start's choice rules, each on its own (pure functions over numbers and runs)."""

from __future__ import annotations

import numpy as np
import pytest

from scalingnote.quickstart.choose import (
    choose_best,
    choose_student,
    cross_fit_fusion,
    keep_better,
    readability,
    tokenizer_report,
    val_confidence,
)


class _Tok:
    """A whitespace tokenizer with a fixed vocabulary; everything else is unknown (id 0)."""

    unk_token_id = 0

    def __init__(self, vocab):
        self.vocab = {w: i + 1 for i, w in enumerate(vocab)}

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [self.vocab.get(w, 0) for w in text.split()]}


def test_tokenizer_report_counts_unknown_tokens_and_characters():
    rep = tokenizer_report(_Tok(["heart", "attack"]), ["heart attack", "heart xyz"])
    assert rep["unk_share"] == 0.25 and rep["tokens"] == 4 and rep["chars_per_token"] == round(21 / 4, 2)


def test_readability_refuses_a_vocabulary_that_maps_the_text_to_unknown():
    ok, why = readability({"unk_share": 0.70, "chars_per_token": 1.04, "texts": 500}, 0.05)
    assert not ok and "70%" in why and "cannot read" in why
    ok, _ = readability({"unk_share": 0.01, "chars_per_token": 4.3, "texts": 500}, 0.05)
    assert ok


def test_minilm_cannot_read_chinese_but_smollm2_can():
    """The packaged tokenizers on Chinese queries: MiniLM's English WordPiece is mostly [UNK]."""
    pytest.importorskip("transformers")
    from scalingnote.models import load_tower

    zh = ["10个月宝宝一般睡多少个小时", "孕妇可以吃螃蟹吗", "高血压吃什么药好", "感冒了喝什么汤好得快"]
    minilm = tokenizer_report(load_tower("minilm-l6", "query", num_layers=1, dim=None).tokenizer, zh)
    smol = tokenizer_report(load_tower("smollm2-135m", "query", num_layers=1, dim=None).tokenizer, zh)
    assert not readability(minilm, 0.05)[0] and minilm["unk_share"] > 0.3
    assert readability(smol, 0.05)[0]


@pytest.mark.parametrize(
    ("trained", "start", "keep"), [(0.60, 0.50, True), (0.50, 0.50, True), (0.40, 0.50, False), (0.3, None, True)]
)
def test_keep_better_keeps_the_start_when_training_hurts(trained, start, keep):
    kept, msg = keep_better(trained, start, "bert large tower")
    assert kept is keep
    assert ("keeping the start" in msg) is (not keep)


def test_each_choice_says_how_sure_the_validation_split_is_without_changing_it():
    qrels = {f"q{i}": {"d1": 1} for i in range(40)}
    top = {q: {"d1": 2.0, "d2": 1.0} for q in qrels}  # d1 first everywhere
    mixed = {q: ({"d1": 2.0, "d2": 1.0} if i % 2 else {"d2": 2.0, "d1": 1.0}) for i, q in enumerate(qrels)}
    near = {q: ({"d2": 2.0, "d1": 1.0} if i == 0 else {"d1": 2.0, "d2": 1.0}) for i, q in enumerate(qrels)}
    far, close = val_confidence(top, mixed, qrels), val_confidence(top, near, qrels)
    assert far["queries"] == close["queries"] == 40 and far["p"] < 1e-4 < close["p"]
    assert val_confidence(top, top, qrels) == {"queries": 40, "p": 1.0}  # identical runs: no difference
    assert val_confidence(top, mixed, {}) is None
    kept, msg = keep_better(0.536, 0.528, "bert large tower", {"queries": 62, "p": 0.61})
    assert kept and msg.endswith("on validation (paired t-test over 62 validation queries: p 0.61)")
    assert keep_better(0.536, 0.528, "bert large tower") == (
        True,
        "bert large tower: trained 0.5360 >= start 0.5280 on validation",
    )
    kept, msg = keep_better(0.40, 0.50, "llm large tower", {"queries": 62, "p": 0.02})
    assert not kept and msg.endswith(
        "(0.4000 < its start 0.5000; paired t-test over 62 validation queries: p 0.02); keeping the start"
    )


def test_choose_best_and_pinning():
    assert choose_best({"bert": 0.7, "llm": 0.6})[0] == "bert"
    assert choose_best({"bert": 0.6, "llm": 0.6})[0] == "bert"  # ties: first in order
    choice, why = choose_best({"bert": 0.7, "llm": 0.6}, pinned="llm")
    assert choice == "llm" and "pinned" in why
    with pytest.raises(ValueError, match="not a candidate"):
        choose_best({"bert": 0.7}, pinned="llm")


def test_choose_student_respects_the_latency_budget_and_reports_the_frontier():
    cands = [
        {"name": "bert1", "val": 0.55, "p99_ms": 3.0},
        {"name": "bert2", "val": 0.60, "p99_ms": 5.0},
        {"name": "llm1", "val": 0.58, "p99_ms": 9.0},
        {"name": "bert3", "val": 0.62, "p99_ms": 7.0},
    ]
    assert choose_student(cands, None)[0] == "bert3"
    name, frontier, why = choose_student(cands, 5.5)
    assert name == "bert2" and "p99 <= 5.5" in why
    assert [c["name"] for c in frontier] == ["bert1", "bert2", "bert3"]  # llm1 is beaten on both axes by bert3
    name, _, why = choose_student(cands, 1.0)
    assert name is None and "fastest: bert1" in why


def test_choose_student_breaks_validation_ties_by_size_then_order_never_by_timing_noise():
    same = [
        {"name": "bert2_rw0", "layers": 2, "val": 0.6, "p99_ms": 5.2},
        {"name": "bert2_rw1", "layers": 2, "val": 0.6, "p99_ms": 4.9},
    ]
    assert choose_student(same, None)[0] == "bert2_rw0"
    assert choose_student(same[::-1], None)[0] == "bert2_rw1"
    sizes = [
        {"name": "bert2", "layers": 2, "val": 0.6, "p99_ms": 3.0},
        {"name": "bert1", "layers": 1, "val": 0.6, "p99_ms": 3.1},
    ]
    assert choose_student(sizes, None)[0] == "bert1"


def test_cross_fit_fusion_keeps_the_declared_hybrid_default_on_a_tie():
    qrels = {f"q{i}": {f"d{i}": 1} for i in range(20)}
    dense = {q: {f"d{i}": 2.0, "x": 1.0} for i, q in enumerate(qrels)}  # perfect
    bm25 = {q: {"x": 5.0, "y": 4.0} for q in qrels}  # useless
    res = cross_fit_fusion(dense, bm25, qrels)
    # the fitted weight keeps the perfect order (val_hybrid 1.0): a tie does not separate them
    assert res["choice"] == "hybrid" and res["val_dense"] == 1.0 and res["val_hybrid"] == 1.0 and res["p"] == 1.0
    assert "p < 0.05" in res["rule"]


def _halves(n: int, seed: int = 0) -> tuple[set[int], set[int]]:
    """The two halves :func:`cross_fit_fusion` splits ``q0..q{n-1}`` into (sorted ids, seeded permutation)."""
    qids = sorted(f"q{i}" for i in range(n))
    order = np.random.default_rng(seed).permutation(n)
    return {int(qids[i][1:]) for i in order[: n // 2]}, {int(qids[i][1:]) for i in order[n // 2 :]}


def _fusion_case(n: int, a_lead: float, b_hurts: bool):
    """Half A: BM25 puts the answer first where dense has it a hair lower (fitting on A mixes BM25 in);
    half B: BM25 ranks a wrong document far first (``b_hurts``), so the weight fitted on A hurts B."""
    a, _ = _halves(n)
    qrels = {f"q{i}": {f"d{i}": 1} for i in range(n)}
    dense, bm25 = {}, {}
    for i in range(n):
        if i in a:
            dense[f"q{i}"] = {"x": 3.0, f"d{i}": 3.0 - a_lead, "z": 0.0}
            bm25[f"q{i}"] = {f"d{i}": 9.0, "x": 1.0, "z": 0.0}
        else:
            dense[f"q{i}"] = {f"d{i}": 3.0, "x": 2.0, "y": 1.9, "z": 0.0}
            bm25[f"q{i}"] = {"y": 50.0, "x": 40.0, f"d{i}": 0.0, "z": 0.0} if b_hurts else {f"d{i}": 9.0, "z": 0.0}
    return dense, bm25, qrels


def test_cross_fit_fusion_serves_dense_only_when_the_paired_test_separates_it():
    dense, bm25, qrels = _fusion_case(60, 2.0, b_hurts=True)
    res = cross_fit_fusion(dense, bm25, qrels)
    assert res["val_dense"] > res["val_hybrid"] and res["p"] < 0.05 and res["choice"] == "dense"
    dense, bm25, qrels = _fusion_case(6, 2.0, b_hurts=True)  # the same pattern on 6 queries: not separated
    res = cross_fit_fusion(dense, bm25, qrels)
    assert res["val_dense"] > res["val_hybrid"] + 0.2  # the same lead as on 60 queries ...
    assert (
        res["p"] >= 0.05 and res["choice"] == "hybrid" and res["default_kept"] and "declared default" in res["reason"]
    )  # ... not separated


def test_default_unless_beaten_keeps_the_default_within_the_noise():
    from scalingnote.quickstart.choose import default_unless_beaten

    lr, why = default_unless_beaten({1e-3: 0.643, 3e-3: 0.6557}, 1e-3, 0.02, "head learning rate")
    assert lr == 1e-3 and "within the noise" in why and "0.0127" in why
    lr, why = default_unless_beaten({1e-3: 0.60, 3e-3: 0.65}, 1e-3, 0.02, "head learning rate")
    assert lr == 3e-3 and "ahead of the default" in why
    assert default_unless_beaten({"128": 0.70, "384": 0.69}, "384", 0.02, "width")[0] == "384"
    assert default_unless_beaten({"a": 0.5, "b": 0.6}, "zz", 0.02, "x")[0] == "b"  # no default among them: the best


def test_separates_needs_a_higher_mean_and_a_small_p():
    from scalingnote.evaluation.significance import separates

    base = {f"q{i}": 0.5 for i in range(40)}
    better = {f"q{i}": 0.5 + (0.2 if i % 2 else 0.1) for i in range(40)}
    noisy = {f"q{i}": 0.5 + (0.3 if i % 2 else -0.28) for i in range(40)}
    assert separates(better, base)[0] and not separates(base, better)[0]
    wins, t = separates(noisy, base)
    assert not wins and t.mean_diff > 0 and t.pvalue >= 0.05


def test_cross_fit_fusion_chooses_fusion_when_both_sides_help():
    qrels = {f"q{i}": {f"d{i}": 1} for i in range(40)}
    # dense ranks the answer first for even queries and a close second for odd ones; BM25 the other way round
    dense = {
        f"q{i}": ({f"d{i}": 3.0, "x": 2.9, "z": 0.0} if i % 2 == 0 else {"x": 3.0, f"d{i}": 2.9, "z": 0.0})
        for i in range(40)
    }
    bm25 = {
        f"q{i}": ({f"d{i}": 9.0, "y": 1.0, "z": 0.0} if i % 2 else {"y": 9.0, f"d{i}": 8.9, "z": 0.0})
        for i in range(40)
    }
    res = cross_fit_fusion(dense, bm25, qrels)
    assert res["choice"] == "hybrid" and res["val_hybrid"] > res["val_dense"]


def test_default_unless_separated_asks_a_paired_test_and_falls_back_to_the_margin():
    from scalingnote.quickstart.choose import default_unless_separated

    qs = [f"q{i}" for i in range(40)]
    base = {q: 0.5 for q in qs}
    noisy = {q: 0.5 + (0.3 if i % 2 else -0.26) for i, q in enumerate(qs)}  # +0.02 on average, p far above 0.05
    better = {q: 0.5 + (0.05 if i % 2 else 0.03) for i, q in enumerate(qs)}  # +0.04 on every query
    val = {1e-3: 0.5, 3e-3: 0.52}
    lr, why = default_unless_separated(val, {1e-3: base, 3e-3: noisy}, 1e-3, 0.001, "head learning rate")
    assert lr == 1e-3 and "does not separate 0.003" in why and "paired t-test over 40 validation queries" in why
    lr, why = default_unless_separated(
        {1e-3: 0.5, 3e-3: 0.54}, {1e-3: base, 3e-3: better}, 1e-3, 0.1, "head learning rate"
    )
    assert lr == 3e-3 and "better than the default 0.001" in why
    # no per-query scores (a run recorded before them): the margin rule
    assert default_unless_separated(val, {1e-3: None, 3e-3: noisy}, 1e-3, 0.01, "x")[0] == 3e-3
    assert default_unless_separated(val, {1e-3: None, 3e-3: noisy}, 1e-3, 0.05, "x")[0] == 1e-3


def test_the_fusion_weight_is_the_declared_default_unless_a_fitted_one_is_separated():
    from scalingnote.index.hybrid import choose_norm_and_weight
    from scalingnote.quickstart.choose import DEFAULT_FUSION, fusion_unless_separated

    n = 60
    qrels = {f"q{i}": {f"d{i}": 1} for i in range(n)}
    # BM25 finds every answer first; dense puts a wrong document a long way ahead: only a low dense weight fixes it
    dense = {f"q{i}": {"x": 10.0, f"d{i}": 1.0, "z": 0.0} for i in range(n)}
    bm25 = {f"q{i}": {f"d{i}": 9.0, "x": 8.5, "z": 0.0} for i in range(n)}
    norm, weight, why = fusion_unless_separated(dense, bm25, qrels)
    assert (norm, weight) != DEFAULT_FUSION and weight < 0.5 and "separated from the default" in why
    # a fitted weight that wins on two queries of sixty (every other query ranks the same at any weight) is
    # not separated: the default is served
    for i in range(n):
        dense[f"q{i}"] = {f"d{i}": 3.0, "x": 2.0, "z": 0.0}
        bm25[f"q{i}"] = {f"d{i}": 9.0, "x": 1.0, "z": 0.0}
    for q, d in (("q0", "d0"), ("q1", "d1")):
        dense[q], bm25[q] = {"x": 3.0, d: 1.0, "z": 0.0}, {d: 9.0, "x": 7.0, "z": 0.0}
    best, _ = choose_norm_and_weight(dense, bm25, qrels)
    norm, weight, why = fusion_unless_separated(dense, bm25, qrels)
    assert (best.norm, best.weight) != DEFAULT_FUSION  # the grid's best is another weight ...
    assert (norm, weight) == DEFAULT_FUSION and "declared default" in why and "p 0." in why  # ... not separated
