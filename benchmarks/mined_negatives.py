"""Hard negatives mined by the model itself: BM25 negatives (today) vs dense-mined
negatives without and with the false-negative guard, and BM25 + dense (``mixed``).

    python -m benchmarks.mined_negatives --data scifact [--steps 200] [--num-negatives 3]
    python -m benchmarks.mined_negatives --data synthetic --smoke     # a small end-to-end check
    python -m benchmarks.mined_negatives --data scifact --config runs/quickstart_scifact/stage1/<teacher>/config.yaml

Round 1 trains the base Stage I config on BM25 negatives (``data.negatives: bm25``, one per
example: today's teacher); its towers then mine the training queries' candidates (FAISS Flat) and
round 2 trains the same config from the same start on them (rows ``dense_unguarded``,
``dense_guarded``, ``mixed``; guarded rows use ``--guard``), by default with the mined negatives in
the Eq. 5 denominators as well as the Eq. 9 hinge (the quick start's ``mining_hard_in_denominator``;
``--no-hard-in-denominator``: the hinge only). ``bm25_denominator`` is the ablation that separates
the loss from the mining: BM25 negatives, as many per example and in the same loss as round 2.
Every row reports validation and test
nDCG@10, the paired t-test p of its per-query test nDCG@10 against the BM25 row, the guard's
false-negative measurement (:func:`scalingnote.training.guard_eval.measure_guard`: a fraction of
the judged positives of multi-positive training queries hidden from the known-positive filter)
and the mining time.

Writes benchmarks/results/mined_negatives_<data>.json (``_smoke`` appended for a ``--smoke`` run:
a reduced run never claims the acceptance targets). Runs live under .cache/bench/mined_negatives_<data>/.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import REPO_ROOT, shared_data_dir, write_results
from scalingnote.config import load_config
from scalingnote.data.synth import SynthConfig, synthesize
from scalingnote.evaluation import paired_ttest
from scalingnote.evaluation.dense import exact_search, truncate_normalize
from scalingnote.evaluation.metrics import per_query
from scalingnote.models import load_tower
from scalingnote.quickstart import runs
from scalingnote.quickstart.config import QuickstartConfig, family
from scalingnote.training import TrainConfig, train
from scalingnote.training.data import load_training_data
from scalingnote.training.guard_eval import measure_guard
from scalingnote.training.mining import load_mining_towers

ROWS = ("bm25", "bm25_denominator", "dense_unguarded", "dense_guarded", "mixed")
ROUND2_DEFAULTS = {
    "hard_in_denominator": False,
    "warm_start": False,
}  #: what a results file without the key was measured with


def data_dir_for(name: str, work: Path, smoke: bool) -> Path:
    """A set under ../shared/data, a data directory (e.g. a quick start's ``<run>/data``: its own
    synthetic log), or the synthetic log generated once (smaller with ``smoke``)."""
    if Path(name).is_dir():
        return Path(name)
    shared = shared_data_dir() / name
    if shared.is_dir():
        return shared
    if name != "synthetic":
        raise SystemExit(f"{shared}: no such data set")
    out = work / "synthetic_data"
    if not (out / "corpus.jsonl").is_file():
        synthesize(out, SynthConfig(seed=0, num_docs=300 if smoke else 3000, num_queries=150 if smoke else 1500))
    return out


def base_config(args, data_dir: Path, out: Path) -> dict[str, Any]:
    """Round 1's Stage I config: ``--config`` (a Stage I YAML, e.g. a quick-start teacher's
    ``config.yaml``, trained again here on the qrels pairs: mining needs them, so its triplets
    are dropped) or a CPU-sized TwinBERT on MiniLM."""
    if args.config:
        base = dataclasses.asdict(load_config(TrainConfig, args.config))
        base["data"].update(triplets=None, validation_triplets=None)
    else:
        tower = {"model": "minilm-l6", "trainable_layers": args.trainable_layers, "max_length": 64}
        base = {
            "method": "twinbert",
            "dim": 128,
            "query_tower": tower,
            "doc_tower": {**tower, "max_length": 256},
            "optim": {
                "batch_size": args.batch_size,
                "max_steps": args.steps,
                "epochs": 100.0,
                "lr": 2e-5,
                "head_lr": 1e-3,
            },
            "eval_every": "epoch",
            "patience": 3,
        }
    base["data"] = {
        **base.get("data", {}),
        "data_dir": str(data_dir),
        "validation_fraction": 0.1,
        "eval_overlap": "drop",
        "max_train_examples": args.max_train_examples,
        "max_eval_queries": args.max_eval_queries,
    }
    return {**base, "output_dir": str(out), "seed": args.seed, "show_progress": False}


def row_config(args, base: dict[str, Any], row: str, work: Path, miner: Path | None) -> TrainConfig:
    data = dict(base["data"])
    if row == "bm25":
        return load_config(TrainConfig, {**base, "data": data, "output_dir": str(work / row)})
    data.update(
        num_negatives=args.num_negatives
    )  # bm25_denominator: round 2's loss and count on BM25's negatives (the loss without the mining)
    if row != "bm25_denominator":
        guard = [] if row == "dense_unguarded" else args.guard.split(",")
        data.update(
            negatives="mixed" if row == "mixed" else "dense",
            mining={
                "tower": str(miner),
                "skip_top": args.skip_top,
                "max_rank": args.max_rank,
                "guard": guard,
                "guard_margin": args.guard_margin,
                "guard_top_r": args.guard_top_r,
                "cache_dir": str(work / "mined"),
            },
        )
    return load_config(
        TrainConfig, {**base, "data": data, "output_dir": str(work / row), **round2_overrides(args, base, work)}
    )


def round2_overrides(args, base: dict[str, Any], work: Path) -> dict[str, Any]:
    """Round 2's training settings that differ from round 1's: the mined negatives in the Eq. 5
    denominators (``--hard-in-denominator``; the paper's Eq. 9 hinge keeps its term), and
    ``--warm-start`` from round 1's heads (ANCE's continued training, not a fresh start)."""
    out: dict[str, Any] = {}
    if args.hard_in_denominator:
        out["loss"] = {**base.get("loss", {}), "hard_in_denominator": True}
    if args.warm_start:
        out["init_heads_from"] = str(work / "bm25")
    return out


def per_query_ndcg(cfg: TrainConfig, run_dir: Path, data) -> dict[str, float]:
    """Per-query test nDCG@10 of a finished run (its saved query tower and document embeddings)."""
    qt = load_tower(run_dir / "query_tower")
    d = truncate_normalize(np.load(run_dir / "doc_embeddings.npy"), cfg.dim)
    ids = json.loads((run_dir / "doc_ids.json").read_text(encoding="utf-8"))
    qids = list(data.eval_queries)
    q = truncate_normalize(qt.encode_queries([data.eval_queries[x] for x in qids], show_progress=False), cfg.dim)
    pq = per_query(exact_search(q, qids, d, ids, k=100), data.eval_qrels, ["ndcg@10"])
    return {x: v["ndcg@10"] for x, v in pq.items()}


def guard_measurement(cfg: TrainConfig, miner: Path, fraction: float, seed: int) -> dict[str, Any]:
    """The hidden-positive measurement of ``cfg``'s mining settings (its guard) with the round-1 towers."""
    data = load_training_data(dataclasses.replace(cfg.data, negatives="none"), cfg.seed, show_progress=False)
    positives: dict[str, list[str]] = {}
    for e in data.train + data.validation:
        positives.setdefault(e.query_id, []).append(e.pos.id)
    qt, dt = load_mining_towers(str(miner))
    return measure_guard(
        cfg.data, data.corpus, data.queries, positives, qt, dt, fraction=fraction, seed=seed, tower_dir=miner
    )


