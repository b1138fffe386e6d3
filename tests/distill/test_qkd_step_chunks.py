"""A QKD step in length-sorted chunks (``step_chunk``): each query once, the chunks sorted by length
and padded to their own longest, and the step the same as one forward over the whole batch."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from scalingnote.distill import distill
from scalingnote.distill import trainer as qkd_trainer
from scalingnote.distill.batches import (
    CHUNK_OVERHEAD_TOKENS,
    cheapest_chunks,
    chunk_padded,
    length_chunks,
    padded_tokens,
)
from scalingnote.distill.trainer import qkd_inputs, step_chunk
from scalingnote.errors import ConfigError
from scalingnote.models import load_tower
from tests.distill.test_qkd import _dcfg
from tests.distill.test_qkd_bucketing import _varied_queries


@pytest.mark.parametrize("n, chunk", [(128, 32), (100, 32), (7, 3), (5, 5), (5, 0)])
def test_chunks_hold_each_query_once_sorted_by_length(n, chunk):
    rng = np.random.default_rng(1)
    lengths = rng.integers(3, 65, size=400).astype(np.int32)
    idx = rng.choice(400, size=n, replace=False)
    parts = length_chunks(idx, lengths, chunk)
    assert sorted(np.concatenate(parts).tolist()) == sorted(idx.tolist())
    if chunk == 0 or n <= chunk:
        assert len(parts) == 1 and np.array_equal(parts[0], idx)
        return
    assert len(parts) == -(-n // chunk) and max(len(p) for p in parts) <= chunk
    flat = np.concatenate(parts)
    assert np.all(np.diff(lengths[flat]) >= 0)  # sorted by length across the chunks
    # the chunks pad less than the whole batch padded to its longest
    assert sum(len(p) * lengths[p].max() for p in parts) < padded_tokens(idx[None, :], lengths)


def _padded(parts: list[np.ndarray], lengths: np.ndarray) -> int:
    return int(sum(len(p) * lengths[p].max() for p in parts))


def test_auto_takes_the_count_whose_padding_and_passes_cost_least():
    lengths = np.array([10] * 120 + [64] * 8, dtype=np.int32)  # a few long texts among short ones
    idx = np.random.default_rng(0).permutation(128)
    parts = cheapest_chunks(idx, lengths)
    assert sorted(np.concatenate(parts).tolist()) == list(range(128))
    # whole: 128 x 64 = 8192 padded tokens; 2 chunks: 64 x 10 + 64 x 64 = 4736 (+ one pass); 4 chunks:
    # 3 x 32 x 10 + 32 x 64 = 3008 (+ three passes); 8 chunks: 7 x 16 x 10 + 16 x 64 = 2144 (+ seven passes)
    costs = {k: chunk_padded(sorted(lengths.tolist()), k) * 128 + CHUNK_OVERHEAD_TOKENS * (k - 1) for k in (1, 2, 4, 8)}
    assert costs[1] == 8192 and costs[2] == 4736 + CHUNK_OVERHEAD_TOKENS
    assert len(parts) == min(costs, key=costs.get)
    assert _padded(parts, lengths) < padded_tokens(idx[None, :], lengths)
    # texts of one length: no chunk pays for its pass, the batch stays whole and in its order
    same = np.full(128, 20, dtype=np.int32)
    whole = cheapest_chunks(idx, same)
    assert len(whole) == 1 and np.array_equal(whole[0], idx)
    # a chunk's pass is priced: a free pass would cut the mixed batch as fine as it may
    assert len(cheapest_chunks(idx, lengths, overhead=0)) == 8


def _run(stage1, out, tmp_path, chunk, seen=None, monkeypatch=None):
    if seen is not None:
        orig = qkd_trainer.QKDLoop.batch_loss

        def batch_loss(self, idx):
            seen.append((np.asarray(idx).copy(), self.data.lengths))
            return orig(self, idx)

        monkeypatch.setattr(qkd_trainer.QKDLoop, "batch_loss", batch_loss)
    cfg = _dcfg(
        stage1,
        out,
        queries=_varied_queries(stage1, tmp_path / "varied.jsonl"),
        step_chunk=chunk,
        student_dropout=0.0,  # a chunk draws its own dropout masks: without dropout the steps are equal
        rank_weight=1.0,  # the listwise term too is a mean over queries
        optim={"batch_size": 8, "epochs": 2.0, "lr": 3e-3},
    )
    return cfg, distill(cfg)


def test_a_chunked_step_is_the_whole_batchs_step(stage1, tmp_path, monkeypatch):
    _, whole = _run(stage1, tmp_path / "whole", tmp_path, 0)
    seen: list = []
    cfg, chunked = _run(stage1, tmp_path / "chunked", tmp_path, 3, seen, monkeypatch)
    # every step ran as chunks of at most 3 length-sorted queries (8 = 3 + 3 + 2)
    train = [(i, lens) for i, lens in seen if len(i) <= 3]
    assert len(train) == 3 * chunked["steps_run"]
    for i, lens in train:
        assert np.all(np.diff(lens[i]) >= 0)
    a = load_tower(tmp_path / "whole" / "query_tower").state_dict()
    b = load_tower(tmp_path / "chunked" / "query_tower").state_dict()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)
    logs = [
        [json.loads(x)["loss"] for x in (tmp_path / d / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
        for d in ("whole", "chunked")
    ]
    assert logs[0] == pytest.approx(logs[1], rel=1e-4, abs=1e-5)  # the logged loss is the batch mean
    assert chunked["qkd_val_loss"] == pytest.approx(whole["qkd_val_loss"], rel=1e-4, abs=1e-5)
    assert "step_chunk" not in qkd_inputs(cfg)  # speed only: a resumed run is not refused over it


def test_step_chunk_resolves_by_device_and_names_a_bad_value(stage1, tmp_path):
    cfg = _dcfg(stage1, tmp_path / "q")
    assert cfg.step_chunk is None  # auto
    assert step_chunk(cfg, torch.device("cpu")) == "auto"
    assert step_chunk(cfg, torch.device("cuda")) == 0
    assert step_chunk(_dcfg(stage1, tmp_path / "q", step_chunk=0), torch.device("cpu")) == 0
    assert step_chunk(_dcfg(stage1, tmp_path / "q", step_chunk=32), torch.device("cuda")) == 32
    for bad in (-1, True, "some"):
        with pytest.raises(ConfigError, match="step_chunk"):
            _dcfg(stage1, tmp_path / "q", step_chunk=bad)
