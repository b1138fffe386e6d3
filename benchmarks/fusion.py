"""Fusion towers on the synthetic note-search log (ScalingNote §3.5): does fusing semantic
IDs, side features and a user/context vector into the towers help?

    python -m benchmarks.fusion [--features DIR] [--rows no_fusion,doc_semantic_ids,...]

Data: the synthetic note-search log (``scalingnote.data.synth``, default size: 3,000 notes, 1,500
queries, 20% test queries), training pairs = graded training qrels (grade >= 1, up to 4 positives per
query), 10% of the training queries held out as dev. Model: ScalingDual, SmolLM2-135M truncated to 2
layers, heads only over cached pooled states (``scalingnote.scaling.points``), in-batch negatives,
batch 64, head lr 3e-3, early stopping on the dev contrastive perplexity (stop after 1000 steps without
improvement), best weights
restored — the same for every row; only the fusion inputs differ (``scalingnote.models.fusion``):

- ``no_fusion``: the plain towers;
- ``doc_semantic_ids``: 3-layer residual K-means codes (K = 64; ``scalingnote.index.semantic_ids``,
  what the index stores) of the document embeddings at the start of training;
- ``doc_side``: the note's topic (category) + standardised log word count, log click count,
  log impression count and smoothed CTR from the click log (training queries only);
- ``doc_all``: both;
- ``doc_all_query_context``: both + a user/context vector on the query side. The log has no users,
  so the vector is **simulated**: a one-hot of the query's hidden intent topic with probability 0.7,
  else of a random topic (what a user's long-term interests might give; it is not the label).

Columns: ``ndcg@10``, ``r@100``, ``contrastive_ppl`` (Fang et al. Eq. 6 on the test queries, W = 256
negatives drawn once, seed 0, s = cos/0.05) and two-sided paired t-test p-values against ``no_fusion``.
Writes benchmarks/results/fusion_synthetic.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

from benchmarks._common import REPO_ROOT, write_results

ROWS = ["no_fusion", "doc_semantic_ids", "doc_side", "doc_all", "doc_all_query_context"]


def side_features(log):
    """(category [n], numeric [n, 4] standardised, names) per note, in corpus order."""
    import numpy as np

    topics = sorted({d.topic.split("; ")[0] for d in log.corpus})
    cat = np.asarray([topics.index(d.topic.split("; ")[0]) for d in log.corpus], dtype=np.int64)
    clicks: dict[str, int] = {}
    imps: dict[str, int] = {}
    for r in log.clicks:  # the click log covers training queries only
        imps[r.doc_id] = imps.get(r.doc_id, 0) + 1
        clicks[r.doc_id] = clicks.get(r.doc_id, 0) + int(r.clicked)
    num = np.asarray(
        [
            [
                math.log1p(len(d.content.split())),
                math.log1p(clicks.get(d.id, 0)),
                math.log1p(imps.get(d.id, 0)),
                (clicks.get(d.id, 0) + 1) / (imps.get(d.id, 0) + 2),
            ]
            for d in log.corpus
        ],
        dtype=np.float64,
    )
    num = (num - num.mean(0)) / np.maximum(num.std(0), 1e-9)
    return cat, num.astype(np.float32), topics, ["log_words", "log_clicks", "log_impressions", "ctr"]


def context_vectors(log, topics: list[str], seed: int, noise: float = 0.3) -> dict[str, object]:
    """Simulated user context: one-hot of the query's hidden intent topic (prob 1 - noise) or of a random topic."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = {}
    for q in log.queries:
        intents = log.meta["intents"][q.id]
        t = intents[0]["topic"]
        v = np.zeros(len(topics), dtype=np.float32)
        v[topics.index(t) if rng.random() >= noise else int(rng.integers(len(topics)))] = 1.0
        out[q.text] = v
    return out


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, default=REPO_ROOT / "runs" / "fusion")
    ap.add_argument("--features", type=Path, default=None, help="feature cache dir (default <work>/features)")
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    return ap.parse_args()


