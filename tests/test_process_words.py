"""Nothing the project ships speaks of how it was made: no development-history words ("session 12"),
issue or pull-request numbers ("issue #51", "issue 52"), borrowed machines ("a lent NVIDIA H200")
or their transfer limits ("64 MiB per call"), and no one machine's absolute paths (``/work/...``,
``/home/<user>``, a worktree). Scanned: ``src/``, ``scripts/``, ``docs/``, ``README.md``,
``mkdocs.yml``, the packaging and CI files, ``configs/``, ``benchmarks/*.py`` and
``benchmarks/results/*.json``, and everything a quick start prints (a tiny run, in its own process)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: what is looked for, by name: phrases, not bare words (an HTTP or ONNX Runtime "session", a
#: "lent" inside another word, a "#" heading or colour are not process words)
PATTERNS: dict[str, re.Pattern[str]] = {
    "development session": re.compile(r"\bsessions? \d+\b", re.I),
    "issue or pull-request number": re.compile(r"\b(?:issues?|pull requests?|PRs?) #?\d+\b|\bissue #\w", re.I),
    "borrowed machine": re.compile(r"\blent (?:an? |the )?(?:NVIDIA|GPU|machine|H\d00|A100|device)", re.I),
    "transfer limit": re.compile(r"\b\d+ ?MiB (?:per call|transfer)|\btransfer limit\b", re.I),
    "local absolute path": re.compile(r"/work/|/home/[a-z_][\w.-]*/|/Users/[A-Za-z]"),
    "worktree": re.compile(r"\bworktrees?\b", re.I),
}

#: the shipped text, by area (one test each, so a failure names the area)
AREAS: dict[str, list[str]] = {
    "src": ["src/**/*.py", "src/**/*.md", "src/**/*.yaml", "src/**/*.json", "src/**/*.html", "src/**/*.js"],
    "scripts": ["scripts/*"],
    "benchmarks": ["benchmarks/*.py"],
    "results": ["benchmarks/results/*.json"],
    "readme": ["README.md"],
    "docs": ["docs/**/*", "mkdocs.yml"],
    "packaging": [
        "pyproject.toml",
        "requirements.txt",
        "requirements.lock",
        ".pre-commit-config.yaml",
        ".ci/*",
        "configs/**/*",
    ],
}


def find_process_words(text: str, where: str) -> list[str]:
    """``where:line: [kind] the match`` for every process word in ``text``."""
    hits = []
    for n, line in enumerate(text.splitlines(), 1):
        for kind, pat in PATTERNS.items():
            for m in pat.finditer(line):
                hits.append(f"{where}:{n}: [{kind}] ...{line[max(0, m.start() - 40) : m.end() + 40]}...")
    return hits


def _files(area: str) -> list[Path]:
    out: set[Path] = set()
    for pattern in AREAS[area]:
        out.update(p for p in ROOT.glob(pattern) if p.is_file() and "__pycache__" not in p.parts)
    return sorted(out)


def test_the_patterns_find_process_words_and_leave_ordinary_words_alone():
    planted = [
        "measured in session 11 on a Xeon",
        "see issue #51",
        "(issue 52, item 1)",
        "on a lent NVIDIA H200",
        "a lent GPU machine",
        "at most 64 MiB per call",
        "over the transfer limit",
        "/work/wt_kuake/runs/recipe",
        "/home/alice/data",
        "in a worktree",
        "PR #12",
        "Sessions 3 and 4",
    ]
    for text in planted:
        assert find_process_words(text, "x"), text
    ordinary = [
        "ort_session(path, threads)",
        "an HTTP session pool",
        "the ONNX Runtime session",
        "session_id = 3",
        "# 50 ms per query",
        "issues a request",
        "an issue with the corpus",
        "color: #1f77b4",
        "excellent GPU",
        "silent machine",
        "/tmp/qs/run",
        "runs/recipe/kuake_qtr/results.json",
        "16 MiB of memory",
        "the working tree",
    ]
    for text in ordinary:
        assert not find_process_words(text, "x"), text


@pytest.mark.parametrize("area", sorted(AREAS))
def test_shipped_text_has_no_process_words(area):
    files = _files(area)
    if area in ("docs", "readme"):
        assert files, f"no {area} files found"
    hits: list[str] = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:  # a binary file (an image)
            continue
        hits += find_process_words(text, str(path.relative_to(ROOT)))
    assert not hits, f"{len(hits)} process words in {area}:\n" + "\n".join(hits[:60])


def test_a_quick_start_prints_no_process_words(tiny_quickstart):
    """Everything a (tiny) quick start prints, stdout and stderr, and the text files it writes
    beside its results (its config and results.json name the run's own directory, which is the
    user's: only the printed output and the results' text fields are scanned)."""
    out, _, printed = tiny_quickstart
    mine = str(out.parent)  # the test's own temporary folder (the run and its tiny models)
    hits = find_process_words(printed.replace(mine, "<tmp>"), "scalingnote quickstart output")
    results = (out / "results.json").read_text(encoding="utf-8").replace(mine, "<tmp>")
    hits += find_process_words(results, "results.json")
    assert not hits, "\n".join(hits[:60])


def test_results_files_are_written_without_this_machines_paths():
    """``benchmarks._common.write_results`` records paths inside the repository relative to it and
    the shared data as ``../shared/data``; a path elsewhere is kept (it is the run's own input)."""
    from benchmarks._common import REPO_ROOT, shared_data_dir, without_local_paths

    row = {
        "run": str(REPO_ROOT / "runs" / "recipe" / "scifact"),
        "n": 3,
        "cmd": f"scalingnote serve --index {REPO_ROOT / 'runs/x/index/ivfpq'} --corpus {shared_data_dir() / 'scifact'}",
        "nested": [{"dir": str(REPO_ROOT / ".cache" / "bench")}],
        "tmp": "/tmp/qs",
    }
    assert without_local_paths(row) == {
        "run": "runs/recipe/scifact",
        "n": 3,
        "cmd": "scalingnote serve --index runs/x/index/ivfpq --corpus ../shared/data/scifact",
        "nested": [{"dir": ".cache/bench"}],
        "tmp": "/tmp/qs",
    }
