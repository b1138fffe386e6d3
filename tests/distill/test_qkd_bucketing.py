"""QKD's length-bucketed batches: the same texts per epoch, each once, in batches that pad less,
a pure function of (seed, epoch, step) (a killed run resumes to the same weights), token
lengths counted once per run, and the quick start's setting passed through."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from scalingnote.distill import distill
from scalingnote.distill import trainer as qkd_trainer
from scalingnote.distill.batches import bucketed_batches, epoch_order, padded_tokens
from scalingnote.errors import ConfigError
from scalingnote.models import load_tower
from scalingnote.training import StopTraining
from tests.distill.test_qkd import _dcfg


def _lengths(n: int, seed: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).integers(3, 33, size=n).astype(np.int32)


@pytest.mark.parametrize("n_train, bs, window", [(96, 8, 4), (101, 8, 3), (64, 16, 8)])
def test_an_epoch_holds_the_unbucketed_epochs_texts_each_once(n_train, bs, window):
    train_idx = np.sort(np.random.default_rng(0).choice(200, size=n_train, replace=False))
    lengths = _lengths(200)
    spe = n_train // bs
    for epoch in range(3):
        b = bucketed_batches(train_idx, lengths, bs, spe, seed=7, epoch=epoch, window=window)
        plain = epoch_order(train_idx, 7, epoch)[: spe * bs]
        assert b.shape == (spe, bs)
        assert sorted(b.ravel().tolist()) == sorted(plain.tolist())  # the same texts, none twice
        if n_train % bs == 0:
            assert sorted(b.ravel().tolist()) == train_idx.tolist()  # every training text once per epoch
        # each batch comes from one window of the permutation, and pads no more than its unbucketed slices
        where = {int(r): i // (window * bs) for i, r in enumerate(plain)}
        assert all(len({where[int(r)] for r in batch}) == 1 for batch in b)
        assert padded_tokens(b, lengths) < padded_tokens(plain.reshape(spe, bs), lengths)


def test_bucketed_batches_are_a_pure_function_of_seed_and_epoch():
    train_idx, lengths = np.arange(120), _lengths(120)
    a = bucketed_batches(train_idx, lengths, 8, 15, seed=1, epoch=2, window=4)
    assert np.array_equal(a, bucketed_batches(train_idx, lengths, 8, 15, seed=1, epoch=2, window=4))
    assert not np.array_equal(a, bucketed_batches(train_idx, lengths, 8, 15, seed=1, epoch=3, window=4))
    assert not np.array_equal(a, bucketed_batches(train_idx, lengths, 8, 15, seed=2, epoch=2, window=4))
    # the batches' order is shuffled: long and short batches interleave instead of running in window order
    maxes = [int(lengths[x].max()) for x in a]
    assert maxes != sorted(maxes)


def _varied_queries(stage1, path):
    """The tiny set's queries, each repeated 1 to 4 times: texts of several token lengths."""
    import json

    src = [json.loads(x) for x in (Path(stage1["data"]) / "queries.jsonl").read_text().splitlines()]
    rows = [{"_id": f"v{i}", "text": " ".join([q["text"]] * (1 + i % 4))} for i, q in enumerate(src)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return [{"path": stage1["data"], "split": "train"}, {"path": str(path)}]


def test_the_loop_trains_on_bucketed_batches_and_counts_lengths_once(stage1, tmp_path, monkeypatch):
    seen: list[np.ndarray] = []
    loop: dict = {}
    calls = {"lengths": 0}
    orig_loss, orig_lengths = qkd_trainer.QKDLoop.batch_loss, qkd_trainer.token_lengths

    def batch_loss(self, idx):
        seen.append(np.asarray(idx).copy())
        loop.update(train_idx=self.train_idx, lengths=self.data.lengths, texts=self.data.texts)
        return orig_loss(self, idx)

    def token_lengths(student, texts):
        calls["lengths"] += 1
        return orig_lengths(student, texts)

    monkeypatch.setattr(qkd_trainer.QKDLoop, "batch_loss", batch_loss)
    monkeypatch.setattr(qkd_trainer, "token_lengths", token_lengths)
    bs, window = 4, 2
    cfg = _dcfg(
        stage1,
        tmp_path / "qkd",
        queries=_varied_queries(stage1, tmp_path / "varied.jsonl"),
        length_buckets=window,
        optim={"batch_size": bs, "epochs": 2.0, "lr": 3e-3},
    )
    res = distill(cfg)
    assert calls["lengths"] == 1 and res["length_buckets"] == window
    train_idx, lengths = loop["train_idx"], loop["lengths"]
    # the student's own token counts ([CLS] text [SEP], truncated to its max_length)
    student = load_tower(tmp_path / "qkd" / "query_tower")
    assert lengths.tolist() == [len(x) for x in student.query_ids(loop["texts"])]
    assert len(set(lengths.tolist())) > 1  # the texts differ in length: there is something to bucket
    spe = len(train_idx) // bs
    assert len(seen) == res["steps_run"] == 2 * spe
    for epoch in range(2):
        got = np.stack(seen[epoch * spe : (epoch + 1) * spe])
        want = bucketed_batches(train_idx, lengths, bs, spe, cfg.seed, epoch, window)
        assert np.array_equal(got, want)
        plain = epoch_order(train_idx, cfg.seed, epoch)[: spe * bs]
        assert sorted(got.ravel().tolist()) == sorted(plain.tolist())  # the same texts, each once
        assert padded_tokens(got, lengths) <= padded_tokens(plain.reshape(spe, bs), lengths)


def test_a_killed_bucketed_run_resumes_to_the_same_weights(stage1, tmp_path):
    over = {
        "queries": _varied_queries(stage1, tmp_path / "varied.jsonl"),
        "length_buckets": 2,
        "optim": {"batch_size": 4, "epochs": 2.0, "lr": 3e-3},
    }
    full = tmp_path / "full"
    distill(_dcfg(stage1, full, **over))

    def kill(step):
        if step == 5:
            raise StopTraining

    killed = tmp_path / "killed"
    with pytest.raises(StopTraining):
        distill(_dcfg(stage1, killed, **over), on_step=kill)
    distill(_dcfg(stage1, killed, **over))
    a, b = load_tower(full / "query_tower").state_dict(), load_tower(killed / "query_tower").state_dict()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)


