"""`scalingnote models list|info|convert` on tiny models."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from scalingnote.cli.models import register
from scalingnote.errors import ScalingNoteError
from scalingnote.models import load_tower
from tests.models.gguf_writer import write_llama_gguf


@pytest.fixture()
def app():
    a = typer.Typer()
    register(a)
    return a


def test_info_hf_dir_and_saved_tower(app, tiny_dirs, tmp_path):
    r = CliRunner().invoke(app, ["models", "info", str(tiny_dirs["bert"]), "--num-layers", "2", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["kind"] == "bert" and d["num_layers"] == 2 and d["base_num_layers"] == 3 and d["non_embedding_params"] > 0
    t = load_tower(tiny_dirs["llama"], "document", device="cpu", dim=16)
    t.save(tmp_path / "tw")
    r = CliRunner().invoke(app, ["models", "info", str(tmp_path / "tw"), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert (
        d["form"] == "tower" and d["fingerprint"] == t.fingerprint and d["compat_id"] == t.compat_id and d["dim"] == 16
    )
    assert (
        d["storage"] == "base+trained"
        and d["base"]["path"] == str(tiny_dirs["llama"].resolve())
        and d["trained_tensors"] == 0
    )


def test_convert_gguf_and_errors(app, tiny_dirs, tmp_path):
    g = write_llama_gguf(tiny_dirs["llama"], tmp_path / "t.gguf")
    r = CliRunner().invoke(app, ["models", "convert", str(g), "--cache-dir", str(tmp_path / "c")])
    assert r.exit_code == 0, r.output
    out = r.stdout.strip().splitlines()[-1]
    assert (tmp_path / "c").exists() and out.startswith(str(tmp_path / "c"))
    r = CliRunner().invoke(app, ["models", "convert", str(tiny_dirs["llama"])])
    assert isinstance(r.exception, ScalingNoteError) and "only GGUF" in str(r.exception)
    r = CliRunner().invoke(app, ["models", "info", str(tmp_path / "nope")])
    assert isinstance(r.exception, ScalingNoteError) and "nope" in str(r.exception)


def test_list(app):
    r = CliRunner().invoke(app, ["models", "list"])
    assert r.exit_code == 0 and "smollm2-135m" in r.output and "minilm-l6" in r.output
