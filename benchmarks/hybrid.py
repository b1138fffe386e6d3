"""Hybrid BM25 + dense retrieval on the shared BEIR sets -> benchmarks/results/hybrid_<dataset>.json.

Rows: ``mode`` in bm25, dense, hybrid_rrf, hybrid_weighted; columns nDCG@10, R@100 (the paper's
hit-rate), standard recall@100, MRR@10 and QPS (query encoding + search + fusion, single process).
Test split, full corpus. The weight (and the min-max / z-score normalisation) of weighted fusion is
chosen on validation queries drawn (seeded) from the **train** split, never on test. The better
hybrid is compared with the better single system by a two-sided paired t-test over test queries
(``scalingnote.evaluation.significance.paired_ttest``).

The dense side is any query tower + document embeddings:

    python -m benchmarks.hybrid                                   # zero-shot MiniLM-L6 (mean pooling)
    python -m benchmarks.hybrid --query-tower runs/x/qkd/query_tower --doc-embeddings runs/x/emb
    python -m benchmarks.hybrid --query-tower Q --doc-tower D      # encode the corpus with D first

Document embeddings encoded here are cached under ``--work`` (default ``runs/hybrid``, gitignored)
and resumed, so reruns are cheap. BM25 is ``scalingnote bm25``'s (English: stemmed + stop words;
Chinese: character bigrams, picked automatically).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks._common import REPO_ROOT, shared_data_dir, write_results
from scalingnote.errors import ScalingNoteError

METRICS = ["ndcg@10", "r@100", "recall@100", "mrr@10"]
DATASETS = ("scifact", "kuake_qtr")


def _slug(s: str) -> str:
    return hashlib.sha1(s.encode()).hexdigest()[:10]


def load_dense_side(args, data_dir: Path, work: Path):
    """(query tower, document ids, (n, d) unit document vectors, description)."""
    from scalingnote.evaluation.dense import truncate_normalize
    from scalingnote.index import encode_corpus, load_embeddings, tower_identity
    from scalingnote.index.pipeline import load_tower_for

    qt = load_tower_for(args.query_tower, "query")
    q_id = tower_identity(qt)
    if args.doc_embeddings and (Path(args.doc_embeddings) / "doc_embeddings.npy").exists():
        # a Stage I / recipe output directory: doc_embeddings.npy + doc_ids.json (+ run.json with the compat id)
        d = Path(args.doc_embeddings)
        vecs = np.load(d / "doc_embeddings.npy")
        ids = json.loads((d / "doc_ids.json").read_text(encoding="utf-8"))
        compat = None
        if (d / "run.json").exists():
            compat = json.loads((d / "run.json").read_text(encoding="utf-8")).get("metrics", {}).get("compat_id")
        if compat and q_id.get("compat_id") and str(compat) != str(q_id["compat_id"]):
            raise ScalingNoteError(
                f"{d}: document embeddings (compat id {compat}) do not match query tower {args.query_tower!r} "
                f"(compat id {q_id['compat_id']})"
            )
        dim = min(int(q_id.get("dim") or vecs.shape[1]), vecs.shape[1])
        desc = {
            "query_tower": str(args.query_tower),
            "query_tower_identity": q_id,
            "documents": f"doc_embeddings.npy of {d}",
            "document_compat_id": compat,
            "dim": dim,
        }
        return qt, list(ids), truncate_normalize(vecs, dim), desc
    if args.doc_embeddings:
        emb_dir = Path(args.doc_embeddings)
        doc_desc = f"embeddings {emb_dir}"
    else:
        doc_name = args.doc_tower or args.query_tower
        emb_dir = work / f"emb_{_slug(str(doc_name))}"
        dt = load_tower_for(doc_name, "document")
        encode_corpus(
            dt, data_dir, emb_dir, shard_size=2000, batch_size=args.batch_size, progress=True
        )  # small shards: resumable
        doc_desc = f"document tower {doc_name}"
        del dt
    emb = load_embeddings(emb_dir)
    d_id = emb.tower or {}
    if d_id.get("compat_id") and q_id.get("compat_id") and str(d_id["compat_id"]) != str(q_id["compat_id"]):
        raise ScalingNoteError(
            f"{emb_dir}: document embeddings of tower {d_id.get('name')!r} (compat id {d_id['compat_id']}) do "
            "not match "
            f"query tower {args.query_tower!r} (compat id {q_id['compat_id']})"
        )
    vecs = np.asarray(emb.vectors, dtype=np.float32)
    qdim = int(q_id.get("dim") or vecs.shape[1])
    dim = min(qdim, vecs.shape[1])
    desc = {
        "query_tower": str(args.query_tower),
        "query_tower_identity": q_id,
        "documents": doc_desc,
        "document_tower_identity": d_id,
        "dim": dim,
    }
    return qt, list(emb.ids), truncate_normalize(vecs, dim), desc


def encode_queries(tower, texts: list[str], dim: int) -> np.ndarray:
    from scalingnote.evaluation.dense import truncate_normalize

    return truncate_normalize(tower.encode_queries(texts, batch_size=256, show_progress=False), dim)


@dataclass
class QuerySplits:
    """Test queries and validation queries (from the train split) with their qrels."""

    test_ids: list[str]
    test_texts: list[str]
    val_ids: list[str]
    val_texts: list[str]
    qrels_test: dict
    qrels_val: dict
    n_excluded: int  #: train queries left out because they are test queries (by id or text)
    val_source: str


def query_splits(name: str, test, train, args) -> QuerySplits:
    """The test queries and a seeded draw of ``--val-queries`` validation queries from the train
    split (or the queries Stage I held out) that are no test query."""
    rng = np.random.default_rng(args.seed)
    # KUAKE-QTR repeats query ids/texts across its splits (same query, other titles): a validation
    # query must be neither a test query id nor a test query text
    test_texts_norm = {" ".join(q.text.lower().split()) for q in test.queries.values()}
    all_train = sorted(train.queries)
    train_ids = [
        q
        for q in all_train
        if q not in test.queries and " ".join(train.queries[q].text.lower().split()) not in test_texts_norm
    ]
    n_excluded = len(all_train) - len(train_ids)
    val_source = "train split (seeded draw)"
    if args.val_from_stage1:
        # the queries Stage I held out (its validation split): their labels never reached the dense
        # model (QKD only mimics the teacher on query texts), so they are unbiased for the weight
        from scalingnote.training.evaluate import heldout_queries

        held_out, _ = heldout_queries(args.val_from_stage1)
        train_ids = [q for q in train_ids if q in held_out]
        val_source = f"queries held out by Stage I ({args.val_from_stage1})"
    n_val = min(args.val_queries, len(train_ids))
    val_ids = sorted(rng.choice(train_ids, size=n_val, replace=False).tolist())
    overlap = set(val_ids) & set(test.queries)
    if overlap:
        raise ScalingNoteError(f"{name}: {len(overlap)} validation queries are also test queries")
    test_ids = sorted(test.queries)
    test_texts = [test.queries[q].text for q in test_ids]
    val_texts = [train.queries[q].text for q in val_ids]
    qrels_test = {q: test.qrels[q] for q in test_ids}
    qrels_val = {q: train.qrels[q] for q in val_ids}
    return QuerySplits(test_ids, test_texts, val_ids, val_texts, qrels_test, qrels_val, n_excluded, val_source)


def search_runs(name: str, args, test, sp: QuerySplits, data_dir: Path, work: Path) -> dict:
    """BM25, dense and both fusions over the test queries (the weighted one's norm and weight chosen on
    validation) -> runs, seconds per mode and what the config reports of them."""
    from scalingnote.evaluation.dense import exact_search
    from scalingnote.index.hybrid import FusionConfig, choose_norm_and_weight, fuse_runs
    from scalingnote.sparse.bm25 import BM25Config, BM25Retriever

    test_ids, test_texts, val_ids, val_texts = sp.test_ids, sp.test_texts, sp.val_ids, sp.val_texts
    depth = args.depth
    # ---- BM25 (index once; search timed)
    t0 = time.perf_counter()
    bm = BM25Retriever.fit(test.corpus.values(), BM25Config(), show_progress=False)
    bm25_index_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    bm_test = bm.search(dict(zip(test_ids, test_texts, strict=True)), k=depth, show_progress=False)
    bm_s = time.perf_counter() - t0
    bm_val = bm.search(dict(zip(val_ids, val_texts, strict=True)), k=depth, show_progress=False)

    # ---- dense
    qt, doc_ids, doc_vecs, dense_desc = load_dense_side(args, data_dir, work)
    missing = set(test.corpus) - set(doc_ids)
    if missing:
        raise ScalingNoteError(
            f"{name}: the document embeddings lack {len(missing)} corpus documents (e.g. {next(iter(missing))!r})"
        )
    dim = dense_desc["dim"]
    encode_queries(qt, test_texts[:8], dim)  # warm-up
    t0 = time.perf_counter()
    q_test = encode_queries(qt, test_texts, dim)
    enc_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    dn_test = exact_search(q_test, test_ids, doc_vecs, doc_ids, k=depth)
    dn_s = time.perf_counter() - t0
    dn_val = exact_search(encode_queries(qt, val_texts, dim), val_ids, doc_vecs, doc_ids, k=depth)

    # ---- fusion settings: RRF k=60 (no tuning); weighted: norm + weight picked on validation only
    rrf_cfg = FusionConfig(method="rrf", rrf_k=60, depth=depth)
    wc, choices = choose_norm_and_weight(dn_val, bm_val, sp.qrels_val, depth=depth)
    best_norm = wc.norm
    w_cfg = FusionConfig(method="weighted", weight=wc.weight, norm=best_norm, depth=depth)
    t0 = time.perf_counter()
    rrf_test = fuse_runs(dn_test, bm_test, rrf_cfg, k=depth)
    rrf_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    w_test = fuse_runs(dn_test, bm_test, w_cfg, k=depth)
    w_s = time.perf_counter() - t0

    runs = {"bm25": bm_test, "dense": dn_test, "hybrid_rrf": rrf_test, "hybrid_weighted": w_test}
    seconds = {
        "bm25": bm_s,
        "dense": enc_s + dn_s,
        "hybrid_rrf": enc_s + dn_s + bm_s + rrf_s,
        "hybrid_weighted": enc_s + dn_s + bm_s + w_s,
    }
    return {
        "runs": runs,
        "seconds": seconds,
        "bm": bm,
        "bm25_index_s": bm25_index_s,
        "dense_desc": dense_desc,
        "wc": wc,
        "choices": choices,
    }


def result_rows(name: str, found: dict, sp: QuerySplits, n_docs: int) -> tuple[list[dict], dict, dict, str, str]:
    """One row per mode (the hybrids with paired t-tests against both single modes) -> rows,
    metrics per mode, per-query nDCG@10 per mode, the better single and the better hybrid mode."""
    from scalingnote.evaluation import evaluate, per_query
    from scalingnote.evaluation.significance import paired_ttest

    runs, seconds, wc = found["runs"], found["seconds"], found["wc"]
    best_norm, qrels_test, test_ids = wc.norm, sp.qrels_test, sp.test_ids
    ev = {m: evaluate(r, qrels_test, METRICS, missing="zero") for m, r in runs.items()}
    pq = {
        m: {q: v["ndcg@10"] for q, v in per_query(r, qrels_test, ["ndcg@10"], missing="zero").items()}
        for m, r in runs.items()
    }
    for m in pq:  # every test query on both sides of a paired test (absent -> 0, as missing="zero")
        pq[m] = {q: pq[m].get(q, 0.0) for q in test_ids}
    best_single = max(("bm25", "dense"), key=lambda m: ev[m]["ndcg@10"])
    other_single = "dense" if best_single == "bm25" else "bm25"
    best_hybrid = max(("hybrid_rrf", "hybrid_weighted"), key=lambda m: ev[m]["ndcg@10"])
    rows = []
    for m in runs:
        row = {
            "dataset": name,
            "split": "test",
            "mode": m,
            **{k: round(v, 4) for k, v in ev[m].items()},
            "qps": round(len(test_ids) / seconds[m], 1),
            "queries": len(test_ids),
            "docs": n_docs,
            "fusion": {
                "bm25": "-",
                "dense": "-",
                "hybrid_rrf": "rrf k=60",
                "hybrid_weighted": f"weighted {best_norm} w_dense={wc.weight:g}",
            }[m],
        }
        if m.startswith("hybrid"):
            t = paired_ttest(pq[m], pq[best_single])
            t2 = paired_ttest(pq[m], pq[other_single])
            row.update(
                {
                    "vs_best_single": best_single,
                    "ndcg@10_diff_vs_best_single": round(t.mean_diff, 4),
                    "ttest_p_vs_best_single": float(f"{t.pvalue:.4g}"),
                    "ndcg@10_diff_vs_other_single": round(t2.mean_diff, 4),
                    "ttest_p_vs_other_single": float(f"{t2.pvalue:.4g}"),
                }
            )
        rows.append(row)
        print(row, flush=True)
    return rows, ev, pq, best_single, best_hybrid


def run_dataset(name: str, args) -> Path:
    import torch

    from scalingnote.data import load_beir
    from scalingnote.evaluation.significance import paired_ttest

    data_dir = shared_data_dir() / name
    work = Path(args.work) / name
    work.mkdir(parents=True, exist_ok=True)
    test = load_beir(data_dir, "test")
    train = load_beir(data_dir, "train")
    sp = query_splits(name, test, train, args)
    n_val, depth = len(sp.val_ids), args.depth
    print(
        f"[{name}] {len(test.corpus)} docs, {len(sp.test_ids)} test queries, {n_val} validation queries (train split)",
        flush=True,
    )
    found = search_runs(name, args, test, sp, data_dir, work)
    bm, wc, choices, dense_desc = found["bm"], found["wc"], found["choices"], found["dense_desc"]
    best_norm, bm25_index_s, val_source, n_excluded = wc.norm, found["bm25_index_s"], sp.val_source, sp.n_excluded
    rows, ev, pq, best_single, best_hybrid = result_rows(name, found, sp, len(test.corpus))
    beats = all(ev[best_hybrid]["ndcg@10"] > ev[s]["ndcg@10"] for s in ("bm25", "dense"))
    t_best = paired_ttest(pq[best_hybrid], pq[best_single])
    config = {
        "dataset": name,
        "split": "test",
        "dense_model": dense_desc,
        "dense_model_note": args.dense_note,
        "dense_search": "exact inner product over L2-normalised vectors (brute force)",
        "bm25": {
            "k1": 1.5,
            "b": 0.75,
            "method": "lucene",
            "language": bm.language,
            "tokenisation": "stemmed (Snowball) + stop words" if bm.language == "en" else "character bigrams",
        },
        "depth": depth,
        "validation": {
            "split": "train",
            "queries": n_val,
            "seed": args.seed,
            "source": val_source,
            "excluded_train_queries_also_in_test": n_excluded,
            "caveat": None
            if args.val_from_stage1
            else (
                "validation queries come from the train split, which the dense model was trained on (Stage I "
                "pairs / QKD queries): the dense side looks stronger on them than on unseen queries, which "
                "biases the chosen weight toward dense"
            ),
            "grid": {n: {str(w): round(v, 4) for w, v in c.grid.items()} for n, c in choices.items()},
            "chosen": {"norm": best_norm, "weight_dense": wc.weight, "ndcg@10": round(wc.value, 4)},
        },
        "rrf_k": 60,
        "summary": {
            "better_single": best_single,
            "better_hybrid": best_hybrid,
            "better_hybrid_ndcg@10": round(ev[best_hybrid]["ndcg@10"], 4),
            "bm25_ndcg@10": round(ev["bm25"]["ndcg@10"], 4),
            "dense_ndcg@10": round(ev["dense"]["ndcg@10"], 4),
            "ttest_p_better_hybrid_vs_better_single": float(f"{t_best.pvalue:.4g}"),
            "target_better_hybrid_beats_both": beats,
        },
        "qps_note": "queries/s of the whole query path in one process (query encoding + search [+ BM25 + fusion]), "
        f"torch threads {torch.get_num_threads()}; the machine (2 cores) was shared with other jobs, so QPS is noisy",
        "bm25_index_seconds": round(bm25_index_s, 2),
    }
    path = write_results(f"hybrid_{name}", rows, config)
    print(f"[{name}] wrote {path}; target met: {beats} (p={t_best.pvalue:.3g})", flush=True)
    return path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", choices=[*DATASETS, "all"], default="all")
    ap.add_argument(
        "--query-tower", default="minilm-l6", help="query tower: packaged name (zero-shot) or saved tower dir"
    )
    ap.add_argument(
        "--doc-tower", default=None, help="document tower to encode the corpus with (default: --query-tower)"
    )
    ap.add_argument(
        "--doc-embeddings",
        default=None,
        help="embeddings directory (`scalingnote index encode`), or a Stage I / recipe "
        "output directory (doc_embeddings.npy + doc_ids.json), instead of --doc-tower",
    )
    ap.add_argument(
        "--dense-note",
        default="zero-shot all-MiniLM-L6-v2 (mean pooling, docs cut at 256 tokens); "
        "the recipe benchmark's best ScalingNote student was not available when this ran",
        help="free text recorded in the results config about the dense model",
    )
    ap.add_argument(
        "--val-from-stage1",
        default=None,
        help="Stage I output directory: draw validation queries only from the queries it held out (unseen labels)",
    )
    ap.add_argument("--val-queries", type=int, default=300, help="validation queries drawn from the train split")
    ap.add_argument("--depth", type=int, default=100, help="candidates per side (and kept after fusion)")
    ap.add_argument("--batch-size", type=int, default=64, help="document encoding batch size")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    ap.add_argument("--work", default=str(REPO_ROOT / "runs" / "hybrid"), help="cache directory (embeddings)")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(max(1, args.threads))
    if args.doc_embeddings and args.dataset == "all":
        ap.error("--doc-embeddings belongs to one corpus: give --dataset too")
    for name in DATASETS if args.dataset == "all" else (args.dataset,):
        run_dataset(name, args)


if __name__ == "__main__":
    main()
