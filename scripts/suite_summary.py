"""Summarise pytest JUnit XML reports: one line per suite (tests, passed, failed, errors, skipped,
pytest's time and the wall time the shell measured), then every skipped test of the suites named
with ``--list-skips`` and its reason. Used by scripts/test_all.sh (and so by CI).

Usage: python scripts/suite_summary.py NAME=report.xml[@wall_seconds] ... [--list-skips NAME ...]
A report that does not exist (pytest did not run, or exited before writing it) is reported as such.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def read_report(path: Path) -> dict:
    """Counts, time and the skipped tests (``(test id, reason)``) of one JUnit XML report."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    out = {"tests": 0, "failed": 0, "errors": 0, "skipped": 0, "time": 0.0, "skips": []}
    for s in suites:
        out["time"] += float(s.get("time", 0))
        for case in s.iter("testcase"):
            out["tests"] += 1
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            if case.find("failure") is not None:
                out["failed"] += 1
            elif case.find("error") is not None:
                out["errors"] += 1
            elif (sk := case.find("skipped")) is not None:
                out["skipped"] += 1
                out["skips"].append((name, (sk.get("message") or sk.text or "").strip()))
    out["passed"] = out["tests"] - out["failed"] - out["errors"] - out["skipped"]
    return out


def _minutes(s: float) -> str:
    return f"{s:.0f} s ({s / 60:.1f} min)"


def main(argv: list[str]) -> int:
    list_skips: set[str] = set()
    specs = []
    it = iter(argv)
    for a in it:
        if a == "--list-skips":
            list_skips.update(x for x in it)
            break
        name, _, rest = a.partition("=")
        path, _, wall = rest.partition("@")
        specs.append((name, Path(path), float(wall) if wall else None))
    print("=" * 30 + " test suites " + "=" * 30)
    reports = {}
    for name, path, wall in specs:
        wall_txt = f", wall {_minutes(wall)}" if wall is not None else ""
        if not path.exists():
            print(f"{name:>8} suite: no report ({path} missing: pytest did not run to the end){wall_txt}")
            continue
        r = reports[name] = read_report(path)
        print(
            f"{name:>8} suite: {r['tests']} tests: {r['passed']} passed, {r['failed']} failed, {r['errors']} errors, "
            f"{r['skipped']} skipped; pytest {_minutes(r['time'])}{wall_txt}"
        )
    for name in sorted(list_skips & set(reports)):
        skips = reports[name]["skips"]
        print(f"{name} suite: {len(skips)} test(s) skipped (could not run here):")
        for test, reason in skips:
            print(f"  SKIPPED {test}: {reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
