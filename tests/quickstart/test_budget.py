"""The time budget's parts: the proxy sampler, the halving rule, the planner and the progress display
without a terminal. The budgeted quick start against the exhaustive one (``--full``) end to end:
``test_budget_runs.py``."""

from __future__ import annotations

import io
import time
from dataclasses import replace

import pytest

from scalingnote.data.types import Document
from scalingnote.errors import ConfigError
from scalingnote.quickstart import QuickstartConfig
from scalingnote.quickstart.budget import Candidates, Sizes, make_plan, proxy_sizes
from scalingnote.quickstart.choose import halve
from scalingnote.quickstart.config import family
from scalingnote.quickstart.progress import Progress
from scalingnote.quickstart.proxy import sample_proxy
from scalingnote.training.data import Example


# ----------------------------------------------------------------------------- the proxy sampler
def _examples(n_queries: int, prefix: str, start: int) -> list[Example]:
    out = []
    for i in range(n_queries):
        q = f"{prefix}{i}"
        for j in range(2):  # two judged documents per query, each with a hard negative
            out.append(Example(q, f"text {q}", Document(f"d{start + 2 * i + j}"), Document(f"n{start + 2 * i + j}")))
    return out


def _corpus_ids(train, val, extra: int) -> list[str]:
    ids = {d.id for e in train + val for d in (e.pos, *e.negs)}
    return sorted(ids) + [f"x{i}" for i in range(extra)]


