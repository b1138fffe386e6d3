"""Fault-injection benchmark of the live index: every write point fails once in turn, on FAISS and
on Milvus Lite, and a real full disk (an 8 MB tmpfs filled to 40 KB free) is followed by a SIGKILL;
after each restart a history checker compares the index with every acknowledged operation.

Per row (one write point and back end): ``faults_injected`` (failures that happened), ``ops`` /
``acknowledged`` / ``refused`` / ``logged_409`` (Milvus: in the log, applied later) operations,
``restart_ok``, and the checker's ``lost`` (an acknowledged add / replace / delete not holding),
``resurrected`` (a refused write present) and ``duplicated`` (a document found twice): all must be 0.
The write points and the scenario: :mod:`benchmarks._faults`; the full disk:
:mod:`benchmarks._faults_disk`. The tmpfs rows need root (``mount``); without it they say why they
were skipped.

Run: ``flock /tmp/scalingnote-bench.lock nice -n 5 env PYTHONPATH=src .venv/bin/python -m benchmarks.faults``
"""

from __future__ import annotations

import argparse
import logging
import shutil
import tempfile
from pathlib import Path

from tqdm import tqdm

from benchmarks._common import write_results
from benchmarks._faults import build_synthetic_index, points_of, run_point
from benchmarks._faults_disk import run_disk_full


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", nargs="+", default=["faiss", "milvus"], choices=["faiss", "milvus"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ops", type=int, default=14, help="operations per write-point history")
    ap.add_argument("--no-tmpfs", action="store_true", help="skip the full-tmpfs + SIGKILL scenario")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    work = Path(tempfile.mkdtemp(prefix="scalingnote-faults-"))
    try:
        base = build_synthetic_index(work / "base", seed=args.seed)
        jobs = [(b, p) for b in args.backends for p in points_of(b)] + (
            [] if args.no_tmpfs else [(b, "disk_full_tmpfs") for b in args.backends]
        )
        rows = []
        for backend, point in tqdm(jobs, desc="write points", unit="run"):
            if point == "disk_full_tmpfs":
                rows.append(run_disk_full(backend, work / f"{backend}-{point}", base, seed=args.seed))
            else:
                rows.append(
                    run_point(backend, point, work / f"{backend}-{point}", base, seed=args.seed, n_ops=args.ops)
                )
            tqdm.write(str(rows[-1]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    config = {
        "seed": args.seed,
        "ops_per_history": args.ops,
        "backends": args.backends,
        "tmpfs": not args.no_tmpfs,
        "index": "synthetic: 48 unit vectors (dim 16), IVF4,PQ8x4, 2-layer semantic IDs; Milvus Lite export (FLAT)",
        "tmpfs_scenario": "8 MB tmpfs filled to 40 KB free; 30 batches of 1-40 documents (~1 KB each) while "
        "full; space freed; "
        ">= 200 acknowledged documents; SIGKILL; restart",
    }
    path = write_results("faults", rows, config)
    bad = [
        r
        for r in rows
        if "skipped" not in r and (not r.get("restart_ok") or r["lost"] or r["resurrected"] or r["duplicated"])
    ]
    print(f"{path}: {len(rows)} rows, {len(bad)} with a failed restart or lost / resurrected / duplicated documents")
    return path


if __name__ == "__main__":
    main()
