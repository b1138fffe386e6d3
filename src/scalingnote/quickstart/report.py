"""The quick start's results table: baselines, the paper's matched-cost comparison per family
(with paired t-tests between its steps), the LLM depth candidates, the student candidates and
the served rows, each with its validation and test figures and what was chosen."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scalingnote.evaluation.significance import paired_ttest, ratio_interval
from scalingnote.quickstart.scoring import EvalSet, Scored, TowerPool, query_qps_many, score

ORDER = ("twinbert_small", "scaling_doc", "scalingnote", "scaling_dual")
#: method-name prefixes of the baseline rows (BM25, the zero-shot BERT-family tower)
BASELINES = ("bm25", "zero_shot_")


def tower_label(pool: TowerPool, qdir: str | Path, qkd: bool = False) -> tuple[str, int]:
    c = pool.tower(qdir).config
    base = Path(c.base_model).name if "/" in str(c.base_model) else c.base_model
    if base == "backbone":  # a student started from its teacher's saved backbone
        base = Path(c.base_model).parent.parent.name
    return f"{base} ({c.num_layers}L{', QKD' if qkd else ''})", int(c.num_layers)


def row(
    method: str,
    sc: Scored,
    *,
    large: str = "-",
    query: str = "-",
    layers: int | None = None,
    chosen: str = "",
    tower: str | Path | None = None,
    **extra: Any,
) -> dict[str, Any]:
    val = None if sc.val_ndcg != sc.val_ndcg else sc.val_ndcg  # NaN (no validation figure) -> null
    r = {
        "method": method,
        "large_tower": large,
        "query_tower": query,
        "query_layers": layers,
        **sc.metrics,
        "val_ndcg@10": val,
        "query_qps": None,
        "chosen": chosen,
        **extra,
    }
    if tower is not None:
        r["_tower"] = str(tower)
    if sc.per_query:
        r["_pq"] = sc.per_query  # per-query nDCG@10 for the significance columns; dropped by vs_best_baseline
    if sc.val_per_query:
        r["_val_pq"] = sc.val_per_query  # the same on validation, for the retention's interval; dropped alike
    return r


def vs_best_baseline(rows: list[dict]) -> None:
    """The chosen student's and the served row's paired t-test against the best baseline row
    (BM25 or the zero-shot tower, by test nDCG@10): ``best_baseline``, ``delta_vs_best_baseline``,
    ``p_vs_best_baseline`` (a target missed or met by a hair reads with its p-value). Drops the
    rows' per-query scores (test and validation)."""
    base = [r for r in rows if r["method"].startswith(BASELINES) and r.get("_pq")]
    best = max(base, key=lambda r: r["ndcg@10"]) if base else None
    for r in rows:
        if (
            best is not None
            and r is not best
            and r.get("_pq")
            and ("student" in r["chosen"] or "served" in r["chosen"])
        ):
            r.update(
                best_baseline=best["method"],
                delta_vs_best_baseline=round(r["ndcg@10"] - best["ndcg@10"], 4),
                p_vs_best_baseline=round(paired_ttest(r["_pq"], best["_pq"]).pvalue, 6),
            )
    for r in rows:
        r.pop("_pq", None)
        r.pop("_val_pq", None)


