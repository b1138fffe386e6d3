"""README command 1 on a fresh clone, timed -> benchmarks/results/quickstart_fresh_clone.json

Clones this repository (its committed HEAD) into a temporary directory and runs
``bash scripts/quickstart.sh`` there with an empty model cache (``SCALINGNOTE_CACHE``), so the
GGUF -> safetensors conversion is included, and a new virtual environment inside the clone.
pip's own download cache is the machine's (packages still install from wheels). Rows: the
set-up (``scripts/setup.sh``, the first thing command 1 does), the pipeline, and the total, plus
the load average before and after (the machine may be shared).

    python -m benchmarks.fresh_clone [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks._common import REPO_ROOT, write_results


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep", default=None, help="clone into this directory and keep it (default: a temp dir, removed)")
    args = ap.parse_args()

    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="scalingnote-fresh-"))
    clone = base / "scalingnote"
    if clone.exists():
        shutil.rmtree(clone)
    base.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    subprocess.run(["git", "clone", "-q", str(REPO_ROOT), str(clone)], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "SCALINGNOTE_VENV")}
    env["SCALINGNOTE_CACHE"] = str(base / "model_cache")
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    subprocess.run(["bash", "scripts/setup.sh"], cwd=clone, env=env, check=True)
    t1 = time.perf_counter()
    proc = subprocess.run(["bash", "scripts/quickstart.sh"], cwd=clone, env=env, capture_output=True, text=True)
    t2 = time.perf_counter()
    load1 = os.getloadavg()
    (base / "quickstart.out").write_text(proc.stdout + "\n" + proc.stderr[-20000:])
    if proc.returncode != 0:
        raise SystemExit(f"quickstart failed (rc {proc.returncode}); output in {base / 'quickstart.out'}")
    res = json.loads((clone / "runs" / "quickstart" / "results.json").read_text())
    printed_table = (
        "scalingnote quickstart:" in proc.stdout and "scalingnote serve --index" in proc.stdout
    )  # the table and the serve command
    rows = [
        {"phase": "setup (scripts/setup.sh: venv + pinned installs)", "seconds": round(t1 - t0, 1)},
        {"phase": "pipeline (scalingnote quickstart)", "seconds": round(t2 - t1, 1)},
        {
            "phase": "total (README command 1)",
            "seconds": round(t2 - t0, 1),
            "minutes": round((t2 - t0) / 60, 2),
            "table_printed": printed_table,
            "loadavg_before": round(load0[0], 2),
            "loadavg_after": round(load1[0], 2),
            "pipeline_s_in_results": res.get("elapsed_s"),
        },
    ]
    rows += [
        {"phase": f"pipeline phase: {k}", "seconds": v} for k, v in (res.get("phase_seconds") or {}).items()
    ]  # where the time went
    for r in res["rows"]:  # the baselines, the teacher, the student, the served default and the compressed index
        if r["method"] in ("bm25", "scalingnote+ivfpq") or r["method"].startswith("zero_shot_") or r.get("chosen"):
            rows.append(
                {
                    "phase": f"result: {r['method']}",
                    "query_tower": r.get("query_tower"),
                    "chosen": r.get("chosen", ""),
                    "ndcg@10": round(r["ndcg@10"], 4),
                    "r@100": round(r["r@100"], 4),
                }
            )
    write_results(
        "quickstart_fresh_clone",
        rows,
        {
            "commit": commit,
            "clone": str(clone),
            "model_cache": "empty (SCALINGNOTE_CACHE)",
            "pip_cache": "the machine's",
            "target_minutes": 15,
        },
    )
    print(json.dumps(rows, indent=1))
    if not args.keep:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
