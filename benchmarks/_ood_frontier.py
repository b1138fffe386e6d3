"""The recall–QPS frontier of ``benchmarks.ood_routing`` and its plan for ten times the corpus.

``frontier_qps``: per recall@10 level (0.90, 0.95, 0.99) the setting chosen on *validation* —
among the cheapest knob reaching the level at each re-rank depth, the one with the lowest
single-query latency on validation queries — then measured on *test* (recall@10, single-query
QPS, share scanned). ``plan_10m``: memory, build time, single-query latency and machines at 10M
documents, extrapolated from the slopes measured between a real set and the 1M simulation fitted to
it (same towers and width, one run); estimates, not measurements.
``targets``: the routing targets per set and method, judged on the setting chosen on validation
and on the test frontier.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from benchmarks._common import RESULTS_DIR, Timer

LEVELS = (0.90, 0.95, 0.99)
KNOBS = ("nprobe", "ef_search", "rerank")
VAL_TIMING_QUERIES = 50  #: validation queries timed one at a time per candidate setting


def _setting(p: dict) -> dict:
    return {k: p[k] for k in KNOBS if k in p}


def single_ms(idx, q: np.ndarray, setting: dict, n: int) -> float:
    """Mean milliseconds of one query searched alone (the first ``n`` queries, after one warm call)."""
    rows = q[: max(1, n)]
    idx.search(rows[:1], 10, **setting)
    with Timer() as t:
        for i in range(len(rows)):
            idx.search(rows[i : i + 1], 10, **setting)
    return 1000 * t.seconds / len(rows)


def frontier_qps(
    idx, val_points: list[dict], test_points: list[dict], val_q: np.ndarray, test_q: np.ndarray, n_single: int
) -> list[dict]:
    """One entry per level: the setting chosen on validation for it, measured on test."""
    out = []
    for level in LEVELS:
        ok = [p for p in val_points if p["recall@10"] >= level]
        if not ok:
            best = max(val_points, key=lambda p: p["recall@10"])
            out.append({"level": level, "reached_on_validation": False, "val_recall@10": round(best["recall@10"], 4)})
            continue
        per_depth: dict[int, dict] = {}
        for p in ok:  # the cheapest knob at each re-rank depth
            if p["rerank"] not in per_depth or p["share_scanned"] < per_depth[p["rerank"]]["share_scanned"]:
                per_depth[p["rerank"]] = p
        timed = [(single_ms(idx, val_q, _setting(p), VAL_TIMING_QUERIES), p) for p in per_depth.values()]
        _, pick = min(timed, key=lambda t: (t[0], t[1]["share_scanned"]))
        s = _setting(pick)
        at = next(p for p in test_points if _setting(p) == s)
        ms = single_ms(idx, test_q, s, n_single)
        out.append(
            {
                "level": level,
                "reached_on_validation": True,
                "recall@10": round(at["recall@10"], 4),
                "qps_single": round(1000 / ms, 1),
                "share_scanned": round(at["share_scanned"], 5),
                **s,
            }
        )
    return out


def frontier_targets(rows: list[dict]) -> dict[str, str]:
    """The targets per set and method, judged on ``frontier_qps`` (test numbers at the settings
    chosen on validation): recall@10 >= 0.99 at >= 3x today's IVF single-query QPS, <= 1% of the
    corpus scanned at 1M (10% on the real sets), memory <= 0.25 of float32; recall@10 >= 0.90 at
    >= 2,000 single-query QPS."""
    out = {}
    ivf = {r["set"]: r for r in rows if r["method"] == "ivf" and "chosen_for" not in r}
    for r in rows:
        if "chosen_for" in r or "frontier_qps" not in r:
            continue
        f = {e["level"]: e for e in r["frontier_qps"]}
        bound = 0.01 if r["set"] == "sim1m" else 0.10
        parts = []
        hi, lo = f.get(0.99, {}), f.get(0.90, {})
        if not hi.get("reached_on_validation"):
            parts.append(f"0.99: never reached on validation (best {hi.get('val_recall@10')}): MISSED")
        else:
            base = (ivf.get(r["set"]) or {}).get("frontier_qps") or []
            b99 = next((e for e in base if e["level"] == 0.99 and e.get("reached_on_validation")), None)
            ratio = None if b99 is None else hi["qps_single"] / b99["qps_single"]
            parts.append(
                f"0.99: test recall {hi['recall@10']:.4f}"
                + (" (MISSED on test)" if hi["recall@10"] < 0.99 else "")
                + f", {hi['qps_single']:.0f} QPS"
                + ("" if ratio is None else f" = {ratio:.2f}x ivf (target 3x: {'met' if ratio >= 3 else 'MISSED'})")
                + f", {hi['share_scanned']:.2%} scanned ({'met' if hi['share_scanned'] <= bound else 'MISSED'}, "
                f"bound {bound:.0%})"
            )
        parts.append(
            f"memory {r['memory_ratio_vs_float']:.3f} of float32 "
            f"({'met' if r['memory_ratio_vs_float'] <= 0.25 else 'MISSED'})"
        )
        if lo.get("reached_on_validation"):
            parts.append(
                f"0.90: test recall {lo['recall@10']:.4f} at {lo['qps_single']:.0f} QPS (target 2000: "
                f"{'met' if lo['qps_single'] >= 2000 and lo['recall@10'] >= 0.9 else 'MISSED'})"
            )
        else:
            parts.append("0.90: never reached on validation: MISSED")
        out[f"{r['set']}/{r['method']}"] = "; ".join(parts)
    return out


def plan_10m(
    rows: list[dict], *, small_set: str = "kuake_qtr", n_target: int = 10_000_000, ram_gib: float, cores: int
) -> dict:
    """Per method measured at 1M (``sim1m``) and on ``small_set`` (the set it was fitted to: same
    width): the 10M estimate from the measured slopes. Memory: bytes a vector at 1M x 10M (IVF
    lists and codes grow linearly; the centroids by sqrt(N): counted as linear, an upper bound).
    Build seconds and single-query latency at recall 0.99 (else 0.95): a power law through the two
    measured sizes. Machines: enough of this one's RAM (80% usable) for the index plus the float32
    re-rank vectors in the page cache."""
    by = {(r["set"], r["method"]): r for r in rows if "chosen_for" not in r}
    plan: dict = {
        "n": n_target,
        "assumes": f"{cores} cores, {ram_gib:.0f} GiB RAM a machine; power laws through {small_set} and sim1m "
        "(same towers, same width)",
        "nlist_rule": f"4 sqrt(N) = {int(round(4 * math.sqrt(n_target)))} lists",
        "methods": {},
    }
    for (s, method), big in by.items():
        if s != "sim1m":
            continue
        small = by.get((small_set, method))
        n1, d = big["n"], big["dim"]
        e: dict = {
            "memory_gib": round(big["memory_bytes"] / n1 * n_target / 2**30, 2),
            "rerank_floats_gib": round(n_target * d * 4 / 2**30, 2),
        }
        if small is not None and small["n"] < n1:
            slope = math.log(max(big["build_s"], 1e-3) / max(small["build_s"], 1e-3)) / math.log(n1 / small["n"])
            e["build_slope"] = round(slope, 3)
            e["build_s"] = round(big["build_s"] * (n_target / n1) ** slope, 0)
            lat = _latency_slope(small, big, n1, n_target)
            if lat is not None:
                e.update(lat)
        e["machines"] = max(1, math.ceil((e["memory_gib"] + e["rerank_floats_gib"]) / (0.8 * ram_gib)))
        plan["methods"][method] = e
    return plan


def _latency_slope(small: dict, big: dict, n1: int, n_target: int) -> dict | None:
    for level in (0.99, 0.95):
        a = next(
            (x for x in small.get("frontier_qps", []) if x["level"] == level and x.get("reached_on_validation")), None
        )
        b = next(
            (x for x in big.get("frontier_qps", []) if x["level"] == level and x.get("reached_on_validation")), None
        )
        if a and b:
            slope = math.log(a["qps_single"] / b["qps_single"]) / math.log(n1 / small["n"])
            return {
                "latency_level": level,
                "latency_slope": round(slope, 3),
                "qps_single": round(b["qps_single"] / (n_target / n1) ** slope, 1),
            }
    return None


def flatten_frontier(rows: list[dict]) -> dict[str, list[dict]]:
    """Rows stay flat (one value a key, as every results file): each row's ``frontier_qps`` list moves
    to the returned ``{"<set>/<method>": [...]}`` (for the config) and its entries become the row's
    keys ``frontier@<level>_recall@10`` / ``_qps_single`` / ``_share_scanned`` / ``_setting``."""
    out = {}
    for r in rows:
        entries = r.pop("frontier_qps", None)
        if entries is None:
            continue
        out[f"{r['set']}/{r['method']}"] = entries
        for e in entries:
            tag = f"frontier@{e['level']:.2f}"
            r[f"{tag}_recall@10"] = e.get("recall@10")
            r[f"{tag}_qps_single"] = e.get("qps_single")
            r[f"{tag}_share_scanned"] = e.get("share_scanned")
            r[f"{tag}_setting"] = (
                " ".join(f"{k}={e[k]}" for k in KNOBS if k in e)
                or f"not reached on validation (best {e.get('val_recall@10')})"
            )
    return out


__all__ = ["LEVELS", "flatten_frontier", "frontier_qps", "frontier_targets", "plan_10m", "single_ms"]


def _frontier(row: dict) -> list[tuple[str, float, float]]:
    out = []
    for item in row.get("frontier_test", "").split():
        tag, rest = item.split(":")
        rec, share = rest.split("@")
        out.append((tag, float(rec), float(share)))
    return out


def targets(rows: list[dict], target: float = 0.99) -> dict[str, str]:
    """The routing targets per set and method: recall@10 vs exact >= ``target`` within the
    share bound (1% at 1M, 10% on the real sets), memory <= 1/4 of the float vectors, QPS >= 3x
    today's ivf. Judged on the setting chosen on validation (its test numbers), then the test
    frontier's cheapest point at the target (an oracle choice, for how far off the method is)."""
    out = {}
    ivf = {r["set"]: r for r in rows if r["method"] == "ivf" and "chosen_for" not in r}
    for r in rows:
        if "chosen_for" in r:
            continue
        bound = 0.01 if r["set"] == "sim1m" else 0.10
        rec, share = r["recall@10"], r["share_scanned"]
        v = f"chosen on validation: test recall {rec:.4f} at {share:.2%} scanned: "
        if not r["val_reached_target"]:
            v += f"validation never reached {target} (best {r['val_recall@10']:.4f}): MISSED; "
        elif rec < target:
            v += f"test recall below {target}: MISSED by {target - rec:.4f}; "
        v += "share " + ("met" if share <= bound else f"MISSED ({share / bound:.1f}x the {bound:.0%} bound)")
        v += f"; memory {r['memory_ratio_vs_float']:.3f} of float32 " + (
            "(met)" if r["memory_ratio_vs_float"] <= 0.25 else "(MISSED: > 0.25)"
        )
        base = ivf.get(r["set"])
        if base is not None and r["method"] != "ivf" and r["val_reached_target"] and base["val_reached_target"]:
            v += (
                f"; QPS vs today's ivf at the chosen settings: single {r['qps_single'] / base['qps_single']:.2f}x, "
                f"batched {r['qps_batched'] / base['qps_batched']:.2f}x (target 3x)"
            )
        front = _frontier(r)
        ok = [f for f in front if f[1] >= target]
        if ok:
            tag, frec, fshare = min(ok, key=lambda f: f[2])
            v += f". Test frontier: cheapest >= {target} is {tag} {frec:.4f} at {fshare:.2%}"
        elif front:
            best = max(front, key=lambda f: f[1])
            within = [f for f in front if f[2] <= bound]
            v += f". Test frontier: never reaches {target}, max {best[1]:.4f} at {best[2]:.2%} ({best[0]})"
            if within:
                wb = max(within, key=lambda f: f[1])
                v += f"; best within {bound:.0%}: {wb[1]:.4f} ({wb[0]})"
        out[f"{r['set']}/{r['method']}"] = v
    return out