def training_pairs(log, seed: int):
    """(corpus, queries, train qrels, test qrels, dev queries, training examples: up to 4 positives
    per non-dev training query, shuffled once)."""
    import numpy as np

    from scalingnote.training.data import Example, _split_by_query

    corpus = {d.id: d for d in log.corpus}
    queries = {q.id: q.text for q in log.queries}
    train_qrels, test_qrels = log.qrels["train"], log.qrels["test"]
    dev_q = _split_by_query(sorted(train_qrels), 0.1, seed)
    train = [
        Example(q, queries[q], corpus[d], None, "qrels")
        for q in sorted(train_qrels)
        if q not in dev_q
        for d in sorted(train_qrels[q], key=lambda d: (-train_qrels[q][d], d))[:4]
        if train_qrels[q][d] > 0
    ]
    train = [train[i] for i in np.random.default_rng(seed).permutation(len(train))]
    return corpus, queries, train_qrels, test_qrels, dev_q, train


def start_semantic_ids(session, train: list, cfg, seed: int, base_q, base_d):
    """Semantic IDs of the documents at the start of training (the heads as train_point
    initialises them) -> (the fitted ResidualKMeans, codes [n, 3])."""
    import numpy as np

    from scalingnote.index.semantic_ids import ResidualKMeans
    from scalingnote.training.heads import init_heads

    session.reset()
    order = np.random.default_rng(seed).permutation(len(train))
    init_heads(
        session.qt,
        session.dt,
        [train[i] for i in order[: cfg.center_samples]],
        cfg.projection_init,
        n=cfg.center_samples,
        encoders=(base_q, base_d),
    )
    rkm = ResidualKMeans(n_layers=3, codebook_size=64, seed=seed).fit(session.encode(docs=True))
    codes = rkm.assign(session.encode(docs=True)).astype(np.int64)
    return rkm, codes


def use_fusion(name: str, session, base_q, base_d, cfg, seed: int, rkm, codes, side, ctx) -> None:
    """Point the session's encoders at the row's fusion (none for ``no_fusion``)."""
    import torch

    from scalingnote.models.fusion import DocumentFeatures, DocumentFusion, FusedPrefixEncoder, QueryFusion

    cat, num, topics = side
    for t in (session.qt, session.dt):
        if hasattr(t, "fusion"):
            del t.fusion
    session.q_enc, session.d_enc = base_q, base_d
    if name == "no_fusion":
        return
    use_sid = name in ("doc_semantic_ids", "doc_all", "doc_all_query_context")
    use_side = name in ("doc_side", "doc_all", "doc_all_query_context")
    torch.manual_seed(seed)
    fus = DocumentFusion(
        cfg.dim,
        codebook_sizes=rkm.codebook_sizes if use_sid else (),
        num_categories=len(topics) if use_side else 0,
        num_numeric=num.shape[1] if use_side else 0,
    )
    feats = DocumentFeatures(
        session.doc_ids,
        codes=codes if use_sid else None,
        category=cat if use_side else None,
        numeric=num if use_side else None,
    )
    session.d_enc = FusedPrefixEncoder(base_d, fus, feats)
    if name == "doc_all_query_context":
        session.q_enc = FusedPrefixEncoder(base_q, QueryFusion(cfg.dim, len(topics)), ctx)


def result_rows(recs: dict[str, dict]) -> list[dict]:
    """One row per measured fusion, with paired p-values against ``no_fusion``."""
    from benchmarks.prompt_ablation import paired_pvalues

    rows = []
    for name in ROWS:
        if name not in recs:
            continue
        r = recs[name]
        row = {
            "fusion": name,
            "ndcg@10": r["ndcg@10"],
            "r@100": r["r@100"],
            "contrastive_ppl": r["test_contrastive_ppl"],
            "dev_contrastive_ppl": r["dev_contrastive_ppl"],
            "steps_run": r["steps_run"],
            "best_step": r["best_step"],
            "train_seconds": r["train_seconds"],
        }
        if name != "no_fusion":
            row.update(paired_pvalues(r, recs["no_fusion"], prefix="vs_no_fusion_"))
        rows.append(row)
    return rows


