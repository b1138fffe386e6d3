"""The quick start's Stage I steps: the large and small towers' runs and the zero-shot start of a
family. Each is a step (:mod:`scalingnote.quickstart.step_markers`): reused when its inputs match,
redone (saying what changed) when they do not. The data step (:mod:`scalingnote.quickstart.run_data`)
and the Stage II steps (:mod:`scalingnote.quickstart.qkd_runs`) are importable from here too."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from scalingnote.config import load_config
from scalingnote.data import load_corpus
from scalingnote.models import (
    DocumentTower,
    PrefixTower,
    QueryTower,
    fill_pooled_depths,
    load_tower,
    pair_towers,
)
from scalingnote.models.info import hidden_size as model_hidden_size
from scalingnote.models.layers import is_bottom
from scalingnote.models.towers import matryoshka_dims_for
from scalingnote.quickstart.choose import default_unless_separated
from scalingnote.quickstart.config import Family, QuickstartConfig
from scalingnote.quickstart.qkd_runs import (
    layer_pool,
    pseudo_queries,
    qkd_name,
    run_qkd,
    student_base,
)
from scalingnote.quickstart.run_data import corpus_file, data_fingerprint, prepare_data
from scalingnote.quickstart.step_markers import (
    COSMETIC,
    banner,
    mark_done,
    on_gpu,
    step_digest,
    step_done,
    step_inputs,
    step_is_done,
)
from scalingnote.training import TrainConfig, train
from scalingnote.utils import write_json


# ---------------------------------------------------------------------------- Stage I
def data_spec(cfg: QuickstartConfig, data: dict) -> dict[str, Any]:
    """The ``DataSpec`` of every Stage I run over ``data`` (the same split, the same held-out queries);
    ``data["spec"]``: more DataSpec fields (the mining round's mined negatives)."""
    return {
        "data_dir": data["beir"],
        "triplets": data["triplets"],
        "validation_triplets": data["validation_triplets"],
        "eval_split": cfg.eval_split,
        "max_eval_queries": cfg.max_eval_queries,
        "eval_overlap": "drop",  # any BEIR set: never train on a test query (KUAKE-QTR reuses them)
        **data.get("spec", {}),
    }


def stage1_config(
    cfg: QuickstartConfig,
    method: str,
    data: dict,
    out_dir: Path,
    q: dict,
    d: dict,
    *,
    lr: float,
    head_lr: float,
    max_epochs: float,
    init_heads_from: str | None = None,
    dim: int | None = None,
):
    """A Stage I run's TrainConfig; ``dim`` = its embedding size (None = ``cfg.dim``), with the
    Matryoshka sizes {16, 32, ..., dim/2, dim} of §3.2."""
    heads_only = q["trainable_layers"] == 0 and d["trainable_layers"] == 0
    dim = dim or cfg.dim
    return load_config(
        TrainConfig,
        {
            "method": method,
            "output_dir": str(out_dir),
            "dim": dim,
            "loss": {"dims": matryoshka_dims_for(dim), **data.get("loss", {})},  # data["loss"]: the mining round's
            "query_tower": q,
            "doc_tower": d,
            "data": data_spec(cfg, data),
            "optim": {
                "batch_size": cfg.batch_size,
                "micro_batch_size": cfg.micro_batch_size,
                "max_steps": cfg.steps,
                "epochs": max_epochs,
                "lr": lr,
                "head_lr": head_lr,
            },
            "seed": cfg.seed,
            "feature_cache_dir": str(Path(cfg.out).resolve() / "features"),  # shared by every run over this data
            "center_samples": 100_000 if heads_only else 1024,  # cached features make the head fit cheap
            "eval_every": "epoch",  # validation queries: held out from the training split / triplets
            "patience": cfg.patience,
            "save_every": 50,
            "precision": cfg.precision,
            "evaluate_zero_shot": False,
            "init_heads_from": init_heads_from,
            "show_progress": cfg.show_progress,
        },
    )


def run_stage1(
    cfg: QuickstartConfig,
    name: str,
    method: str,
    data: dict,
    out: Path,
    q: dict,
    d: dict,
    *,
    lr: float,
    head_lr: float,
    max_epochs: float,
    init_heads_from: str | None = None,
    dim: int | None = None,
) -> dict[str, Any]:
    """Train (or reuse) one Stage I run under ``out/stage1/<name>``; returns its metrics + ``run_dir``."""
    run_dir = out / "stage1" / name
    tc = stage1_config(
        cfg,
        method,
        data,
        run_dir,
        q,
        d,
        lr=lr,
        head_lr=head_lr,
        max_epochs=max_epochs,
        init_heads_from=init_heads_from,
        dim=dim,
    )
    return stage1_step(tc, name, data)


def stage1_step(tc: TrainConfig, name: str, data: dict, **more: Any) -> dict[str, Any]:
    """Train (or reuse) the Stage I run ``tc`` (its ``output_dir``) as a step; ``more``: further inputs."""
    run_dir = Path(tc.output_dir)
    inputs = _stage1_inputs(tc, data, **more)
    if not step_done(run_dir, inputs):
        banner(f"Stage I: {name}")
        res = train(tc, resume=True, on_change="redo")  # the step's own digest decided: redo, never refuse
        mark_done(run_dir, inputs, {"best_val_score": res.get("best_val_score")})
    m = json.loads((run_dir / "run.json").read_text())["metrics"]
    return dict(m, run_dir=str(run_dir))


def _stage1_inputs(tc: TrainConfig, data: dict, **more: Any) -> dict[str, Any]:
    """A Stage I step's inputs: its config, the data's fingerprint and ``more``."""
    return step_inputs(tc, data=data_fingerprint(data), **more)


def family_method(fam: Family) -> str:
    """Stage I's method name for two towers of one family (it checks the towers' kinds): the
    matched-cost rows differ in tower sizes, not kinds, so ScalingDoc's small query tower and
    large document tower of one family train under that family's dual method."""
    return "scaling_dual" if fam.name == "llm" else "twinbert"


def large_tower_runs(
    cfg: QuickstartConfig,
    fam: Family,
    data: dict,
    out: Path,
    head_lrs: dict[int | None, list[float]] | None = None,
    *,
    dim: int | None = None,
) -> dict[int | None, dict[str, Any]]:
    """The family's large dual tower at each candidate depth (``fam.depths``), each with the best
    head learning rate of ``cfg.head_lrs`` (or ``head_lrs[depth]``: the ones still in after the
    proxy) on validation; {depth: metrics (+ ``lr_grid``, ``lr_scores`` {lr: validation nDCG@10})}.
    ``dim``: the embedding size (None: ``cfg.dim``)."""
    grid = [(depth, hl) for depth in fam.depths for hl in (head_lrs or {}).get(depth, cfg.head_lrs)]
    if not all(_large_done(cfg, fam, data, out, depth, hl, dim=dim) for depth, hl in grid):
        prefill_depth_caches(cfg, fam, data)  # a resumed run whose candidates are all done passes no corpus
    res = {}
    for depth in fam.depths:
        tried, ms, scores = [], {}, {}
        for hl in (head_lrs or {}).get(depth, cfg.head_lrs):
            run = _large_run(cfg, fam, data, out, depth, hl, dim=dim)
            ms[hl] = dict(run, head_lr=hl, depth=depth, dim=dim or cfg.dim)
            tried.append(f"{hl:g}:{ms[hl]['best_val_score']:.4f}")
            scores[hl] = ms[hl]["best_val_score"]
        # the declared default (the first configured rate) unless another is better beyond the noise
        lr, why = default_unless_separated(
            scores,
            {k: m.get("best_val_per_query") for k, m in ms.items()},
            cfg.head_lrs[0],
            cfg.choice_margin,
            "head learning rate",
        )
        res[depth] = dict(ms[lr], lr_grid=" ".join(tried), lr_scores=scores, lr_choice=why)
    return res


def _dim_tag(cfg: QuickstartConfig, dim: int | None) -> str:
    """A run name's embedding-size suffix: none at ``cfg.dim`` (a run at the configured size keeps the
    plain name), ``_d384`` otherwise."""
    return "" if dim in (None, cfg.dim) else f"_d{dim}"


def _large_done(
    cfg: QuickstartConfig, fam: Family, data: dict, out: Path, depth: int | None, head_lr: float, *, dim: int | None
) -> bool:
    """Whether the heads-only :func:`_large_run` of ``depth`` / ``head_lr`` is finished with today's inputs."""
    tc = _large_config(cfg, fam, data, out, depth, head_lr, dim=dim)
    return step_is_done(Path(tc.output_dir), _stage1_inputs(tc, data))


def _large_config(
    cfg: QuickstartConfig,
    fam: Family,
    data: dict,
    out: Path,
    depth: int | None,
    head_lr: float,
    *,
    k: int | str | None = None,
    dim: int | None = None,
    max_epochs: float | None = None,
    init_heads_from: str | None = None,
    suffix: str = "",
) -> TrainConfig:
    """The TrainConfig of one Stage I run of the family's large dual tower (both towers ``depth`` layers, the
    top ``k`` training; default ``cfg.trainable_layers``), under
    ``out/stage1/<family>_large_L<depth>_hlr<lr>[_d<dim>]<suffix>``."""
    tower = fam.tower(depth, cfg.trainable_layers if k is None else k, cfg.query_max_length)
    return stage1_config(
        cfg,
        family_method(fam),
        data,
        out / "stage1" / f"{fam.name}_large_L{depth or 'all'}_hlr{head_lr:g}{_dim_tag(cfg, dim)}{suffix}",
        tower,
        {**tower, "max_length": cfg.doc_max_length},
        lr=fam.lr,
        head_lr=head_lr,
        max_epochs=cfg.max_epochs if max_epochs is None else max_epochs,
        init_heads_from=init_heads_from,
        dim=dim,
    )


def _large_run(
    cfg: QuickstartConfig, fam: Family, data: dict, out: Path, depth: int | None, head_lr: float, **kw: Any
) -> dict[str, Any]:
    """Train (or reuse) the Stage I run of :func:`_large_config`; returns its metrics + ``run_dir``."""
    tc = _large_config(cfg, fam, data, out, depth, head_lr, **kw)
    return stage1_step(tc, Path(tc.output_dir).name, data)


def hidden_size(run_dir: str | Path) -> int:
    """The backbone hidden size of a finished Stage I run's query tower."""
    return model_hidden_size(Path(run_dir) / "query_tower")


def full_dim_run(
    cfg: QuickstartConfig, fam: Family, best: dict[str, Any], data: dict, out: Path
) -> dict[str, Any] | None:
    """The family's chosen large tower (``best``: depth and head learning rate, a
    :func:`large_tower_runs` entry) trained again with the embedding size = its backbone's hidden
    size (``cfg.full_dim``); None when that is ``cfg.dim`` already. The paper's dim = 128 reduces a
    3,584-d Qwen state (§4.1, dim << h); a frozen 384-d MiniLM projected to 128 starts below its own
    zero-shot embeddings, so the size is a choice made on validation, like the head learning rate."""
    h = hidden_size(best["run_dir"])
    if h == cfg.dim:
        return None
    return dict(
        _large_run(cfg, fam, data, out, best["depth"], best["head_lr"], dim=h),
        head_lr=best["head_lr"],
        depth=best["depth"],
        dim=h,
    )


def prefill_depth_caches(cfg: QuickstartConfig, fam: Family, data: dict) -> None:
    """One pass of the deepest candidate's frozen prefix fills the pooled document caches of
    every candidate depth (heads-only runs read the state after layer N + the final norm, which
    the deepest tower passes through), so each shallower depth costs no pass of its own over the
    corpus (a no-op when there is one depth, layers train, or the caches are full)."""
    depths = sorted({d for d in fam.depths if d})
    if cfg.trainable_layers != 0 or len(depths) < 2:
        return

    pool: dict[str, Any] = {"pooling": fam.pooling} if fam.pooling else {}
    dt = load_tower(fam.model, "document", dim=None, max_doc_length=cfg.doc_max_length, num_layers=depths[-1], **pool)
    corpus = load_corpus(corpus_file(data))
    fill_pooled_depths(
        Path(cfg.out).resolve() / "features", dt, depths, list(corpus.values()), show_progress=cfg.show_progress
    )


def unfreeze_run(
    cfg: QuickstartConfig, fam: Family, best: dict[str, Any], k: int, data: dict, out: Path
) -> dict[str, Any]:
    """Heads first, then layers: the family's chosen heads-only large tower (``best``, a
    :func:`large_tower_runs` entry) with the top ``k`` layers of both towers trained, starting
    from its trained heads."""
    return _large_run(
        cfg,
        fam,
        data,
        out,
        best["depth"],
        best["head_lr"],
        k=k,
        dim=best.get("dim"),
        max_epochs=cfg.unfreeze_epochs,
        init_heads_from=best["run_dir"],
        suffix=f"_top{k}",
    )


def _keep_tag(keep: list[int] | None) -> str:
    """A small run's name suffix for a start other than the bottom layers: ``_l0-5``."""
    return "" if not keep or is_bottom(keep) else "_l" + "-".join(map(str, keep))


def small_dual_run(
    cfg: QuickstartConfig,
    fam: Family,
    data: dict,
    out: Path,
    head_lr: float,
    dim: int | None = None,
    keep: list[int] | None = None,
) -> dict[str, Any]:
    """``twinbert_small``: the family's small tower on both sides. The query tower (the online
    one) trains every layer (embeddings frozen and cached); the document tower trains like every
    document tower of the run (``trainable_layers``: heads only on a CPU, where a step over the
    layers of 64 + 64 documents costs seconds)."""
    s = fam.small_layers
    q = fam.tower(s, s, cfg.query_max_length, keep)
    d = fam.tower(s, cfg.trainable_layers, cfg.doc_max_length, keep)  # the same small model on both sides
    return run_stage1(
        cfg,
        f"{fam.name}_small_dual_L{s}{_keep_tag(keep)}{_dim_tag(cfg, dim)}{data.get('tag', '')}",
        family_method(fam),
        data,
        out,
        q,
        d,
        lr=fam.lr,
        head_lr=head_lr,
        max_epochs=cfg.small_max_epochs,
        dim=dim,
    )


def scaling_doc_run(
    cfg: QuickstartConfig,
    fam: Family,
    depth: int | None,
    data: dict,
    out: Path,
    head_lr: float,
    dim: int | None = None,
    keep: list[int] | None = None,
) -> dict[str, Any]:
    """``scaling_doc``: the small query tower (every layer trains) + the large document tower
    (``trainable_layers``, like every document tower), trained jointly."""
    s = fam.small_layers
    q = fam.tower(s, s, cfg.query_max_length, keep)
    d = fam.tower(depth, cfg.trainable_layers, cfg.doc_max_length)
    return run_stage1(
        cfg,
        f"{fam.name}_scaling_doc_L{s}{_keep_tag(keep)}_L{depth or 'all'}{_dim_tag(cfg, dim)}{data.get('tag', '')}",
        "scaling_doc" if fam.name == "llm" else "twinbert",
        data,
        out,
        q,
        d,
        lr=fam.lr,
        head_lr=head_lr,
        max_epochs=cfg.small_max_epochs,
        dim=dim,
    )


# ---------------------------------------------------------------------------- the zero-shot start
def zero_shot_run(cfg: QuickstartConfig, fam: Family, depth: int | None, like: Path, data: dict, out: Path) -> Path:
    """The family's pre-trained tower as a Stage I output directory (native pooling, no
    projection): the start a trained large tower must beat, and a teacher when it does not."""
    d = out / "stage1" / f"{fam.name}_zero_shot_L{depth or 'all'}"
    inputs = {
        "model": fam.model,
        "depth": depth,
        "pooling": fam.pooling,
        "q_max": cfg.query_max_length,
        "d_max": cfg.doc_max_length,
        "data": data_fingerprint(data),
    }
    if step_done(d, inputs):
        return d
    banner(f"zero-shot start: {fam.name} ({fam.model})")
    kw: dict[str, Any] = {"num_layers": depth} if depth else {}
    pool: dict[str, Any] = {"pooling": fam.pooling} if fam.pooling else {}
    qt = load_tower(fam.model, "query", dim=None, max_query_length=cfg.query_max_length, **kw, **pool)
    dt = load_tower(fam.model, "document", dim=None, max_doc_length=cfg.doc_max_length, **kw, **pool)
    corpus = load_corpus(corpus_file(data))
    ids = list(corpus)
    emb = PrefixTower(dt, 0, Path(cfg.out).resolve() / "features", show_progress=cfg.show_progress).encode(
        [corpus[i] for i in ids], normalize=False
    )
    assert isinstance(qt, QueryTower) and isinstance(dt, DocumentTower)  # the roles asked for
    pair_towers(qt, dt)
    d.mkdir(parents=True, exist_ok=True)
    qt.save(d / "query_tower")
    dt.save(d / "doc_tower")
    np.save(d / "doc_embeddings.npy", np.asarray(emb, dtype=np.float32))
    write_json(d / "doc_ids.json", ids, indent=None)
    shutil.copy(like / "config.yaml", d / "config.yaml")  # the same data spec: the same held-out queries
    write_json(d / "run.json", {"metrics": {"method": "zero_shot", "compat_id": qt.compat_id}})
    mark_done(d, inputs)
    return d


__all__ = [
    "COSMETIC",
    "banner",
    "corpus_file",
    "data_fingerprint",
    "data_spec",
    "full_dim_run",
    "hidden_size",
    "large_tower_runs",
    "layer_pool",
    "mark_done",
    "on_gpu",
    "prefill_depth_caches",
    "prepare_data",
    "pseudo_queries",
    "qkd_name",
    "run_qkd",
    "run_stage1",
    "scaling_doc_run",
    "small_dual_run",
    "stage1_config",
    "stage1_step",
    "step_digest",
    "step_done",
    "student_base",
    "unfreeze_run",
    "zero_shot_run",
]
