"""Is the quick start unchanged by a refactoring? -> benchmarks/results/quickstart_equivalence.json.

Compares two quick-start run directories made from different commits on the embedded defaults
(same seed), at full precision: every row of ``results.json`` (matched by method and family),
its choices (teacher, student, served mode: the names, paths left out) and every number of each
step's ``run.json`` (``stage1/*``, ``qkd/*``), timings, paths and versions excluded::

    git clone --quiet . /tmp/pre && git -C /tmp/pre checkout --detach <older commit>
    (cd /tmp/pre && PYTHONPATH=src python -m benchmarks.quickstart --out /tmp/qs_pre)
    python -m benchmarks.quickstart --out /tmp/qs_now
    python -m benchmarks.quickstart_equivalence --before /tmp/qs_pre --after /tmp/qs_now --before-commit <older commit>

Step digests fingerprint the resolved paths of their inputs, so two directories never share
them; that the current code reuses every step of an older run is checked by re-running the
older directory in place (``python -m benchmarks.quickstart --out /tmp/qs_pre`` from the current
checkout, after noting the time) and passing ``--rerun-started <that Unix time>``: no ``DONE``
marker may be newer.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import yaml

from benchmarks._common import write_results

#: leaves left out: timings and what is derived from them (minutes spent, measured speed-ups), paths, provenance
SKIP = (
    "seconds",
    "minutes",
    "speedup",
    "qps",
    "_s",
    "ms",
    "created",
    "time",
    "path",
    "dir",
    "versions",
    "machine",
    "out",
    "teacher",
    "model",
    "cache",
)


def leaves(doc: Any, prefix: str = "") -> dict[str, Any]:
    """Every leaf value of a JSON document by its path (``a.b[0].c``)."""
    if isinstance(doc, dict):
        return {k: v for key, val in doc.items() for k, v in leaves(val, f"{prefix}.{key}" if prefix else key).items()}
    if isinstance(doc, list):
        return {k: v for i, val in enumerate(doc) for k, v in leaves(val, f"{prefix}[{i}]").items()}
    return {prefix: doc}


def numbers(doc: Any) -> dict[str, float]:
    """Every float of a JSON document by its path (timings, paths and versions left out)."""
    return {k: v for k, v in leaves(doc).items() if isinstance(v, float) and not any(s in k.lower() for s in SKIP)}


def compare(a: dict[str, float], b: dict[str, float], tol: float) -> dict[str, Any]:
    common = [k for k in a if k in b]
    diffs = {k: abs(a[k] - b[k]) for k in common}
    worst = max(diffs, key=diffs.get) if diffs else None
    return {
        "numbers_compared": len(common),
        "only_before": len(set(a) - set(b)),
        "max_abs_diff": diffs[worst] if worst else 0.0,
        "worst": worst or "",
        "within_tol": all(d <= tol for d in diffs.values()),
    }


def _labels(doc: Any) -> dict[str, str]:
    """Every string of the choices by its path, file-system paths left out (latencies inside
    them are timings, not choices), and step digests (they fingerprint the resolved paths of
    their inputs, so two run directories never share them: that a re-run reuses every step is
    checked by re-running in place)."""
    return {
        k: re.sub(r"[\d.]+ ms\b", "<timing> ms", v)
        for k, v in leaves(doc).items()
        if isinstance(v, str) and "/" not in v and not any(s in k.lower() for s in ("dir", "path", "digest"))
    }


def _choices_row(before: Any, after: Any) -> dict[str, Any]:
    a, b = _labels(before), _labels(after)
    differ = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    num = compare(numbers(before), numbers(after), 1e-6)
    return {
        "what": "results.json choices",
        "in_after": True,
        "labels_compared": len(a),
        "labels_differ": ", ".join(differ[:5]),
        **num,
        "within_tol": num["within_tol"] and not differ,
    }


def _rerun_row(root: Path, started: float) -> dict[str, Any]:
    """The older run directory re-run in place by the current code: every step (a ``DONE``
    marker) must be reused, none redone (a marker rewritten after ``started``)."""
    done = sorted(root.rglob("DONE"))
    redone = [str(p.parent.relative_to(root)) for p in done if p.stat().st_mtime > started]
    return {
        "what": "re-run of --before in place (steps reused)",
        "in_after": True,
        "steps": len(done),
        "steps_redone": len(redone),
        "redone": ", ".join(redone[:5]),
        "within_tol": not redone,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True, help="quick-start run directory of the older commit")
    ap.add_argument("--after", type=Path, required=True, help="quick-start run directory of the current code")
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("--before-commit", default="", help="the commit the --before run was made from (recorded)")
    ap.add_argument("--after-commit", default="", help="the commit the --after run was made from (recorded)")
    ap.add_argument(
        "--rerun-started",
        type=float,
        default=None,
        help="the --before directory was then re-run in place with the current code, starting at this Unix time: "
        "count its steps and those it redid (a DONE marker written after the start)",
    )
    ap.add_argument(
        "--tag",
        default=None,
        help="write quickstart_equivalence_<tag>.json (a second comparison beside the default one)",
    )
    args = ap.parse_args(argv)
    load = lambda root, rel: json.loads((root / rel).read_text(encoding="utf-8"))  # noqa: E731
    key = lambda r: f"{r['method']}[{r['family']}]" if r.get("family") else r["method"]  # noqa: E731
    rows = []
    before = {key(r): r for r in load(args.before, "results.json")["rows"]}
    after = {key(r): r for r in load(args.after, "results.json")["rows"]}
    for m, r in before.items():
        row = {"what": f"results.json {m}", "in_after": m in after}
        if m in after:
            row.update(compare(numbers(r), numbers(after[m]), args.tol))
            row["labels_equal"] = {k: v for k, v in r.items() if isinstance(v, str)} == {
                k: v for k, v in after[m].items() if isinstance(v, str)
            }
            row["within_tol"] = row["within_tol"] and row["labels_equal"]
        rows.append(row)
    rows.append(
        _choices_row(
            load(args.before, "results.json").get("choices", {}), load(args.after, "results.json").get("choices", {})
        )
    )
    runs = sorted(
        str(p.relative_to(args.before))
        for pat in ("stage1/*/run.json", "qkd/*/run.json")
        for p in args.before.glob(pat)
    )
    for rel in runs:
        row = {"what": rel, "in_after": (args.after / rel).exists()}
        if row["in_after"]:
            row.update(compare(numbers(load(args.before, rel)), numbers(load(args.after, rel)), args.tol))
        rows.append(row)
    if args.rerun_started is not None:
        rows.append(_rerun_row(args.before, args.rerun_started))
    for r in rows:
        print(r, flush=True)
    settings = {name: _settings(root) for name, root in (("before", args.before), ("after", args.after))}
    config = {
        "before": args.before.name,  # run directories by name: where they lie is one machine's business
        "after": args.after.name,
        "run_settings": settings["after"],  # the quick start's resolved config (its output directory left out)
        "same_settings": settings["before"] == settings["after"],
        "tol": args.tol,
        "before_commit": args.before_commit,
        "after_commit": args.after_commit,
        "rows_only_after": ", ".join(m for m in after if m not in before),
        "all_within_tol": all(r.get("within_tol", False) for r in rows),
    }
    name = f"quickstart_equivalence_{args.tag}" if args.tag else "quickstart_equivalence"
    print(write_results(name, rows, config))


def _settings(root: Path) -> dict[str, Any]:
    """The run's resolved ``quickstart.yaml`` without its output directory (empty when there is none)."""
    path = root / "quickstart.yaml"
    doc = yaml.safe_load(path.read_text(encoding="utf-8")) if path.exists() else {}
    return {k: v for k, v in (doc or {}).items() if k != "out"}


if __name__ == "__main__":
    main()