def main() -> None:
    from benchmarks._heads_recipe import stage1_config

    args = parse_args()
    import torch

    from scalingnote.data.synth import SynthConfig, generate
    from scalingnote.scaling.points import HeadSession, PointSettings, make_eval_set, run_point

    torch.set_num_threads(args.threads)
    rows_wanted = args.rows.split(",")
    bad = [r for r in rows_wanted if r not in ROWS]
    if bad:
        raise SystemExit(f"unknown rows {bad}; choose from {ROWS}")
    log = generate(SynthConfig(seed=args.seed))
    corpus, queries, train_qrels, test_qrels, dev_q, train = training_pairs(log, args.seed)
    cfg = stage1_config("scifact", "scaling_dual", 2, 3e-3, args.seed, args.work, max_epochs=40)
    cfg = dataclasses.replace(
        cfg,
        feature_cache_dir=str(args.features or args.work / "features"),
        data=dataclasses.replace(cfg.data, data_dir=str(args.work), negatives="none"),
    )
    session = HeadSession(cfg, corpus, show_progress=True)
    doc_ids = session.doc_ids
    dev = make_eval_set(queries, {q: train_qrels[q] for q in dev_q}, doc_ids, seed=args.seed + 1, name="dev")
    test = make_eval_set(queries, test_qrels, doc_ids, seed=args.seed, name="test")
    session.ensure_features(list(queries.values()))
    base_q, base_d = session.q_enc, session.d_enc

    rkm, codes = start_semantic_ids(session, train, cfg, args.seed, base_q, base_d)
    cat, num, topics, num_names = side_features(log)
    ctx = context_vectors(log, topics, args.seed)
    settings = PointSettings(seed=args.seed, lr=3e-3)
    recs: dict[str, dict] = {}
    for name in ROWS:
        if name not in rows_wanted and name != "no_fusion":
            continue
        use_fusion(name, session, base_q, base_d, cfg, args.seed, rkm, codes, (cat, num, topics), ctx)
        key = json.dumps({"row": name, "settings": str(settings), "train": len(train), "codes": int(codes.sum())})
        recs[name] = run_point(session, train, dev, test, args.work / name, settings, extra={"key": key, "row": name})
        r = recs[name]
        print(
            f"[fusion] {name}: nDCG@10 {r['ndcg@10']:.4f} R@100 {r['r@100']:.4f} ppl {r['test_contrastive_ppl']:.4f} "
            f"({r['steps_run']} steps)",
            flush=True,
        )
    rows = result_rows(recs)
    write_results(
        "fusion_synthetic",
        rows,
        {
            "data": "synthetic note-search log (scalingnote.data.synth, SynthConfig defaults, seed 0): "
            f"{len(corpus)} notes, {len(train)} training pairs, {len(dev.query_ids)} dev / "
            f"{len(test.query_ids)} test queries",
            "model": "ScalingDual, SmolLM2-135M truncated to 2 layers, heads only over cached pooled states",
            "training": "in-batch negatives, batch 64, head and fusion lr 3e-3, early stopping on dev "
            "contrastive perplexity "
            "(stop after 1000 steps without improvement), best weights restored",
            "semantic_ids": "ResidualKMeans(n_layers=3, K=64) on the start-of-training document embeddings; "
            f"codebooks {rkm.codebook_sizes}",
            "side_features": {
                "category": f"primary topic ({len(topics)} topics)",
                "numeric": num_names,
                "source": "click log of the training queries (no test query appears in it)",
            },
            "query_context": "simulated: one-hot of the query's hidden intent topic with prob 0.7, else a random topic",
            "fusion": "fused = e + W_out [sum_l E_l[code_l]; E_topic[topic]; GELU(W_1 numeric)] (documents), "
            "e_q + W_ctx ctx "
            "(queries); W_out, W_ctx zero-initialised (scalingnote.models.fusion)",
            "contrastive_ppl": "Fang et al. Eq. 6 on the test queries, W=256 negatives drawn once (seed 0), s = "
            "cos/0.05",
            "p_values": "two-sided paired t-test over the test queries against no_fusion",
            "missing_rows": [r for r in ROWS if r not in recs],
            "machine_note": "2 CPU cores shared with other jobs",
        },
    )
    for r in rows:
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()})


if __name__ == "__main__":
    main()
