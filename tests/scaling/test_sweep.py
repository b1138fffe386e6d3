"""Scaling sweep on tiny random towers: the grid runs, scores every point on one fixed
validation set, and resumes without retraining finished points."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from scalingnote.errors import ConfigError, ScalingNoteError
from scalingnote.scaling.sweep import SweepConfig, load_sweep_config, prepare, run_sweep
from scalingnote.scaling.table import read_table
from tests.helpers.tiny_data import tiny_inputs


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_inputs(tmp_path_factory.mktemp("tiny_sweep"), "bert")


def _cfg(tiny, out, **over) -> SweepConfig:
    base = {
        "output_dir": str(out),
        "layers": [1, 2],
        "data_sizes": [8, 16],
        "steps": 3,
        "train": {
            "method": "twinbert",
            "query_tower": {"model": tiny["bert"], "max_length": 16, "pooling": "mean"},
            "doc_tower": {"model": tiny["bert"], "max_length": 32, "pooling": "mean"},
            "dim": 32,
            "data": {"data_dir": tiny["data"], "negatives": "none"},
            "loss": {"dims": [16, 32]},
            "optim": {"batch_size": 4, "lr": 1e-3, "head_lr": 1e-2},
            "seed": 5,
            "save_every": 2,
        },
        "validation": {"fraction": 0.2, "num_negatives": 16, "doc_pool": None, "seed": 1},
        "show_progress": False,
    }
    for k, v in over.items():
        if isinstance(v, dict):
            base.setdefault(k, {}).update(v)
        else:
            base[k] = v
    return load_sweep_config(base)


def test_sweep_grid_and_resume(tiny, tmp_path):
    out = tmp_path / "sweep"
    # first only the 1-layer column of the grid ...
    res1 = run_sweep(_cfg(tiny, out, layers=[1]))
    assert [(r["layers"], r["D"]) for r in res1.rows] == [(1, 8), (1, 16)]
    first = {r["D"]: (out / "points" / f"L1_D{r['D']}" / "point.json").stat().st_mtime_ns for r in res1.rows}
    # ... then the full 2x2 grid: the finished points are skipped, not retrained
    seen = []
    res = run_sweep(_cfg(tiny, out), on_point=seen.append)
    assert [(r["layers"], r["D"]) for r in res.rows] == [(1, 8), (1, 16), (2, 8), (2, 16)]
    for D, mtime in first.items():
        assert (out / "points" / f"L1_D{D}" / "point.json").stat().st_mtime_ns == mtime
    assert [r["loss"] for r in res.rows[:2]] == [r["loss"] for r in res1.rows]
    assert len(seen) == 4

    # one fixed validation set for all points
    assert len({r["validation_hash"] for r in res.rows}) == 1
    assert res.validation["num_negatives"] == 16 and res.validation["pairs"] >= 5

    # N grows with the layers; D is what was trained on; loss is a positive finite NLL
    rows = read_table(res.table, required=("N", "D", "loss"))
    header = res.table.read_text().splitlines()[0].split(",")
    assert header[:3] == ["N", "D", "loss"] and "layers" in header and "seconds" in header
    by = {(int(r["layers"]), int(r["D"])): r for r in rows}
    assert by[(2, 8)]["N"] > by[(1, 8)]["N"] and by[(1, 8)]["N"] == by[(1, 16)]["N"]
    for r in res.rows:
        assert r["train_examples"] == r["D"] and r["steps"] == 3
        assert 0 < r["loss"] < 10 and np.isfinite(r["loss"])
    # nested data subsets: D=8 is the prefix of D=16
    d8 = (out / "data" / "train_D8.jsonl").read_text().splitlines()
    d16 = (out / "data" / "train_D16.jsonl").read_text().splitlines()
    assert d16[:8] == d8
    # no validation query is trained on
    val = np.load(out / "validation" / "contrastive_set.npz")
    train_q = {json.loads(x)["query_id"] for x in (out / "data" / "train_pool.jsonl").read_text().splitlines()}
    assert not set(val["query_ids"].tolist()) & train_q
    # the run directory records config + versions
    meta = json.loads((out / "run.json").read_text())
    assert "versions" in meta and len(meta["metrics"]["rows"]) == 4


def test_resume_refuses_changed_training_config(tiny, tmp_path, monkeypatch):
    import yaml
    from typer.testing import CliRunner

    from scalingnote.cli import app
    from scalingnote.config import config_to_dict

    out = tmp_path / "sweep"
    cfgfile = tmp_path / "sweep.yaml"
    cfgfile.write_text(yaml.safe_dump(config_to_dict(_cfg(tiny, out, layers=[1], data_sizes=[8]))))
    res = CliRunner().invoke(
        app, ["scaling", "sweep", "--config", str(cfgfile), "--set", "steps=3"], catch_exceptions=False
    )
    assert res.exit_code == 0, res.output
    assert "1 grid points" in res.output and (out / "results.csv").exists()
    # the same data directory spelled differently is the same configuration: skipped
    point = out / "points" / "L1_D8" / "run.json"
    mtime = point.stat().st_mtime_ns
    monkeypatch.chdir(Path(tiny["data"]).parent)
    run_sweep(
        _cfg(
            tiny,
            out,
            layers=[1],
            data_sizes=[8],
            train={"data": {"data_dir": Path(tiny["data"]).name, "negatives": "none"}},
        )
    )
    assert point.stat().st_mtime_ns == mtime
    with pytest.raises(ScalingNoteError, match="optim.lr"):
        run_sweep(
            _cfg(tiny, out, layers=[1], data_sizes=[8], train={"optim": {"batch_size": 4, "lr": 5e-4, "head_lr": 1e-2}})
        )


def test_validation_set_is_deterministic_and_rescored(tiny, tmp_path):
    out = tmp_path / "sweep"
    cfg = _cfg(tiny, out, layers=[1], data_sizes=[8])
    _, v1 = prepare(cfg)
    _, v2 = prepare(cfg)
    assert v1.info["hash"] == v2.info["hash"]
    res = run_sweep(cfg)
    # fewer negatives: a new validation set over the same training pool -> re-scored, not retrained
    run_json = (out / "points" / "L1_D8" / "run.json").stat().st_mtime_ns
    res2 = run_sweep(_cfg(tiny, out, layers=[1], data_sizes=[8], validation={"num_negatives": 12}))
    assert res2.validation["hash"] != res.validation["hash"]
    assert res2.rows[0]["validation_hash"] == res2.validation["hash"]
    assert res2.rows[0]["loss"] != res.rows[0]["loss"]
    assert (out / "points" / "L1_D8" / "run.json").stat().st_mtime_ns == run_json
    # another hold-out seed changes the training pairs: refused
    with pytest.raises(ScalingNoteError, match="different training pairs"):
        run_sweep(_cfg(tiny, out, layers=[1], data_sizes=[8], validation={"seed": 2}))


def test_config_errors(tiny, tmp_path):
    with pytest.raises(ConfigError, match="data_sizes|batch_size"):
        _cfg(tiny, tmp_path, data_sizes=[2, 16])
    with pytest.raises(ConfigError, match="data_sizes"):
        run_sweep(_cfg(tiny, tmp_path / "big", data_sizes=[8, 10_000]))
    with pytest.raises(ConfigError, match="num_negatives"):
        run_sweep(_cfg(tiny, tmp_path / "w", validation={"num_negatives": 500}))


@pytest.mark.shared_data
def test_scifact_sweep_config_and_fixed_validation(shared_data, tmp_path):
    """The benchmark config is valid; its validation set is held-out SciFact train queries,
    identical whatever the grid, and disjoint from every training pair."""
    from pathlib import Path

    cfgfile = Path(__file__).resolve().parents[2] / "configs" / "scaling_sweep_scifact.yaml"
    cfg = load_sweep_config(
        cfgfile, output_dir=str(tmp_path), train__data__data_dir=str(shared_data / "scifact"), show_progress=False
    )
    pool, val = prepare(cfg)
    other = load_sweep_config(
        cfgfile,
        output_dir=str(tmp_path),
        train__data__data_dir=str(shared_data / "scifact"),
        data_sizes=[16, 32],
        layers=[1],
        show_progress=False,
    )
    pool2, val2 = prepare(other)
    assert val.info["hash"] == val2.info["hash"] and [e.query_id for e in pool] == [e.query_id for e in pool2]
    assert val.info["num_negatives"] == 256 and val.info["queries"] >= 70
    assert not {e.query_id for e in pool} & set(val.cset.query_ids)
    assert len(pool) >= max(cfg.data_sizes)
