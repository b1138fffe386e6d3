"""The design and the points of :mod:`benchmarks.scaling_trained` (its protocol is in that
module's docstring): the families and their grids, the fitted and held-out points, one point's
settings and tower configuration, the shared data (training pool, dev and test sets), training the
points (resumable) and reading them back as rows, and the fits of the fitted points. Shared by
:mod:`benchmarks.scaling_trained` (the phases' entry) and :mod:`benchmarks.scaling_trained_report`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks._common import shared_data_dir


@dataclass(frozen=True)
class Family:
    """One model family of the size axis: every depth is the same pre-trained model truncated."""

    name: str
    model: str
    method: str
    depths: tuple[int, ...]
    doc_max: int  #: document tokens (an LLM's includes its 56-token §3.2 prompt: 128 of text either way)
    pooling: str | None = None
    data_depth: int | None = None  #: the model of L(D) (None: no data axis for this family)
    joint_extra: tuple[tuple[int, int], ...] = ()  #: D varies at more than one N: the joint law's interaction
    eval_every: int = 30  #: dev validation period in steps (SmolLM2: 50, its validations cost more CPU time)


FAMILIES = {
    "minilm": Family(
        "minilm", "minilm-l6", "twinbert", (1, 2, 3, 4, 5, 6), 128, data_depth=2, joint_extra=((4, 256), (1, 512))
    ),
    "smollm2": Family(
        "smollm2", "smollm2-135m", "scaling_dual", (1, 2, 3, 4, 6), 128 + 56, pooling="mean", eval_every=50
    ),
    # the same protocol up to the whole 30-layer tower (held out): for a GPU (scripts/device_scaling_trained.sh)
    "smollm2_full": Family(
        "smollm2_full", "smollm2-135m", "scaling_dual", (1, 2, 4, 8, 16, 30), 128 + 56, pooling="mean", eval_every=50
    ),
}
MODEL_D = 4096  #: the data size of L(N)
D_GRID = [64, 128, 256, 512, 1024, 2048, 4096]
QUERY_MAX = 32


def fitted_points(fam: Family, axis: str = "all") -> list[tuple[int, int, str]]:
    """``axis="model"``: the model-size axis only (L(N) at D = MODEL_D)."""
    pts = [(d, MODEL_D, "model") for d in fam.depths[:-1]]
    if fam.data_depth is not None and axis == "all":
        pts += [(fam.data_depth, D, "data") for D in D_GRID if D != MODEL_D]
    return pts + [(n, D, "joint") for n, D in fam.joint_extra]


def heldout_points(fam: Family, pool_size: int, axis: str = "all") -> list[tuple[int, int, str]]:
    out = [(fam.depths[-1], MODEL_D, "heldout_largest_n")]
    if fam.data_depth is not None and axis == "all":
        out += [(fam.data_depth, pool_size, "heldout_largest_d"), (fam.depths[-1], 256, "heldout_corner")]
    return out


def settings(args, fam: Family):
    from scalingnote.scaling.points import PointSettings

    every = fam.eval_every
    return PointSettings(
        lr=args.lr,
        head_lr=1e-3,
        batch_size=32,
        max_steps=args.steps,
        min_eval_every=every,
        max_eval_every=every,
        patience=3,
        warmup_steps=20,
        schedule="constant",
        seed=args.seed,
    )


def family_dir(args, fam: Family) -> Path:
    return args.work if fam.name == "minilm" else args.work / fam.name


def session_config(fam: Family, depth: int, args, out: Path):
    from scalingnote.config import load_config
    from scalingnote.training import TrainConfig

    tower = {
        "model": fam.model,
        "num_layers": depth,
        "trainable_layers": "all",
        **({"pooling": fam.pooling} if fam.pooling else {}),
    }
    return load_config(
        TrainConfig,
        {
            "method": fam.method,
            "output_dir": str(out),
            "dim": 128,
            "query_tower": {**tower, "max_length": QUERY_MAX},
            "doc_tower": {**tower, "max_length": fam.doc_max},
            "data": {"data_dir": str(shared_data_dir() / args.data), "negatives": "none"},
            "optim": {"batch_size": 32, "lr": args.lr, "head_lr": 1e-3},
            "center_samples": 512,
            "projection_init": "pca",
            "seed": args.seed,
            "show_progress": False,
        },
    )


def load(args):
    """(pool, dev over a fixed 768-document pool, test over the corpus, corpus, digest)."""
    import numpy as np

    from benchmarks._heads_recipe import ict_dir
    from benchmarks.scaling_sweep import load_pool, pool_digest
    from scalingnote.scaling.points import make_eval_set

    pool, dev_full, test, corpus, queries = load_pool(
        args.data, ict_dir(args.work / "pseudo_ict", args.data, args.seed), args.seed
    )
    rng = np.random.default_rng(args.seed + 7)
    ids = list(corpus)
    keep = {ids[i] for i in rng.choice(len(ids), size=768, replace=False)} | {
        d for q in dev_full.qrels.values() for d in q
    }
    dev = make_eval_set(queries, dev_full.qrels, sorted(keep), seed=args.seed + 1, name="dev", pool=True)
    return pool, dev, test, corpus, pool_digest(pool, dev, test)


def run(fam: Family, points: list[tuple[int, int, str]], args) -> None:
    import torch

    from scalingnote.scaling.points import run_point
    from scalingnote.scaling.trained import TowerSession

    torch.set_num_threads(args.threads)
    pool, dev, test, corpus, digest = load(args)
    st = settings(args, fam)
    root = family_dir(args, fam)
    session, at = None, None
    for depth, D, role in sorted(points, key=lambda p: p[0]):  # one model in memory, loaded once per depth
        key = f"{fam.model}|{depth}|{D}|{digest}|{st}"
        out = root / f"d{depth}" / f"D{D}"
        if (out / "point.json").exists() and json.loads((out / "point.json").read_text()).get("key") == key:
            continue
        if at != depth:
            session = None  # free the previous depth's towers before loading the next
            session, at = TowerSession(session_config(fam, depth, args, root / f"d{depth}"), corpus), depth
        t0 = time.perf_counter()
        rec = run_point(
            session,
            pool[:D],
            dev,
            test,
            out,
            st,
            extra={
                "key": key,
                "role": role,
                "depth": depth,
                "D": D,
                "human_pairs": sum(e.source == "human" for e in pool[:D]),
            },
        )
        print(
            f"[scaling_trained] {fam.name} d{depth} D{D} ({role}): test ppl {rec['test_contrastive_ppl']:.4f} "
            f"nDCG@10 {rec['ndcg@10']:.4f} "
            f"dev {rec['start_dev_contrastive_ppl']:.4f}->{rec['dev_contrastive_ppl']:.4f} steps {rec['steps_run']} "
            f"(best {rec['best_step']}) {time.perf_counter() - t0:.0f}s",
            flush=True,
        )


def rows(args, fam: Family) -> list[dict]:
    """The finished points of ``fam`` trained with the current settings (``_per_query``: each test
    query's loss, for paired tests between points)."""
    import numpy as np

    st = str(settings(args, fam))
    out = []
    for f in sorted(family_dir(args, fam).glob("d*/D*/point.json")):
        r = json.loads(f.read_text(encoding="utf-8"))
        if not r.get("key", "").startswith(f"{fam.model}|") or not r["key"].endswith(st):
            continue
        # the mean contrastive loss of each test query (queries without a scored pair have none)
        query_loss = {qid: v[2] for qid, v in r["per_query"].items() if len(v) > 2}
        per_query = list(query_loss.values())
        out.append(
            {
                "_per_query": query_loss,
                "loss_se": round(float(np.std(per_query, ddof=1) / np.sqrt(len(per_query))), 4),
                "role": r["role"],
                "family": fam.name,
                "method": fam.method,
                "depth": r["depth"],
                "N": r["non_embedding_params"]["query"],
                "D": r["D"],
                "loss": r["test_contrastive_ppl"],
                "ndcg@10": r["ndcg@10"],
                "r@100": r["r@100"],
                "start_dev_contrastive_ppl": r["start_dev_contrastive_ppl"],
                "dev_contrastive_ppl": r["dev_contrastive_ppl"],
                "dev_curve": " ".join(f"{a}:{b:.4f}" for a, b in r["dev_curve"]),
                "human_pairs": r["human_pairs"],
                "steps_run": r["steps_run"],
                "best_step": r["best_step"],
                "train_seconds": r["train_seconds"],
            }
        )
    return sorted(out, key=lambda r: (r["depth"], r["D"]))


def laws(fit_rows: list[dict], fam: Family) -> dict:
    """The fits of the fitted points: {"model": L(N) at D = MODEL_D, "data": L(D), "joint": L(N, D)} (the
    last two where the family has a data axis)."""
    from scalingnote.scaling.fit import fit_table

    out = {"model": fit_table([r for r in fit_rows if r["D"] == MODEL_D], "model")}
    if fam.data_depth is not None and len({r["D"] for r in fit_rows if r["depth"] == fam.data_depth}) >= 4:
        out["data"] = fit_table([r for r in fit_rows if r["depth"] == fam.data_depth], "data")
        out["joint"] = fit_table(fit_rows, "joint")
    return out


__all__ = [
    "D_GRID",
    "FAMILIES",
    "MODEL_D",
    "QUERY_MAX",
    "Family",
    "family_dir",
    "fitted_points",
    "heldout_points",
    "laws",
    "load",
    "rows",
    "run",
    "session_config",
    "settings",
]
