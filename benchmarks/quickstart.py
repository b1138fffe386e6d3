"""Run (or resume) `scalingnote quickstart` and record its table in benchmarks/results/.

    python -m benchmarks.quickstart                          # embedded defaults (synthetic log)
    python -m benchmarks.quickstart --data scifact           # a shared BEIR set
    python -m benchmarks.quickstart --out runs/quickstart    # reuse an existing run directory
    python -m benchmarks.quickstart --from-run runs/qs1      # record a finished run as it is

Writes benchmarks/results/quickstart_<name>.json (one row per method), with the run's resolved
config, its choices and their reasons, the recipe's acceptance checks and its wall time.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks._common import REPO_ROOT, shared_data_dir
from benchmarks.recipe import results_of_run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=None, help="name of a set under ../shared/data (default: synthetic)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--from-run", type=Path, default=None, help="write the results file from this finished run directory instead")
    args = ap.parse_args()
    name = args.data or "synthetic"
    if args.from_run is not None:
        print(results_of_run(f"quickstart_{name}", args.from_run.resolve(), timed=True))
        return

    from scalingnote.quickstart import QuickstartConfig, quickstart

    out = Path(args.out) if args.out else REPO_ROOT / "runs" / ("quickstart" if name == "synthetic" else f"quickstart_{name}")
    quickstart(QuickstartConfig(out=str(out), data=str(shared_data_dir() / args.data) if args.data else None, show_progress=False))
    print(results_of_run(f"quickstart_{name}", out.resolve(), timed=True))


if __name__ == "__main__":
    main()
