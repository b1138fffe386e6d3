"""The quick start's choices, in order: which families can read the data, each family's large
tower (depth and head learning rate on validation, never worse than its zero-shot start), the
teacher, the students (and the latency budget), the paper's matched-cost comparison, and the
served default. Every choice reads validation queries held out from the training split."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import scalingnote.quickstart.choose as choose
import scalingnote.quickstart.runs as runs
from scalingnote.errors import ScalingNoteError
from scalingnote.models.info import hidden_size
from scalingnote.quickstart.budget import QKD_FLOOR, Candidates
from scalingnote.quickstart.config import Family, QuickstartConfig, family, parse_student
from scalingnote.quickstart.inputs import check_inputs, readable_families, say
from scalingnote.quickstart.scoring import EvalSet, TowerPool, score, single_query_p99_many

log = logging.getLogger(__name__)


def restrict(fam: Family, cands: Candidates | None) -> tuple[Family, dict | None, bool | None]:
    """``fam`` with only the depths still in after the proxy, their head learning rates and
    whether its width run is in (``cands`` None: every candidate, as configured)."""
    if cands is None:
        return fam, None, None
    keep = cands.depths[fam.name]
    return replace(fam, depths=tuple(d for d in fam.depths if d in keep)), keep, cands.width.get(fam.name, False)


def stage1_dim(cfg: QuickstartConfig, fam: Family, cands: Candidates | None) -> int | None:
    """The embedding size the family's Stage I candidates train at: ``cfg.dim`` (None), or the
    backbone's hidden size when the budget left room for one width only (``cands.wide``)."""
    if cands is None or not cands.wide.get(fam.name):
        return None
    return hidden_size(fam.model)


def large_towers(
    cfg: QuickstartConfig,
    fams: list[Family],
    data: dict,
    out: Path,
    pool: TowerPool,
    ev: EvalSet,
    cands: Candidates | None = None,
) -> dict[str, dict]:
    """Per family: every depth's best-head-lr run, the depth chosen on validation, and the kept
    tower (the trained one, or its zero-shot start when training made it worse on validation).
    ``cands``: only the candidates the proxy kept (:func:`scalingnote.quickstart.proxy.compare_on_proxy`)."""
    res = {}
    for fam in fams:
        fam, lrs, width = restrict(fam, cands)
        dim = stage1_dim(cfg, fam, cands)
        if dim is not None:
            say(f"{fam.name} large tower: trained at the backbone's width {dim} only (the budget holds one width)")
        by_depth = runs.large_tower_runs(cfg, fam, data, out, lrs, dim=dim)
        depth, why = choose.choose_best({str(d): m["best_val_score"] for d, m in by_depth.items()})
        best = by_depth[None if depth == "None" else int(depth)]
        say(f"{fam.name} large tower, depth {best['depth'] or 'all'}: {best.get('lr_choice', '')}")
        best, dim_choice = _choose_dim(cfg, fam, best, data, out, width)
        trained_dir = Path(best["run_dir"])
        zs_dir = runs.zero_shot_run(cfg, fam, best["depth"], trained_dir, data, out)
        trained = score(pool, trained_dir / "query_tower", trained_dir, ev)
        heads_dir, unfrozen = trained_dir, None
        k = cfg.unfreeze_k(runs.on_gpu())
        if k:  # heads first, then the top layers from them; kept only if validation improves
            trained_dir, trained, unfrozen = _unfreeze(cfg, fam, best, k, data, out, pool, ev, trained_dir, trained)
        start = score(pool, zs_dir / "query_tower", zs_dir, ev)
        conf = choose.val_confidence(trained.val_run, start.val_run, ev.val_qrels)
        keep_trained, msg = choose.keep_better(trained.val_ndcg, start.val_ndcg, f"{fam.name} large tower", conf)
        say(msg)
        res[fam.name] = {
            "family": fam,
            "depths": by_depth,
            "depth_choice": why,
            "trained_dir": trained_dir,
            "zero_shot_dir": zs_dir,
            "heads_dir": heads_dir,
            "unfrozen": unfrozen,
            "dim": best["dim"],
            "dim_choice": dim_choice,
            "dir": trained_dir if keep_trained else zs_dir,
            "kept": "trained" if keep_trained else "zero_shot",
            "guard": msg,
            "val": trained.val_ndcg if keep_trained else start.val_ndcg,
            "head_lr": best["head_lr"],
            "lr_choice": best.get("lr_choice"),
            "depth": best["depth"],
            "val_trained": trained.val_ndcg,
            "val_start": start.val_ndcg,
            "val_trained_vs_start": conf,
        }
    return res


