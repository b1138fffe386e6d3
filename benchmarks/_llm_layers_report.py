"""The report side of ``benchmarks/llm_layers.py``: per-query test runs of the saved towers, paired
t-tests between rows, the row chosen on validation per (depth, k, tower), the TwinBERT reference
and the depth-curve plot."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks._common import RESULTS_DIR, shared_data_dir


def k_order(k: int | str) -> int:
    return 10**6 if k == "all" else int(k)


def per_query_run(run_dir: Path, data: str) -> dict[str, dict[str, float]]:
    """The saved towers' test run (query tower re-encoded, the saved document embeddings)."""
    import numpy as np

    from scalingnote.data import load_beir
    from scalingnote.evaluation.dense import exact_search, truncate_normalize
    from scalingnote.models import load_tower

    ds = load_beir(shared_data_dir() / data, "test")
    qids = sorted(ds.qrels)
    qt = load_tower(run_dir / "query_tower")
    q = truncate_normalize(
        qt.encode_queries([ds.queries[i].text for i in qids], batch_size=128, show_progress=False), 128
    )
    doc_ids = json.loads((run_dir / "doc_ids.json").read_text())
    d = truncate_normalize(np.load(run_dir / "doc_embeddings.npy"), 128)
    return exact_search(q, qids, d, doc_ids, k=100)


def add_significance(rows: list[dict], data: str, runs: dict) -> None:
    """Start nDCG@10 of k > 0 rows (warm: their depth's trained k = 0 row; else its start) and
    paired t-tests (per-query test nDCG@10) of each row against the same k one depth shallower
    and, for k > 0, against the heads-only row of its depth."""
    from scalingnote.data import load_beir
    from scalingnote.evaluation.significance import compare_runs

    qrels = load_beir(shared_data_dir() / data, "test").qrels
    mark_chosen(rows)
    for r in rows:  # ``runs``: per-row test runs, kept between calls
        if r["_dir"] not in runs:
            runs[r["_dir"]] = per_query_run(Path(r["_dir"]), data)
    for r in rows:
        heads = next((b for b in rows if b["depth"] == r["depth"] and b["trainable_layers"] == 0), None)
        if r["start_ndcg@10"] is None and heads is not None:
            r["start_ndcg@10"] = heads["ndcg@10"] if r.get("_warm") else heads["start_ndcg@10"]
        if r["trainable_layers"] and heads is not None:  # trained layers vs heads only, same depth and budget
            c = compare_runs(runs[r["_dir"]], runs[heads["_dir"]], qrels)
            r["delta_ndcg@10_vs_heads"] = round(c.mean_a - c.mean_b, 4)
            r["p_vs_heads"] = round(c.ttest.pvalue, 4)
        shallower = [
            b
            for b in rows
            if b["trainable_layers"] == r["trainable_layers"]
            and b["tower"] == r["tower"]
            and b["depth"] < r["depth"]
            and b["chosen"]
        ]
        if shallower:
            b = max(shallower, key=lambda x: x["depth"])
            c = compare_runs(runs[r["_dir"]], runs[b["_dir"]], qrels)
            r["vs_shallower_depth"] = b["depth"]
            r["delta_ndcg@10_vs_shallower"] = round(c.mean_a - c.mean_b, 4)
            r["p_vs_shallower"] = round(c.ttest.pvalue, 4)


def mark_chosen(rows: list[dict]) -> None:
    """``chosen``: the row of its (depth, k, tower) with the best validation nDCG@10 (several
    ``--lr``); never a test figure."""
    for r in rows:
        same = [
            b
            for b in rows
            if (b["depth"], b["trainable_layers"], b["tower"]) == (r["depth"], r["trainable_layers"], r["tower"])
        ]
        r["chosen"] = r is max(same, key=lambda b: b["val_ndcg@10"])


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"


def twinbert_reference(data: str) -> tuple[float | None, str]:
    """TwinBERT on this data (the BERT-family dual tower, MiniLM-L6, both towers trained) from
    ``recipe_<data>.json``, the issue's bar for ScalingDual with trained LLM layers; None where
    the recipe has no such row (KUAKE-QTR: MiniLM cannot read Chinese)."""
    f = RESULTS_DIR / f"recipe_{data}.json"
    rows = json.loads(f.read_text())["rows"] if f.is_file() else []
    hit = next(
        (r for r in rows if r.get("method") == "scaling_dual" and str(r.get("large_tower", "")).startswith("minilm")),
        None,
    )
    return (
        (hit["ndcg@10"], f"benchmarks/results/recipe_{data}.json: scaling_dual, {hit['large_tower']}")
        if hit
        else (None, "none")
    )


def plot_depth_curve(rows: list[dict], name: str, twinbert: float | None) -> Path:
    """Test nDCG@10 against depth (log scale), one line per ``k``, TwinBERT as a reference line."""
    from scalingnote.scaling.plots import _plt, _save

    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4.3))
    for k in sorted({r["trainable_layers"] for r in rows}, key=k_order):
        rs = sorted([r for r in rows if r["trainable_layers"] == k and r["chosen"]], key=lambda r: r["depth"])
        label = (
            "heads only (frozen backbone)"
            if k == 0
            else f"every layer trained, {rs[0]['tower']} tower(s)"
            if k == "all"
            else f"top {k} layer{'s' if k > 1 else ''} trained, {rs[0]['tower']} tower(s)"
        )
        ax.plot([r["depth"] for r in rs], [r["ndcg@10"] for r in rs], "o-", label=label)
    if twinbert is not None:
        ax.axhline(twinbert, color="grey", ls="--", label=f"TwinBERT (MiniLM-L6) {twinbert:.3f}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({r["depth"] for r in rows}), [str(d) for d in sorted({r["depth"] for r in rows})])
    ax.set_xlabel("SmolLM2 depth (layers of both towers)")
    ax.set_ylabel(f"test nDCG@10 ({name.removeprefix('llm_layers_')})")
    ax.set_title(f"ScalingDual document-tower scaling (ScalingNote §4.4), {device_name()}")
    ax.legend(fontsize=8)
    path = RESULTS_DIR / "plots" / f"{name}.png"
    _save(fig, path)
    return path
