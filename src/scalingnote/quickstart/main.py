"""The quick start's main job, :func:`quickstart`: the steps of :mod:`scalingnote.quickstart.runs`
and the choices of :mod:`scalingnote.quickstart.pipeline` in order, then the evaluation rows
(the baselines, the matched-cost comparison, the served configuration) and ``results.json``."""

from __future__ import annotations

import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from scalingnote.config import save_config
from scalingnote.data import load_corpus
from scalingnote.evaluation import evaluate
from scalingnote.index import read_manifest
from scalingnote.index.hybrid import hybrid_search_run
from scalingnote.live import LiveIndex
from scalingnote.models.prefix.cache import holds_tokens
from scalingnote.models.towers.store import dir_bytes
from scalingnote.quickstart import early, index_choice, mining_round, pipeline, plan_record, proxy, report, runs
from scalingnote.quickstart.budget import Plan
from scalingnote.quickstart.choose import cross_fit_fusion
from scalingnote.quickstart.config import QuickstartConfig, family
from scalingnote.quickstart.progress import Progress, is_terminal
from scalingnote.quickstart.report import row, tower_label
from scalingnote.quickstart.scoring import (
    METRICS,
    EvalSet,
    Scored,
    TowerPool,
    load_eval_set,
    per_query_ndcg,
    score,
    tuning_texts,
)
from scalingnote.serve.corpus import served_searcher
from scalingnote.sparse.bm25 import BM25Retriever
from scalingnote.training.curves import tensorboard_command
from scalingnote.utils import run_metadata, seed_everything, write_json


def _baselines(
    cfg: QuickstartConfig, ev, pool, data: dict, out: Path, zero_shot: bool = True
) -> tuple[list[dict], Any, Any, Any]:
    """BM25 (test and validation runs) and the zero-shot BERT-family tower (``zero_shot``: not cut by the budget)."""
    corpus = load_corpus(runs.corpus_file(data))
    bm = BM25Retriever.fit(corpus.values(), show_progress=False)
    t0 = time.perf_counter()
    bm_run = bm.search(dict(zip(ev.qids, ev.texts, strict=True)), k=100, show_progress=False)
    qps = round(len(ev.qids) / (time.perf_counter() - t0), 1)
    bm_val = (
        bm.search(dict(zip(ev.val_qids, ev.val_texts, strict=True)), k=100, show_progress=False) if ev.val_qids else {}
    )
    val = round(float(evaluate(bm_val, ev.val_qrels, ["ndcg@10"])["ndcg@10"]), 4) if ev.val_qids else float("nan")
    bm_sc = Scored(evaluate(bm_run, ev.qrels, METRICS), per_query_ndcg(bm_run, ev.qrels), val, bm_run, bm_val)
    rows = [dict(row("bm25", bm_sc), query_qps=qps)]
    if "bert" in cfg.families and zero_shot:
        fam = family(cfg, "bert")
        like = next((out / "stage1").glob("*_large_*"))
        zs = runs.zero_shot_run(cfg, fam, fam.depths[0], like, data, out)
        label, n = tower_label(pool, zs / "query_tower")
        rows.append(
            row(
                f"zero_shot_{Path(cfg.bert).name}",
                score(pool, zs / "query_tower", zs, ev),
                query=label,
                layers=n,
                tower=zs / "query_tower",
            )
        )
    return rows, bm_sc, bm, bm_run