def _choose_dim(
    cfg: QuickstartConfig, fam: Family, best: dict, data: dict, out: Path, width: bool | None = None
) -> tuple[dict, dict | None]:
    """``cfg.full_dim``: the chosen depth and head learning rate again with the embedding size =
    the backbone's hidden size; the run with the higher validation nDCG@10 (Stage I's own early
    stopping score on the held-out training queries) is kept. Returns (kept run, what was measured)."""
    full = runs.full_dim_run(cfg, fam, best, data, out) if cfg.full_dim and width is not False else None
    if full is None:
        return best, None
    a, b = best["best_val_score"], full["best_val_score"]
    # the wider head is the default (a frozen backbone projected below its width starts below its own
    # zero-shot embeddings); the narrower one is kept only when it is ahead beyond the noise
    dim, why = choose.default_unless_separated(
        {str(best["dim"]): a, str(full["dim"]): b},
        {str(best["dim"]): best.get("best_val_per_query"), str(full["dim"]): full.get("best_val_per_query")},
        str(full["dim"]),
        cfg.choice_margin,
        "embedding size",
    )
    keep = dim == str(full["dim"])
    msg = f"{fam.name} large tower: {why}: {full['dim'] if keep else best['dim']} kept"
    say(msg)
    info = {
        "dir": full["run_dir"],
        "dim": full["dim"],
        "val": round(b, 4),
        "val_at_dim": round(a, 4),
        "kept": keep,
        "reason": msg,
        "train_seconds": full.get("train_seconds"),
        "best_step": full.get("best_step"),
        "val_curve": full.get("val_curve"),
    }
    return (dict(full, lr_grid=best.get("lr_grid")) if keep else best), info


def choose_teacher(
    cfg: QuickstartConfig, readable: list[str], large: dict, pool: TowerPool, ev: EvalSet
) -> tuple[str, str]:
    """The large tower with the best validation nDCG@10 (or the pinned family), with how sure
    the validation split is of it against the runner-up."""
    val = {f: large[f]["val"] for f in readable}
    teacher, why = choose.choose_best(val, None if cfg.teacher == "auto" else cfg.teacher)
    others = sorted((f for f in readable if f != teacher), key=lambda f: -val[f])
    if others:
        runs_ = {
            f: score(pool, Path(large[f]["dir"]) / "query_tower", large[f]["dir"], ev).val_run
            for f in (teacher, others[0])
        }
        sure = choose.conf_text(choose.val_confidence(runs_[teacher], runs_[others[0]], ev.val_qrels))
        if sure:
            why += f"; {teacher} vs {others[0]}: {sure}"
    return teacher, why