def test_a_bad_window_names_its_field(stage1, tmp_path):
    for bad in (1, -2):
        with pytest.raises(ConfigError, match="length_buckets"):
            _dcfg(stage1, tmp_path / "q", length_buckets=bad)


def quick_start_qkd_config(stage1, tmp_path, monkeypatch, **qs_kw):
    """The DistillConfig the quick start's QKD run builds from ``QuickstartConfig(**qs_kw)`` (a BERT
    student; training stopped before its first step)."""
    from scalingnote.quickstart import QuickstartConfig, qkd_runs
    from scalingnote.quickstart.config import Family

    got = {}

    def fake_distill(dc, **kw):
        got["cfg"] = dc
        raise StopTraining

    monkeypatch.setattr(qkd_runs, "distill", fake_distill)
    qs = QuickstartConfig(out=str(tmp_path / "qs"), show_progress=False, **qs_kw)
    fam = Family("bert", stage1["bert"], (None,), 2, "mean", 1e-4)
    data = {"beir": stage1["data"], "fingerprint": {}}
    with pytest.raises(StopTraining):
        qkd_runs.run_qkd(qs, "s", stage1["stage1"], fam, 2, data, tmp_path, [], rank_weight=0.0)
    return got["cfg"]


def test_the_quick_start_passes_its_window_to_qkd(stage1, tmp_path, monkeypatch):
    from scalingnote.quickstart import QuickstartConfig

    for window in (0, 8):
        assert quick_start_qkd_config(stage1, tmp_path, monkeypatch, qkd_length_buckets=window).length_buckets == window
    assert QuickstartConfig().qkd_length_buckets == 0
    with pytest.raises(ConfigError, match="qkd_length_buckets"):
        QuickstartConfig(qkd_length_buckets=1)
