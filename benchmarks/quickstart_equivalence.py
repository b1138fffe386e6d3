"""Is the quick start unchanged by a refactoring? -> benchmarks/results/quickstart_equivalence.json.

Compares two quick-start run directories made from different commits on the embedded defaults
(same seed), at full precision: every method's row of ``results.json`` (matched by method) and
every number in ``qkd/run.json`` and ``stage1/<method>/run.json``, timings, paths and versions
excluded. The run recorded here compares the code before the restructuring of issue 20 (commit
318a7af, the parent of 89b6453) with the current code::

    git worktree add --detach /tmp/pre 318a7af
    (cd /tmp/pre && PYTHONPATH=src python benchmarks/quickstart.py --out /tmp/qs_pre)   # the layout of that commit
    python -m benchmarks.quickstart --out /tmp/qs_now
    python -m benchmarks.quickstart_equivalence --before /tmp/qs_pre --after /tmp/qs_now
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks._common import write_results

SKIP = ("seconds", "qps", "_s", "ms", "created", "time", "path", "dir", "versions", "machine", "out", "teacher", "model", "cache")


def numbers(doc: Any, prefix: str = "") -> dict[str, float]:
    """Every float of a JSON document by its path (timings, paths and versions left out)."""
    if isinstance(doc, dict):
        return {k: v for key, val in doc.items() for k, v in numbers(val, f"{prefix}.{key}" if prefix else key).items()}
    if isinstance(doc, list):
        return {k: v for i, val in enumerate(doc) for k, v in numbers(val, f"{prefix}[{i}]").items()}
    if isinstance(doc, float) and not any(s in prefix.lower() for s in SKIP):
        return {prefix: doc}
    return {}


def compare(a: dict[str, float], b: dict[str, float], tol: float) -> dict[str, Any]:
    common = [k for k in a if k in b]
    diffs = {k: abs(a[k] - b[k]) for k in common}
    worst = max(diffs, key=diffs.get) if diffs else None
    return {"numbers_compared": len(common), "only_before": len(set(a) - set(b)), "max_abs_diff": diffs[worst] if worst else 0.0,
            "worst": worst or "", "within_tol": all(d <= tol for d in diffs.values())}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True, help="quick-start run directory of the older commit")
    ap.add_argument("--after", type=Path, required=True, help="quick-start run directory of the current code")
    ap.add_argument("--tol", type=float, default=1e-6)
    args = ap.parse_args(argv)
    load = lambda root, rel: json.loads((root / rel).read_text(encoding="utf-8"))  # noqa: E731
    rows = []
    before = {r["method"]: r for r in load(args.before, "results.json")["rows"]}
    after = {r["method"]: r for r in load(args.after, "results.json")["rows"]}
    for m, r in before.items():
        row = {"what": f"results.json {m}", "in_after": m in after}
        if m in after:
            row.update(compare(numbers(r), numbers(after[m]), args.tol))
        rows.append(row)
    runs = ["qkd/run.json"] + sorted(str(p.relative_to(args.before)) for p in args.before.glob("stage1/*/run.json"))
    for rel in runs:
        row = {"what": rel, "in_after": (args.after / rel).exists()}
        if row["in_after"]:
            row.update(compare(numbers(load(args.before, rel)), numbers(load(args.after, rel)), args.tol))
        rows.append(row)
    for r in rows:
        print(r, flush=True)
    config = {"before": str(args.before), "after": str(args.after), "tol": args.tol,
              "before_commit": "318a7af (the parent of the restructuring commit 89b6453)",
              "methods_only_after": ", ".join(m for m in after if m not in before),
              "all_within_tol": all(r.get("within_tol", False) for r in rows)}
    print(write_results("quickstart_equivalence", rows, config))


if __name__ == "__main__":
    main()
