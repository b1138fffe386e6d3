"""Training-data statistics -> benchmarks/results/data_stats.json.

Rows (flat dicts, told apart by ``kind``):

* ``triplets`` — one row per source (click_one_hop, click_multi_hop, relevance_one_hop,
  relevance_multi_hop, plus ``all``) of the triplets built by ``scalingnote data build``
  from the SYNTHETIC note-search log (default sizes, seed 0): counts, and the quality of
  positives / hard negatives measured against the generator's hidden relevance grades
  (``qrels/train.tsv``): ``pos_relevant`` = share of positives with grade >= 1,
  ``pos_grade2``, ``neg_relevant`` and ``neg_grade2`` (false negatives).
* ``association`` — query association counts (Algorithm 1) on the same log.
* ``sanity`` — is the synthetic test set learnable but not trivial? nDCG@10 / Recall@100 of a
  TF-IDF retriever (scikit-learn), BM25 (bm25s) and a random ranking on the synthetic test
  queries, overall and split into queries whose intent terms all appear verbatim
  (``subset=exact_terms``) vs. queries with a synonym or misspelling (``vocabulary_gap``).
  Metrics from :func:`scalingnote.evaluation.evaluate`.
* ``pseudo`` / ``pseudo_sample`` — ICT (all SciFact documents) and SmolLM2 LLM
  pseudo-queries (a seeded sample of SciFact documents; CPU generation is slow), with a
  few samples.

Usage: ``python -m benchmarks.data_stats [--llm-docs 20] [--skip-llm]``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from benchmarks._common import report, shared_data_dir
from scalingnote.augment.llm_queries import LLMQueryConfig, llm_queries
from scalingnote.config import config_to_dict
from scalingnote.data import load_beir, load_qrels
from scalingnote.data.build import SOURCES, build_triplets, load_build_config
from scalingnote.data.pseudo import ICTConfig, ict_queries
from scalingnote.data.synth import SynthConfig, generate, write_synthetic
from scalingnote.evaluation import evaluate

METRICS = ["ndcg@10", "recall@100"]


def triplet_rows(triplets, train: set, stats, qrels_train) -> list[dict]:
    rows = []
    for source in (*SOURCES, "all"):
        ts = [t for t in triplets if source == "all" or t.source == source]
        pos = [qrels_train.get(t.query_id, {}).get(t.pos_id, 0) for t in ts]
        neg = [qrels_train.get(t.query_id, {}).get(t.neg_id, 0) for t in ts if t.neg_id is not None]
        s = stats["total"] if source == "all" else stats["sources"][source]
        rows.append(
            {
                "kind": "triplets",
                "dataset": "synthetic",
                "source": source,
                "triplets": s["triplets"],
                "queries": s["queries"],
                "unique_positives": s["unique_positives"],
                "unique_pairs": s["unique_pairs"],
                "with_negative": s["with_negative"],
                "train_triplets": sum(1 for t in ts if t in train),
                "pos_relevant": round(float(np.mean([p > 0 for p in pos])), 4) if pos else None,
                "pos_grade2": round(float(np.mean([p == 2 for p in pos])), 4) if pos else None,
                "neg_relevant": round(float(np.mean([n > 0 for n in neg])), 4) if neg else None,
                "neg_grade2": round(float(np.mean([n == 2 for n in neg])), 4) if neg else None,
            }
        )
    return rows


def sanity_rows(root: Path, log) -> list[dict]:
    from sklearn.feature_extraction.text import TfidfVectorizer

    from scalingnote.sparse.bm25 import BM25Config, bm25_search

    ds = load_beir(root, "test")
    doc_ids = list(ds.corpus)
    qids = list(ds.queries)
    vec = TfidfVectorizer(sublinear_tf=True)
    D = vec.fit_transform([ds.corpus[d].text for d in doc_ids])
    Q = vec.transform([ds.queries[q].text for q in qids])
    S = (Q @ D.T).toarray()
    tfidf = {}
    for i, q in enumerate(qids):
        top = np.argsort(-S[i], kind="stable")[:100]
        tfidf[q] = {doc_ids[j]: float(S[i, j]) for j in top}
    rng = np.random.default_rng(0)
    rand = {q: {doc_ids[j]: float(100 - r) for r, j in enumerate(rng.permutation(len(doc_ids))[:100])} for q in qids}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bm25, _ = bm25_search(root, "test", k=100, config=BM25Config(language="en"), show_progress=False)
    # queries whose intent terms all appear verbatim vs. ones with a synonym or misspelling
    exact = set()
    for q in qids:
        words = set(ds.queries[q].text.split())
        if all(t in words for it in log.meta["intents"][q] for t in it["terms"]):
            exact.add(q)
    subsets = {"all": set(qids), "exact_terms": exact, "vocabulary_gap": set(qids) - exact}
    rows = []
    for name, run in (("tfidf", tfidf), ("bm25", bm25), ("random", rand)):
        for subset, qs in subsets.items():
            qrels = {q: ds.qrels[q] for q in qs}
            m = evaluate({q: run.get(q, {}) for q in qs}, qrels, METRICS)
            rows.append(
                {
                    "kind": "sanity",
                    "dataset": "synthetic",
                    "split": "test",
                    "retriever": name,
                    "subset": subset,
                    "queries": len(qs),
                    **{k: round(v, 4) for k, v in m.items()},
                }
            )
    return rows


def pseudo_rows(method: str, pairs, stats: dict, elapsed: float, n_samples: int, load_s: float = 0.0) -> list[dict]:
    rows = [
        {
            "kind": "pseudo",
            "dataset": "scifact",
            "method": method,
            "documents": stats["documents"],
            "queries": stats["queries"],
            "mean_query_words": stats["mean_query_words"],
            "model_load_s": round(load_s, 1),
            "seconds": round(elapsed, 1),
            "seconds_per_doc": round(elapsed / max(1, stats["documents"]), 3),
        }
    ]
    for p in pairs[:n_samples]:
        rows.append(
            {"kind": "pseudo_sample", "dataset": "scifact", "method": method, "doc_id": p.doc_id, "query": p.query.text}
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llm-docs", type=int, default=20, help="SciFact documents for LLM generation (slow on CPU)")
    ap.add_argument("--skip-llm", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    synth_cfg = SynthConfig(seed=args.seed)
    rows: list[dict] = []
    config: dict = {"synth": config_to_dict(synth_cfg)}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "synthetic"
        t0 = time.perf_counter()
        log = generate(synth_cfg)
        write_synthetic(root, log)
        synth_s = time.perf_counter() - t0
        cfg = load_build_config(root / "build.yaml")
        paths = ("queries", "corpus", "click_log", "relevance_log", "out")
        config["build"] = {k: v for k, v in config_to_dict(cfg).items() if k not in paths}
        t0 = time.perf_counter()
        res = build_triplets(cfg)
        build_s = time.perf_counter() - t0
        rows += triplet_rows(
            res.train + res.validation, set(res.train), res.stats, load_qrels(root / "qrels" / "train.tsv")
        )
        a = res.stats["association"]
        rows.append(
            {
                "kind": "association",
                "dataset": "synthetic",
                "queries": a["queries"],
                "candidate_pairs": a["candidate_pairs"],
                "all_pairs": a["queries"] * (a["queries"] - 1),
                "click_associations": a["click_associations"],
                "queries_with_click_association": a["queries_with_click_association"],
                "relevance_associations": a["relevance_associations"],
                "queries_with_relevance_association": a["queries_with_relevance_association"],
                "duplicates_removed": res.stats["removed"]["duplicates"],
                "leaked_queries": res.stats["leakage"]["leaked_queries"],
                "impressions": res.stats["inputs"]["click_log"]["impressions"],
                "clicks": res.stats["inputs"]["click_log"]["clicks"],
                "relevance_scores": res.stats["inputs"]["relevance_log"]["scores"],
                "synth_s": round(synth_s, 2),
                "build_s": round(build_s, 2),
            }
        )
        rows += sanity_rows(root, log)
    for r in rows:
        if r["kind"] in ("triplets", "sanity", "association"):
            print(r)

    scifact = shared_data_dir() / "scifact" / "corpus.jsonl"
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        ict_cfg = ICTConfig(seed=args.seed)
        pairs = ict_queries(scifact, Path(tmp) / "ict", ict_cfg, progress=False)
        stats = json.loads((Path(tmp) / "ict" / "stats.json").read_text())
        rows += pseudo_rows("ict", pairs, stats, time.perf_counter() - t0, 5)
        config["ict"] = config_to_dict(ict_cfg)
        if not args.skip_llm:
            from scalingnote.augment.llm_queries import load_causal_lm

            llm_cfg = LLMQueryConfig(seed=args.seed, max_docs=args.llm_docs, max_new_tokens=24, batch_size=10)
            t0 = time.perf_counter()
            model_and_tok = load_causal_lm(llm_cfg.model)
            load_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            pairs = llm_queries(scifact, Path(tmp) / "llm", llm_cfg, progress=True, model_and_tokenizer=model_and_tok)
            stats = json.loads((Path(tmp) / "llm" / "stats.json").read_text())
            rows += pseudo_rows("llm", pairs, stats, time.perf_counter() - t0, 8, load_s)
            config["llm"] = config_to_dict(llm_cfg)
    for r in rows:
        if r["kind"].startswith("pseudo"):
            print(r)
    report("data_stats", rows, config)


if __name__ == "__main__":
    main()
