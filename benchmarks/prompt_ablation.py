"""Prompt ablations of the LLM document tower (ScalingNote §4.5.1, Table 5), measured on SciFact.

    python -m benchmarks.prompt_ablation [--data scifact] [--features DIR] [--presets full,no_title,...]

Rows ``full`` (the §3.2 prompt), ``no_title`` (no title view / title loss), ``no_content`` (no content
view), ``no_summarize`` (no "combine ... compress into one word" instruction; the content view is the
embedding) and ``plain`` (the document as plain text, no placeholders): the presets of
``scalingnote.models.prompt.PROMPT_PRESETS``, each a config switch ``doc_tower.prompt``.

Same recipe and data for every row (benchmarks/_heads_recipe.py, ScalingDual, SmolLM2 truncated to depth 2,
mean pooling): heads only over cached pooled states (``trainable_layers: 0``), heads initialised from
the training pairs (PCA), BM25 hard negatives, batch 64, head lr 3e-3 (the recipe's validated choice
for depth 2), <= 40 epochs with validation nDCG@10 every epoch on 10% of the training queries,
patience 4, best weights restored. Each new prompt fills its own document feature cache once
(5,183 documents through 2 layers). Columns: ``ndcg@10``, ``r@100``, ``contrastive_ppl`` on the
SciFact test queries (Fang et al. Eq. 6, W = 256 negatives drawn once, seed 0, s = cos/0.05) and
two-sided paired t-test p-values of each against ``full`` over the 300 test queries.
Writes benchmarks/results/prompt_ablation_<data>.json (rows written as they finish).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from benchmarks._common import REPO_ROOT, write_results

PRESETS = ["full", "no_title", "no_content", "no_summarize", "plain"]
DEPTH = 2
HEAD_LR = 3e-3


def paired_pvalues(rec: dict, base: dict, prefix: str = "") -> dict:
    """Two-sided paired t-tests (per test query) of ``rec`` against ``base``: nDCG@10, R@100, contrastive ppl."""
    from scalingnote.evaluation.significance import paired_ttest

    out = {}
    qids = sorted(set(rec["per_query"]) & set(base["per_query"]))
    for i, m in enumerate(("ndcg@10", "r@100", "contrastive_ppl")):
        a = [rec["per_query"][q][i] for q in qids]
        b = [base["per_query"][q][i] for q in qids]
        out[f"{prefix}p_{m}"] = paired_ttest(a, b).pvalue
    return out


def result_row(name: str, rec: dict, base: dict | None, **extra) -> dict:
    row = {
        "prompt": name,
        "ndcg@10": rec["ndcg@10"],
        "r@100": rec["r@100"],
        "contrastive_ppl": rec["test_contrastive_ppl"],
        "val_ndcg@10": rec.get("dev_ndcg@10"),
        "start_val_ndcg@10": rec.get("start_dev_ndcg@10"),
        "steps_run": rec["steps_run"],
        "best_step": rec["best_step"],
        "train_seconds": rec["train_seconds"],
        **extra,
    }
    if base is not None and base is not rec:
        row.update(paired_pvalues(rec, base, prefix="vs_full_"))
    return row


def write_rows(data: str, recs: dict, config: dict) -> list[dict]:
    rows = [result_row(n, recs[n], recs.get("full")) for n in PRESETS if n in recs]
    write_results(f"prompt_ablation_{data}", rows, dict(config, missing_rows=[p for p in PRESETS if p not in recs]))
    return rows


def main() -> None:
    from benchmarks._heads_recipe import stage1_config, work_dir

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="scifact")
    ap.add_argument(
        "--features", type=Path, default=None, help="feature cache dir (default runs/recipe/<data>/features)"
    )
    ap.add_argument("--work", type=Path, default=REPO_ROOT / "runs" / "prompt_ablation")
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import torch

    from scalingnote.models.prompt import PROMPT_PRESETS
    from scalingnote.scaling.points import HeadSession, PointSettings, make_eval_set, run_point
    from scalingnote.training.data import load_training_data

    torch.set_num_threads(args.threads)
    features = args.features or work_dir(args.data) / "features"
    presets = args.presets.split(",")
    unknown = [p for p in presets if p not in PROMPT_PRESETS]
    if unknown:
        raise SystemExit(f"unknown presets {unknown}; choose from {list(PROMPT_PRESETS)}")
    base_cfg = stage1_config(args.data, "scaling_dual", DEPTH, HEAD_LR, args.seed, args.work, max_epochs=40)
    base_cfg = dataclasses.replace(base_cfg, feature_cache_dir=str(features))
    data = load_training_data(base_cfg.data, args.seed, show_progress=True)  # BM25 negatives: the same for every prompt
    dev = make_eval_set(data.queries, data.validation_qrels(), list(data.corpus), seed=args.seed, name="validation")
    test = make_eval_set(data.queries, data.eval_qrels, list(data.corpus), seed=args.seed, name="test")
    spe = len(data.train) // base_cfg.optim.batch_size
    settings = PointSettings(
        head_lr=HEAD_LR,
        batch_size=base_cfg.optim.batch_size,
        max_steps=40 * spe,
        min_eval_every=spe,
        max_eval_every=spe,
        patience=4,
        warmup_ratio=base_cfg.optim.warmup_ratio,
        seed=args.seed,
        validation_metric="ndcg@10",
    )
    recs: dict[str, dict] = {}
    rows: list[dict] = []
    config = {
        "data": args.data,
        "model": f"SmolLM2-135M truncated to {DEPTH} layers, ScalingDual, mean pooling",
        "train_pairs": len(data.train),
        "validation_queries": len(dev.query_ids),
        "test_queries": len(test.query_ids),
        "recipe": "trainable_layers 0 (heads over cached pooled states), PCA head init, BM25 hard negatives, batch 64, "
        f"head lr {HEAD_LR:g}, <= 40 epochs, validation nDCG@10 every epoch, patience 4, best weights restored",
        "contrastive_ppl": "Fang et al. Eq. 6 on the test queries: W=256 random non-relevant documents per "
        "pair, drawn once "
        "(seed 0) from the whole corpus, s = cos/0.05",
        "p_values": "two-sided paired t-test over the test queries against the full prompt (vs_full_p_<metric>)",
        "templates": {p: PROMPT_PRESETS[p] for p in presets},
        "seed": args.seed,
        "machine_note": "2 CPU cores shared with other jobs: train_seconds are noisy",
    }
    order = (["full"] if "full" in presets else []) + [p for p in presets if p != "full"]

    def key_of(name: str) -> str:
        return json.dumps(
            {"prompt": PROMPT_PRESETS[name], "settings": dataclasses.asdict(settings), "train": len(data.train)}
        )

    for name in PRESETS:  # rows finished by earlier invocations (one results file for all presets)
        f = args.work / name / "point.json"
        if f.exists() and json.loads(f.read_text(encoding="utf-8")).get("key") == key_of(name):
            recs[name] = json.loads(f.read_text(encoding="utf-8"))
    for name in order:
        if name in recs:
            continue
        cfg = dataclasses.replace(
            base_cfg, output_dir=str(args.work / name), doc_tower=dataclasses.replace(base_cfg.doc_tower, prompt=name)
        )
        session = HeadSession(cfg, data.corpus, show_progress=True)
        session.ensure_features(
            [e.query for e in data.train] + dev.texts + test.texts,
            [d for e in data.train for d in (e.pos, e.neg) if d is not None],
        )
        rec = run_point(
            session, data.train, dev, test, args.work / name, settings, extra={"key": key_of(name), "prompt": name}
        )
        recs[name] = rec
        del session
        print(
            f"[prompt] {name}: nDCG@10 {rec['ndcg@10']:.4f} R@100 {rec['r@100']:.4f} ppl "
            f"{rec['test_contrastive_ppl']:.4f} "
            f"(val {rec['dev_ndcg@10']:.4f}, {rec['steps_run']} steps)",
            flush=True,
        )
        write_rows(args.data, recs, config)
    rows = write_rows(args.data, recs, config)
    for r in rows:
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()})


if __name__ == "__main__":
    main()
