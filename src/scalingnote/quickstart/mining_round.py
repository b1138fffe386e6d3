"""The quick start's mining round: the teacher's Stage I config trained a second time,
on hard negatives the teacher mines itself (``data.negatives: dense | mixed``,
:mod:`scalingnote.training.mining`: FAISS Flat over its own embeddings, dense ranks K+1..T, the
false-negative guard, several negatives per example), kept only when it validates above the first
round — the rule of every other choice, on the user's validation queries.

When it is kept it is the teacher: the students are distilled from it, and the teacher family's
matched-cost rows train on the same mined set (the triplets mined once by the first round's towers,
cached under ``<out>/mined_negatives/<key>/triplets.jsonl`` in the ``scalingnote data build`` format,
keyed by the towers' fingerprints and the mining settings; every run reads that one file). Every
step it adds has a name of its own (``*_mined*``), so the first round's steps and digests are never
touched; ``mining_round: off`` makes exactly the steps of a run without it.

Triplet data (the synthetic log's click triplets) carry their own negatives, and mining draws
negatives for qrels pairs: the round's data is the same BEIR set with ``qrels/train.tsv`` = the
training triplets' (query, positive) pairs, the same validation triplets (the same held-out queries,
never trained on) and the same test split."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any

import scalingnote.quickstart.runs as runs
from scalingnote.config import load_config
from scalingnote.data import load_triplets
from scalingnote.quickstart.budget import Plan
from scalingnote.quickstart.choose import conf_text, val_confidence
from scalingnote.quickstart.config import QuickstartConfig
from scalingnote.quickstart.report import row, tower_label
from scalingnote.quickstart.scoring import EvalSet, TowerPool, score
from scalingnote.training import TrainConfig
from scalingnote.utils.io import atomic_write

TAG = "_mined"  #: the name suffix of every step trained on (or distilled from a teacher trained on) mined negatives


def say(msg: str) -> None:
    print(f"[quickstart] {msg}", flush=True)


def go_now(
    cfg: QuickstartConfig, plan: Plan, spent: dict[str, float], ratio: float, val_queries: int
) -> tuple[bool, str]:
    """Whether the round runs now, and why. ``auto``: when the plan held it, and the time spent plus
    the rest of the run with it at the pace it has kept (``ratio``) still fits the budget (it is cut
    before anything else); ``on`` / ``--full``: always; ``off``: never; nor without validation
    queries to decide it on."""
    if cfg.mining_round == "off":
        return False, "mining_round: off in the config"
    if not val_queries:
        return False, "no validation queries to decide it on"
    if not plan.mining:
        return (
            False,
            f"skipped (budget): {plan.mining_note}; `--full`, a larger --budget-minutes or mining_round: on runs it",
        )
    limit_s = plan.limit_s
    if cfg.mining_round == "on" or cfg.full or plan.budget_s is None or limit_s is None:
        return True, plan.mining_note
    rest = (
        sum(
            plan.phases.get(k, 0.0)
            for k in ("mining_round", "stage2_students", "comparison_runs", "index", "evaluation")
        )
        * ratio
    )
    done = sum(spent.values())
    if done + rest > limit_s:
        why = (
            f"the mining round: {done / 60:.1f} min spent + {rest / 60:.1f} min left with it at this run's pace "
            f"> the {limit_s / 60:.1f} of the {plan.budget_s / 60:g}-minute budget the plan may fill"
        )
        plan.skipped.append(why)
        plan.mining, plan.mining_note, plan.phases["mining_round"] = (
            False,
            "cut late: the run fell behind its plan",
            0.0,
        )
        return False, f"skipped (budget): {why}"
    return (
        True,
        f"planned {plan.phases.get('mining_round', 0.0) / 60:.1f} min, within the "
        f"{limit_s / 60:.1f} of the {plan.budget_s / 60:g}-minute budget the plan may fill",
    )


# ----------------------------------------------------------------------------- the round's data
def mining_data(cfg: QuickstartConfig, data: dict[str, Any], out: Path, teacher_dir: Path) -> dict[str, Any]:
    """``data`` for runs on negatives mined by ``teacher_dir``: the same BEIR set (triplet data: its
    training pairs as ``qrels/train.tsv``, :func:`_pairs_as_qrels`), ``spec`` = the mining settings
    (:func:`runs.data_spec` adds them), ``loss`` = the loss settings of every run on them
    (``mining_hard_in_denominator``), ``tag`` = :data:`TAG` (the runs' names)."""
    k, t = (int(x) for x in cfg.mining_window)
    spec = {
        "negatives": cfg.mining_negatives,
        "num_negatives": cfg.mining_num_negatives,
        "mining": {
            "tower": str(teacher_dir),
            "skip_top": k,
            "max_rank": t,
            "guard": list(cfg.mining_guard),
            "cache_dir": str(out / "mined_negatives"),
        },
    }  # one cache: the round and the matched-cost rows read one mined set
    # every run on the mined set trains with the same loss
    extra = {"spec": spec, "loss": {"hard_in_denominator": cfg.mining_hard_in_denominator}, "tag": TAG}
    if not data.get("triplets"):
        return {**data, **extra}
    d = _pairs_as_qrels(cfg, data, out / "mining_round" / "data")
    m = {
        "beir": str(d),
        "corpus": str(d / Path(data["corpus"]).name),
        "triplets": None,
        "validation_triplets": data["validation_triplets"],
    }
    return {**m, "fingerprint": runs.data_fingerprint(m), **extra}


def _pairs_as_qrels(cfg: QuickstartConfig, data: dict[str, Any], d: Path) -> Path:
    """A BEIR directory (a step): ``data``'s corpus, queries and ``qrels/<eval_split>.tsv``, and
    ``qrels/train.tsv`` = the (query, positive) pairs of its training triplets, in their order."""
    inputs = {"data": runs.data_fingerprint(data), "eval_split": cfg.eval_split}
    if runs.step_done(d, inputs):
        return d
    (d / "qrels").mkdir(parents=True, exist_ok=True)
    src = Path(data["beir"])
    for name in (Path(data["corpus"]).name, "queries.jsonl", f"qrels/{cfg.eval_split}.tsv"):
        _link_or_copy(src / name, d / name)
    pairs = dict.fromkeys((t.query_id, t.pos_id) for t in load_triplets(data["triplets"]))
    with atomic_write(d / "qrels" / "train.tsv") as fh:
        fh.write("query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{p}\t1\n" for q, p in pairs))
    runs.mark_done(d, inputs, {"pairs": len(pairs)})
    return d


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.unlink(missing_ok=True)
    try:
        os.link(src, dst)
    except OSError:  # another file system
        shutil.copyfile(src, dst)