def _served_rows(
    cfg: QuickstartConfig, ev, pool, student: dict, teacher_dir: Path, bm_sc, index_dir: Path
) -> tuple[list[dict], dict]:
    """The chosen student alone, fused with BM25 (RRF; weighted with the norm and weight fitted on
    validation), and over the IVFPQ index; which one is served is chosen on validation."""
    sc = score(pool, student["dir"], teacher_dir, ev)
    label, n = tower_label(pool, student["dir"], qkd=True)
    base = {"large_tower": tower_label(pool, teacher_dir / "query_tower")[0], "query_tower": label, "query_layers": n}
    fusion: dict[str, Any] = (
        cross_fit_fusion(sc.val_run, bm_sc.val_run, ev.val_qrels, seed=cfg.seed)
        if ev.val_qids
        else {"choice": "dense", "reason": "no validation queries"}
    )
    rows = []
    rrf, info = hybrid_search_run(sc.run, bm_sc.run, "rrf", k=100)
    rows.append(
        {
            **row("scalingnote+bm25_rrf", Scored(evaluate(rrf, ev.qrels, METRICS), {}, float("nan"), {}, {})),
            **base,
            "search": f"exact + bm25s, rrf k={info['rrf_k']}",
        }
    )
    if "weight" in fusion:
        hyb, _ = hybrid_search_run(sc.run, bm_sc.run, "weighted", k=100, weight=fusion["weight"], norm=fusion["norm"])
        rows.append(
            {
                **row(
                    "scalingnote+bm25_weighted",
                    Scored(evaluate(hyb, ev.qrels, METRICS), {}, fusion["val_hybrid"], {}, {}),
                ),
                **base,
                "search": f"exact + bm25s, {fusion['norm']} w_dense={fusion['weight']} (chosen on "
                f"{fusion['n_queries']} validation queries: the default unless a fitted weight is separated)",
            }
        )
    qv = pool.encode(student["dir"], ev.texts)
    _write_fusion(index_dir, fusion)  # the served default, read by `scalingnote serve` and by the served row
    # the index opened as `scalingnote serve` opens it (read-only here): both compressed-index rows
    idx = LiveIndex.open(index_dir, pool.tower(student["dir"]), writer=False)
    try:
        tuned = idx.manifest.get("search_tuning")
        kw = {} if tuned else {"nprobe": cfg.nprobe, "rerank": cfg.rerank}  # tuned: its search defaults, as served
        res = idx.search(qv, k=100, **kw)
        used = {**idx.manifest.get("search_defaults", {}), **kw}
        knob = "ef_search" if "ef_search" in used and "nprobe" not in used else "nprobe"
        how = f"{knob}={used.get('nprobe', used.get('ef_search'))} rerank={used.get('rerank', 0)}"
        if tuned:  # the structure and its setting chosen on validation queries (older indexes: + training queries)
            how += (
                f" (chosen on {tuned['n_queries']} {tuned.get('queries', 'validation + training')} "
                f"queries: recall@10 vs exact {tuned['chosen']['recall']})"
            )
        rows.append(
            {
                **row(
                    "scalingnote+ivfpq",
                    Scored(evaluate(res.to_run(ev.qids), ev.qrels, METRICS), {}, float("nan"), {}, {}),
                ),
                **base,
                "search": f"{idx.factory} {how}",
                "_tower": student["dir"],
            }
        )
        rows.append(_served_row(ev, idx, qv, fusion, base, how))
    finally:
        idx.close()
    return rows, fusion


def _served_row(ev, live, qv, fusion: dict, base: dict, how: str) -> dict:
    """The served configuration measured through the service's own searcher
    (:func:`scalingnote.serve.corpus.served_searcher` over ``live``, the index opened as ``scalingnote
    serve`` opens it): the compressed index at its tuned settings, ``fusion.json``'s mode and fusion,
    the BM25 side beside the index. This row, not an exact-search one, is what a user's queries get.
    ``qv``: the test queries encoded by the served student."""
    searcher, mode = served_searcher(live, None)
    run = searcher.search(ev.texts, 100, mode=mode, query_vectors=qv).to_run(ev.qids)
    # no validation figure: the choice was made on exact search (the exact rows carry it)
    sc = Scored(evaluate(run, ev.qrels, METRICS), per_query_ndcg(run, ev.qrels), float("nan"), {}, {})
    what = f"{fusion['norm']} w_dense={fusion['weight']} + bm25s" if mode == "hybrid" else "dense alone"
    return {
        **row("served", sc),
        **base,
        "chosen": "served",
        "search": f"as `scalingnote serve` answers: {live.factory} {how}, {what}",
    }


