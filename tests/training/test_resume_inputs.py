"""Stage I resume only from checkpoints made from the same inputs: a killed run
resumed with other data or another setting is refused naming what changed, or redone from
scratch (bit-identical to a fresh run on the new inputs); settings that do not change the
result (progress bars, checkpoint period) still resume."""

from __future__ import annotations

import json

import pytest
import torch

from scalingnote.training import StopTraining, train
from scalingnote.utils.steps import StepChangedError
from tests.helpers.tiny_data import write_tiny_beir
from tests.training.test_trainer import _cfg, _weights


def _kill_at(n):
    def kill(step):
        if step == n:
            raise StopTraining

    return kill


def _killed_run(tiny, out, **over):
    with pytest.raises(StopTraining):
        train(_cfg(tiny, out, "twinbert", **over), on_step=_kill_at(4))
    assert (out / "checkpoints" / "step-00000004").is_dir()


@pytest.fixture(scope="module")
def other_data(tmp_path_factory):
    return str(write_tiny_beir(tmp_path_factory.mktemp("other") / "beir", seed=1))


def test_other_data_is_refused_then_redone_from_scratch(tiny, other_data, tmp_path):
    out = tmp_path / "run"
    _killed_run(tiny, out)
    config_before = (out / "config.yaml").read_text()
    other = {**tiny, "data": other_data}
    with pytest.raises(StepChangedError) as e:
        train(_cfg(other, out, "twinbert"), resume=True)
    assert e.value.keys == ["data.data_dir"] and tiny["data"] in str(e.value) and other_data in str(e.value)
    assert (out / "config.yaml").read_text() == config_before  # refused before anything was overwritten
    assert (out / "checkpoints" / "step-00000004").is_dir()

    res = train(_cfg(other, out, "twinbert"), resume=True, on_change="redo")
    fresh = tmp_path / "fresh"
    train(_cfg(other, fresh, "twinbert"))
    a, b = _weights(fresh), _weights(out)
    assert a.keys() == b.keys() and a
    for k in a:  # nothing of the old run leaked into the redone one
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == list(range(1, res["total_steps"] + 1))
    done = json.loads((out / "checkpoints" / "DONE").read_text())
    assert done["inputs"]["data"]["data_dir"]["$path"] == other_data


def test_edited_corpus_and_changed_setting_are_refused(tiny, tmp_path):
    data = tmp_path / "beir"
    write_tiny_beir(data)
    mine = {**tiny, "data": str(data)}
    out = tmp_path / "run"
    _killed_run(mine, out)
    with pytest.raises(StepChangedError, match=r"optim\.lr: 0\.001 -> 0\.002"):
        train(_cfg(mine, out, "twinbert", optim={"lr": 2e-3}))
    with open(data / "corpus.jsonl", "a", encoding="utf-8") as fh:  # same directory, other documents
        fh.write(json.dumps({"_id": "extra", "title": "new", "text": "a document added later"}) + "\n")
    with pytest.raises(StepChangedError, match="its content changed"):
        train(_cfg(mine, out, "twinbert"))


def test_same_inputs_resume_and_cosmetic_settings_do_not_count(tiny, tmp_path):
    out = tmp_path / "run"
    _killed_run(tiny, out)
    steps: list[int] = []
    res = train(_cfg(tiny, out, "twinbert", save_every=3, show_progress=False, log_every=2), on_step=steps.append)
    assert steps == list(range(5, res["total_steps"] + 1))  # resumed after step 4
    assert (out / "checkpoints" / "DONE").exists()
    # a finished run with the same inputs resumes from its last checkpoint
    from scalingnote.training.checkpoint import list_checkpoints

    last = list_checkpoints(out)[-1]
    again: list[int] = []
    train(_cfg(tiny, out, "twinbert"), on_step=again.append)
    assert last > 4 and again == list(range(last + 1, res["total_steps"] + 1))


def test_no_resume_starts_over_over_other_inputs(tiny, other_data, tmp_path):
    out = tmp_path / "run"
    _killed_run(tiny, out)
    train(_cfg({**tiny, "data": other_data}, out, "twinbert"), resume=False)
    assert json.loads((out / "checkpoints" / "DONE").read_text())["inputs"]["data"]["data_dir"]["$path"] == other_data