def comparison_rows(
    pool: TowerPool, ev: EvalSet, comp: dict, large: dict, teacher: str, student_dir: str
) -> list[dict]:
    """Per family: twinbert_small < scaling_doc < scalingnote <= scaling_dual (the paper's claim),
    each step with the paired t-test p-value over the reported queries against the previous one."""
    rows = []
    for fam, methods in comp.items():
        L = large[fam]
        large_label = tower_label(pool, L["dir"] / "query_tower")[0]
        prev: Scored | None = None
        for method in ORDER:
            m = methods[method]
            sc = score(pool, m["q"], m["d"], ev)
            label, n = tower_label(pool, m["q"], qkd=method == "scalingnote")
            chosen = []
            if method == "scaling_dual" and fam == teacher:
                chosen.append("teacher")
            if method == "scalingnote" and str(m["q"]) == student_dir:
                chosen.append("student")
            extra: dict[str, Any] = {
                "p_vs_prev": round(paired_ttest(sc.per_query, prev.per_query).pvalue, 6) if prev else None,
                "delta_vs_prev": round(sc.metrics["ndcg@10"] - prev.metrics["ndcg@10"], 4) if prev else None,
            }
            if method == "scalingnote":
                extra["qkd_rank_weight"] = m.get("rank_weight")
            if method == "scaling_dual":
                extra["note"] = f"kept the {L['kept']} tower ({L['guard']})"
            rows.append(
                row(
                    method,
                    sc,
                    large=large_label,
                    query=label,
                    layers=n,
                    chosen="+".join(chosen),
                    tower=m["q"],
                    family=fam,
                    **extra,
                )
            )
            prev = sc
    return rows


def student_rows(pool: TowerPool, ev: EvalSet, students: dict, teacher_dir: Path, rows: list[dict]) -> list[dict]:
    """Every student candidate not already a row of the comparison (another family or size), and
    each candidate's single-query p99 (the latency frontier the student was chosen from)."""
    large_label = tower_label(pool, teacher_dir / "query_tower")[0]
    by_dir = {r.get("_tower"): r for r in rows}
    new = []
    for c in students["candidates"]:
        chosen = c["name"] == students["chosen"]["name"]
        r = by_dir.get(c["dir"])
        if r is None:
            label, n = tower_label(pool, c["dir"], qkd=True)
            r = row(
                "scalingnote" if chosen else "scalingnote_candidate",
                score(pool, c["dir"], teacher_dir, ev),
                large=large_label,
                query=label,
                layers=n,
                chosen="student" if chosen else "",
                tower=c["dir"],
            )
            new.append(r)
        r["p99_ms"] = c["p99_ms"]
        r["qkd_rank_weight"] = c.get("rank_weight")
        r["on_frontier"] = c["name"] in students["frontier"]
    return new


def teacher_row(pool: TowerPool, ev: EvalSet, large: dict, teacher: str, rows: list[dict]) -> list[dict]:
    """The teacher's row when the comparison did not add it (a budget that cut the comparison
    runs): every table shows what the student is distilled from."""
    if any("teacher" in r["chosen"].split("+") for r in rows):
        return []
    d = Path(large[teacher]["dir"])
    label, n = tower_label(pool, d / "query_tower")
    return [
        row(
            "scaling_dual",
            score(pool, d / "query_tower", d, ev),
            large=label,
            query=label,
            layers=n,
            chosen="teacher",
            tower=d / "query_tower",
            family=teacher,
            note=f"kept the {large[teacher]['kept']} tower ({large[teacher]['guard']})",
        )
    ]


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or a != a or b != b or not b else round(a / b, 4)


def _interval(student: dict | None, teacher: dict | None) -> dict[str, Any]:
    """The validation retention's 95% bootstrap interval over the validation queries
    (:func:`~scalingnote.evaluation.significance.ratio_interval`; None where it cannot be read): 62
    queries leave a retention known to a few points, which a 97% target must be read against."""
    none = {"retention_val_low": None, "retention_val_high": None, "val_queries": len(student or {})}
    if not student or not teacher or student.keys() != teacher.keys() or len(student) < 2:
        return none
    if sum(teacher.values()) <= 0:
        return none
    _, lo, hi = ratio_interval(student, teacher)
    if lo != lo or hi != hi:  # too many resamples with no query the teacher scored: not known
        return none
    return {"retention_val_low": round(lo, 4), "retention_val_high": round(hi, 4), "val_queries": len(student)}


