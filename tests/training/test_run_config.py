"""A finished run's recorded config, read back where the run now is: a run moved or copied together
with its data (a quick start's output directory) reads the data at its new place; a path that is still
there, or that the move did not carry, is left as recorded."""

from __future__ import annotations

import shutil
from dataclasses import asdict, replace

import yaml

from scalingnote.training.config import TrainConfig, load_run_config


def _write_run(root):
    (root / "data" / "triplets").mkdir(parents=True)
    (root / "data" / "triplets" / "train.jsonl").write_text("")
    cfg = TrainConfig()
    cfg = replace(
        cfg,
        output_dir=str(root / "stage1" / "run"),
        data=replace(cfg.data, data_dir=str(root / "data"), triplets=str(root / "data" / "triplets" / "train.jsonl")),
    )
    (root / "stage1" / "run").mkdir(parents=True)
    (root / "stage1" / "run" / "config.yaml").write_text(yaml.safe_dump(asdict(cfg)))
    return cfg


def test_a_moved_run_reads_its_data_at_its_new_place(tmp_path):
    cfg = _write_run(tmp_path / "a")
    assert load_run_config(tmp_path / "a" / "stage1" / "run") == cfg  # where it was made: as recorded
    shutil.move(tmp_path / "a", tmp_path / "b")
    moved = load_run_config(tmp_path / "b" / "stage1" / "run")
    assert moved.data.data_dir == str((tmp_path / "b" / "data").resolve())
    assert moved.data.triplets == str((tmp_path / "b" / "data" / "triplets" / "train.jsonl").resolve())
    assert moved.output_dir == str(tmp_path / "b" / "stage1" / "run")
    assert moved.data.validation_triplets is None  # none recorded: none made up


def test_data_left_behind_or_not_carried_keeps_its_recorded_path(tmp_path):
    cfg = _write_run(tmp_path / "a")
    shutil.copytree(tmp_path / "a" / "stage1", tmp_path / "b" / "stage1")  # the run without its data
    assert load_run_config(tmp_path / "b" / "stage1" / "run").data.data_dir == cfg.data.data_dir
    shutil.rmtree(tmp_path / "a")
    kept = load_run_config(tmp_path / "b" / "stage1" / "run")
    assert kept.data.data_dir == cfg.data.data_dir and kept.data.triplets == cfg.data.triplets
