"""The quick start over an existing output directory: input paths are checked before
any work, and a finished Stage I built from other data is redone or refused, never reused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from scalingnote.errors import ScalingNoteError
from tests.helpers.tiny_data import write_tiny_beir
from tests.quickstart.test_quickstart import _cfg


@pytest.mark.parametrize("make", ["missing", "file", "not_beir"])
def test_cli_checks_data_before_any_work(tmp_path, make):
    from scalingnote.cli import app

    data = tmp_path / "data"
    if make == "file":
        data.write_text("x")
    elif make == "not_beir":
        (data / "qrels").mkdir(parents=True)
        (data / "queries.jsonl").write_text("")
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["quickstart", "--data", str(data), "--out", str(out)])
    assert r.exit_code != 0 and isinstance(r.exception, ScalingNoteError), r.output
    assert str(data) in str(r.exception)
    # a directory without a corpus file: the error names the corpus files it looked for
    assert ("no corpus file in this directory (looked for corpus.jsonl (jsonl)" in str(r.exception)) == (
        make == "not_beir"
    )
    assert not out.exists()  # nothing was started


def test_cli_refuses_an_out_that_is_a_file(tmp_path):
    from scalingnote.cli import app

    out = tmp_path / "out"
    out.write_text("x")
    r = CliRunner().invoke(app, ["quickstart", "--out", str(out)])
    assert isinstance(r.exception, ScalingNoteError) and "not a directory" in str(r.exception)


def test_quickstart_over_other_data_redoes_stage1(tiny_models, tmp_path):
    """Two BEIR directories with the same document ids and other texts, one output directory:
    the second run trains Stage I (and QKD) on B, never reuses what was built from A."""
    from scalingnote.quickstart import quickstart

    a = write_tiny_beir(tmp_path / "a", docs_per_topic=6, seed=0)
    b = write_tiny_beir(tmp_path / "b", docs_per_topic=6, seed=7)
    out = tmp_path / "qs"
    small = {"qkd_max_pseudo_queries": 30, "semantic_id_layers": 1, "compare": False, "teacher": "bert"}
    quickstart(_cfg(tiny_models, out, data=str(a), **small))
    teacher = lambda: Path(json.loads((out / "results.json").read_text())["choices"]["teacher"]["dir"])  # noqa: E731
    emb_a = np.load(teacher() / "doc_embeddings.npy")
    quickstart(_cfg(tiny_models, out, data=str(b), **small))
    s1 = teacher()
    cfg = (s1 / "config.yaml").read_text()
    assert str(b) in cfg and str(a) not in cfg
    assert not np.allclose(np.load(s1 / "doc_embeddings.npy"), emb_a)  # b's texts, not a's
    assert str(b) in (out / "qkd" / "bert1_from_bert_rw1" / "config.yaml").read_text()


def test_data_fingerprint_reads_content_not_modification_times(tmp_path):
    """A data set copied or re-provisioned with the same bytes (new mtimes) keeps every step;
    one changed byte changes the fingerprint."""
    import os

    from scalingnote.quickstart.runs import data_fingerprint
    from tests.helpers.tiny_data import write_tiny_beir

    beir = write_tiny_beir(tmp_path / "beir")
    data = {"beir": str(beir), "triplets": None, "validation_triplets": None}
    before = data_fingerprint(data)
    corpus = beir / "corpus.jsonl"
    st = corpus.stat()
    os.utime(corpus, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert data_fingerprint(data) == before
    text = corpus.read_text()
    corpus.write_text(text.replace("a", "b", 1))
    after = data_fingerprint(data)
    assert after != before and after[str(corpus)] != before[str(corpus)]
    assert data_fingerprint({**data, "fingerprint": before}) == before  # prepare_data computes it once per run