def run_row(
    args, base, row: str, work: Path, miner: Path | None, ref: dict[str, float] | None
) -> tuple[dict[str, Any], dict[str, float]]:
    cfg = row_config(args, base, row, work, miner)
    t0 = time.perf_counter()
    res = train(cfg, resume=True, on_change="redo")
    mined = cfg.data.negatives != "bm25"
    data = load_training_data(
        cfg.data, cfg.seed, show_progress=False, out_dir=work / row if mined else None
    )  # mined: the cache
    pq = per_query_ndcg(cfg, work / row, data)
    out: dict[str, Any] = {
        "row": row,
        "negatives": cfg.data.negatives,
        "num_negatives": cfg.data.num_negatives,
        "guard": ",".join(cfg.data.mining.guard) or "none",
        "hard_in_denominator": cfg.loss.hard_in_denominator,
        "val_ndcg@10": res.get("best_val_score"),
        "ndcg@10": round(res["ndcg@10"], 4),
        "test_queries": len(pq),
        "train_seconds": res["train_seconds"],
        "wall_seconds": round(time.perf_counter() - t0, 1),
    }
    if ref is not None:
        t = paired_ttest(pq, ref)
        out.update(p_vs_bm25=round(t.pvalue, 4), diff_vs_bm25=round(t.mean_diff, 4))
    if mined:
        out["mining_seconds"] = (res.get("mining") or {}).get("mining_seconds")
        out["mining_document_embeddings"] = (res.get("mining") or {}).get("document_embeddings")
        m = guard_measurement(cfg, miner, args.hide_fraction, args.seed)
        out.update(
            {
                k if k.startswith("fn_") else f"fn_{k}": v
                for k, v in m.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool)
            }
        )
    return out, pq


