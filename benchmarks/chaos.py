"""Chaos benchmark: SIGKILL the pipeline at seeded random moments, run the same command
again, and check that it resumes and ends with the outputs of an uninterrupted run.

Stages (tiny random SmolLM2-shaped LLM + tiny BERT from ``scalingnote.models.tiny``, the
synthetic note-search log; the settings of ``tests/test_quickstart.py``):

* ``stage1``     ``scalingnote train --config stage1.yaml --output-dir T`` (ScalingDual, 30 steps, checkpoints every 10)
* ``qkd_cache``  ``scalingnote distill --config qkd.yaml`` (teacher cache + QKD training)
* ``index_encode`` ``scalingnote index encode`` (16-document shards)
* ``index_build``  ``scalingnote index build --overwrite`` (IVF + PQ + semantic IDs)
* ``quickstart`` ``scalingnote quickstart`` (every step above, end to end)

Each command runs in a forked child of this process (the heavy imports are paid once, so
the kill moments fall inside the real work, not in ``import torch``). Per stage: one
uninterrupted reference run (its wall time D), then ``--trials`` runs, each killed with
SIGKILL at a seeded uniform moment in [0.05 D, 0.95 D], then the same command again in the
same directory, to completion. Per trial:

* ``half_written``: right after the kill, every visible file of the output directory
  (names not starting with ``.`` and not ``*.tmp``) is opened with its reader (JSON, JSONL,
  YAML, ``.npy``, safetensors, ``.pt`` via the weights-only loader, FAISS); files that fail
  to parse are counted (must be 0);
* ``resumed_ok``: the second run exits 0;
* ``outputs_identical``: every output file equals the reference run's (binary files
  byte-for-byte; JSON/JSONL/YAML after dropping wall-clock fields — seconds, timestamps,
  versions — and replacing the run directory by a placeholder); ``differing`` lists the
  files that do not.

Run: ``.venv/bin/python -m benchmarks.chaos`` (``--trials 4`` per stage: 20 trials).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse
import hashlib
import importlib
import json
import random
import re
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks._chaos_stages import models_of, prepare, quickstart_args, stage_commands
from benchmarks._common import REPO_ROOT, write_results
from scalingnote.cli import COMMANDS

STAGES = ("index_build", "index_encode", "qkd_cache", "stage1", "quickstart")
_VOLATILE = re.compile(
    r"(seconds|_s$|^t_|time|created|elapsed|per_s|qps|duration|versions|machine|^host|hostname|pid|date|resumed|_ms$|started|finished|walltime|last_run)",
    re.I,
)
#: a feature-cache part (``scalingnote.models.prefix.FeatureCache``): unique per writing process
_CACHE_PART = re.compile(r"^part-\d{5}-\d+-[0-9a-f]{8}\.(json|npy)$")


# ------------------------------------------------------------------ running a command in a forked child


def _child(argv: list[str], log: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    code = 0
    try:
        from scalingnote.cli import main

        main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run(argv: list[str], log: Path, kill_after: float | None = None) -> dict[str, Any]:
    """Fork, run ``scalingnote argv`` in the child; SIGKILL it after ``kill_after`` s if given."""
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # child
        _child(argv, str(log))
    killed = False
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if kill_after is not None and time.perf_counter() - t0 >= kill_after:
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            killed = True
            break
        time.sleep(0.005)
    el = time.perf_counter() - t0
    code = os.waitstatus_to_exitcode(status)
    return {"seconds": el, "exit": code, "killed": killed}


# ------------------------------------------------------------------ readers and comparison


def _visible(root: Path) -> list[Path]:
    out = []
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if any(part.startswith(".") or part.endswith(".tmp") or ".tmp" in part for part in rel.parts):
            continue  # temporary names: never read by the pipeline
        if p.is_file():
            out.append(p)
    return out


def _read(p: Path) -> Any:
    """Open ``p`` with the reader the pipeline would use (raises if half-written)."""
    import numpy as np
    import yaml

    name = p.name
    if name.endswith(".jsonl"):
        return [json.loads(ln) for ln in p.read_text(encoding="utf-8").splitlines() if ln.strip()]
    if name.endswith(".json") or name == "DONE":
        return json.loads(p.read_text(encoding="utf-8"))
    if name.endswith((".yaml", ".yml")):
        return yaml.safe_load(p.read_text(encoding="utf-8"))
    if name.endswith(".npy"):
        return np.load(p, mmap_mode=None)
    if name.endswith(".safetensors"):
        from safetensors.numpy import load_file

        return load_file(str(p))
    if name.endswith(".pt"):
        from scalingnote.training.checkpoint import safe_torch_load

        return safe_torch_load(p)
    if name.endswith((".faiss", ".index")):
        import faiss

        return faiss.read_index(str(p))
    if name.endswith((".tsv", ".txt", ".trec", ".md")):
        return p.read_text(encoding="utf-8")
    return p.read_bytes()


def half_written(root: Path) -> list[str]:
    bad = []
    if not root.exists():
        return bad
    for p in _visible(root):
        try:
            _read(p)
        except Exception as e:  # noqa: BLE001 - the finding this check looks for
            bad.append(f"{p.relative_to(root)}: {type(e).__name__}: {str(e)[:120]}")
    return bad


def _strip(obj: Any, root: str) -> Any:
    if isinstance(obj, dict):
        return {k: _strip(v, root) for k, v in obj.items() if not _VOLATILE.search(str(k))}
    if isinstance(obj, list):
        return [_strip(v, root) for v in obj]
    if isinstance(obj, str):
        return obj.replace(root, "<RUN>")
    if isinstance(obj, float):
        return float(f"{obj:.12g}")
    return obj


def _canon(obj: Any, root: str) -> Any:
    """Tensors / arrays -> dtype, shape and a hash of their bytes; containers recursively."""
    import numpy as np
    import torch

    if isinstance(obj, torch.Tensor):
        obj = obj.detach().cpu().contiguous()
        return [
            "tensor",
            str(obj.dtype),
            list(obj.shape),
            hashlib.sha256(obj.reshape(-1).view(torch.uint8).numpy().tobytes() if obj.numel() else b"").hexdigest(),
        ]
    if isinstance(obj, np.ndarray):
        return [
            "ndarray",
            str(obj.dtype),
            list(obj.shape),
            hashlib.sha256(np.ascontiguousarray(obj).tobytes()).hexdigest(),
        ]
    if isinstance(obj, dict):
        return {str(k): _canon(v, root) for k, v in obj.items() if not _VOLATILE.search(str(k))}
    if isinstance(obj, (list, tuple)):
        return [_canon(v, root) for v in obj]
    return _strip(obj, root)


def _cache_rows(cache_dir: Path) -> str:
    """Logical content of a feature cache: a hash over (key, row bytes), sorted by key. Part files
    are named per writing process (pid + random), so a resumed fill names and splits its parts
    differently from an uninterrupted one while caching the same rows; an ``.npy`` without its
    ``.json`` is an interrupted part the reader never sees (FeatureCache counts a part by its json)."""
    import numpy as np

    rows: dict[str, str] = {}
    for pj in sorted(cache_dir.glob("part-*.json")):
        if not _CACHE_PART.match(pj.name):
            continue
        info = json.loads(pj.read_text(encoding="utf-8"))
        arr = np.load(pj.with_suffix(".npy"))
        offs = info.get("offsets")
        for i, k in enumerate(info["keys"]):
            row = arr[i] if offs is None else arr[offs[i] : offs[i + 1]]
            rows.setdefault(k, hashlib.sha256(np.ascontiguousarray(row).tobytes()).hexdigest())
    return hashlib.sha256(json.dumps(sorted(rows.items())).encode()).hexdigest()


def digest(root: Path) -> dict[str, str]:
    """Normalised content hash of every visible output file, by relative path (feature caches:
    by their logical rows, see :func:`_cache_rows`)."""
    out = {}
    r = str(root.resolve())
    for p in _visible(root):
        if _CACHE_PART.match(p.name) and (p.parent / "meta.json").is_file():
            rel_dir = str(p.parent.relative_to(root))
            if f"{rel_dir}/[rows]" not in out:
                out[f"{rel_dir}/[rows]"] = _cache_rows(p.parent)
            continue
        rel = str(p.relative_to(root))
        if rel.endswith(".log") or "/logs/" in f"/{rel}" or rel.endswith("tfevents"):
            continue
        name = p.name
        if name.endswith((".json", ".jsonl", ".yaml", ".yml")) or name == "DONE":
            try:
                obj = _read(p)
                data = json.dumps(_strip(obj, r), sort_keys=True, default=str).encode()
            except Exception:  # noqa: BLE001
                data = p.read_bytes()
        elif name.endswith(".pt"):  # torch's zip records the (temporary) file name: compare the contents
            data = json.dumps(_canon(_read(p), r), sort_keys=True, default=str).encode()
        elif name.endswith((".tsv", ".txt", ".trec", ".md")):
            data = p.read_text(encoding="utf-8", errors="replace").replace(r, "<RUN>").encode()
        else:
            data = p.read_bytes()
        out[rel] = hashlib.sha256(data).hexdigest()
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=REPO_ROOT / ".cache" / "chaos")
    ap.add_argument("--trials", type=int, default=4, help="Killed runs per stage.")
    ap.add_argument(
        "--stage-trials",
        default="",
        help="Per-stage trial counts overriding --trials, e.g. index_build=6,quickstart=1.",
    )
    ap.add_argument("--stages", nargs="*", default=list(STAGES), choices=STAGES)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--reuse-references",
        action="store_true",
        help="Keep the reference runs of a previous invocation (same --work).",
    )
    ap.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="Stop starting new trials after this many minutes (results so far are written).",
    )
    return ap.parse_args(argv)


def _import_stages() -> None:
    """Every stage's heavy imports once, before forking."""
    for stage in sorted({m for m, _ in COMMANDS.values()}):
        importlib.import_module(f"scalingnote.cli.{stage}")
    import scalingnote.distill
    import scalingnote.index
    import scalingnote.quickstart
    import scalingnote.training  # noqa: F401


