"""QKD never imitates the teacher on the teacher's own validation queries: they are what the
quick start scores students with, so a student trained on them would validate optimistically."""

from __future__ import annotations

from scalingnote.data import load_beir
from scalingnote.distill import distill, open_teacher_cache
from scalingnote.distill.data import _norm_text
from scalingnote.training.evaluate import heldout_queries
from tests.distill.test_qkd import _dcfg


def _trained_on(out) -> tuple[set[str], set[str]]:
    cache = open_teacher_cache(out / "teacher_cache")
    return {i.split(":", 1)[1] for i in cache.ids}, {_norm_text(t) for t in cache.texts}


def test_teacher_validation_queries_never_reach_qkd(stage1, tmp_path):
    val, _ = heldout_queries(stage1["stage1"])
    assert val, "the tiny Stage I run holds out validation queries"
    res = distill(_dcfg(stage1, tmp_path / "held", optim={"batch_size": 8, "epochs": 1.0, "lr": 3e-3}))
    ids, texts = _trained_on(tmp_path / "held")
    assert not ids & set(val)
    assert not texts & {_norm_text(t) for t in val.values()}
    assert res["queries_dropped_teacher_validation"] >= len(val)


def test_the_old_behaviour_keeps_them(stage1, tmp_path):
    """The switch is real: with it off, the same sources do include the teacher's validation queries."""
    val, _ = heldout_queries(stage1["stage1"])
    distill(
        _dcfg(
            stage1,
            tmp_path / "kept",
            exclude_teacher_validation=False,
            optim={"batch_size": 8, "epochs": 1.0, "lr": 3e-3},
        )
    )
    ds = load_beir(stage1["data"], "test")
    test = {_norm_text(ds.queries[q].text) for q in ds.qrels}
    _, texts = _trained_on(tmp_path / "kept")
    want = {
        _norm_text(t) for t in val.values()
    } - test  # a validation query that is also a test query is dropped as such
    assert want and want <= texts