def student_row(
    args, teacher_row: str, work: Path, data_dir: Path, teacher_cfg: TrainConfig, ref: dict[str, float] | None
) -> tuple[dict[str, Any], dict[str, float]]:
    """QKD of one teacher row into the quick start's student (its own ``run_qkd``: the family's small
    tower, the same pseudo-queries, corpus texts and step cap), scored like the teachers."""
    fam_name = "llm" if teacher_cfg.method == "scaling_dual" else "bert"
    qcfg = QuickstartConfig(
        data=str(data_dir),
        out=str(work / "qkd_out"),
        seed=0,
        query_max_length=teacher_cfg.query_tower.max_length,
        doc_max_length=teacher_cfg.doc_tower.max_length,
        dim=teacher_cfg.dim,
        show_progress=False,
    )
    fam = family(qcfg, fam_name)
    data = {"beir": str(data_dir), "triplets": None, "validation_triplets": None}
    pseudo = runs.pseudo_queries(qcfg, data, work / "qkd_out")
    t0 = time.perf_counter()
    m = runs.run_qkd(
        qcfg,
        f"from_{teacher_row}",
        work / teacher_row,
        fam,
        fam.small_layers,
        data,
        work / "qkd_out",
        pseudo,
        rank_weight=1.0,
        pool=runs.layer_pool(work / teacher_row),
    )
    d = Path(m["run_dir"])
    qt = load_tower(d / "query_tower")
    docs = truncate_normalize(np.load(work / teacher_row / "doc_embeddings.npy"), teacher_cfg.dim)
    ids = json.loads((work / teacher_row / "doc_ids.json").read_text(encoding="utf-8"))
    ev = load_training_data(teacher_cfg.data, teacher_cfg.seed, show_progress=False)
    qids = list(ev.eval_queries)
    q = truncate_normalize(qt.encode_queries([ev.eval_queries[x] for x in qids], show_progress=False), teacher_cfg.dim)
    pq = {
        x: v["ndcg@10"]
        for x, v in per_query(exact_search(q, qids, docs, ids, k=100), ev.eval_qrels, ["ndcg@10"]).items()
    }
    out: dict[str, Any] = {
        "row": f"student_of_{teacher_row}",
        "student": f"{fam.model} ({fam.small_layers}L, QKD)",
        "qkd_val_loss": m.get("qkd_val_loss"),
        "qkd_steps": m.get("steps_run"),
        "ndcg@10": round(float(np.mean(list(pq.values()))), 4),
        "test_queries": len(pq),
        "wall_seconds": round(time.perf_counter() - t0, 1),
    }
    if ref is not None:
        t = paired_ttest(pq, ref)
        out.update(p_vs_bm25_student=round(t.pvalue, 4), diff_vs_bm25_student=round(t.mean_diff, 4))
    return out, pq


def students(
    args, rows: list[dict[str, Any]], work: Path, data_dir: Path, base: dict[str, Any]
) -> list[dict[str, Any]]:
    """Students of the BM25 teacher and of the round-2 teacher that validates best (the quick start's
    rule: round 2 is kept only when it validates above round 1; when none does, only BM25's)."""
    cfg = load_config(TrainConfig, {**base, "output_dir": str(work / "bm25")})
    r2 = [r for r in rows if r["negatives"] != "bm25" and r.get("val_ndcg@10") is not None]  # the mined rows
    bm = next(r for r in rows if r["row"] == "bm25")
    win = max(r2, key=lambda r: r["val_ndcg@10"]) if r2 else None
    out, ref = [], None
    for teacher in ["bm25"] + ([win["row"]] if win and win["val_ndcg@10"] > bm["val_ndcg@10"] else []):
        r, pq = student_row(args, teacher, work, data_dir, cfg, ref)
        ref = pq if teacher == "bm25" else ref
        out.append(r)
        print(json.dumps(r), flush=True)
    return out