def test_the_proxy_keeps_every_validation_querys_judged_documents_and_draws_the_rest_with_the_seed():
    train, val = _examples(100, "t", 0), _examples(10, "v", 10_000)
    ids = _corpus_ids(train, val, 2000)
    s = sample_proxy(train, val, ids, fraction=0.25, min_docs=50, min_train_queries=5, seed=0)
    kept = set(s.doc_ids)
    # every validation query with every judged document: the full runs' held-out queries, unchanged
    assert [e.query_id for e in s.validation] == [e.query_id for e in val] and all(e.pos.id in kept for e in val)
    # a quarter of the training queries, each with all its pairs and their judged documents
    assert s.train_queries == 25 and len({e.query_id for e in s.train}) == 25 and len(s.train) == 50
    assert all(e.pos.id in kept for e in s.train)
    # their hard negatives come first among the distractors (here all fit), then random documents
    assert all(e.neg is not None and e.neg.id in kept for e in s.train + s.validation)
    # the size rule: max(min_docs, fraction x corpus) documents, distractors filling what the judged ones leave
    n_docs, _ = proxy_sizes(len(ids), 100, 0.25, 50, 5)
    assert len(s.doc_ids) == n_docs == -(-len(ids) // 4) and s.distractors == n_docs - s.required_docs > 60
    assert s.required_docs == 2 * 25 + 2 * 10
    assert s.doc_ids == [i for i in ids if i in kept]  # in corpus order
    assert s.cheaper
    again = sample_proxy(train, val, ids, fraction=0.25, min_docs=50, min_train_queries=5, seed=0)
    other = sample_proxy(train, val, ids, fraction=0.25, min_docs=50, min_train_queries=5, seed=1)
    assert again.doc_ids == s.doc_ids and [e.query_id for e in again.train] == [e.query_id for e in s.train]
    assert other.doc_ids != s.doc_ids and {e.query_id for e in other.train} != {e.query_id for e in s.train}
    assert {e.pos.id for e in val} <= set(other.doc_ids)  # whatever the seed


def test_hard_negatives_that_do_not_fit_the_proxy_leave_their_examples_not_their_positives():
    train, val = _examples(100, "t", 0), _examples(10, "v", 10_000)
    ids = _corpus_ids(train, val, 2000)
    s = sample_proxy(train, val, ids, fraction=0.02, min_docs=80, min_train_queries=25, seed=0)
    kept = set(s.doc_ids)
    assert len(kept) == 80 and s.required_docs == 70 and all(e.pos.id in kept for e in s.train + s.validation)
    assert all(e.neg is None or e.neg.id in kept for e in s.train + s.validation)
    assert sum(e.neg is not None for e in s.train + s.validation) == 10  # the 10 places left went to hard negatives


def test_a_proxy_that_would_hold_most_of_the_data_is_not_cheaper():
    train, val = _examples(20, "t", 0), _examples(5, "v", 10_000)
    s = sample_proxy(
        train, val, _corpus_ids(train, val, 10), fraction=0.25, min_docs=500, min_train_queries=200, seed=0
    )
    assert (
        s.train_queries == 20 and not s.cheaper
    )  # the minimum sizes take everything: the full runs are the comparison


# ----------------------------------------------------------------------------- the halving rule
def test_halving_keeps_every_candidate_within_the_margin_and_states_it():
    keep, why = halve({"bert": 0.70, "llm": 0.38}, 0.02)
    assert keep == ["bert"] and "within 0.02 of the best (bert)" in why and "dropped llm" in why
    keep, why = halve({"2": 0.360, "4": 0.346, "8": 0.339}, 0.02)
    assert keep == ["2", "4"] and "dropped 8" in why  # 0.346 can still win; 0.339 is 0.021 behind
    assert halve({"a": 0.5, "b": 0.5}, 0.0)[0] == ["a", "b"]  # a tie is not a loss
    keep, why = halve({"a": 0.50, "b": 0.51, "c": 0.505}, 0.02, keep_at_most=1)
    assert keep == ["b"] and "at most 1 (time budget)" in why
    with pytest.raises(ValueError):
        halve({"a": 0.5}, -0.1)


# ----------------------------------------------------------------------------- the planner
def _plan(budget, **over):
    cfg = QuickstartConfig(out="unused", budget_minutes=budget, **over)
    fams = {f: family(cfg, f) for f in cfg.families}
    sizes = Sizes(docs=24_000, doc_tokens=40, train_examples=20_000, train_queries=18_000, val_queries=2000)
    return cfg, fams, sizes, make_plan(cfg, fams, sizes, ("bert", 2))


def test_the_plan_prices_every_phase_and_names_what_a_short_budget_skips():
    cfg, fams, sizes, roomy = _plan(600)
    assert list(roomy.phases) == [
        "data",
        "proxy",
        "stage1_large_towers",
        "mining_round",
        "stage2_students",
        "comparison_runs",
        "index",
        "evaluation",
    ]
    assert roomy.skipped == [] and roomy.phases["proxy"] > 0  # the proxy is drawn (24k docs)
    assert roomy.mining and roomy.phases["mining_round"] > 0  # the mining round, held by the budget
    assert roomy.phases["comparison_runs"] > 0 and roomy.total <= 600 * 60
    # every candidate trained in full costs more than the proxy's survivors alone
    one = Candidates({"bert": {None: [1e-3]}}, {"bert": True})
    survivors = make_plan(cfg, fams, sizes, ("bert", 2), cands=one, proxy_done=True, spent={"data": 5.0, "proxy": 60.0})
    assert survivors.phases["stage1_large_towers"] < roomy.phases["stage1_large_towers"] / 2
    assert (
        survivors.phases["data"] == 5.0 and survivors.phases["proxy"] == 60.0
    )  # spent phases keep their measured time
    # a short budget: the comparison runs go first, then the extra candidates, in the stated order, each named
    _, _, _, short = _plan(10)
    assert short.skipped[0].startswith("comparison runs") and short.compare == "none"  # they serve nothing: first
    assert (
        short.skipped[1].startswith("the mining round") and not short.mining and short.phases["mining_round"] == 0
    )  # a second round: next
    assert any(s.startswith("head learning rates") for s in short.skipped)
    assert short.total < roomy.total
    assert "skipped (budget): comparison runs" in short.text() and "of a 10-minute budget" in short.text()
    # a budget nothing can hold: QKD steps are cut down to the floor, and the plan says it is still over
    _, _, _, tiny = _plan(1)
    assert any(s.startswith("QKD steps 600 -> 200") for s in tiny.skipped) and tiny.total > 60
    assert "OVER the budget by" in tiny.text() and "OVER" not in roomy.text()
    # a corpus too small for a proxy: no ranking to keep "the best" by, so no candidate is cut,
    # only work that is no choice
    small = Sizes(docs=400, doc_tokens=40, train_examples=300, train_queries=250, val_queries=30)
    cfg1 = QuickstartConfig(out="unused", budget_minutes=1)
    p = make_plan(cfg1, fams, small, ("bert", 2))
    assert (
        p.phases["proxy"] == 0
        and p.skipped
        and not any(s.startswith(("head learning", "depths", "families")) for s in p.skipped)
    )
    assert p.cands.depths["llm"] == {2: [1e-3, 3e-3], 4: [1e-3, 3e-3]}
    # --full: no proxy, no budget, nothing skipped
    _, _, _, full = _plan(1, full=True)
    assert full.budget_s is None and full.skipped == [] and full.phases["proxy"] == 0 and full.compare == "teacher"


def test_the_budget_and_the_proxy_settings_are_checked():
    for bad in ({"budget_minutes": 0}, {"proxy_fraction": 0}, {"proxy_margin": -0.1}):
        with pytest.raises(ConfigError):
            QuickstartConfig(out="x", **bad)


# ----------------------------------------------------------------------------- the progress display
def test_without_a_terminal_progress_is_a_line_per_phase_and_per_interval_not_a_flood():
    buf = io.StringIO()
    with Progress({"a": 60.0, "b": 120.0}, out=buf, heartbeat_s=0.2) as p:
        p.begin("a")
        time.sleep(0.7)
        p.end("a")
        p.begin("b")
    lines = buf.getvalue().splitlines()
    phase = [ln for ln in lines if "phase " in ln]
    beats = [ln for ln in lines if "elapsed:" in ln]
    assert len(phase) == 2 and "planned 1.0 min" in phase[0] and "ETA 3.0 min for the whole run" in phase[0]
    assert 2 <= len(beats) <= 4  # one line per interval (0.7 s / 0.2 s), each with the phase and the ETA
    assert all(ln.startswith("[quickstart] ") and "ETA" in ln for ln in beats)
    # the ETA scales the rest of the plan by how the finished phases compared with theirs: "a" took ~0.7 s of 60 planned
    assert p.eta_s() < 120 * 0.6


def test_the_comparison_runs_are_cut_late_when_the_run_falls_behind_its_plan():
    from scalingnote.quickstart.early import late_cut

    cfg, fams, sizes, _ = _plan(11, mining_round="off")  # (the plan fills 95% of it: 10.45 min)
    one = Candidates({"bert": {None: [1e-3]}}, {"bert": False})
    plan = make_plan(
        cfg,
        fams,
        Sizes(docs=1500, doc_tokens=110, train_examples=2000, train_queries=550, val_queries=60),
        ("bert", 2),
        cands=one,
        proxy_done=True,
        spent={"data": 20.0, "proxy": 60.0},
    )
    assert plan.compare == "teacher" and plan.phases["comparison_runs"] > 0  # the plan held them
    spent = {"data": 20.0, "proxy": 60.0, "stage1_large_towers": 60.0, "stage2_students": 120.0}
    assert late_cut(cfg, plan, spent, 1.0).compare == "teacher"  # on pace: kept
    behind = late_cut(cfg, plan, {**spent, "stage2_students": 400.0}, 1.5)
    assert behind.compare == "none" and plan.compare == "none" and "at this run's pace" in plan.skipped[-1]
    full = QuickstartConfig(out="unused", full=True)
    assert late_cut(full, plan, {**spent, "stage2_students": 3000.0}, 3.0) is full  # --full never cuts


def test_the_eta_grows_when_a_phase_runs_over_its_plan():
    now = [0.0]
    p = Progress({"a": 100.0, "b": 100.0, "c": 100.0}, out=io.StringIO(), clock=lambda: now[0])
    p.begin("a")
    now[0] = 50.0
    assert p.eta_s() == pytest.approx(250.0)  # on plan: 50 left of a, then b and c
    now[0] = 200.0  # a has run twice its plan: the rest is expected at that pace
    assert p.eta_s() == pytest.approx(400.0)
    p.end("a")
    p.begin("b")
    assert p.eta_s() == pytest.approx(400.0)  # a finished at 2x: b and c at 2x


def test_the_eta_keeps_growing_while_a_phase_runs_far_over_its_plan():
    now = [0.0]
    p = Progress({"a": 100.0, "b": 100.0}, out=io.StringIO(), clock=lambda: now[0])
    p.begin("a")
    now[0] = 400.0
    at4 = p.eta_s()
    now[0] = 600.0
    assert at4 == pytest.approx(400.0) and p.eta_s() == pytest.approx(600.0)  # 4x, then 6x: b at the same pace


def test_the_plan_prices_each_familys_tokens_from_its_tokenizer_and_prompt():
    from scalingnote.quickstart.cost import TOKEN_LAYER_S, family_tokens, qkd_pool, stage1_seconds

    cfg = QuickstartConfig(out="unused", doc_max_length=256, query_max_length=64)
    report = {
        "bert": {"chars_per_token": 4.3, "tokens": 500, "texts": 100},
        "llm": {"chars_per_token": 1.0, "tokens": 1200, "texts": 100, "prompt_tokens": 30},
    }
    docs, queries = family_tokens(cfg, 40.0, report)  # 40-character Chinese titles
    assert docs["llm"] == pytest.approx(40 + 2 + 30) and docs["bert"] == pytest.approx(40 / 4.3 + 2)
    assert queries == {"bert": pytest.approx(7.0), "llm": pytest.approx(14.0)}
    long_docs, _ = family_tokens(cfg, 4000.0, report)
    assert long_docs["llm"] == 256  # capped by doc_max_length
    fams = {f: family(cfg, f) for f in cfg.families}
    flat = Sizes(docs=10_000, doc_tokens=10, train_examples=5000, train_queries=4000, val_queries=400)
    priced = Sizes(
        docs=10_000,
        doc_tokens=10,
        train_examples=5000,
        train_queries=4000,
        val_queries=400,
        doc_tokens_by=docs,
        query_tokens_by=queries,
    )
    every = Candidates.every(cfg, list(fams.values()))
    # SmolLM2's pass over 10k documents of 72 tokens, not 10, at its deepest candidate (4 layers,
    # TOKEN_LAYER_S per token and layer)
    more = stage1_seconds(cfg, fams, every, priced, 10_000, 5000, 5400) - stage1_seconds(
        cfg, fams, every, flat, 10_000, 5000, 5400
    )
    assert more > 10_000 * (72 - 10) * 4 * TOKEN_LAYER_S["llm"]
    n, tok = qkd_pool(cfg, priced, "llm")
    assert n == 4400 + 3000 + 10_000 and 14 < tok <= 64  # corpus texts are cut to the query length


def test_a_proxy_planned_over_its_share_of_the_budget_is_drawn_smaller():
    from scalingnote.quickstart.early import MIN_PROXY_FRACTION, PROXY_SHARE, sized_proxy

    cfg = QuickstartConfig(out="unused", budget_minutes=15)
    fams = [family(cfg, f) for f in cfg.families]
    sizes = Sizes(docs=32_000, doc_tokens=94, train_examples=13_000, train_queries=4500, val_queries=500)
    plan0 = make_plan(cfg, {f.name: f for f in fams}, sizes, ("bert", 2))
    assert (
        plan0.phases["proxy"] > PROXY_SHARE * 15 * 60
    )  # at the default fraction the proxy alone is most of the budget
    smaller, plan = sized_proxy(cfg, fams, sizes, {})
    assert MIN_PROXY_FRACTION <= smaller.proxy_fraction < cfg.proxy_fraction
    assert plan.phases["proxy"] < plan0.phases["proxy"]
    roomy, _ = sized_proxy(replace(cfg, budget_minutes=600), fams, sizes, {})
    assert roomy.proxy_fraction == cfg.proxy_fraction  # a budget that holds it leaves it alone
    full, _ = sized_proxy(replace(cfg, full=True), fams, sizes, {})
    assert full.proxy_fraction == cfg.proxy_fraction


def test_a_budget_that_holds_one_depth_keeps_the_shallowest_survivor():
    cfg = QuickstartConfig(out="unused", budget_minutes=1)
    fams = {f: family(cfg, f) for f in cfg.families}
    sizes = Sizes(docs=24_000, doc_tokens=40, train_examples=20_000, train_queries=18_000, val_queries=2000)
    survivors = Candidates({"llm": {4: [1e-3], 2: [1e-3]}}, {"llm": False})  # the proxy's best (4) first
    plan = make_plan(cfg, fams, sizes, ("llm", 1), cands=survivors, proxy_done=True, spent={"data": 5.0, "proxy": 60.0})
    assert plan.cands.depths["llm"] == {2: [1e-3]}
    assert any(s.startswith("depths beyond the shallowest") for s in plan.skipped)


def test_over_the_budget_a_shallower_depth_the_proxy_dropped_takes_the_survivors_place():
    from scalingnote.quickstart.early import affordable_depth

    sizes = Sizes(docs=32_000, doc_tokens=94, train_examples=13_000, train_queries=4500, val_queries=500)
    # the proxy ran SmolLM2 at depths 2 and 4 (and 8, deeper than the survivor) and kept only 4
    rec = [
        {"family": "llm", "depth": d, "head_lr": lr, "dim": 128, "proxy_val": v}
        for d, lr, v in ((2, 1e-3, 0.836), (4, 1e-3, 0.856), (4, 3e-3, 0.851), (8, 1e-3, 0.84))
    ]

    def run(minutes, **over):
        cfg = QuickstartConfig(out="unused", budget_minutes=minutes, **over)
        fams = {"llm": family(cfg, "llm")}

        def make(c):
            spent = {"data": 5.0, "proxy": 150.0}
            return make_plan(cfg, fams, sizes, ("llm", 1), cands=c, proxy_done=True, spent=spent)

        plan = make(Candidates({"llm": {4: [1e-3]}}, {"llm": False}))
        return plan, affordable_depth(cfg, plan, rec, make)

    plan, new = run(15)  # depth 4 is over with QKD at its floor; depth 2 fits
    assert plan.total > plan.limit_s and plan.qkd_steps == 200
    assert new.cands.depths == {"llm": {2: [1e-3]}} and new.total <= new.limit_s
    assert "llm depth 4, the proxy's best" in new.skipped[-1] and "0.8360 against 0.8560" in new.skipped[-1]
    assert "the deepest the proxy ran that fits" in new.skipped[-1]
    plan, new = run(10)  # nothing fits: the cheaper depth comes nearest
    assert new.cands.depths == {"llm": {2: [1e-3]}} and plan.total > new.total > new.limit_s
    assert "the cheapest the proxy ran (none fits)" in new.skipped[-1]
    for plan, new in (run(20), run(15, full=True), run(None)):  # within the budget, or no budget: the proxy's best
        assert new is plan and new.cands.depths == {"llm": {4: [1e-3]}}


def test_a_budget_cuts_the_zero_shot_row_of_a_family_that_cannot_read_the_data_first():
    cfg = QuickstartConfig(out="unused", budget_minutes=5)
    sizes = Sizes(docs=32_000, doc_tokens=94, train_examples=13_000, train_queries=4500, val_queries=500)
    llm_only = {"llm": family(cfg, "llm")}  # MiniLM configured, unreadable (KUAKE-QTR's Chinese)
    plan = make_plan(cfg, llm_only, sizes, ("llm", 1))
    assert not plan.zero_shot_row and plan.skipped[0].startswith("the zero-shot MiniLM row")
    roomy = make_plan(replace(cfg, budget_minutes=600), llm_only, sizes, ("llm", 1))
    assert (
        roomy.zero_shot_row and roomy.phases["evaluation"] > plan.phases["evaluation"] + 60
    )  # a pass over 32k documents
    both = make_plan(cfg, {f: family(cfg, f) for f in cfg.families}, sizes, ("bert", 2))
    assert both.zero_shot_row  # a readable MiniLM's zero-shot row is a real baseline: never cut


def test_a_qkd_step_is_priced_by_its_batchs_padded_length_not_the_pools_mean():
    from scalingnote.quickstart.cost import qkd_padded_tokens, qkd_pool, qkd_step_seconds

    cfg = QuickstartConfig(out="unused", query_max_length=64, qkd_length_buckets=0)
    fam = family(cfg, "bert")
    base = dict(
        docs=5000,
        doc_tokens=256,
        train_examples=800,
        train_queries=700,
        val_queries=80,
        chars_per_token_by={"bert": 4.0},
        query_tokens_by={"bert": 20.0},
    )
    short = Sizes(**base, pool_chars_sample=(40.0,) * 900 + (60.0,) * 100)  # 12-17 tokens
    mixed = Sizes(**base, pool_chars_sample=(40.0,) * 900 + (400.0,) * 100)  # one sentence in ten fills the cap
    assert qkd_pool(cfg, mixed, "bert")[1] < 25  # the pool's mean is short...
    # ...but nearly every whole batch of 128 holds a long one: padded to 64
    assert qkd_padded_tokens(cfg, mixed, "bert", chunk=0) > 63
    # a step in length-sorted chunks pads only the chunk that holds the long tenth to 64; every pass
    # beyond the first is priced too (256 tokens over the batch), for a fixed size as for "auto" (the
    # default), which takes the cheapest count and so costs no more than any fixed size
    assert 20 < qkd_padded_tokens(cfg, mixed, "bert", chunk=32) < 0.5 * qkd_padded_tokens(cfg, mixed, "bert", chunk=0)
    whole = qkd_padded_tokens(cfg, mixed, "bert", chunk=0)
    assert whole == qkd_padded_tokens(cfg, mixed, "bert", chunk=128)  # one chunk: no pass priced beyond it
    auto = qkd_padded_tokens(cfg, mixed, "bert")
    assert auto < 0.5 * whole
    assert auto <= min(qkd_padded_tokens(cfg, mixed, "bert", chunk=c) for c in (64, 32, 16))
    # whole: the logged queries (20) or the longest sentence (17); chunks of 16 of the 12-token sentences
    # pad to 12-17 but cost seven more passes: dearer than the whole batch (as measured on the embedded
    # default's short texts, ``qkd_step_chunks_default.json``), and auto no dearer than either
    short_whole = qkd_padded_tokens(cfg, short, "bert", chunk=0)
    assert 17 <= short_whole <= 20.5
    assert qkd_padded_tokens(cfg, short, "bert", chunk=16) > short_whole
    assert qkd_padded_tokens(cfg, short, "bert") <= min(short_whole, qkd_padded_tokens(cfg, short, "bert", chunk=32))
    assert qkd_step_seconds(cfg, mixed, fam, 2) > 1.2 * qkd_step_seconds(cfg, short, fam, 2)
    # length-bucketed batches (a window of 8 batches sorted by length): the long tenth fills about one
    # batch of the eight, the others pad to the short texts
    bucketed = replace(cfg, qkd_length_buckets=8)
    assert qkd_padded_tokens(bucketed, mixed, "bert", chunk=0) < 0.4 * qkd_padded_tokens(cfg, mixed, "bert", chunk=0)
    assert qkd_padded_tokens(bucketed, short, "bert") <= qkd_padded_tokens(cfg, short, "bert")
    assert qkd_step_seconds(bucketed, mixed, fam, 2) < qkd_step_seconds(cfg, mixed, fam, 2)
    assert (
        qkd_padded_tokens(cfg, Sizes(**{**base, "chars_per_token_by": {}}), "bert")
        == qkd_pool(cfg, Sizes(**base), "bert")[1]
    )  # no sample: the mean


def test_a_budget_with_room_for_one_width_trains_the_default_width_not_the_narrow_one():
    from scalingnote.quickstart.budget import _cut_width
    from scalingnote.quickstart.cost import stage1_seconds

    cfg, fams, sizes, _ = _plan(600)
    one = make_plan(
        cfg, fams, sizes, ("bert", 2), cands=Candidates({"bert": {None: [1e-3]}}, {"bert": True}), proxy_done=True
    )
    assert "the width run (bert): bert trains at the backbone's width" in _cut_width(one, cfg)
    assert one.cands.width == {"bert": False} and one.cands.wide == {"bert": True}
    assert "at the backbone's width" in one.text() and one.to_json()["wide"] == {"bert": True}
    # one run at the backbone's width costs less than a run at dim and the width run after it, more than one at dim
    price = {
        k: stage1_seconds(cfg, fams, Candidates({"bert": {None: [1e-3]}}, {"bert": w}, {"bert": v}), sizes, 99, 9, 9)
        for k, (w, v) in {"two": (True, False), "wide": (False, True), "narrow": (False, False)}.items()
    }
    assert price["narrow"] < price["wide"] < price["two"]
    # with many candidates left, training each at the backbone's width would cost more than the width run: only cut
    many = make_plan(
        cfg,
        fams,
        sizes,
        ("llm", 1),
        cands=Candidates({"llm": {2: [1e-3, 3e-3], 4: [1e-3, 3e-3]}}, {"llm": True}),
        proxy_done=True,
    )
    assert _cut_width(many, cfg) == "the width run (llm)" and many.cands.wide == {"llm": False}
    assert _cut_width(many, cfg) is None  # nothing left to cut


def test_the_student_start_and_the_index_phase_are_priced_by_their_work():
    """Stage II prices the student's head fit and, with layer candidates, each candidate's smaller
    fit and validation loss; the index phase grows with the corpus it indexes."""
    from scalingnote.quickstart.cost import index_seconds, qkd_seconds, student_start_seconds

    cfg = QuickstartConfig(out="unused", query_max_length=64)
    fam = family(cfg, "bert")
    small = Sizes(docs=1500, doc_tokens=110, train_examples=2000, train_queries=550, val_queries=60)
    large = replace(small, docs=32_000)
    one, three = (student_start_seconds(cfg, large, fam, 2, c) for c in (1, 3))
    assert 0 < one < three
    assert qkd_seconds(cfg, large, fam, 2, 200, 6, 3) - qkd_seconds(cfg, large, fam, 2, 200, 6, 1) == pytest.approx(
        three - one
    )
    assert index_seconds(small) < index_seconds(large)
    sizes = Sizes(docs=24_000, doc_tokens=40, train_examples=20_000, train_queries=18_000, val_queries=2000)
    fams = {f: family(cfg, f) for f in cfg.families}
    choose, bottom = (
        make_plan(replace(cfg, student_layers=mode), fams, sizes, ("bert", 2)) for mode in ("choose", "bottom")
    )
    assert choose.phases["stage2_students"] > bottom.phases["stage2_students"]  # three starts scored, not one
