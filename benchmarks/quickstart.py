"""Run (or resume) `scalingnote quickstart` and record its table in benchmarks/results/.

    python -m benchmarks.quickstart                          # embedded defaults (synthetic log)
    python -m benchmarks.quickstart --data scifact           # a shared BEIR set
    python -m benchmarks.quickstart --out runs/quickstart    # reuse an existing run directory
    python -m benchmarks.quickstart --from-run runs/qs1      # record a finished run as it is
    python -m benchmarks.quickstart --from-run runs/qs2 --tag unfreeze1 --reused   # a variant beside it

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
    ap.add_argument(
        "--from-run", type=Path, default=None, help="write the results file from this finished run directory instead"
    )
    ap.add_argument(
        "--tag", default=None, help="write quickstart_<data>_<tag>.json (a variant beside the default table)"
    )
    ap.add_argument(
        "--reused",
        action="store_true",
        help="the run reused earlier steps (a variant re-run in a copy): its wall time is not the pipeline's, "
        "so no 10-minute check",
    )
    args = ap.parse_args()
    name = (args.data or "synthetic") + (f"_{args.tag}" if args.tag else "")
    if args.from_run is not None:
        print(results_of_run(f"quickstart_{name}", args.from_run.resolve(), timed=not args.reused))
        return

    from scalingnote.quickstart import QuickstartConfig, quickstart

    out = (
        Path(args.out)
        if args.out
        else REPO_ROOT / "runs" / ("quickstart" if name == "synthetic" else f"quickstart_{name}")
    )
    quickstart(
        QuickstartConfig(
            out=str(out), data=str(shared_data_dir() / args.data) if args.data else None, show_progress=False
        )
    )
    print(results_of_run(f"quickstart_{name}", out.resolve(), timed=not args.reused))


if __name__ == "__main__":
    main()
