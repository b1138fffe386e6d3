from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import pytest

from scalingnote.config import load_config, save_config
from scalingnote.errors import ConfigError
from scalingnote.utils import atomic_write, run_metadata
from scalingnote.utils.io import read_json, write_jsonl


@dataclass
class Optim:
    lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.999)


@dataclass
class Cfg:
    name: str
    steps: int = 10
    mode: Literal["a", "b"] = "a"
    dims: list[int] = field(default_factory=lambda: [16, 32])
    optim: Optim = field(default_factory=Optim)
    out: str | None = None


def test_load_yaml_and_round_trip(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("name: x\nsteps: 3\noptim:\n  lr: 2e-5\n  betas: [0.8, 0.9]\n")
    cfg = load_config(Cfg, p, mode="b")
    assert cfg == Cfg("x", 3, "b", [16, 32], Optim(2e-5, (0.8, 0.9)))
    save_config(cfg, tmp_path / "resolved.yaml")
    assert load_config(Cfg, tmp_path / "resolved.yaml") == cfg


@pytest.mark.parametrize(
    "text, line, key, words",
    [
        ("name: x\nstesp: 3\n", 2, "stesp", "unknown key"),
        ("name: x\noptim:\n  lr: fast\n", 3, "optim.lr", "expected a number"),
        ("name: x\nmode: c\n", 2, "mode", "one of"),
        ("name: x\ndims: [1, two]\n", 2, "dims[1]", "integer"),
        ("steps: 3\n", None, "name", "missing required"),  # the missing key is named
        ("name: x\nsteps: 3: 4\n", 2, None, "invalid YAML"),
    ],
)
def test_config_errors(tmp_path, text, line, key, words):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_config(Cfg, p)
    assert words in str(exc.value) and str(p) in str(exc.value)
    if line is not None:
        assert exc.value.line == line
    assert exc.value.field == key


@dataclass
class Checked:
    steps: int = 1
    rate: float = 0.5

    def __post_init__(self) -> None:
        if not 0 < self.rate <= 1:
            raise ConfigError(None, None, "rate", f"must be in (0, 1], got {self.rate}")


def test_a_validation_error_that_names_its_field_gets_the_files_line_and_says_it_once(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("steps: 3\nrate: 2\n")
    with pytest.raises(ConfigError) as exc:
        load_config(Checked, p)
    assert (exc.value.field, exc.value.line, exc.value.path) == ("rate", 2, str(p))
    assert str(exc.value).count("field 'rate'") == 1 and str(exc.value).endswith("must be in (0, 1], got 2.0")


def test_atomic_write_keeps_old_file_on_failure(tmp_path):
    p = tmp_path / "f.txt"
    p.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_write(p) as fh:
            fh.write("half")
            raise RuntimeError("boom")
    assert p.read_text() == "old"
    assert list(tmp_path.iterdir()) == [p]


def test_write_jsonl_and_read_json(tmp_path):
    p = tmp_path / "r.jsonl"
    assert write_jsonl(p, iter([{"a": "é"}, [1, 2]])) == 2
    assert p.read_text(encoding="utf-8") == '{"a": "é"}\n[1, 2]\n'
    good = tmp_path / "g.json"
    good.write_text('{"k": 1}', encoding="utf-8")
    assert read_json(good) == {"k": 1}
    bad = tmp_path / "b.json"
    bad.write_text('{"k": 1,\n oops}', encoding="utf-8")
    with pytest.raises(ConfigError, match="invalid JSON") as exc:
        read_json(bad)
    assert exc.value.path == str(bad) and exc.value.line == 2
    with pytest.raises(ConfigError, match=r"cannot read \(.*\): not a thing") as exc:
        read_json(tmp_path / "missing.json", unreadable="not a thing")
    assert exc.value.path == str(tmp_path / "missing.json")


def test_run_metadata():
    meta = run_metadata(Cfg("x"))
    assert meta["config"]["optim"]["lr"] == 1e-4
    assert "torch" in meta["versions"] and meta["machine"] and meta["created"]
