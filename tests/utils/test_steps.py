"""Step digests: a finished step is reused only when its inputs are the same."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from scalingnote.errors import ScalingNoteError
from scalingnote.utils import steps
from scalingnote.utils.steps import StepChangedError, changed_keys, check_step, input_digest, mark_step, step_state


@dataclass
class _Opt:
    lr: float = 1e-3
    dims: tuple[int, ...] = (16, 32)


@dataclass
class _Cfg:
    seed: int = 0
    optim: _Opt = field(default_factory=_Opt)


def _beir(root: Path, text: str = "hello") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "corpus.jsonl").write_text(json.dumps({"_id": "d1", "text": text}) + "\n")
    (root / "qrels").mkdir(exist_ok=True)
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    return root


def test_digest_is_canonical_and_sees_every_value():
    a = {"b": 1, "a": [1, 2], "c": {"y": None, "x": 1.5}}
    b = {"c": {"x": 1.5, "y": None}, "a": (1, 2), "b": 1}  # other key order, a tuple for the list
    assert input_digest(a) == input_digest(b)
    assert len(input_digest(a)) == 64
    for other in (
        {**a, "b": 2},
        {**a, "a": [2, 1]},
        {**a, "c": {"y": None, "x": 1.25}},
        {**a, "d": 0},
        {"b": 1, "a": [1, 2]},
    ):
        assert input_digest(other) != input_digest(a), other
    assert input_digest({"cfg": _Cfg()}) == input_digest({"cfg": {"seed": 0, "optim": {"lr": 1e-3, "dims": [16, 32]}}})
    assert input_digest({"x": {3, 1, 2}}) == input_digest({"x": {2, 3, 1}})
    assert input_digest({"x": float("nan")}) == input_digest({"x": float("nan")})
    with pytest.raises(ScalingNoteError, match="cannot record a object"):
        input_digest({"x": object()})


def test_paths_are_fingerprinted_strings_are_not(tmp_path):
    d = _beir(tmp_path / "beir")
    before = input_digest({"data": d})
    as_text = input_digest({"data": str(d)})
    assert before == input_digest({"data": tmp_path / "beir" / ".." / "beir"})  # resolved
    (d / "corpus.jsonl").write_text(json.dumps({"_id": "d1", "text": "other"}) + "\n")  # same name, other content
    assert input_digest({"data": d}) != before
    assert input_digest({"data": str(d)}) == as_text  # a str is only a name
    # small files by content: rewriting the same bytes (new mtime) is not a change
    now = input_digest({"data": d})
    os.utime(d / "corpus.jsonl", ns=(1, 1))
    assert input_digest({"data": d}) == now
    # hidden files and step markers inside an input directory do not count
    (d / ".lock").write_text("x")
    (d / "DONE").write_text("{}")
    assert input_digest({"data": d}) == now
    (d / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n")
    assert input_digest({"data": d}) != now
    fp = steps.fingerprint(tmp_path / "nowhere")
    assert fp["kind"] == "missing"


def test_large_files_by_size_and_mtime(tmp_path, monkeypatch):
    monkeypatch.setattr(steps, "SMALL_FILE", 10)
    f = tmp_path / "big.bin"
    f.write_bytes(b"x" * 100)
    fp = steps.fingerprint(f)
    assert fp["kind"] == "file" and fp["size"] == 100 and "mtime_ns" in fp and "sha256" not in fp
    os.utime(f, ns=(10**18, 10**18))
    assert steps.fingerprint(f) != fp


def test_content_fingerprint_reads_every_byte(tmp_path, monkeypatch):
    # a copy that does not keep the times is the same content; one changed byte is not
    monkeypatch.setattr(steps, "SMALL_FILE", 10)
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    (a / "corpus.jsonl").write_bytes(b"x" * 100)
    b.mkdir()
    (b / "corpus.jsonl").write_bytes(b"x" * 100)
    os.utime(b / "corpus.jsonl", ns=(10**18, 10**18))
    assert steps.content_fingerprint(a) == steps.content_fingerprint(b)
    assert steps.content_fingerprint(a / "corpus.jsonl") == steps.content_fingerprint(b / "corpus.jsonl")
    (b / "corpus.jsonl").write_bytes(b"x" * 99 + b"y")
    assert steps.content_fingerprint(a) != steps.content_fingerprint(b)


def test_step_states_and_reuse(tmp_path):
    d = tmp_path / "step"
    inputs = {"data": _beir(tmp_path / "beir"), "cfg": _Cfg()}
    assert step_state(d, inputs) == "missing"
    assert check_step(d, inputs) is False  # not done: the inputs are recorded for the work that starts
    (d / "partial.bin").write_text("half")
    assert step_state(d, inputs) == "partial"
    mark_step(d, inputs, {"ndcg@10": 0.5})
    done = json.loads((d / "DONE").read_text())
    assert (
        done["digest"] == input_digest(inputs)
        and done["info"] == {"ndcg@10": 0.5}
        and done["inputs"]["cfg"]["seed"] == 0
    )
    assert step_state(d, inputs) == "done" and check_step(d, inputs) is True
    assert not list(d.glob(".*tmp"))  # atomic writes leave no temporary files


def test_older_work_without_a_record_is_partial(tmp_path):
    d = tmp_path / "step"
    d.mkdir()
    (d / "checkpoints").mkdir()
    assert step_state(d, {"a": 1}) == "partial"


def test_changed_inputs_are_redone_with_one_log_line(tmp_path, caplog):
    d = tmp_path / "step"
    data_a, data_b = _beir(tmp_path / "a"), _beir(tmp_path / "b", text="other corpus")
    mark_step(d, {"data": data_a, "cfg": _Cfg()})
    new = {"data": data_b, "cfg": _Cfg(optim=_Opt(lr=2e-3))}
    assert step_state(d, new) == "changed"
    assert changed_keys(d, new) == ["cfg.optim.lr", "data"]
    with caplog.at_level(logging.WARNING, logger="scalingnote.utils.steps"):
        assert check_step(d, new, on_change="redo") is False
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 1 and "cfg.optim.lr: 0.001 -> 0.002" in msgs[0] and f"data: {data_a} -> {data_b}" in msgs[0]
    assert not (d / "DONE").exists()
    assert step_state(d, new) == "partial"  # the new inputs are recorded: a crash now resumes with them
    mark_step(d, new)
    assert check_step(d, new) is True


def test_same_path_other_content_is_a_change(tmp_path):
    d = tmp_path / "step"
    data = _beir(tmp_path / "beir")
    mark_step(d, {"data": data})
    (data / "corpus.jsonl").write_text(json.dumps({"_id": "d9", "text": "edited"}) + "\n")
    with pytest.raises(StepChangedError) as e:
        check_step(d, {"data": data}, on_change="refuse")
    assert e.value.keys == ["data"] and "its content changed" in str(e.value) and str(d) in str(e.value)
    assert (d / "DONE").exists()  # refusing leaves the step as it was


def test_refuse_names_the_keys_and_is_a_scalingnote_error(tmp_path):
    d = tmp_path / "step"
    mark_step(d, {"seed": 0, "steps": 10})
    with pytest.raises(ScalingNoteError, match=r"seed: 0 -> 1") as e:
        check_step(d, {"seed": 1, "steps": 10}, on_change="refuse")
    assert isinstance(e.value, StepChangedError) and e.value.keys == ["seed"]
    with pytest.raises(StepChangedError, match="new_key"):
        check_step(d, {"seed": 0, "steps": 10, "new_key": True}, on_change="refuse")
    with pytest.raises(ValueError):
        check_step(d, {"seed": 0}, on_change="ignore")


@pytest.mark.parametrize("content", ["{}", "not json", '{"factory": "IVF4"}'])
def test_a_marker_without_a_digest_is_never_trusted(tmp_path, content):
    d = tmp_path / "step"
    d.mkdir()
    (d / "DONE").write_text(content)  # written by an older version, or by hand
    assert step_state(d, {"a": 1}) == "changed"
    with pytest.raises(StepChangedError, match="records no inputs"):
        check_step(d, {"a": 1}, on_change="refuse")
    assert check_step(d, {"a": 1}) is False and not (d / "DONE").exists()


def test_a_started_step_with_other_inputs_is_changed(tmp_path):
    d = tmp_path / "step"
    assert check_step(d, {"data": "a"}) is False  # started, never finished
    assert step_state(d, {"data": "a"}) == "partial"
    assert step_state(d, {"data": "b"}) == "changed"
    with pytest.raises(StepChangedError, match="data: a -> b"):
        check_step(d, {"data": "b"}, on_change="refuse")


def test_a_setting_added_or_retired_at_an_empty_default_is_no_change(tmp_path):
    d = tmp_path / "step"
    mark_step(d, {"lr": 0.1, "deepspeed": None, "loss": {"dims": [8]}})  # recorded by an older version
    assert step_state(d, {"lr": 0.1, "loss": {"dims": [8], "name": None, "options": {}}}) == "done"
    assert changed_keys(d, {"lr": 0.1, "loss": {"dims": [8], "name": "infonce"}}) == ["loss.name"]
    assert changed_keys(d, {"lr": 0.1, "deepspeed": "zero3.json", "loss": {"dims": [8]}}) == ["deepspeed"]


@dataclass
class _CfgV2:  # _Cfg of a later version: one more setting, with a non-empty default
    seed: int = 0
    optim: _Opt = field(default_factory=_Opt)
    schedule: str = "linear"


def test_a_setting_added_later_at_its_default_does_not_redo_older_steps(tmp_path):
    from dataclasses import asdict

    from scalingnote.utils.steps import with_defaults

    d = tmp_path / "step"
    mark_step(
        d, with_defaults({"config": asdict(_Cfg(seed=3)), "data": "a"}, _Cfg(seed=3), "config.")
    )  # the older version
    new = _CfgV2(seed=3)
    assert step_state(d, with_defaults({"config": asdict(new), "data": "a"}, new, "config.")) == "done"
    other = _CfgV2(seed=3, schedule="cosine")  # the new setting away from its default is a change
    assert changed_keys(d, with_defaults({"config": asdict(other), "data": "a"}, other, "config.")) == [
        "config.schedule"
    ]
    # a record made before defaults were recorded at all matches too, and real changes still show
    mark_step(d, {"config": asdict(_Cfg(seed=3)), "data": "a"})
    assert step_state(d, with_defaults({"config": asdict(new), "data": "a"}, new, "config.")) == "done"
    moved = _CfgV2(seed=4, optim=_Opt(dims=(8,)))
    assert changed_keys(d, with_defaults({"config": asdict(moved), "data": "a"}, moved, "config.")) == [
        "config.optim.dims.0",
        "config.optim.dims.1",
        "config.seed",
    ]
    with pytest.raises(StepChangedError, match=r"config.seed: 3 -> 4"):
        check_step(d, with_defaults({"config": asdict(moved), "data": "a"}, moved, "config."), on_change="refuse")