def retention(rows: list[dict]) -> dict[str, Any]:
    """The student's share of its teacher (the paper's headline: a small query tower keeps most of
    its large teacher's quality): student / teacher nDCG@10 on validation and on test, and its query
    speed-up (student / teacher query QPS, after :func:`measure_qps`); set on the student's and the
    teacher's rows and returned for ``results.json`` (empty without both rows)."""
    t = next((r for r in rows if "teacher" in r["chosen"].split("+")), None)
    s = next((r for r in rows if "student" in r["chosen"].split("+")), None)
    if t is None or s is None:
        return {}
    out = {
        "teacher": t["query_tower"],
        "student": s["query_tower"],
        "teacher_val": t.get("val_ndcg@10"),
        "student_val": s.get("val_ndcg@10"),
        "teacher_test": t["ndcg@10"],
        "student_test": s["ndcg@10"],
        "retention_val": _ratio(s.get("val_ndcg@10"), t.get("val_ndcg@10")),
        **_interval(s.get("_val_pq"), t.get("_val_pq")),
        "retention_test": _ratio(s["ndcg@10"], t["ndcg@10"]),
        "speedup": _ratio(s.get("query_qps"), t.get("query_qps")),
    }
    s.update({k: out[k] for k in ("retention_val", "retention_val_low", "retention_val_high", "retention_test")})
    s.update(speedup=out["speedup"])
    t.update(retention_val=1.0, retention_test=1.0, speedup=1.0)
    return out


def retention_text(ret: dict[str, Any]) -> str:
    """:func:`retention` in one line (for the run's closing lines)."""
    if not ret:
        return "student vs teacher: no teacher row to compare with"
    pct = lambda x: "-" if x is None else f"{100 * x:.1f}%"  # noqa: E731
    val = (
        f"{ret['student_val']:.4f} / {ret['teacher_val']:.4f}"
        if ret["student_val"] is not None and ret["teacher_val"] is not None
        else "-"
    )
    speed = "-" if ret["speedup"] is None else f"{ret['speedup']:.1f}x"
    band = (
        f", 95% interval {pct(ret['retention_val_low'])}-{pct(ret['retention_val_high'])} over "
        f"{ret['val_queries']} queries"
        if ret.get("retention_val_low") is not None
        else f", no interval over {ret['val_queries']} queries"
        if ret.get("val_queries")
        else ""
    )
    return (
        f"the student {ret['student']} keeps {pct(ret['retention_val'])} of its teacher's "
        f"validation nDCG@10 ({val}{band}) and "
        f"{pct(ret['retention_test'])} on test ({ret['student_test']:.4f} / "
        f"{ret['teacher_test']:.4f}), at {speed} the teacher's "
        f"query speed ({ret['teacher']})"
    )


def ordering_holds(rows: list[dict]) -> dict[str, bool]:
    """Per family: does twinbert_small < scaling_doc < scalingnote <= scaling_dual hold on nDCG@10?"""
    out = {}
    for fam in sorted({r["family"] for r in rows if "family" in r and r["method"] in ORDER}):
        v = {r["method"]: r["ndcg@10"] for r in rows if r.get("family") == fam and r["method"] in ORDER}
        if len(v) < len(ORDER):  # the teacher's row alone (the comparison runs were cut): no ordering to check
            continue
        out[fam] = v["twinbert_small"] < v["scaling_doc"] < v["scalingnote"] <= v["scaling_dual"]
    return out