def reference_runs(args) -> tuple[dict[str, Any], dict[str, dict[str, str]], dict[str, float]]:
    """The uninterrupted reference run of each stage (kept from an earlier invocation with
    ``--reuse-references``) -> (stage commands, output digests, wall times)."""
    work = args.work
    ref_qs = work / "ref" / "quickstart"
    durations_file = work / "ref" / "durations.json"
    ref_durations = json.loads(durations_file.read_text()) if args.reuse_references and durations_file.is_file() else {}
    if not ref_durations:  # a fresh start: tiny models and the reference quick start
        if work.exists():
            shutil.rmtree(work)
        work.mkdir(parents=True)
        (work / "logs").mkdir()
        prepare(work, args.seed)
        r = run(quickstart_args(models_of(work), ref_qs, args.seed), work / "logs" / "ref_quickstart.log")
        if r["exit"] != 0:
            raise SystemExit(f"reference quickstart failed: see {work / 'logs' / 'ref_quickstart.log'}")
        ref_durations = {"quickstart": r["seconds"]}
    else:
        shutil.rmtree(work / "trials", ignore_errors=True)
    models = models_of(work)
    cmds = stage_commands(work, models, ref_qs, args.seed)
    if not (work / "encode_for_build" / "manifest.json").is_file():
        r = run(cmds["_encode_for_build"](), work / "logs" / "encode_for_build.log")
        assert r["exit"] == 0, "encode for index_build failed"
    refs = {"quickstart": digest(ref_qs)}
    for stage in args.stages:
        if stage == "quickstart":
            continue
        out = work / "ref" / stage
        if stage not in ref_durations or not out.exists():  # uninterrupted reference run
            shutil.rmtree(out, ignore_errors=True)
            r = run(cmds[stage](out), work / "logs" / f"ref_{stage}.log")
            if r["exit"] != 0:
                raise SystemExit(f"reference {stage} failed: see {work / 'logs' / f'ref_{stage}.log'}")
            ref_durations[stage] = r["seconds"]
            durations_file.write_text(json.dumps(ref_durations))
        refs[stage] = digest(out)
        print(f"reference {stage}: {ref_durations[stage]:.1f}s, {len(refs[stage])} files", flush=True)
    durations_file.write_text(json.dumps(ref_durations))
    return cmds, refs, ref_durations


