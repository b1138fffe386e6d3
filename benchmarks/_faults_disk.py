"""The full-disk scenario of the fault-injection harness (:mod:`benchmarks._faults`): a real 8 MB
tmpfs filled to a few KB free, a writer child that ingests while the disk is full, frees the space,
ingests more and is killed; then the index is reopened and the child's history checked.

Mounting the tmpfs needs root (``mount``); without it the scenario reports why it was skipped.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._faults import History, export_lite, open_live, restart_and_check


def mount_tmpfs(path: Path, size: str = "8m") -> str | None:
    """Mount a ``size`` tmpfs on ``path``; None, or why it cannot (not root, no mount permission)."""
    import subprocess

    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root (CI runs as root)"
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True
    )
    return None if r.returncode == 0 else f"mount -t tmpfs failed here: {(r.stderr or '').strip() or r.returncode}"


def umount(path: Path) -> None:
    import subprocess

    subprocess.run(["umount", "-l", str(path)], capture_output=True)


def _fill(disk: Path, leave: int) -> Path:
    """A filler file that leaves ``leave`` bytes free on ``disk``."""
    filler = disk / "filler.bin"
    st = os.statvfs(disk)
    free = st.f_bavail * st.f_frsize
    with open(filler, "wb") as fh:
        left = max(0, free - leave)
        while left > 0:
            n = min(left, 1 << 20)
            try:
                fh.write(b"\0" * n)
                fh.flush()
            except OSError:
                break
            left -= n
    return filler


def disk_full_child(backend: str, idx: Path, db: Path | None, history: Path, seed: int, free_kb: int = 40) -> None:
    """The writer of the full-disk scenario (a child process): fill the disk to ``free_kb`` KB
    free, ingest batches of 1-40 documents while full, free the space, ingest 200 acknowledged
    documents (and replaces / deletes), then SIGKILL itself. Each outcome is fsync-ed to ``history``."""
    import signal

    if db is not None and not db.exists():
        export_lite(idx, db)
    live = open_live(backend, idx, db)
    hist = History(seed=seed, pad=150)  # about 1 KB of text per document
    with open(history, "a", encoding="utf-8") as out:

        def step(op, phase):
            outcome = hist.run(live, op)
            vecs = {d["title"]: hist.vectors[d["title"]].tolist() for d in op.get("docs", [])}
            out.write(json.dumps({**op, "outcome": outcome, "phase": phase, "vectors": vecs}) + "\n")
            out.flush()
            os.fsync(out.fileno())
            return outcome

        filler = _fill(idx.parent, free_kb * 1024)
        hist.batch = (1, 41)
        for _ in range(30):
            step(hist.next_op(hist.present()), "full")
        filler.unlink()
        hist.batch = (1, 9)
        added = 0
        while added < 200:  # acknowledged documents after the space came back
            op = hist.next_op(hist.present())
            added += len(op.get("docs", [])) if step(op, "freed") == "ok" else 0
    os.kill(os.getpid(), signal.SIGKILL)


def load_history(path: Path) -> History:
    hist = History()
    for line in path.read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        for title, v in rec.pop("vectors").items():
            hist.vectors[title] = np.asarray(v, dtype=np.float32)
        hist.ops.append(rec)
    return hist


def run_disk_full(backend: str, work: Path, base_idx: Path, seed: int = 0) -> dict[str, Any]:
    """The full-disk scenario on an 8 MB tmpfs for ``backend``: the child's history, a restart, the check."""
    import subprocess
    import sys

    disk = work / "disk"
    if work.exists():
        umount(disk)
        shutil.rmtree(work)
    why = mount_tmpfs(disk)
    if why:
        return {"backend": backend, "write_point": "disk_full_tmpfs", "skipped": why}
    try:
        idx = Path(shutil.copytree(base_idx, disk / "idx"))
        db = (
            work / "live.db" if backend == "milvus" else None
        )  # exported by the child: Milvus Lite locks its file to one process
        history = work / "history.jsonl"
        args = json.dumps(
            {"backend": backend, "idx": str(idx), "db": str(db) if db else None, "history": str(history), "seed": seed}
        )
        import scalingnote

        src = Path(scalingnote.__file__).resolve().parents[1]  # the child imports the code this process runs
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(Path(__file__).resolve().parents[1])])}
        child = [sys.executable, "-m", "benchmarks._faults_disk", args]
        r = subprocess.run(child, env=env, capture_output=True, text=True, timeout=1800)
        hist = load_history(history)
        full = [o for o in hist.ops if o["phase"] == "full"]
        row = {
            "backend": backend,
            "write_point": "disk_full_tmpfs",
            "killed": r.returncode == -9,
            "faults_injected": sum(o["outcome"] == "refused" for o in full),
            "ops": len(hist.ops),
            "acknowledged": sum(o["outcome"] in ("ok", "logged") for o in hist.ops),
            "acknowledged_while_full": sum(o["outcome"] == "ok" for o in full),
            "logged_409": sum(o["outcome"] == "logged" for o in hist.ops),
            "refused": sum(o["outcome"] == "refused" for o in hist.ops),
            "acknowledged_docs_after_freeing": sum(
                len(o.get("docs", [])) for o in hist.ops if o["phase"] == "freed" and o["outcome"] == "ok"
            ),
        }
        if r.returncode != -9:
            return {
                **row,
                "restart_ok": False,
                "restart_error": (r.stderr or "")[-300:],
                "lost": -1,
                "resurrected": -1,
                "duplicated": -1,
            }
        return restart_and_check(backend, idx, db, hist, row, error_chars=300)
    finally:
        umount(disk)


if __name__ == "__main__":  # the writer child of run_disk_full
    import sys

    a = json.loads(sys.argv[1])
    disk_full_child(
        a["backend"], Path(a["idx"]), Path(a["db"]) if a["db"] else None, Path(a["history"]), int(a["seed"])
    )
