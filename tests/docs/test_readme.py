"""The README's commands and Python example run as printed.

The Python example runs in a fresh interpreter in a directory whose ``runs/quickstart`` is a small
quick start's output (random tiny models, one family: seconds, not the default's minutes), and its
``sn.quickstart(...)`` line runs with the same tiny models passed as options. The two top-level
commands train for minutes and run the whole suite, so they are checked for what they run, and
``scalingnote quickstart --help`` runs. The output layout the README lists is the small run's.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from benchmarks._common import ServeProcess
from scalingnote.models import build_tiny_model
from scalingnote.quickstart import QuickstartConfig, quickstart
from tests.docs.codeblocks import ROOT, blocks

README = ROOT / "README.md"


def tiny_options(root: Path) -> dict:
    """A quick start that finishes in seconds: tiny random models, one family, nothing optional."""
    return dict(
        bert=str(build_tiny_model(root / "bert", "bert", num_layers=2)),
        families=["bert"],
        teacher="bert",
        dim=32,
        full_dim=False,
        synth_docs=120,
        synth_queries=60,
        steps=3,
        batch_size=4,
        qkd_epochs=1.0,
        qkd_batch_size=16,
        qkd_max_pseudo_queries=60,
        qkd_max_steps=10,
        semantic_id_layers=2,
        query_max_length=16,
        doc_max_length=64,
        show_progress=False,
        head_lrs=[1e-3],
        compare="none",
        mining_round="off",
    )


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("readme")
    options = tiny_options(root)
    quickstart(QuickstartConfig(out=str(root / "work" / "runs" / "quickstart"), **options))
    return root, options


def test_the_readme_is_short_and_in_order():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
    heads = [h.strip() for h in re.findall(r"^## (.+)$", text, re.M)]
    assert heads == [
        "Install",
        "Quick start: two commands",
        "Your own data",
        "Python",
        "Results",
        "Commands",
        "Extending",
        "Limits",
        "Tests and CI",
    ]
    limits = re.search(r"^## Limits$(.*?)^## ", text, re.M | re.S).group(1)
    bullets = re.findall(r"^- ", limits, re.M)
    assert 1 <= len(bullets) <= 10 and limits.count("](docs/results.md#") >= len(bullets)


def test_the_readme_links_only_to_files_and_results_tables_that_exist():
    text = README.read_text(encoding="utf-8")
    results = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)#\s]+)(?:#([\w-]+))?\)", text):
        path, anchor = target
        if path.startswith("http"):
            continue
        assert (ROOT / path).exists(), path
        if anchor and path == "docs/results.md":
            assert f'<a id="{anchor}"></a>' in results, anchor


def test_the_two_commands_run_what_the_readme_says():
    qs = (ROOT / "scripts" / "quickstart.sh").read_text(encoding="utf-8")
    test = (ROOT / "scripts" / "test.sh").read_text(encoding="utf-8")
    assert "scripts/setup.sh" in qs and re.search(r"bin/scalingnote\" quickstart \"\$@\"", qs)
    assert "scripts/setup.sh" in test and "-m pytest" in test
    proc = subprocess.run(
        [sys.executable, "-m", "scalingnote", "quickstart", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert proc.returncode == 0 and "--budget-minutes" in proc.stdout


def test_the_output_layout_the_readme_lists_is_what_a_quick_start_writes(small_run):
    root, _ = small_run
    run = root / "work" / "runs" / "quickstart"
    layout = next(b for b in blocks(README) if b.lang == "text" and "runs/quickstart/" in b.code)
    names = re.findall(r"^\s+([\w./]+?)/?\s{2,}", layout.code, re.M)
    assert names and all((run / n).exists() for n in names), [n for n in names if not (run / n).exists()]


def test_the_python_example_runs_as_printed(small_run):
    root, options = small_run
    (code,) = [b.code for b in blocks(README) if b.lang == "python"]
    prelude = (
        "import scalingnote as _sn, functools as _ft\n"
        f"_sn.quickstart = _ft.partial(_sn.quickstart, **{options!r})  # the tiny models: seconds, not minutes\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", prelude + code],
        cwd=root / "work",
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    first = proc.stdout.splitlines()[0].split()
    assert len(first) >= 2 and float(first[1]) == float(first[1])  # "id score title" of the first hit
    assert (root / "work" / "runs" / "qs2" / "results.json").exists()


def test_the_serve_and_query_commands_run_as_printed(small_run):
    """The README's serve command (the student's directory name filled in, a free port instead of
    8080) on the small run, then its query, sent as the `curl` line sends it."""
    root, _ = small_run
    work = root / "work"
    (block,) = [b for b in blocks(README) if b.lang == "bash" and "scalingnote serve" in b.code]
    serve_line, curl_line = [line for line in block.code.splitlines() if line.strip()]
    (student,) = [p.name for p in (work / "runs" / "quickstart" / "qkd").iterdir() if p.is_dir()]
    argv = shlex.split(serve_line.replace("<student>", student))
    assert argv[:2] == [".venv/bin/scalingnote", "serve"] and argv[-2:] == ["--port", "8080"]
    args = [str(work / a) if a.startswith("runs/") else a for a in argv[2:-2]]
    svc = ServeProcess(args)
    try:
        svc.wait_ready(timeout=300)
        curl = shlex.split(curl_line)
        url = svc.url + "/" + curl[curl.index("-s") + 1].split("/", 1)[1]
        body = curl[curl.index("-d") + 1]
        r = httpx.post(url, content=body, headers={"content-type": "application/json"}, trust_env=False, timeout=60)
        assert r.status_code == 200, r.text
        hits = r.json()["results"]
        assert len(hits) == 3 and all(h["doc_id"] for h in hits)
    finally:
        svc.stop()