def trial_order(args) -> list[tuple[str, int]]:
    """(stage, trial index) round robin over the stages, ``--stage-trials`` overriding ``--trials``."""
    counts = {st: args.trials for st in args.stages}
    for item in filter(None, args.stage_trials.split(",")):
        k, _, v = item.partition("=")
        counts[k.strip()] = int(v)
    return [(stage, i) for i in range(max(counts.values())) for stage in args.stages if i < counts[stage]]


def kill_and_resume(cmd, out: Path, log: Path, kill_at: float, ref: dict[str, str]) -> dict[str, Any]:
    """Run ``cmd(out)`` killed at ``kill_at`` s, count the half-written files, run it again to the end
    and compare its outputs with the reference digests -> the trial's columns."""
    first = run(cmd(out), log, kill_after=kill_at)
    bad = half_written(out)
    second = run(cmd(out), log)
    got = digest(out) if second["exit"] == 0 else {}
    differing = sorted(k for k in set(ref) | set(got) if ref.get(k) != got.get(k))
    return {
        "killed": first["killed"],
        "first_exit": first["exit"],
        "half_written_files": len(bad),
        "resumed_ok": second["exit"] == 0,
        "resume_s": round(second["seconds"], 2),
        "outputs_identical": second["exit"] == 0 and not differing,
        "files_compared": len(ref),
        "differing": "; ".join(differing[:6]) + (f" (+{len(differing) - 6})" if len(differing) > 6 else ""),
        "half_written": "; ".join(bad[:3]),
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    _import_stages()
    work = args.work
    t0 = time.perf_counter()
    cmds, refs, ref_durations = reference_runs(args)

    rng = random.Random(args.seed)
    rows: list[dict[str, Any]] = []
    trial = 0
    for stage, i in trial_order(args):
        if args.max_minutes is not None and time.perf_counter() - t0 > 60 * args.max_minutes:
            print(f"time limit: stopping after {len(rows)} trials", flush=True)
            break
        trial += 1
        d = ref_durations[stage]
        kill_at = round(rng.uniform(0.05, 0.95) * d, 3)
        out, log = work / "trials" / f"{stage}-{i}", work / "logs" / f"{stage}-{i}.log"
        row = {
            "trial": trial,
            "stage": stage,
            "kill_at_s": kill_at,
            "reference_s": round(d, 2),
            **kill_and_resume(cmds[stage], out, log, kill_at, refs[stage]),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
        _write(rows, args, ref_durations, t0)
    path = _write(rows, args, ref_durations, t0)
    print(f"wrote {path}", flush=True)


def _write(rows: list[dict[str, Any]], args, ref_durations: dict, t0: float) -> Path:
    config = {
        "stages": args.stages,
        "trials_per_stage": args.stage_trials or args.trials,
        "references_reused": args.reuse_references,
        "reference_time_note": "uninterrupted wall time of each stage, measured from fork (with "
        "--reuse-references: the times of the earlier invocation)",
        "seed": args.seed,
        "kill": "SIGKILL at uniform(0.05, 0.95) x the stage's uninterrupted wall time, measured from fork",
        "reference_seconds": {k: round(v, 2) for k, v in ref_durations.items()},
        "models": "tiny random models (scalingnote.models.tiny: 2-layer LLM, 2-layer BERT), synthetic log 120 "
        "docs / 60 queries",
        "compare": "binary files byte-identical; JSON/JSONL/YAML equal after dropping wall-clock keys ("
        + _VOLATILE.pattern
        + ") and the run path",
        "totals": {
            "trials": len(rows),
            "killed": sum(r["killed"] for r in rows),
            "resumed_ok": sum(r["resumed_ok"] for r in rows),
            "outputs_identical": sum(r["outputs_identical"] for r in rows),
            "half_written_files": sum(r["half_written_files"] for r in rows),
        },
        "wall_s": round(time.perf_counter() - t0, 1),
        "note": "2 CPU cores shared with other jobs (the machine was shared); times are noisy, correctness "
        "columns are not.",
    }
    return write_results("chaos", rows, config)


if __name__ == "__main__":
    main()
