"""Annotation types at matched sizes (Fang et al., *Scaling Laws for Dense Retrieval* §5, Fig. 5).

    python -m benchmarks.annotation [--data scifact] [--features DIR] [--ict DIR] [--gen-minutes 8]

Three kinds of training pairs over the **same positive documents** (the paper: "we generate a query
for each positive document annotated by humans"): the SciFact human training queries, ICT
pseudo-queries (a sentence of the document, ``scalingnote.data.pseudo.ict_queries``) and LLM
pseudo-queries (SmolLM2-135M-Instruct, greedy, ``scalingnote.augment.llm_queries.generate_queries``). The
human pairs (minus 10% dev queries) are shuffled once; size D takes the first D pairs and swaps the
query for the ICT / LLM query of the same positive. SmolLM2 generation on CPU is slow, so it runs
for ``--gen-minutes`` (resumable, in pool order) and the largest size is what it reached.

Every point: ScalingDual, SmolLM2 truncated to 2 layers, heads only over cached pooled states,
in-batch negatives, batch min(64, D), head lr 3e-3, early stopping on the contrastive perplexity of
the human dev queries (stop after 1000 steps without improvement), best weights restored
(``scalingnote.scaling.points``). Columns:
``contrastive_ppl`` (Fang et al. Eq. 6 on the SciFact test queries, W = 256 negatives drawn once,
seed 0, s = cos/0.05), ``ndcg@10``, ``r@100``, and two-sided paired t-test p-values against the
human labels at the same D. A L(D) = (B/D)^beta + delta fit per annotation type gives the slopes.
Writes benchmarks/results/annotation_<data>.json and benchmarks/results/plots/annotation_<data>.png.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from benchmarks._common import REPO_ROOT, RESULTS_DIR, shared_data_dir, write_results

TYPES = ("human", "ict", "llm")
SIZES = [64, 128, 256, 512]


def generate_llm(docs, out: Path, minutes: float, seed: int) -> dict[str, str]:
    """LLM queries for ``docs`` in order, for at most ``minutes`` (resumable log); {doc_id: query}."""
    from scalingnote.augment.llm_queries import LLMQueryConfig, _read_generations, generate_queries, load_causal_lm

    cfg = LLMQueryConfig(seed=seed, batch_size=8)
    log = out / "generations.jsonl"
    done = _read_generations(log) if log.exists() else {}
    todo = [d for d in docs if d.id not in done]
    if todo and minutes > 0:
        lm, tok = load_causal_lm(cfg.model)
        t0 = time.perf_counter()
        for i in range(0, len(todo), 32):
            if time.perf_counter() - t0 > 60 * minutes:
                break
            generate_queries(todo[i : i + 32], lm, tok, cfg, log, progress=True)
            rate = (time.perf_counter() - t0) / min(len(todo), i + 32)
            print(f"[annotation] LLM queries: {len(done) + min(len(todo), i + 32)} docs, {rate:.2f} s/doc", flush=True)
        done = _read_generations(log)
    return {k: v["query"] for k, v in done.items()}


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="scifact")
    ap.add_argument("--features", type=Path, default=None)
    ap.add_argument("--ict", type=Path, default=None)
    ap.add_argument("--work", type=Path, default=REPO_ROOT / "runs" / "annotation")
    ap.add_argument("--gen-minutes", type=float, default=8.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    return ap.parse_args()


def load_pairs(args, ict_dir: Path):
    """The data set, its human training pairs (minus the dev queries, shuffled once) and the ICT
    pseudo-query of each document -> (corpus, queries, train qrels, test qrels, dev queries, pairs, ict)."""
    import numpy as np

    from scalingnote.data import load_corpus, load_qrels, load_queries
    from scalingnote.data.beir import qrels_path
    from scalingnote.training.data import _split_by_query

    root = shared_data_dir() / args.data
    corpus = load_corpus(root / "corpus.jsonl")
    queries = {q.id: q.text for q in load_queries(root / "queries.jsonl").values()}
    train_qrels = load_qrels(qrels_path(root, "train"), queries, corpus)
    test_qrels = load_qrels(qrels_path(root, "test"), queries, corpus)
    dev_q = _split_by_query(sorted(train_qrels), 0.1, args.seed)  # the same dev queries as the scaling sweep
    pairs = [
        (q, d) for q in sorted(train_qrels) if q not in dev_q for d in sorted(train_qrels[q]) if train_qrels[q][d] > 0
    ]
    order = np.random.default_rng(args.seed).permutation(len(pairs))
    pairs = [pairs[i] for i in order]
    ict = {}
    with open(ict_dir / "triplets.jsonl", encoding="utf-8") as fh:
        ict_text = {q.id: q.text for q in load_queries(ict_dir / "queries.jsonl").values()}
        for line in fh:
            if line.strip():
                t = json.loads(line)
                ict[t["pos_id"]] = ict_text[t["query_id"]]
    return corpus, queries, train_qrels, test_qrels, dev_q, pairs, ict


def train_points(args, session, sets: dict, sizes: list[int], dev, test) -> dict[tuple[str, int], dict]:
    """One heads-only training point per (annotation type, D) -> its record."""
    from scalingnote.scaling.points import PointSettings, run_point

    settings = PointSettings(seed=args.seed)
    recs: dict[tuple[str, int], dict] = {}
    for D in sizes:
        for t in TYPES:
            key = json.dumps(
                {"type": t, "D": D, "pairs": [(e.query_id, e.pos.id) for e in sets[t][:D]], "settings": str(settings)}
            )
            recs[(t, D)] = run_point(
                session,
                sets[t][:D],
                dev,
                test,
                args.work / t / f"D{D}",
                settings,
                extra={"key": key, "annotation": t, "D": D},
            )
            r = recs[(t, D)]
            print(
                f"[annotation] {t} D={D}: ppl {r['test_contrastive_ppl']:.4f} nDCG@10 {r['ndcg@10']:.4f} R@100 "
                f"{r['r@100']:.4f}",
                flush=True,
            )
    return recs


def rows_and_fits(recs: dict[tuple[str, int], dict], data: str) -> tuple[list[dict], dict]:
    """One row per (D, type) with paired p-values against the human labels, and the data-scaling
    law fitted per type (4 sizes or more)."""
    from benchmarks.prompt_ablation import paired_pvalues
    from benchmarks.scaling_sweep import _fit_record

    rows = []
    for (t, D), r in sorted(recs.items(), key=lambda kv: (kv[0][1], TYPES.index(kv[0][0]))):
        row = {
            "annotation": t,
            "D": D,
            "N": r["non_embedding_params"]["query"],
            "loss": r["test_contrastive_ppl"],
            "contrastive_ppl": r["test_contrastive_ppl"],
            "ndcg@10": r["ndcg@10"],
            "r@100": r["r@100"],
            "dev_contrastive_ppl": r["dev_contrastive_ppl"],
            "steps_run": r["steps_run"],
            "best_step": r["best_step"],
            "train_seconds": r["train_seconds"],
        }
        if t != "human":
            row.update(paired_pvalues(r, recs[("human", D)], prefix="vs_human_"))
        rows.append(row)
    fits = {}
    for t in TYPES:
        tr = [r for r in rows if r["annotation"] == t]
        if len(tr) >= 4:
            rec = _fit_record(f"annotation_{data}_{t}", "data", tr, "D", RESULTS_DIR / "plots", "D")
            fits[t] = {k: rec.get(k) for k in ("B", "beta", "delta", "r2", "holdout_mape", "error")}
    for r in rows:
        f = fits.get(r["annotation"], {})
        r["fit_beta"] = f.get("beta")
        r["fit_r2"] = f.get("r2")
    return rows, fits


def main() -> None:
    from benchmarks._heads_recipe import pseudo_queries_path, stage1_config, work_dir

    args = parse_args()
    import torch

    from scalingnote.scaling.points import HeadSession, make_eval_set
    from scalingnote.training.data import Example

    torch.set_num_threads(args.threads)
    features = args.features or work_dir(args.data) / "features"
    ict_dir = args.ict or pseudo_queries_path(args.data, args.seed).parent
    corpus, queries, train_qrels, test_qrels, dev_q, pairs, ict = load_pairs(args, ict_dir)
    seen, pos_docs = set(), []
    for _, d in pairs:
        if d not in seen:
            seen.add(d)
            pos_docs.append(corpus[d])
    llm = generate_llm(pos_docs, args.work / "llm_queries", args.gen_minutes, args.seed)
    # matched pairs: those whose positive has an ICT and a non-empty LLM query (generation runs in pool order)
    dropped = sum(1 for _, d in pairs if d in llm and not llm[d])
    pairs = [(q, d) for q, d in pairs if llm.get(d) and ict.get(d)]
    n_max = len(pairs)
    sizes = [s for s in SIZES if s < n_max] + ([n_max] if n_max >= 32 else [])
    if not sizes:
        raise SystemExit(f"only {n_max} pairs have LLM queries: run longer (--gen-minutes)")
    sets = {
        "human": [Example(q, queries[q], corpus[d], None, "human") for q, d in pairs[:n_max]],
        "ict": [Example(f"ict-{d}", ict[d], corpus[d], None, "ict") for _, d in pairs[:n_max]],
        "llm": [Example(f"llm-{d}", llm[d], corpus[d], None, "llm") for _, d in pairs[:n_max]],
    }
    cfg = stage1_config(args.data, "scaling_dual", 2, 3e-3, args.seed, args.work, max_epochs=40)
    cfg = dataclasses.replace(
        cfg, feature_cache_dir=str(features), data=dataclasses.replace(cfg.data, negatives="none")
    )
    session = HeadSession(cfg, corpus, show_progress=True)
    doc_ids = list(corpus)
    dev = make_eval_set(queries, {q: train_qrels[q] for q in dev_q}, doc_ids, seed=args.seed + 1, name="dev")
    test = make_eval_set(queries, test_qrels, doc_ids, seed=args.seed, name="test")
    session.ensure_features([e.query for s in sets.values() for e in s] + dev.texts + test.texts)
    recs = train_points(args, session, sets, sizes, dev, test)
    rows, fits = rows_and_fits(recs, args.data)
    _plot(rows, RESULTS_DIR / "plots" / f"annotation_{args.data}.png")
    llm_n = sum(1 for d in pos_docs if llm.get(d.id))
    write_results(
        f"annotation_{args.data}",
        [{k: v for k, v in r.items() if k != "loss"} for r in rows],
        {
            "data": args.data,
            "sizes": sizes,
            "dev_queries": len(dev.query_ids),
            "test_queries": len(test.query_ids),
            "human_pairs_available": len(pairs),
            "llm_generated_docs": llm_n,
            "llm_empty": sum(1 for d in pos_docs if d.id in llm and not llm[d.id]),
            "pairs_dropped_empty_llm": dropped,
            "llm": "SmolLM2-135M-Instruct (GGUF package), greedy, 24 new tokens, no_repeat_ngram 4, one demonstration; "
            f"generation budget {args.gen_minutes} min on the shared CPU (the largest matched size is what it reached)",
            "ict": "one sentence of the positive document (ICTConfig defaults, seed 0)",
            "model": "ScalingDual, SmolLM2-135M truncated to 2 layers, heads only over cached pooled states",
            "training": "in-batch negatives, batch min(64, D), head lr 3e-3, early stopping on dev contrastive "
            "perplexity (stop after 1000 steps without improvement)",
            "contrastive_ppl": "Fang et al. Eq. 6 on the SciFact test queries, W=256 negatives drawn once (seed "
            "0), s = cos/0.05",
            "p_values": "two-sided paired t-test over the test queries against the human labels at the same D",
            "fits": fits,
            "plot": f"benchmarks/results/plots/annotation_{args.data}.png",
            "machine_note": "2 CPU cores shared with other jobs",
        },
    )
    for r in rows:
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()})


def _plot(rows, path: Path) -> None:
    from scalingnote.scaling.plots import _plt, _save

    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4.3))
    for t in TYPES:
        rs = sorted([r for r in rows if r["annotation"] == t], key=lambda r: r["D"])
        if rs:
            ax.plot([r["D"] for r in rs], [r["loss"] for r in rs], "o-", label=t)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("training pairs D (same positive documents)")
    ax.set_ylabel("test contrastive perplexity")
    ax.set_title("Annotation types (SmolLM2 depth 2, heads only)")
    ax.legend()
    _save(fig, path)


if __name__ == "__main__":
    main()