def _unfreeze(
    cfg: QuickstartConfig,
    fam: Family,
    best: dict,
    k: int,
    data: dict,
    out: Path,
    pool: TowerPool,
    ev: EvalSet,
    heads_dir: Path,
    heads: Any,
) -> tuple[Path, Any, dict[str, Any]]:
    """Train the chosen heads-only tower's top ``k`` layers from its heads; returns the kept
    (directory, score) — the layer run only when its validation nDCG@10 is above the heads-only
    run's — and what was measured."""
    top = runs.unfreeze_run(cfg, fam, best, k, data, out)
    top_dir = Path(top["run_dir"])
    top_sc = score(pool, top_dir / "query_tower", top_dir, ev)
    what = f"{fam.name} large tower with its top {k} layers trained from its heads"
    keep = top_sc.val_ndcg > heads.val_ndcg  # a tie (no step beat the start) keeps the simpler heads-only tower
    msg = (
        f"{what}: {top_sc.val_ndcg:.4f} > heads only {heads.val_ndcg:.4f} on validation: kept"
        if keep
        else f"{what}: {top_sc.val_ndcg:.4f} <= heads only {heads.val_ndcg:.4f} on validation: keeping "
        "the heads-only tower"
    )
    say(msg)
    info = {
        "dir": str(top_dir),
        "layers": k,
        "val_heads_only": heads.val_ndcg,
        "val_top_layers": top_sc.val_ndcg,
        "kept": "top_layers" if keep else "heads_only",
        "reason": msg,
        "train_seconds": top.get("train_seconds"),
        "best_step": top.get("best_step"),
        "val_curve": top.get("val_curve"),
    }
    return (top_dir, top_sc, info) if keep else (heads_dir, heads, info)


def student_candidates(cfg: QuickstartConfig, readable: list[str], teacher: str) -> list[tuple[str, int]]:
    if cfg.students:
        cands = [parse_student(s) for s in cfg.students]
        skipped = [f"{f}:{n}" for f, n in cands if f not in readable]
        if skipped:
            say(f"students {skipped} skipped: their family cannot read the data")
        cands = [(f, n) for f, n in cands if f in readable]
    elif cfg.student_p99_ms is not None:
        cands = [(f, n) for f in readable for n in range(1, family(cfg, f).small_layers + 1)]
    else:
        cands = [(teacher, family(cfg, teacher).small_layers)]
    if not cands:
        raise ScalingNoteError(
            "no student candidate can read the data (students: " + ", ".join(cfg.students or []) + ")"
        )
    return cands


def train_students(
    cfg: QuickstartConfig,
    readable: list[str],
    large: dict,
    teacher: str,
    data: dict,
    out: Path,
    pseudo: list[str],
    pool: TowerPool,
    ev: EvalSet,
    decide_early: bool = False,
    deadline: float | None = None,
) -> dict[str, Any]:
    """QKD from the teacher into each student candidate at each listwise weight; the
    best-validating one within the latency budget is the ScalingNote student. ``decide_early``
    (a budgeted run whose data proxy was drawn): several candidates are first compared on a
    fraction of QKD's steps (:func:`_students_on_proxy`). ``deadline`` (Stage II's time box,
    :func:`~scalingnote.quickstart.early.qkd_deadline`): the QKD runs still to go share what is left of it."""
    tdir = large[teacher]["dir"]
    cands: list[dict[str, Any]] = []
    specs = [(f, n, w) for f, n in student_candidates(cfg, readable, teacher) for w in cfg.qkd_rank_weights]
    specs, early = (
        _students_on_proxy(cfg, specs, large, teacher, data, out, pseudo, pool, ev) if decide_early else (specs, None)
    )
    for i, (fam_name, layers, w) in enumerate(specs):  # one QKD run per (student, listwise weight) still in
        fam = family(cfg, fam_name)
        name = runs.qkd_name(fam_name, layers, teacher_label(large, teacher), w)
        m = runs.run_qkd(
            cfg,
            name,
            tdir,
            fam,
            layers,
            data,
            out,
            pseudo,
            rank_weight=w,
            pool=runs.layer_pool(large[fam_name]["dir"]),
            deadline=run_deadline(deadline, len(specs) - i),
            min_steps=QKD_FLOOR,
        )
        qdir = Path(m["run_dir"]) / "query_tower"
        sc = score(pool, qdir, tdir, ev)
        cands.append(
            {
                "name": name,
                "family": fam_name,
                "layers": layers,
                "rank_weight": w,
                "val": sc.val_ndcg,
                "dir": str(qdir),
                "qkd": {
                    k: m.get(k)
                    for k in (
                        "best_step",
                        "steps_run",
                        "steps",
                        "planned_steps",
                        "train_seconds",
                        "qkd_val_loss",
                        "student_base_layers",
                        "student_layer_choice",
                    )
                },
            }
        )
    # every candidate timed in the same minutes, taking turns in blocks of queries; on validation
    # query texts only: a choice never reads the reported split, its texts included
    p99 = single_query_p99_many(
        {c["name"]: (pool.tower(c["dir"]), Path(c["dir"]).parent / "onnx") for c in cands},
        ev.val_texts,
        backend=cfg.serve_backend,
    )
    for c in cands:
        c["p99_ms"] = p99[c["name"]]
        say(
            f"student {c['name']}: validation nDCG@10 {c['val']:.4f}, single-query p99 "
            f"{c['p99_ms']:.2f} ms ({cfg.serve_backend}), "
            f"QKD best step {c['qkd']['best_step']} of {c['qkd']['steps_run']}"
        )
    chosen, frontier, why = choose.choose_student(cands, cfg.student_p99_ms)
    if chosen is None:
        raise ScalingNoteError(f"student_p99_ms={cfg.student_p99_ms}: {why}")
    say(f"student: {chosen} ({why})")
    if early:
        early.update(
            full_val={c["name"]: c["val"] for c in cands},
            agreed=max(early["proxy_val"], key=early["proxy_val"].get) == chosen,
        )
    return {
        "chosen": next(c for c in cands if c["name"] == chosen),
        "candidates": cands,
        "frontier": [c["name"] for c in frontier],
        "reason": why,
        "proxy": early,
    }