# ----------------------------------------------------------------------------- the round
def round_two(cfg: QuickstartConfig, L: dict[str, Any], mdata: dict[str, Any], out: Path) -> dict[str, Any]:
    """The Stage I run the teacher came from (``L["trained_dir"]``: its config, depth, head learning
    rate, width) trained again on ``mdata``'s mined negatives, as the step
    ``stage1/<family>_mined_<rest of its name>``."""
    src = Path(L["trained_dir"])
    base = dataclasses.asdict(load_config(TrainConfig, src / "config.yaml"))
    run_dir = out / "stage1" / src.name.replace("_large_", "_mined_", 1)
    if run_dir.name == src.name:
        run_dir = run_dir.with_name(src.name + TAG)
    base.update(
        output_dir=str(run_dir),
        data={**base["data"], **runs.data_spec(cfg, mdata)},
        loss={**base["loss"], **mdata.get("loss", {})},
        show_progress=cfg.show_progress,
    )
    tc = load_config(TrainConfig, base)
    teacher = Path(mdata["spec"]["mining"]["tower"])
    return runs.stage1_step(
        tc, f"{run_dir.name} (the mining round: negatives mined by {teacher.name})", mdata, miner=_digest(teacher)
    )


def _digest(step_dir: Path) -> str | None:
    marker = step_dir / "DONE"
    return json.loads(marker.read_text()).get("digest") if marker.exists() else None