def depth_rows(pool: TowerPool, ev: EvalSet, large: dict) -> list[dict]:
    """Every candidate depth of a family with several (its best head learning rate each), and the
    chosen depth with its top layers trained from its heads (``unfreeze_layers``) where it ran."""
    rows = []
    for fam, L in large.items():
        for depth, m in L["depths"].items() if len(L["depths"]) >= 2 else ():
            d = Path(m["run_dir"])
            sc = score(pool, d / "query_tower", d, ev)
            label, n = tower_label(pool, d / "query_tower")
            rows.append(
                row(
                    f"scaling_dual_depth_{depth}",
                    sc,
                    large=label,
                    query=label,
                    layers=n,
                    tower=d / "query_tower",
                    family=fam,
                    chosen="depth" if d == L["heads_dir"] else "",
                    head_lr_grid=m["lr_grid"],
                    stage1_val_ndcg=round(m["best_val_score"], 4),
                    train_seconds=m.get("train_seconds"),
                    best_step=m.get("best_step"),
                    val_curve=curve_text(m.get("val_curve")),
                )
            )
        c = L.get("dim_choice")
        if c:  # the chosen depth and head learning rate at the backbone's full embedding size (``full_dim``)
            d = Path(c["dir"])
            label, n = tower_label(pool, d / "query_tower")
            rows.append(
                row(
                    f"scaling_dual_dim_{c['dim']}",
                    score(pool, d / "query_tower", d, ev),
                    large=label,
                    query=label,
                    layers=n,
                    tower=d / "query_tower",
                    family=fam,
                    chosen="dim" if c["kept"] else "",
                    stage1_val_ndcg=c["val"],
                    val_at_dim=c["val_at_dim"],
                    train_seconds=c.get("train_seconds"),
                    best_step=c.get("best_step"),
                    val_curve=curve_text(c.get("val_curve")),
                )
            )
        u = L.get("unfrozen")
        if u:
            d = Path(u["dir"])
            label, n = tower_label(pool, d / "query_tower")
            rows.append(
                row(
                    f"scaling_dual_top{u['layers']}_layers",
                    score(pool, d / "query_tower", d, ev),
                    large=label,
                    query=label,
                    layers=n,
                    tower=d / "query_tower",
                    family=fam,
                    chosen="top_layers" if u["kept"] == "top_layers" else "",
                    stage1_val_ndcg=round(u["val_top_layers"], 4),
                    val_heads_only=round(u["val_heads_only"], 4),
                    train_seconds=u.get("train_seconds"),
                    best_step=u.get("best_step"),
                    val_curve=curve_text(u.get("val_curve")),
                )
            )
    return rows


def curve_text(curve: list | None) -> str | None:
    """A Stage I run's validation curve as one flat results cell: ``"step:nDCG@10 ..."`` (step 0
    = its start), so that a row shows whether training moved it."""
    return " ".join(f"{int(s)}:{v:.4f}" for s, v in curve) if curve else None


def measure_qps(pool: TowerPool, rows: list[dict], texts: list[str]) -> None:
    """Query QPS of every query tower, measured together at the end (interleaved rounds)."""
    dirs = list(dict.fromkeys(t for r in rows if (t := r.get("_tower")) is not None))
    qps = query_qps_many({t: pool.tower(t) for t in dirs}, texts)
    for r in rows:
        t = r.pop("_tower", None)
        if t is not None:
            r["query_qps"] = round(qps[t], 1)


def print_table(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    cols = [
        "method",
        "large_tower",
        "query_tower",
        "query_qps",
        "val_ndcg@10",
        "r@100",
        "ndcg@10",
        "p_vs_prev",
        "retention_val",
        "retention_test",
        "speedup",
        "chosen",
    ]
    t = Table(title="scalingnote quickstart: quality and online query cost (choices made on validation queries)")
    for c in cols:
        t.add_column(c, justify="left" if c in ("method", "large_tower", "query_tower", "chosen") else "right")
    for r in rows:
        t.add_row(
            *[
                (
                    "-"
                    if r.get(c) is None
                    else f"{r[c]:.4f}"
                    if isinstance(r[c], float) and c not in ("query_qps", "p_vs_prev")
                    else f"{r[c]:.2g}"
                    if c == "p_vs_prev"
                    else f"{r[c]:.1f}x"
                    if c == "speedup"
                    else str(r[c])
                )
                for c in cols
            ]
        )
    Console(width=max(170, Console().width)).print(t)


__all__ = [
    "ORDER",
    "comparison_rows",
    "retention",
    "retention_text",
    "teacher_row",
    "depth_rows",
    "measure_qps",
    "ordering_holds",
    "print_table",
    "row",
    "student_rows",
    "tower_label",
]
