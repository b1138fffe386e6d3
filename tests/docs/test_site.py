"""The documentation site: ``mkdocs build --strict`` passes with no warning, its generated references
hold what the code has, every code block of the docs and the README is run by a test or marked with
the reason it is not (:mod:`tests.docs.codeblocks`), the cheap ones run here, the findings' figures
match their results files, and the generated results page prints no machine's absolute paths."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from tests.docs.codeblocks import NOT_CODE, ROOT, blocks, doc_files, help_block, run_by

sys.path.insert(0, str(ROOT / "docs" / "hooks"))
import citations

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]), "NO_MKDOCS_2_WARNING": "1"}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(out)],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return out, proc, time.perf_counter() - t0


def test_the_site_builds_strict_without_a_warning_in_under_a_minute(site):
    _, proc, seconds = site
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]
    assert not re.search(r"^(WARNING|ERROR)\b", log, re.M), log[-5000:]
    assert seconds < 60, f"mkdocs build took {seconds:.0f} s"


def test_the_cli_reference_is_generated_from_the_typer_app(site):
    out, _, _ = site
    page = (out / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    from scalingnote.cli import COMMANDS

    for name in COMMANDS:  # every top-level command, with its subcommands' options
        assert f'id="scalingnote-{name}"' in page, name
    assert 'id="scalingnote-index-build"' in page and "--budget-minutes" in page


def test_the_api_reference_documents_the_packages_modules(site):
    out, _, _ = site
    page = (out / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    for name in ("scalingnote.data.corpus.register_corpus_format", "scalingnote.index.backends.register_backend"):
        assert f'id="{name}"' in page, name
    if (ROOT / "src" / "scalingnote" / "api.py").exists():  # the Python API, once the package has it
        assert 'id="scalingnote.api"' in page


def test_the_findings_page_lists_the_machine_and_date_of_each_file_it_cites(site):
    out, _, _ = site
    page = (out / "findings" / "index.html").read_text(encoding="utf-8")
    assert "findings-sources" not in page
    for c in citations.citations((ROOT / "docs" / "findings.md").read_text(encoding="utf-8")):
        assert f"benchmarks/results/{c.file}.json" in page


def test_every_code_block_is_run_by_a_test_or_marked_with_the_reason():
    unaccounted = [
        b.where()
        for path in doc_files()
        for b in blocks(path)
        if b.lang not in NOT_CODE and b.not_run is None and run_by(b) is None
    ]
    assert not unaccounted, "blocks neither run by a test nor marked <!-- not-run: reason -->: " + ", ".join(
        unaccounted
    )


def test_the_convention_reads_markers_and_languages(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text(
        "<!-- not-run: needs a GPU -->\n```bash\ntorchrun x\n```\n\n"
        "```bash\nscalingnote index --help\n```\n\n```text\nout\n```\n",
        encoding="utf-8",
    )
    a, b, c = blocks(doc)
    assert (a.not_run, b.not_run, c.lang) == ("needs a GPU", None, "text")
    assert help_block(b) and not help_block(a)


def _help_lines() -> list[tuple[str, str]]:
    return [
        (b.where(), line.strip())
        for path in doc_files()
        for b in blocks(path)
        if b.not_run is None and help_block(b)
        for line in b.code.splitlines()
        if line.strip()
    ]


@pytest.mark.parametrize(("where", "line"), _help_lines())
def test_the_cheap_shell_blocks_run_as_printed(where, line):
    argv = line.split()
    argv = [sys.executable, "-m", "scalingnote", *argv[1:]]  # `.venv/bin/scalingnote` is this interpreter's entry point
    proc = subprocess.run(argv, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "Usage" in proc.stdout, (
        f"{where}: {line}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    )


def test_every_figure_on_the_findings_page_is_cited_and_matches_its_results_file():
    text = (ROOT / "docs" / "findings.md").read_text(encoding="utf-8")
    cites = citations.citations(text)
    assert len(cites) >= 20
    wrong = [e for e in (c.check() for c in cites) if e]
    assert not wrong, "\n".join(wrong)
    # no decimal figure outside a citation
    bare = re.sub(r"`[^`]*`", "", citations.CITE.sub("", text))
    assert not re.findall(r"\d+\.\d+", bare), re.findall(r".{30}\d+\.\d+.{10}", bare)


def test_a_citation_that_does_not_match_its_file_is_reported():
    (c,) = citations.citations("0.9999 (`recipe_scifact: chosen=served: ndcg@10`)")
    assert c.check() is not None and "ndcg@10 is" in c.check()


def test_the_results_page_is_current_and_prints_no_absolute_path():
    proc = subprocess.run(
        [sys.executable, "scripts/gen_results.py", "--check"],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    text = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    assert not re.findall(r"(?<![\w.:/])/(?:work|home|root|tmp|Users|mnt|opt|srv|var)/\S*", text)


def test_gen_results_keeps_the_repository_part_of_a_path():
    sys.path.insert(0, str(ROOT / "scripts"))
    import gen_results

    assert gen_results.portable("--index /a/b/wt/.cache/bench/x/index") == "--index .cache/bench/x/index"
    assert gen_results.portable("/a/b/c.json and http://h:1/a/b/ and 1/3") == ".../c.json and http://h:1/a/b/ and 1/3"
    assert gen_results.portable("DELETE /documents/x") == "DELETE /documents/x"  # an endpoint is no machine's path