def _write_fusion(index_dir: Path, fusion: dict) -> None:
    """The served default beside the index (read by ``scalingnote serve``)."""
    if "weight" in fusion:
        write_json(
            index_dir / "fusion.json",
            {
                "method": "weighted",
                "weight": fusion["weight"],
                "norm": fusion["norm"],
                "default_mode": "hybrid" if fusion["choice"] == "hybrid" else "dense",
                "reason": fusion["reason"],
            },
        )


class _Laps:
    """Wall seconds of each phase of a run (a reused step costs ~0), for ``results.json``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.start = self._t = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] = round(now - self._t, 1)
        self._t = now


def quickstart(cfg: QuickstartConfig) -> list[dict[str, Any]]:
    """Run (or resume) the whole pipeline; returns the results rows (also in ``results.json``).
    Unless ``cfg.full``: the plan first, the candidates compared on the proxy, only the survivors
    trained in full, within ``cfg.budget_minutes`` (:mod:`scalingnote.quickstart.early`)."""
    pipeline.check_inputs(Path(cfg.out), Path(cfg.data) if cfg.data else None, cfg.eval_split, cfg.corpus_format)
    out = Path(cfg.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out / "quickstart.yaml")
    seed_everything(cfg.seed)
    tty = is_terminal()
    if not tty and cfg.show_progress:  # a log, not a terminal: one line per phase and per minute, not a flood of bars
        cfg = replace(cfg, show_progress=False)
    laps = _Laps()
    data = runs.prepare_data(cfg, out)
    readable, family_report = pipeline.readable_families(cfg, Path(data["beir"]), Path(data["corpus"]))
    laps.lap("data")
    fams = [family(cfg, f) for f in readable]
    cfg, sizes, plan0 = early.first_plan(cfg, fams, data, dict(laps.seconds), family_report)
    with Progress(plan0.phases, heartbeat_s=None if tty else 60.0) as prog:
        prog.end("data", laps.seconds["data"])
        prog.begin("proxy")
        cands, proxy_result = early.decide(cfg, fams, data, out, plan0)
        laps.lap("proxy")
        prog.end("proxy", laps.seconds["proxy"])
        key = plan_record.plan_inputs(cfg, data, cands)  # a re-run goes on with the plan it made
        plan = plan_record.recorded_plan(
            out, key, lambda: early.second_plan(cfg, fams, sizes, plan0, cands, dict(laps.seconds), proxy_result)
        )
        prog.replan(plan.phases)
        kept = None if cfg.full else plan.cands  # the proxy's survivors, less what the budget cut
        return _run(
            early.budgeted(cfg, plan),
            out,
            data,
            readable,
            family_report,
            fams,
            kept,
            proxy_result,
            (plan0, plan),
            laps,
            prog,
            key,
        )


def _run(
    cfg: QuickstartConfig,
    out: Path,
    data: dict,
    readable: list[str],
    family_report: dict,
    fams: list,
    cands,
    proxy_result: dict | None,
    plans: tuple[Plan, Plan],
    laps: _Laps,
    prog: Progress,
    plan_key: dict[str, Any],
) -> list[dict[str, Any]]:
    """Stage I on the candidates still in, Stage II, the comparison, the index, the evaluation
    (``plan_key``: what the plan was made for; a cut made late is written into its record)."""
    prog.begin("stage1_large_towers")
    fams = [f for f in fams if cands is None or f.name in cands.depths]  # the families the proxy kept
    contenders = [f.name for f in fams]
    pool = TowerPool()
    f0, lrs0, _ = pipeline.restrict(fams[0], cands)
    # the held-out queries come from the first Stage I run
    first = runs.large_tower_runs(cfg, f0, data, out, lrs0, dim=pipeline.stage1_dim(cfg, f0, cands))
    first_dir = Path(next(iter(first.values()))["run_dir"])
    ev = load_eval_set(Path(data["beir"]), cfg.eval_split, first_dir, cfg.max_eval_queries)
    large = pipeline.large_towers(cfg, fams, data, out, pool, ev, cands)
    teacher, t_why = pipeline.choose_teacher(cfg, contenders, large, pool, ev)
    pipeline.say(f"teacher: {teacher} large tower ({t_why})")
    laps.lap("stage1_large_towers")
    prog.end("stage1_large_towers", laps.seconds["stage1_large_towers"])
    go = mining_round.go_now(cfg, plans[1], dict(laps.seconds), prog.ratio(), len(ev.val_qids))
    plan_record.keep(out, plan_key, plans[1])
    if go[0]:
        prog.begin("mining_round")
    large, mined = mining_round.mining_round(cfg, go, large, teacher, data, out, pool, ev)
    if mined["tried"]:  # a round not tried is no phase of this run (``mining_round: off``: today's phases)
        laps.lap("mining_round")
        prog.end("mining_round", laps.seconds["mining_round"])
    prog.begin("stage2_students")
    pseudo = runs.pseudo_queries(cfg, data, out)
    deadline = early.qkd_deadline(cfg, plans[1], time.perf_counter() - laps.start, prog.ratio())
    students = pipeline.train_students(
        cfg,
        contenders,
        large,
        teacher,
        data,
        out,
        pseudo,
        pool,
        ev,
        decide_early=bool(proxy_result and proxy_result.get("drawn")),
        deadline=deadline,
    )
    laps.lap("stage2_students")
    prog.end("stage2_students", laps.seconds["stage2_students"])
    cfg = early.late_cut(cfg, plans[1], laps.seconds, prog.ratio())
    plan_record.keep(out, plan_key, plans[1])
    prog.replan(plans[1].phases)
    prog.begin("comparison_runs")
    compared = {"all": contenders, "teacher": [teacher], "none": []}[str(cfg.compare)]
    comp = pipeline.comparison_runs(cfg, compared, large, students, data, out, pseudo)
    laps.lap("comparison_runs")
    prog.end("comparison_runs", laps.seconds["comparison_runs"])
    prog.begin("index")
    tune = tuning_texts(ev, first_dir, seed=cfg.seed) if cfg.index_recall is not None else None
    index_dir = index_choice.build_ivfpq(cfg, out, data, large[teacher]["dir"], Path(students["chosen"]["dir"]), tune)
    laps.lap("index")
    prog.end("index", laps.seconds["index"])
    prog.begin("evaluation")
    runs.banner("evaluation")
    rows, fusion, kept = _evaluation_rows(
        cfg, ev, pool, data, out, plans[1], comp, large, teacher, students, mined, index_dir
    )
    laps.lap("evaluation")
    prog.end("evaluation", laps.seconds["evaluation"])
    elapsed = time.perf_counter() - laps.start
    dropped = drop_feature_cache(out, keep_pooled=cfg.keep_feature_cache)
    choices = {
        **pipeline.summary(readable, family_report, large, teacher, t_why, students),
        "served": fusion,
        "ordering": report.ordering_holds(rows),
        "index": read_manifest(index_dir).get("search_tuning"),
        "proxy": proxy.agreement(proxy_result, large, teacher, cfg.dim)
        if proxy_result and proxy_result.get("drawn")
        else proxy_result,
        "budget": early.report(*plans, laps.seconds),
        "mining_round": mined,
        "retention": kept,
        "output_mb": round(dir_bytes(out) / 2**20, 1),
        "feature_cache": dropped,
    }
    _write_results(cfg, out, rows, choices, elapsed, laps)
    report.print_table(rows)
    _closing(out, elapsed, laps, plans[1], fusion, index_dir, students, kept)
    print(f"mining round: {mined['reason']}")
    return rows


def drop_feature_cache(out: Path, *, keep_pooled: bool = False) -> dict[str, Any]:
    """Drop ``out/features`` at the end of a finished run: the token embeddings always (recomputed in
    a moment if a later step needs them), the pooled backbone states unless ``keep_pooled`` (every
    step that read them is done and marked; a later run with other candidates fills them again).
    Returns what went: ``{"dropped": [cache names], "dropped_mb", "kept": [names]}``."""
    root = out / "features"
    caches = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    gone = [p for p in caches if holds_tokens(p.name) or not keep_pooled]
    mb = sum(dir_bytes(p) for p in gone) / 2**20
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    if root.is_dir() and not any(root.iterdir()):
        root.rmdir()
    return {
        "dropped": [p.name for p in gone],
        "dropped_mb": round(mb, 1),
        "kept": [p.name for p in caches if p not in gone],
    }


def _evaluation_rows(
    cfg: QuickstartConfig,
    ev: EvalSet,
    pool: TowerPool,
    data: dict,
    out: Path,
    plan: Plan,
    comp: dict,
    large: dict,
    teacher: str,
    students: dict,
    mined: dict,
    index_dir: Path,
) -> tuple[list[dict[str, Any]], dict, dict]:
    """The results table's rows (baselines, the matched-cost comparison, the teacher, the students,
    the served configuration, the other mining round, the depths), with their query rates, the
    retention and the comparison with the best baseline; also the served fusion and the retention."""
    rows, bm_sc, _, _ = _baselines(cfg, ev, pool, data, out, zero_shot=plan.zero_shot_row)
    rows += report.comparison_rows(pool, ev, comp, large, teacher, students["chosen"]["dir"])
    rows += report.teacher_row(pool, ev, large, teacher, rows)
    rows += report.student_rows(pool, ev, students, large[teacher]["dir"], rows)
    served, fusion = _served_rows(cfg, ev, pool, students["chosen"], large[teacher]["dir"], bm_sc, index_dir)
    rows += served + mining_round.other_round_row(pool, ev, mined, teacher) + report.depth_rows(pool, ev, large)
    report.measure_qps(pool, rows, ev.texts)
    kept = report.retention(rows)
    report.vs_best_baseline(rows)
    return rows, fusion, kept


def _write_results(
    cfg: QuickstartConfig, out: Path, rows: list[dict[str, Any]], choices: dict, elapsed: float, laps: _Laps
) -> None:
    """``results.json``: the rows, the choices, the time per phase and the run's metadata."""
    write_json(
        out / "results.json",
        {
            "rows": rows,
            "choices": choices,
            "elapsed_s": round(elapsed, 1),
            "phase_seconds": laps.seconds,
            **run_metadata(cfg),
        },
    )


def _closing(
    out: Path, elapsed: float, laps: _Laps, plan, fusion: dict, index_dir: Path, students: dict, kept: dict
) -> None:
    print(
        f"\nall artefacts in {out} (this run: {elapsed / 60:.1f} min, torch threads "
        f"{torch.get_num_threads()}; seconds per phase: "
        + ", ".join(f"{k} {v:g} (planned {plan.phases.get(k, 0):.0f})" for k, v in laps.seconds.items())
        + ")"
    )
    if plan.skipped:
        print("skipped to hold the budget: " + "; ".join(plan.skipped))
    print(f"training curves (every Stage I and QKD run): {tensorboard_command(out)}")
    mode = "hybrid (student + BM25, weighted)" if fusion["choice"] == "hybrid" else "dense (the student alone)"
    print(f"served default: {mode}: {fusion['reason']}")
    print(report.retention_text(kept))
    print(
        f"output: {dir_bytes(out) / 2**20:.0f} MB (trained parts only; the base models are named "
        "by package and fingerprint)"
    )
    print("serve it:")
    print(f"  scalingnote serve --index {index_dir} --query-tower {students['chosen']['dir']} --port 8080")


__all__ = ["quickstart"]