def kept_rows(name: str, args) -> dict[str, dict[str, Any]]:
    """``--keep``: the teacher rows of the earlier results file (same settings), by row name."""
    path = REPO_ROOT / "benchmarks" / "results" / f"{name}.json"
    if not path.exists():
        return {}
    old = json.loads(path.read_text())
    same = (
        "num_negatives",
        "skip_top",
        "max_rank",
        "guard",
        "guard_margin",
        "guard_top_r",
        "hide_fraction",
        "seed",
        *ROUND2_DEFAULTS,
    )
    measured = {**ROUND2_DEFAULTS, **old["config"]}
    diff = [k for k in same if k in measured and measured[k] != getattr(args, k)]
    if diff:
        raise SystemExit(
            f"--keep: {path} was measured with other settings ({', '.join(diff)}); re-run every row instead"
        )
    return {r["row"]: r for r in old["rows"] if r["row"] in ROWS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="scifact", help="a set under ../shared/data, 'synthetic', or a data directory")
    ap.add_argument("--name", default=None, help="the set's name in the results file (default: --data)")
    ap.add_argument("--config", default=None, help="base Stage I YAML (round 1); default: TwinBERT on MiniLM")
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--trainable-layers", type=int, default=2)
    ap.add_argument("--num-negatives", type=int, default=3)
    ap.add_argument("--skip-top", type=int, default=10)
    ap.add_argument("--max-rank", type=int, default=100)
    ap.add_argument(
        "--guard", default="near_positive,agree_top", help="comma-separated guard rules of the guarded rows"
    )
    ap.add_argument("--guard-margin", type=float, default=0.05)
    ap.add_argument("--guard-top-r", type=int, default=30)
    ap.add_argument(
        "--hard-in-denominator",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="round 2 (and bm25_denominator): the negatives join the Eq. 5 denominators (default; --no-...: the "
        "Eq. 9 hinge only)",
    )
    ap.add_argument(
        "--warm-start", action="store_true", help="round 2 starts from round 1's heads (default: from round 1's start)"
    )
    ap.add_argument("--hide-fraction", type=float, default=0.5)
    ap.add_argument("--max-train-examples", type=int, default=None)
    ap.add_argument("--max-eval-queries", type=int, default=None)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument(
        "--students",
        action="store_true",
        help="also distil the quick start's student from the BM25 teacher "
        "and from the round-2 teacher that validates best",
    )
    ap.add_argument(
        "--keep",
        action="store_true",
        help="keep the teacher rows of the earlier results file that --rows does not name",
    )
    ap.add_argument("--smoke", action="store_true", help="a small run: results name gets _smoke; no target is claimed")
    args = ap.parse_args()
    if args.smoke:
        args.steps, args.batch_size, args.trainable_layers = min(args.steps, 60), min(args.batch_size, 16), 0
        args.max_train_examples, args.max_eval_queries = args.max_train_examples or 200, args.max_eval_queries or 60
    name = f"mined_negatives_{args.name or args.data}" + ("_smoke" if args.smoke else "")
    work = REPO_ROOT / ".cache" / "bench" / name
    data_dir = data_dir_for(args.data, work, args.smoke)
    base = base_config(args, data_dir, work / "bm25")
    rows, ref = [], None
    kept = kept_rows(name, args) if args.keep else {}
    todo = args.rows.split(",")
    if kept and "bm25" not in todo:  # the paired tests need the BM25 teacher's per-query scores (its run is reused)
        todo = ["bm25", *todo]
    for row in todo:
        r, pq = run_row(args, base, row, work, None if row == "bm25" else work / "bm25", ref)
        ref = pq if row == "bm25" else ref
        rows.append(r)
        print(json.dumps(r), flush=True)
    measured = {r["row"] for r in rows}
    rows = [kept[k] for k in ROWS if k in kept and k not in measured] + rows
    rows.sort(key=lambda r: ROWS.index(r["row"]) if r["row"] in ROWS else len(ROWS))
    if args.students:
        rows += students(args, rows, work, data_dir, base)
    config = {**vars(args), "base": base, "rows_order": list(ROWS)}
    if kept:
        config["kept_rows"] = (
            f"rows {sorted(set(kept) - measured)} kept from the earlier results file (--keep), the others "
            "measured by this run"
        )
    write_results(name, rows, config)
    print(f"wrote benchmarks/results/{name}.json")


if __name__ == "__main__":
    main()
