"""Validation and evaluation of a Stage I pair: the early-stopping score on the held-out
validation queries, the final metrics (+ the saved document embeddings QKD reuses), and the
held-out queries of a finished run (labels it never trained on)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from scalingnote.evaluation import contrastive_perplexity
from scalingnote.evaluation.dense import dense_metrics, exact_search, perplexity_negatives, truncate_normalize
from scalingnote.evaluation.metrics import per_query
from scalingnote.training.config import TrainConfig, load_run_config
from scalingnote.training.data import load_training_data
from scalingnote.utils import write_json
from scalingnote.utils.io import atomic_path


def encode_queries_with(qt, q_enc, texts: list[str], batch_size: int) -> np.ndarray:
    """Normalised query embeddings, through the feature cache when ``q_enc`` is set."""
    if q_enc is not None:
        return q_enc.encode(texts, batch_size=max(256, batch_size))
    return qt.encode_queries(texts, batch_size=batch_size, show_progress=False)


def encode_docs_with(dt, d_enc, docs: list, batch_size: int, show_progress: bool) -> np.ndarray:
    """Normalised ``[EMB]``-view document embeddings, through the feature cache when ``d_enc`` is set."""
    if d_enc is not None:
        return d_enc.encode(docs, batch_size=max(256, batch_size))
    return dt.encode_documents(docs, batch_size=batch_size, show_progress=show_progress)


def make_validator(cfg: TrainConfig, qt, dt, data, encoders=(None, None)):
    """``() -> score`` on the validation queries (held out from training) over the full corpus:
    nDCG@10, or minus the contrastive perplexity (higher is better for both)."""

    doc_ids = list(data.corpus)
    docs = [data.corpus[i] for i in doc_ids]
    vq = sorted({e.query_id for e in data.validation})
    vtexts = [data.queries[q] for q in vq]
    qrels = data.validation_qrels()

    class Validator:
        """The validation score; ``per_query``: the per-query nDCG@10 of the last call (None under
        the contrastive perplexity)."""

        per_query: dict[str, float] | None = None

        def __call__(self) -> float:
            dn = truncate_normalize(encode_docs_with(dt, encoders[1], docs, cfg.eval_batch_size, False), cfg.dim)
            qn = truncate_normalize(encode_queries_with(qt, encoders[0], vtexts, cfg.eval_batch_size), cfg.dim)
            if cfg.validation_metric == "contrastive_ppl":
                return -contrastive_perplexity(
                    qn,
                    vq,
                    dn,
                    doc_ids,
                    qrels=qrels,
                    temperature=cfg.loss.tau,
                    seed=cfg.seed,
                    num_negatives=perplexity_negatives(len(doc_ids), qrels),
                )
            run = exact_search(qn, vq, dn, doc_ids, k=100)
            pq = per_query(run, qrels, ["ndcg@10"])
            # per-query nDCG@10 of this validation (the loop keeps the best one's): a choice between runs
            # can then ask a paired test whether their validation scores really differ
            self.per_query = {q: round(float(pq.get(q, {}).get("ndcg@10", 0.0)), 6) for q in vq if q in qrels}
            return float(
                dense_metrics(qn, vq, dn, doc_ids, qrels, tau=cfg.loss.tau, perplexity_seed=cfg.seed)["ndcg@10"]
            )

    return Validator()


def evaluate_pair(
    cfg: TrainConfig, qt, dt, data, prefix: str = "", save_embeddings: Path | None = None, encoders=(None, None)
) -> dict[str, float]:
    """Encode the corpus once; validation contrastive perplexity + test retrieval metrics."""

    t0 = time.perf_counter()
    doc_ids = list(data.corpus)
    d_emb = encode_docs_with(dt, encoders[1], [data.corpus[i] for i in doc_ids], cfg.eval_batch_size, cfg.show_progress)
    out: dict[str, float] = {}
    dn = truncate_normalize(d_emb, cfg.dim)
    if data.validation:
        vq = sorted({e.query_id for e in data.validation})
        q_emb = truncate_normalize(
            encode_queries_with(qt, encoders[0], [data.queries[q] for q in vq], cfg.eval_batch_size), cfg.dim
        )
        out[f"{prefix}val_contrastive_ppl"] = contrastive_perplexity(
            q_emb,
            vq,
            dn,
            doc_ids,
            qrels=data.validation_qrels(),
            temperature=cfg.loss.tau,
            seed=cfg.seed,
            num_negatives=perplexity_negatives(len(doc_ids), data.validation_qrels()),
        )
    if data.eval_qrels:
        qids = list(data.eval_queries)
        q_emb = truncate_normalize(
            encode_queries_with(qt, encoders[0], [data.eval_queries[q] for q in qids], cfg.eval_batch_size), cfg.dim
        )
        m = dense_metrics(q_emb, qids, dn, doc_ids, data.eval_qrels, tau=cfg.loss.tau, perplexity_seed=cfg.seed)
        out.update({f"{prefix}{k}": v for k, v in m.items()})
    out[f"{prefix}eval_seconds"] = round(time.perf_counter() - t0, 2)
    if save_embeddings is not None:
        with atomic_path(save_embeddings / "doc_embeddings.npy", suffix=".npy") as p:
            np.save(p, d_emb.astype(np.float32))
        write_json(save_embeddings / "doc_ids.json", doc_ids, indent=None)
    return out


def heldout_queries(
    run_dir: str | Path, exclude: set[str] | None = None
) -> tuple[dict[str, str], dict[str, dict[str, int]]]:
    """The validation queries of a Stage I output directory (its held-out split, or its
    validation triplets) as ``({query_id: text}, {query_id: {positive_id: 1}})``, minus
    ``exclude``: labels the run never trained on, e.g. to tune a fusion weight."""
    cfg = load_run_config(run_dir)  # a moved run reads its data where it now is
    texts: dict[str, str] = {}
    qrels: dict[str, dict[str, int]] = {}
    for e in load_training_data(cfg.data, cfg.seed, show_progress=False).validation:
        if not exclude or e.query_id not in exclude:
            texts[e.query_id] = e.query
            qrels.setdefault(e.query_id, {})[e.pos.id] = 1
    return texts, qrels


__all__ = ["encode_docs_with", "encode_queries_with", "evaluate_pair", "heldout_queries", "make_validator"]
