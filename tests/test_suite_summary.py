"""scripts/suite_summary.py: the per-suite lines and the skipped slow tests at the end of a CI run,
read from the JUnit XML pytest writes."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run_pytest(tmp_path: Path, name: str, body: str, *args: str) -> Path:
    (tmp_path / f"test_{name}.py").write_text(body, encoding="utf-8")
    xml = tmp_path / f"{name}.xml"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--junitxml={xml}",
            "-o",
            "addopts=",
            str(tmp_path / f"test_{name}.py"),
            *args,
        ],
        cwd=tmp_path,
        capture_output=True,
        check=False,
    )
    return xml


def test_counts_and_skip_reasons_from_pytest_reports(tmp_path):
    body = """
import pytest

def test_ok(): pass
def test_bad(): assert False
@pytest.mark.skip(reason="no Milvus binary for this platform")
def test_skipped(): pass
def test_skips_inside(): pytest.skip("cannot start a local Ray instance: X")
"""
    xml = _run_pytest(tmp_path, "mixed", body)
    spec = importlib.util.spec_from_file_location("suite_summary", ROOT / "scripts" / "suite_summary.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    r = mod.read_report(xml)
    assert (r["tests"], r["passed"], r["failed"], r["errors"], r["skipped"]) == (4, 1, 1, 0, 2)
    reasons = dict(r["skips"])
    assert any("no Milvus binary" in v for v in reasons.values()) and any("local Ray" in v for v in reasons.values())

    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "suite_summary.py"),
            f"default={xml}@65",
            f"slow={xml}@3",
            f"gone={tmp_path / 'missing.xml'}",
            "--list-skips",
            "slow",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "default suite: 4 tests: 1 passed, 1 failed, 0 errors, 2 skipped" in out and "wall 65 s (1.1 min)" in out
    assert "gone suite: no report" in out
    assert "slow suite: 2 test(s) skipped" in out and out.count("  SKIPPED ") == 2
