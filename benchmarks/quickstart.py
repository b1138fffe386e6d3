"""Run (or resume) `scalingnote quickstart` and record its table in benchmarks/results/.

    python -m benchmarks.quickstart                          # embedded defaults (synthetic log)
    python -m benchmarks.quickstart --data scifact           # a shared BEIR set
    python -m benchmarks.quickstart --out runs/quickstart    # reuse an existing run directory

Writes benchmarks/results/quickstart_<name>.json (one row per method), with the run's
resolved config and its wall time.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from benchmarks._common import REPO_ROOT, shared_data_dir, write_results
from benchmarks.recipe import targets


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=None, help="name of a set under ../shared/data (default: synthetic)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from scalingnote.quickstart import QuickstartConfig, quickstart

    name = args.data or "synthetic"
    out = Path(args.out) if args.out else REPO_ROOT / "runs" / ("quickstart" if name == "synthetic" else f"quickstart_{name}")
    cfg = QuickstartConfig(out=str(out), data=str(shared_data_dir() / args.data) if args.data else None, show_progress=False)
    rows = quickstart(cfg)
    run = json.loads((out / "results.json").read_text())
    flat = [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()} for r in rows]
    write_results(f"quickstart_{name}", flat, {**asdict(cfg), "out": str(out.relative_to(REPO_ROOT)) if out.is_relative_to(REPO_ROOT) else str(out),
                                                 "elapsed_s_last_run": run.get("elapsed_s"), "choices": run["choices"],
                                                 "targets": targets(flat, run["choices"]["ordering"])})


if __name__ == "__main__":
    main()
