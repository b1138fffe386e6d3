"""The live index's drift curve (ScalingNote §3.5): recall@10 of the live index at its
search defaults against exact search while new documents arrive, and after a rebuild. Used by
:mod:`benchmarks.ingest` (its ``drift`` rows) and by ``python -m benchmarks.ingest --drift-only``
(``ingest_drift.json``: one block of rows per structure)."""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import REPO_ROOT, loadavg, write_results
from benchmarks._ingest_backends import index_for


def encode_cached(cache: Path, live, docs) -> np.ndarray:
    """``docs`` encoded by the index's recorded document tower (cached by its fingerprint)."""
    fp = live.manifest["tower"]["fingerprint"]
    ids = hashlib.sha256("\n".join(d.id for d in docs).encode()).hexdigest()[:12]
    path = cache / f"new-{fp}-{len(docs)}-{ids}.npy"
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        X = np.concatenate([live.encode(docs[s : s + 256])[0] for s in range(0, len(docs), 256)])
        np.save(path, X)
    return np.load(path)


# --------------------------------------------------------------------------- drift


def recall_vs_exact(index, X_live: np.ndarray, Q: np.ndarray, k: int = 10) -> float:
    """Recall@k of ``index`` against exact search over ``X_live`` (rows in the order of ``index.doc_ids``)."""
    exact = np.argsort(-(Q @ X_live.T), axis=1)[:, :k]
    live_ids = index.doc_ids
    want = [{live_ids[j] for j in row} for row in exact]
    got = index.search(Q, k).doc_ids
    return float(np.mean([len(w & set(g)) / k for w, g in zip(want, got, strict=True)]))


def phase_drift(run: Any, work: Path, new_docs, cache: Path) -> tuple[list[dict], np.ndarray, np.ndarray]:
    """Recall drift as new documents arrive; returns the rows, the new documents' vectors and the
    test queries' student vectors."""
    from scalingnote.live import LiveIndex
    from scalingnote.models import load_tower

    live_dir = work / "drift"
    shutil.copytree(run.index, live_dir)
    live = LiveIndex.open(live_dir, query_tower=load_tower(run.student))
    n0 = len(live)
    X_base = np.asarray(live.store.vectors.view[:n0], dtype=np.float32)
    X_new = encode_cached(cache, live, new_docs)
    Q = live.store.dense.query_vectors(run.test_texts)
    rows, done = [], 0
    rows.append({"phase": "drift", "added_pct": 0, "n_docs": n0, **_drift_point(live, work, X_base, Q, rebuild=False)})
    for pct in (10, 50, 100):
        upto = min(len(new_docs), n0 * pct // 100)
        for s in range(done, upto, 256):
            live.upsert(new_docs[s : min(upto, s + 256)], vectors=X_new[s : min(upto, s + 256)])
        done = upto
        X_live = np.concatenate([X_base, X_new[:upto]])
        rows.append(
            {
                "phase": "drift",
                "added_pct": pct,
                "n_docs": n0 + upto,
                **_drift_point(live, work, X_live, Q, rebuild=True),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    live.close()
    return rows, X_new, Q


def _drift_point(live, work: Path, X_live, Q, rebuild: bool) -> dict:
    from scalingnote.live import LiveIndex

    out = {
        "recall@10_live": round(recall_vs_exact(live, X_live, Q), 4),
        "recall_estimate": round(live.recall_estimate(sample=256) or 0, 4),
        "added_share": live.stats()["added_share"],
    }
    if rebuild:
        copy = work / f"rebuilt-{len(X_live)}"  # the same documents, codebooks retrained (`index rebuild`)
        shutil.copytree(live.root, copy)
        rb = LiveIndex.open(copy)
        t0 = time.perf_counter()
        rb.rebuild()
        out["rebuild_s"] = round(time.perf_counter() - t0, 2)
        out["recall@10_rebuilt"] = round(recall_vs_exact(rb, X_live, Q), 4)
        rb.close()
        shutil.rmtree(copy)
    return out


def _compared_setting(manifest: dict, method: str, index_dir: Path) -> str:
    """A structure rebuilt over the run's vectors searches at the setting the quick start's own
    comparison (``search_tuning.methods``) found for it on validation queries, when it has one."""
    from scalingnote.index.tune import save_search_defaults

    row = next(
        (
            m
            for m in (manifest.get("search_tuning") or {}).get("methods", [])
            if m.get("method") == method and m.get("setting")
        ),
        None,
    )
    if row is None:
        return "rebuilt over the same vectors, build defaults"
    save_search_defaults(index_dir, {"chosen": dict(row["setting"]), "knob": row["knob"]})
    return f"rebuilt over the same vectors, at the setting the quick start's comparison found: {row['setting']}"


def drift_only(args, run: Any, new_docs, load0, t_start: float) -> None:
    """``--drift-only``: the drift curve of one structure (the live index keeps the
    chosen structure as documents arrive), rows merged by method into ``ingest_drift.json``."""
    with tempfile.TemporaryDirectory(prefix="sn-drift-") as d:
        work = Path(d)
        own = dict(run.manifest)  # the run's index, before a rebuilt copy replaces it
        built = (own.get("routing") or {}).get("method")
        run.use_index(index_for(run, args.method, work))
        how = "chosen by the quick start"
        if args.method not in ("chosen", built):
            how = _compared_setting(own, args.method, run.index)
        man = json.loads((run.index / "manifest.json").read_text())
        method = (man.get("routing") or {}).get("method") or "factory"
        label = f"{method} ({how})"
        drift, _, _ = phase_drift(run, work, new_docs, args.cache)
    rows = [
        {
            "method": label,
            "structure": man.get("factory"),
            "search_defaults": json.dumps(man.get("search_defaults"), sort_keys=True),
            **r,
        }
        for r in drift
    ]
    path = REPO_ROOT / "benchmarks" / "results" / "ingest_drift.json"
    old = json.loads(path.read_text()) if path.exists() else {"rows": [], "config": {}}
    rows = [r for r in old["rows"] if r["method"] != label] + rows
    config = {
        "run": str(args.run),
        "n_base": int(man.get("n_vectors", 0)),
        "n_new": len(new_docs),
        "seed": args.seed,
        "queries": "the run's test queries encoded by the served student; recall@10 of the live index at its "
        "search defaults vs "
        "exact search over every live vector, and after `rebuild` (codebooks retrained)",
        "new_documents": "synthetic notes beyond the built corpus" if args.new_docs is None else str(args.new_docs),
        "seconds": {**old["config"].get("seconds", {}), label: round(time.perf_counter() - t_start, 1)},
        **loadavg(load0),
    }
    print(f"wrote {write_results('ingest_drift', rows, config)}", flush=True)