def mining_round(
    cfg: QuickstartConfig,
    go: tuple[bool, str],
    large: dict,
    teacher: str,
    data: dict,
    out: Path,
    pool: TowerPool,
    ev: EvalSet,
) -> tuple[dict, dict[str, Any]]:
    """Try the round when ``go`` (:func:`go_now`: whether, why); returns (the large towers, with the
    teacher's replaced by round 2 when it validates above round 1, and what was measured:
    ``choices.mining_round``)."""
    runs_now, why = go
    if not runs_now:
        say(f"mining round: not tried: {why}")
        return large, {"tried": False, "kept": False, "reason": why}
    L = large[teacher]
    r1_dir = Path(L["dir"])
    mdata = mining_data(cfg, data, out, r1_dir)
    m = round_two(cfg, L, mdata, out)
    r2_dir = Path(m["run_dir"])
    r1, r2 = score(pool, r1_dir / "query_tower", r1_dir, ev), score(pool, r2_dir / "query_tower", r2_dir, ev)
    sure = conf_text(conf := val_confidence(r2.val_run, r1.val_run, ev.val_qrels))
    keep = r2.val_ndcg > r1.val_ndcg  # a tie keeps the first round: the second must earn its place
    what = (
        f"mining round ({teacher}: {cfg.mining_num_negatives} negatives mined by the teacher per example"
        f"{', in the Eq. 5 denominators' if cfg.mining_hard_in_denominator else ''})"
    )
    msg = (
        f"{what}: {r2.val_ndcg:.4f} {'>' if keep else '<='} round 1 {r1.val_ndcg:.4f} on validation"
        f"{f' ({sure})' if sure else ''}: {'kept, it teaches' if keep else 'keeping round 1'}"
    )
    say(msg)
    summ = m.get("mining") or {}
    info = {
        "tried": True,
        "kept": keep,
        "reason": msg,
        "why_tried": why,
        "val_round1": r1.val_ndcg,
        "val_round2": r2.val_ndcg,
        "val_round2_vs_round1": conf,
        "round1_dir": str(r1_dir),
        "round2_dir": str(r2_dir),
        "repeats": str(L["trained_dir"]),
        "mining_seconds": summ.get("mining_seconds"),
        "train_seconds": m.get("train_seconds"),
        "audit": {k: v for k, v in summ.items() if k not in ("tower", "cache")},
        "audit_file": str(r2_dir / "mining_audit.jsonl"),
        "triplets": str(Path(summ["cache"]) / "triplets.jsonl") if summ.get("cache") else None,
        "data_dir": mdata["beir"],
        "settings": {
            **mdata["spec"],
            "mining": {k: v for k, v in mdata["spec"]["mining"].items() if k != "cache_dir"},
            "loss": mdata["loss"],
        },
    }
    say(
        f"mining round: audit {info['audit_file']} (`scalingnote data audit {r2_dir}`), mined "
        f"triplets {info['triplets']}"
    )
    if keep:
        large = {
            **large,
            teacher: {
                **L,
                "dir": r2_dir,
                "val": r2.val_ndcg,
                "kept": "mined-negatives round",
                "guard": msg,
                "tag": TAG,
                "data": mdata,
                "round1_dir": r1_dir,
            },
        }
    return large, info


def other_round_row(pool: TowerPool, ev: EvalSet, info: dict[str, Any], teacher: str) -> list[dict]:
    """The round that does not teach, as a row beside the teacher's (``scaling_dual``): its
    validation and test figures (the choice was made on validation alone)."""
    if not info.get("tried"):
        return []
    d = Path(info["round1_dir"] if info["kept"] else info["round2_dir"])
    label, n = tower_label(pool, d / "query_tower")
    name = "scaling_dual_round1" if info["kept"] else "scaling_dual_round2_mined"
    note = (
        "the first round (the data's own negatives); the mined round teaches"
        if info["kept"]
        else "the mining round, not kept: it did not validate above the first"
    )
    return [
        row(name, score(pool, d / "query_tower", d, ev), large=label, query=label, layers=n, family=teacher, note=note)
    ]


__all__ = ["TAG", "go_now", "mining_data", "mining_round", "other_round_row", "round_two"]