#: of each QKD run's share of Stage II's time box, what is kept for after its loop (saving the
#: student, scoring it on the validation queries): this share + RUN_AFTER_S seconds
RUN_AFTER_SHARE, RUN_AFTER_S = 0.05, 3.0


def run_deadline(deadline: float | None, runs_left: int) -> float | None:
    """The next QKD run's deadline: an equal share of what is left of Stage II's (``time.monotonic()``)."""
    if deadline is None:
        return None
    now = time.monotonic()
    share = (deadline - now) / max(runs_left, 1)
    return now + share - (RUN_AFTER_SHARE * max(share, 0.0) + RUN_AFTER_S)


def _students_on_proxy(
    cfg: QuickstartConfig,
    specs: list[tuple[str, int, float]],
    large: dict,
    teacher: str,
    data: dict,
    out: Path,
    pseudo: list[str],
    pool: TowerPool,
    ev: EvalSet,
) -> tuple[list[tuple[str, int, float]], dict[str, Any] | None]:
    """Decide early among several students (sizes, families, listwise weights): each distilled for
    ``proxy_fraction`` of QKD's step cap (under ``out/proxy/qkd``), scored on the validation
    queries, halved with ``proxy_margin``; only the survivors run in full. Not with ``--full``, one
    candidate, a latency budget (a fast student must not be dropped on quality alone) or no step cap."""
    cap = cfg.qkd_step_cap(runs.on_gpu())
    if cfg.full or len(specs) < 2 or cfg.student_p99_ms is not None or cap is None or not ev.val_qids:
        return specs, None
    k = max(20, math.ceil(cfg.proxy_fraction * cap))
    pcfg, tdir, val = replace(cfg, qkd_max_steps=k), large[teacher]["dir"], {}
    for f, n, w in specs:
        name = runs.qkd_name(f, n, teacher_label(large, teacher), w)
        m = runs.run_qkd(
            pcfg,
            name,
            tdir,
            family(cfg, f),
            n,
            data,
            out / "proxy",
            pseudo,
            rank_weight=w,
            pool=runs.layer_pool(large[f]["dir"]),
        )
        val[name] = score(pool, Path(m["run_dir"]) / "query_tower", tdir, ev).val_ndcg
    keep, why = choose.halve(val, cfg.proxy_margin)
    say(f"proxy, students ({k} QKD steps each): {why}")
    return [s for s in specs if runs.qkd_name(s[0], s[1], teacher_label(large, teacher), s[2]) in keep], {
        "steps": k,
        "proxy_val": val,
        "kept": keep,
        "reason": why,
    }