def results_name(recipe_runs: Path | None, name: str | None = None) -> str:
    """The results file a run writes: ``name`` when given, else ``ood_routing`` on the recipes' own
    towers (the out-of-distribution queries the methods are for), ``ood_routing_standin`` on the
    stand-in towers (their queries sit much closer to the documents), so no run overwrites another's
    measurements."""
    if name:
        return name
    return "ood_routing" if recipe_runs is not None else "ood_routing_standin"


def keep_earlier(
    rows: list[dict], info: dict, name: str, methods: list[str]
) -> tuple[list[dict], list[str], dict, dict]:
    """``--keep``: the earlier results file's rows of the sets this run did not measure (their own
    measurement, one machine, an earlier run and its towers), then these, ordered by set, then ``methods``;
    the earlier sets' info; what the kept rows came from (``kept_from``: the earlier run's date, machine,
    methods and settings, and the earlier rows of the re-measured sets that were dropped, because a set
    re-measured may stand on other towers and one set's rows must come from one run)."""

    path = RESULTS_DIR / f"{name}.json"
    if not path.exists():
        return rows, [], info, {}
    old = json.loads(path.read_text())
    measured = {r["set"] for r in rows}
    keep = [r for r in old["rows"] if r["set"] not in measured]
    order = {s: i for i, s in enumerate(("scifact", "kuake_qtr", "sim1m"))}
    merged = sorted(
        keep + rows,
        key=lambda r: (order.get(r["set"], 9), methods.index(r["method"]) if r["method"] in methods else 99),
    )
    oc = old["config"]
    kept_info = {s: v for s, v in oc.get("info", {}).items() if s.split("_sample")[0] not in measured}
    kept_from = {
        "created": old.get("created"),
        "machine": old.get("machine"),
        "sets": sorted({r["set"] for r in keep}),
        **{
            k: oc.get(k)
            for k in ("methods", "sim_methods", "sim_n", "sim_components", "sim_rank", "sim_source", "total_s")
        },
        "dropped_rows": sorted({f"{r['set']}/{r['method']}" for r in old["rows"] if r["set"] in measured}),
    }
    return merged, sorted({f"{r['set']}/{r['method']}" for r in keep}), {**kept_info, **info}, kept_from
