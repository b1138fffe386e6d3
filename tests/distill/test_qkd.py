"""Stage II (QKD) on tiny towers: Eq. 15, the teacher cache, training, compatibility, resume."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from scalingnote.config import load_config
from scalingnote.distill import DistillConfig, build_teacher_cache, distill, open_teacher_cache, qkd_loss
from scalingnote.errors import ScalingNoteError
from scalingnote.models import load_tower
from scalingnote.training import StopTraining
from tests.helpers.curves import read_scalars, steps


def test_qkd_loss_eq15():
    t = torch.tensor([[3.0, 4.0], [1.0, 0.0]])
    s = torch.tensor([[3.0, 4.0], [0.0, 1.0]])
    # row 0: 0 - 1*1 ; row 1: ||(1,-1)||^2 = 2, cos 0 -> 2
    assert abs(float(qkd_loss(t, s, lam=1.0)) - 0.5) < 1e-6
    assert abs(float(qkd_loss(t, s, lam=0.0)) - 1.0) < 1e-6


def _dcfg(s, out, **over):
    base = {
        "teacher": str(s["stage1"]),
        "output_dir": str(out),
        "student": {"model": s["bert"], "max_length": 16},
        "queries": [{"path": s["data"], "split": "train"}, {"path": s["data"]}],
        "optim": {"batch_size": 8, "epochs": 8.0, "lr": 3e-3},
        "eval_data": s["data"],
        "save_every": 3,
        "log_every": 1,
        "show_progress": False,
    }
    base.update(over)
    return load_config(DistillConfig, base)


def test_distill_learns_and_is_compatible(stage1, tmp_path):
    res = distill(_dcfg(stage1, tmp_path / "qkd"))
    log = [json.loads(x) for x in (tmp_path / "qkd" / "metrics.jsonl").read_text().splitlines()]
    assert log[-1]["loss"] < log[0]["loss"]
    # eval queries (test split) never reach training, by id or by text
    assert res["queries_dropped_eval"] >= 6
    student = load_tower(tmp_path / "qkd" / "query_tower")
    doc = load_tower(stage1["stage1"] / "doc_tower")
    assert student.compat_id == doc.compat_id and student.kind == "bert"
    # the reported nDCG@10 is the saved student's against the Stage I document embeddings, recomputed
    from tests.helpers.recompute import saved_ndcg10

    assert res["ndcg@10"] == pytest.approx(
        saved_ndcg10(tmp_path / "qkd" / "query_tower", stage1["stage1"], stage1["data"]), abs=1e-6
    )
    assert np.isfinite(res["qkd_val_loss"])
    # the curves beside metrics.jsonl, read back with TensorBoard's reader: every step's loss, learning
    # rate and throughput, and the validation loss at every validation
    sc = read_scalars(tmp_path / "qkd")
    assert {"train/loss", "train/lr", "train/grad_norm", "throughput/examples_per_s", "val/loss"} <= set(sc)
    assert steps(sc["train/loss"]) == [r["step"] for r in log] == list(range(1, len(log) + 1))
    assert [v for _, v in sc["train/loss"]] == pytest.approx([r["loss"] for r in log], abs=1e-6)
    val = [(r["step"], r["val_loss"]) for r in log if "val_loss" in r]
    assert val and steps(sc["val/loss"])[1:] == [s for s, _ in val]  # + the start (step 0)
    assert [v for _, v in sc["val/loss"]][1:] == pytest.approx([v for _, v in val], abs=1e-6)


def test_distill_resume_is_exact(stage1, tmp_path):
    full = tmp_path / "full"
    distill(_dcfg(stage1, full))

    killed = tmp_path / "killed"
    import scalingnote.training.loop as T  # the shared loop writes every stage's checkpoints

    orig = T.save_checkpoint

    def boom(*a, **k):
        orig(*a, **k)
        raise StopTraining

    T.save_checkpoint = boom
    try:
        with pytest.raises(StopTraining):
            distill(_dcfg(stage1, killed))
    finally:
        T.save_checkpoint = orig
    distill(_dcfg(stage1, killed))
    a = load_tower(full / "query_tower").state_dict()
    b = load_tower(killed / "query_tower").state_dict()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)
    ca, cb = read_scalars(full)["train/loss"], read_scalars(killed)["train/loss"]
    assert steps(cb) == steps(ca) and [v for _, v in cb] == pytest.approx([v for _, v in ca], abs=1e-6)


def test_teacher_cache_resumes_and_refuses_other_teacher(stage1, tmp_path):
    teacher = load_tower(stage1["stage1"] / "query_tower")
    ids = [f"q{i}" for i in range(10)]
    texts = [f"query number {i} fox" for i in range(10)]
    c = build_teacher_cache(teacher, ids, texts, tmp_path / "c", chunk=4, show_progress=False)
    want = teacher.encode_queries(texts, normalize=False, show_progress=False)
    np.testing.assert_allclose(np.asarray(c.emb), want, rtol=1e-5, atol=1e-6)
    # simulate an interruption after the first chunk: progress goes back, meta incomplete
    meta = json.loads((tmp_path / "c" / "meta.json").read_text())
    meta["complete"] = False
    (tmp_path / "c" / "meta.json").write_text(json.dumps(meta))
    (tmp_path / "c" / "progress.json").write_text(json.dumps({"rows": 4}))
    with pytest.raises(ScalingNoteError, match="incomplete"):
        open_teacher_cache(tmp_path / "c")
    c2 = build_teacher_cache(teacher, ids, texts, tmp_path / "c", chunk=4, show_progress=False)
    np.testing.assert_allclose(np.asarray(c2.emb), want, rtol=1e-5, atol=1e-6)
    other = load_tower(stage1["bert"], "query", dim=None)
    with pytest.raises(ScalingNoteError, match="another teacher"):
        build_teacher_cache(other, ids, texts, tmp_path / "c", show_progress=False)


def test_student_of_a_tiny_teacher_reaches_near_zero_loss(stage1, tmp_path):
    """Eq. 15 is minimised (= -λ) when the student reproduces the teacher: on a small query set the
    student gets there — squared error near 0 and cosine near 1 against the teacher embeddings."""
    from scalingnote.data import load_beir
    from scalingnote.training.evaluate import heldout_queries

    ds = load_beir(stage1["data"], "train")
    held, _ = heldout_queries(stage1["stage1"])  # the teacher's validation queries never reach QKD
    texts = [ds.queries[q].text for q in sorted(ds.qrels) if q not in held][:16]
    qfile = tmp_path / "queries.jsonl"
    qfile.write_text("".join(json.dumps({"_id": f"x{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    out = tmp_path / "fit"
    cfg = _dcfg(
        stage1,
        out,
        queries=[{"path": str(qfile)}],
        optim={"batch_size": 8, "epochs": 300.0, "lr": 3e-3},
        validation_fraction=0.0,
        eval_data=None,
        save_every=10_000,
        head_init="orthogonal",
    )
    distill(cfg)
    teacher = load_tower(stage1["stage1"] / "query_tower")
    student = load_tower(out / "query_tower")
    t = torch.from_numpy(teacher.encode_queries(texts, normalize=False, show_progress=False))
    s = torch.from_numpy(student.encode_queries(texts, normalize=False, show_progress=False))
    rel_err = float(((t - s) ** 2).sum(1).mean() / (t**2).sum(1).mean())
    cos = float(torch.nn.functional.cosine_similarity(t, s).mean())
    assert rel_err < 0.02 and cos > 0.99, (rel_err, cos)


def test_lstsq_head_init_recovers_a_linear_teacher(stage1):
    from scalingnote.data import load_beir
    from scalingnote.training.heads import init_student_head

    ds = load_beir(stage1["data"], "train")
    texts = [q.text for q in ds.queries.values()]
    student = load_tower(stage1["bert"], "query", dim=16, max_query_length=16, device="cpu")
    with torch.no_grad():
        h = student.pooled(student.tokenize_queries(texts)).double()
    a = torch.randn(16, h.shape[1], generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    targets = ((h - h.mean(0)) @ a.T).float().numpy()  # a teacher that is a linear map of the student's states
    rel = init_student_head(student, texts, targets, batch_size=8, ridge=1e-6)
    assert rel < 1e-3 and student.config.projection_init == "lstsq"
    got = student.encode_queries(texts, normalize=False, show_progress=False)
    assert float(((got - targets) ** 2).sum() / (targets**2).sum()) < 1e-3


def test_distill_normalized_target_early_stopping_and_cached_teacher(stage1, tmp_path):
    """QKD reads a head-only teacher's pooled states from the feature cache (same embeddings as a
    forward pass), regresses normalised targets, validates every epoch and keeps the best student."""
    from scalingnote.distill.cache import open_teacher_cache

    plain = distill(_dcfg(stage1, tmp_path / "plain", target="normalized"))
    cached = distill(
        _dcfg(stage1, tmp_path / "cached", target="normalized", patience=2, feature_cache_dir=str(tmp_path / "fc"))
    )
    a = np.asarray(open_teacher_cache(tmp_path / "plain" / "teacher_cache").emb)
    b = np.asarray(open_teacher_cache(tmp_path / "cached" / "teacher_cache").emb)
    np.testing.assert_allclose(a, b, atol=1e-5)
    assert list((tmp_path / "fc").glob("query-d2-pooled-*/part-*.npy"))  # the teacher's features were cached
    assert plain["target"] == "normalized" and not plain["stopped_early"]
    curve = cached["val_curve"]
    assert curve[0][0] == 0 and len(curve) >= 2  # the initial student is validated too
    best = min(v for _, v in curve)
    assert cached["best_step"] == [s for s, v in curve if v == best][0]
    # the saved student is the best one: its validation loss is the best of the curve
    assert abs(cached["qkd_val_loss"] - best) < 1e-4


def test_student_with_cached_prefix_trains_top_layers_only(stage1, tmp_path):
    res = distill(
        _dcfg(stage1, tmp_path / "k1", student={"model": stage1["bert"], "max_length": 16, "trainable_layers": 1})
    )
    assert res["student_trainable_layers"] == 1
    base = load_tower(stage1["bert"], "query")
    got = load_tower(tmp_path / "k1" / "query_tower")
    moved = {
        n
        for (n, p), (_, p0) in zip(got.backbone.named_parameters(), base.backbone.named_parameters(), strict=True)
        if not torch.equal(p, p0)
    }
    assert moved and all("layer.1." in n for n in moved), moved


def test_student_dropout_is_the_base_models_unless_set(stage1, tmp_path):
    from scalingnote.distill.student import _load_student

    texts = ["alpha beta gamma", "delta epsilon", "zeta eta theta iota"]
    outs = {}
    for p in (None, 0.0):
        torch.manual_seed(0)
        st = _load_student(_dcfg(stage1, tmp_path / "d", student_dropout=p), 32, None)
        st.train()
        enc = st.tokenize_queries(texts)
        outs[p] = (st(enc), st(enc))
    assert not torch.equal(*outs[None])  # the tiny BERT's own dropout (0.1) is on in train mode
    assert torch.equal(*outs[0.0])
    with pytest.raises(ValueError, match="student_dropout"):
        _dcfg(stage1, tmp_path / "d", student_dropout=1.0)


def test_the_student_starts_from_the_layers_that_validate_best(stage1, tmp_path):
    """``student_layer_candidates``: each start (its layers + the fitted head) is scored with the QKD
    validation loss before any step; the lowest trains, and the saved student records its layers."""
    from scalingnote.distill.data import prepare_data
    from scalingnote.distill.objective import qkd_validation_loss
    from scalingnote.distill.student import _student_start

    cfg = _dcfg(
        stage1,
        tmp_path / "choose",
        student={"model": stage1["bert"], "num_layers": 1, "max_length": 16},
        student_layer_candidates=[[0], [1]],
        optim={"batch_size": 8, "epochs": 1.0, "lr": 3e-3},
    )
    res = distill(cfg)
    choice = res["student_layer_choice"]
    assert [t["layers"] for t in choice["tried"]] == [[0], [1]]
    # each figure is the start's validation loss, computed again here from scratch
    data = prepare_data(cfg)
    dev = torch.device("cpu")
    again = {}
    for layers in ([0], [1]):
        st, prefix = _student_start(cfg, data, dev, layers, scoring=True)
        again[layers[0]] = qkd_validation_loss(cfg, st, prefix, data, dev, False)
    assert [t["val_loss"] for t in choice["tried"]] == pytest.approx([again[0], again[1]], abs=1e-5)
    assert again[0] != pytest.approx(again[1])  # two different starts
    want = [0] if again[0] <= again[1] else [1]
    assert choice["layers"] == want and "validation" in choice["reason"]
    saved = load_tower(tmp_path / "choose" / "query_tower")
    assert saved.config.num_layers == 1 and res["student_base_layers"] == saved.config.base_layers == (
        None if want == [0] else want
    )
    with pytest.raises(ValueError, match="student_layer_candidates"):
        _dcfg(stage1, tmp_path / "bad", student_layer_candidates=[[0], [0, 1]])


def test_lstsq_head_init_through_the_prefix_keeps_each_text_with_its_target(stage1, tmp_path):
    """The cached-prefix head fit runs length-sorted batches: its states must come back in the
    targets' order, so it fits the same head as a plain forward pass in the given order."""
    from scalingnote.data import load_beir
    from scalingnote.models.prefix import PrefixTower
    from scalingnote.training.heads import init_student_head

    ds = load_beir(stage1["data"], "train")
    texts = sorted(
        {q.text for q in ds.queries.values()}, key=lambda t: (-len(t), t)
    )  # longest first: sorting must reorder
    texts = texts[1::2] + texts[0::2]
    assert len({len(t) for t in texts}) > 3
    plain = load_tower(stage1["bert"], "query", dim=16, max_query_length=16, device="cpu").eval()
    with torch.no_grad():
        h = plain.pooled(plain.tokenize_queries(texts)).double()
    a = torch.randn(16, h.shape[1], generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    targets = ((h - h.mean(0)) @ a.T).float().numpy()
    cached = load_tower(stage1["bert"], "query", dim=16, max_query_length=16, device="cpu").eval()
    prefix = PrefixTower(cached, 0, tmp_path / "fc", show_progress=False)
    rel = init_student_head(cached, texts, targets, batch_size=3, ridge=1e-6, prefix=prefix)
    assert rel < 1e-3
    got = prefix.queries(texts).detach().numpy()
    assert float(((got - targets) ** 2).sum() / (targets**2).sum()) < 1e-3


def test_a_spent_deadline_ends_qkd_at_its_floor_with_the_plan_recorded(stage1, tmp_path):
    import time

    res = distill(_dcfg(stage1, tmp_path / "boxed"), deadline=time.monotonic(), min_steps=12)
    assert res["planned_steps"] > 12 and res["steps"] == res["steps_run"] == 12
    log = [json.loads(x) for x in (tmp_path / "boxed" / "metrics.jsonl").read_text().splitlines()]
    assert log[-1]["step"] == 12 and log[-1]["lr"] == pytest.approx(0.0)  # the schedule ended at the new end