def teacher_label(large: dict, name: str) -> str:
    """A family's name in the names of the QKD steps it teaches: ``bert``, or ``bert_mined`` when its
    large tower is the kept mining round's (new steps, the first round's untouched)."""
    return name + large[name].get("tag", "")


def comparison_runs(
    cfg: QuickstartConfig, readable: list[str], large: dict, students: dict, data: dict, out: Path, pseudo: list[str]
) -> dict[str, dict[str, dict]]:
    """The paper's comparison at matched online cost (ScalingNote Tables 3-4), per family: the
    small dual tower, ScalingDoc, ScalingNote (QKD of the family's large tower into its small
    tower) and ScalingDual (the large tower itself, the upper bound). A family whose large tower is
    the kept mining round's (``L["data"]``) trains its small towers on the same mined set."""
    res = {}
    for name in readable:
        L = large[name]
        fam: Family = L["family"]
        hl = float(L["head_lr"])
        w = students["chosen"]["rank_weight"]  # the listwise weight the served student was chosen with
        qkd_name = runs.qkd_name(name, fam.small_layers, teacher_label(large, name), w)
        reuse = next((c for c in students["candidates"] if c["name"] == qkd_name), None)
        if reuse:
            qkd_dir, keep = Path(reuse["dir"]).parent, reuse["qkd"]["student_base_layers"]
        else:
            m = runs.run_qkd(
                cfg,
                qkd_name,
                L["dir"],
                fam,
                fam.small_layers,
                data,
                out,
                pseudo,
                rank_weight=w,
                pool=runs.layer_pool(L["dir"]),
            )
            qkd_dir, keep = Path(m["run_dir"]), m.get("student_base_layers")
        # keep: the layers the family's student started from; its small query towers start there too
        # (one online tower, one start)
        fdata = L.get("data", data)  # the mined set when the family's large tower trained on it
        small = runs.small_dual_run(
            cfg, fam, fdata, out, hl, L.get("dim"), keep
        )  # the large tower's embedding size: one index, one cost
        doc = runs.scaling_doc_run(cfg, fam, L["depth"], fdata, out, hl, L.get("dim"), keep)
        res[name] = {
            "twinbert_small": {
                "q": Path(small["run_dir"]) / "query_tower",
                "d": Path(small["run_dir"]),
                "layers": fam.small_layers,
            },
            "scaling_doc": {
                "q": Path(doc["run_dir"]) / "query_tower",
                "d": Path(doc["run_dir"]),
                "layers": fam.small_layers,
            },
            "scalingnote": {"q": qkd_dir / "query_tower", "d": L["dir"], "layers": fam.small_layers, "rank_weight": w},
            "scaling_dual": {"q": L["dir"] / "query_tower", "d": L["dir"], "layers": None},
        }
    return res


def summary(readable: list[str], report: dict, large: dict, teacher: str, t_why: str, students: dict) -> dict[str, Any]:
    fams = {}
    for name, rep in report.items():
        L = large.get(name)
        fams[name] = {
            **rep,
            **(
                {
                    "depth_choice": L["depth_choice"],
                    "head_lr": L.get("head_lr"),
                    "lr_choice": L.get("lr_choice"),
                    "dim": L.get("dim"),
                    "dim_choice": L.get("dim_choice"),
                    "kept": L["kept"],
                    "guard": L["guard"],
                    "val_ndcg@10": L["val"],
                    "tower_dir": str(L["dir"]),
                    "unfrozen": L.get("unfrozen"),
                }
                if L
                else {}
            ),
        }
    return {
        "families": fams,
        "teacher": {"family": teacher, "dir": str(large[teacher]["dir"]), "reason": t_why},
        "student": {k: v for k, v in students.items() if k != "chosen"} | {"chosen": students["chosen"]["name"]},
    }


__all__ = [
    "check_inputs",
    "choose_teacher",
    "comparison_runs",
    "teacher_label",
    "large_towers",
    "readable_families",
    "restrict",
    "student_candidates",
    "summary",
    "train_students",
]
