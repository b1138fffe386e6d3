"""Contrastive perplexity — Fang et al., *Scaling Laws for Dense Retrieval*, §3.5, Eq. (6).

For every (query, relevant document) pair of the test set, draw ``W`` (256 in the
paper) documents at random that are not relevant to the query, and compute

    L = -log( exp(s(q, p+)/τ) / (exp(s(q, p+)/τ) + Σ_{j=1..W} exp(s(q, p_j-)/τ)) )

averaged over all pairs. ``s`` is the inner product of the embeddings (Eq. 5). The
paper's Eq. (6) has no temperature, so ``temperature=1.0`` is the default; pass the
training temperature (and L2-normalised embeddings) to evaluate a cosine/τ model on
the scale of its training loss. Despite its name the value is a negative
log-likelihood (lower is better), not its exponential.

Usage — sample the negatives **once** (fixed seed), then score any number of
checkpoints on the same set so their values are comparable::

    cset = sample_contrastive_set(val_qrels, doc_ids, num_negatives=256, seed=0)
    loss = contrastive_perplexity(q_emb, query_ids, d_emb, doc_ids, cset)

or in one call ``contrastive_perplexity(q_emb, query_ids, d_emb, doc_ids, qrels=val_qrels)``.
Embeddings may be NumPy arrays or torch tensors (computed on the tensors' device, so a
trainer can evaluate on GPU without copies). Models that are not dual encoders use
:func:`contrastive_perplexity_from_scorer` with a batched scoring callable.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from scalingnote.data.types import Qrels
from scalingnote.errors import ScalingNoteError

if TYPE_CHECKING:  # torch is imported lazily: `scalingnote eval` need not load it
    import torch

#: W in the paper (§3.5).
PAPER_NUM_NEGATIVES = 256


@dataclass(frozen=True)
class ContrastiveSet:
    """Fixed evaluation tuples: pair ``i`` is query ``query_ids[i]`` with positive document
    ``doc_ids[pos[i]]`` and negatives ``doc_ids[neg[i, :]]``."""

    query_ids: tuple[str, ...]  # one per pair
    pos: np.ndarray  # (P,) int64 indices into doc_ids
    neg: np.ndarray  # (P, W) int64 indices into doc_ids
    doc_ids: tuple[str, ...]
    seed: int

    @property
    def num_pairs(self) -> int:
        return len(self.query_ids)

    @property
    def num_negatives(self) -> int:
        return int(self.neg.shape[1])

    def candidates(self) -> np.ndarray:
        """(P, 1 + W) document indices, the positive first."""
        return np.concatenate([self.pos[:, None], self.neg], axis=1)


def sample_contrastive_set(
    qrels: Qrels,
    doc_ids: Sequence[str],
    *,
    num_negatives: int = PAPER_NUM_NEGATIVES,
    seed: int = 0,
    relevance_level: int = 1,
    query_ids: Sequence[str] | None = None,
) -> ContrastiveSet:
    """Draw ``num_negatives`` random negatives for every (query, relevant doc) pair.

    Pairs are the qrels entries with grade ``>= relevance_level``, in sorted (query id,
    doc id) order, restricted to ``query_ids`` when given. Negatives are drawn uniformly
    without replacement from ``doc_ids`` minus every document the qrels grade ``> 0``
    for that query (a negative is never relevant at any level). The result depends only
    on ``qrels``, the order of ``doc_ids`` and ``seed``. Every positive must be in ``doc_ids``.
    """
    if num_negatives < 1:
        raise ScalingNoteError(f"num_negatives must be >= 1, got {num_negatives}")
    doc_ids = tuple(doc_ids)
    index = {d: i for i, d in enumerate(doc_ids)}
    if len(index) != len(doc_ids):
        raise ScalingNoteError("doc_ids contains duplicates")
    keep = set(query_ids) if query_ids is not None else None
    rng = np.random.default_rng(seed)
    n = len(doc_ids)
    q_out: list[str] = []
    pos_out: list[int] = []
    neg_out: list[np.ndarray] = []
    for qid in sorted(qrels):
        if keep is not None and qid not in keep:
            continue
        judged = qrels[qid]
        positives = sorted(d for d, g in judged.items() if g >= relevance_level)
        if not positives:
            continue
        excluded = {index[d] for d, g in judged.items() if g > 0 and d in index}
        if n - len(excluded) < num_negatives:
            raise ScalingNoteError(
                f"query {qid!r}: only {n - len(excluded)} non-relevant documents, need num_negatives={num_negatives}"
            )
        for did in positives:
            if did not in index:
                raise ScalingNoteError(f"positive document {did!r} of query {qid!r} is not among doc_ids")
            # A uniform ordered sample of W + |excluded| indices, minus the excluded ones,
            # keeps >= W indices whose first W are a uniform sample of the allowed documents.
            draw = rng.choice(n, size=min(n, num_negatives + len(excluded)), replace=False)
            if excluded:
                draw = draw[~np.isin(draw, list(excluded))]
            q_out.append(qid)
            pos_out.append(index[did])
            neg_out.append(draw[:num_negatives].astype(np.int64))
    if not q_out:
        raise ScalingNoteError("contrastive perplexity: no (query, relevant document) pair to evaluate")
    return ContrastiveSet(tuple(q_out), np.asarray(pos_out, dtype=np.int64), np.stack(neg_out), doc_ids, seed)


def _as_tensor(x) -> torch.Tensor:
    import torch  # why: the metrics of this package import without torch (~1.3 s)

    if isinstance(x, torch.Tensor):
        return x.detach()
    return torch.from_numpy(np.ascontiguousarray(x))


def contrastive_nll(scores: torch.Tensor | np.ndarray, temperature: float = 1.0) -> torch.Tensor:
    """Eq. (6) per row of ``scores`` (B, 1 + W), the positive in column 0: logsumexp − positive."""
    import torch  # why: torch only when a perplexity is computed (~1.3 s import)

    s = _as_tensor(scores).double() / temperature
    return torch.logsumexp(s, dim=1) - s[:, 0]


def contrastive_perplexity(
    query_emb,
    query_ids: Sequence[str],
    doc_emb,
    doc_ids: Sequence[str],
    cset: ContrastiveSet | None = None,
    *,
    qrels: Qrels | None = None,
    num_negatives: int = PAPER_NUM_NEGATIVES,
    temperature: float = 1.0,
    seed: int = 0,
    batch_size: int = 512,
    return_per_pair: bool = False,
):
    """Mean contrastive perplexity (Eq. 6) of a dual encoder, s = <q, d> / temperature.

    ``query_emb`` (Nq, dim) rows match ``query_ids``; ``doc_emb`` (Nd, dim) rows match
    ``doc_ids``. Give either a prepared ``cset`` (built over the same ``doc_ids``) or
    ``qrels`` (then one is sampled with ``num_negatives`` and ``seed``; qrels queries not
    in ``query_ids`` are left out). Returns a float, or the (P,) per-pair values as a
    NumPy array with ``return_per_pair=True``.
    """
    import torch  # why: torch only when a perplexity is computed (~1.3 s import)

    if temperature <= 0:
        raise ScalingNoteError(f"temperature must be > 0, got {temperature}")
    if cset is None:
        if qrels is None:
            raise ScalingNoteError("give a ContrastiveSet or qrels")
        cset = sample_contrastive_set(qrels, doc_ids, num_negatives=num_negatives, seed=seed, query_ids=query_ids)
    elif tuple(doc_ids) != cset.doc_ids:
        raise ScalingNoteError("doc_ids differ from those the ContrastiveSet was sampled over")
    q = _as_tensor(query_emb)
    d = _as_tensor(doc_emb)
    if q.ndim != 2 or d.ndim != 2 or q.shape[1] != d.shape[1]:
        raise ScalingNoteError(f"embeddings must be (n, dim) with equal dim, got {tuple(q.shape)} and {tuple(d.shape)}")
    if q.shape[0] != len(query_ids) or d.shape[0] != len(doc_ids):
        raise ScalingNoteError("one embedding row per query id / doc id is required")
    qindex = {x: i for i, x in enumerate(query_ids)}
    missing = [x for x in dict.fromkeys(cset.query_ids) if x not in qindex]
    if missing:
        raise ScalingNoteError(f"{len(missing)} queries of the set have no embedding, e.g. {missing[0]!r}")
    qi = torch.as_tensor([qindex[x] for x in cset.query_ids], dtype=torch.long, device=q.device)
    cand = torch.as_tensor(cset.candidates(), dtype=torch.long, device=d.device)
    out = []
    with torch.no_grad():
        for start in range(0, cset.num_pairs, batch_size):
            qb = q[qi[start : start + batch_size]]  # (B, dim)
            db = d[cand[start : start + batch_size]]  # (B, 1+W, dim)
            # dot products in the embeddings' own precision (fp32 stays fp32), softmax in fp64
            dtype = torch.promote_types(qb.dtype, db.dtype)
            scores = torch.bmm(db.to(qb.device, dtype), qb.to(dtype).unsqueeze(2)).squeeze(2)
            out.append(contrastive_nll(scores, temperature).cpu())
    per_pair = torch.cat(out).numpy()
    return per_pair if return_per_pair else float(per_pair.mean())


def contrastive_perplexity_from_scorer(
    score_fn: Callable[[Sequence[str], Sequence[Sequence[str]]], object],
    cset: ContrastiveSet,
    *,
    temperature: float = 1.0,
    batch_size: int = 64,
    return_per_pair: bool = False,
):
    """Contrastive perplexity of any scorer over a prepared set.

    ``score_fn(query_ids, candidate_doc_ids)`` receives B query ids and, for each, the
    1 + W candidate doc ids (the positive first) and returns a (B, 1 + W) array/tensor
    of scores s(q, d) (cross-encoders, BM25, a model encoding on the fly...).
    """
    import torch  # why: torch only when a perplexity is computed (~1.3 s import)

    if temperature <= 0:
        raise ScalingNoteError(f"temperature must be > 0, got {temperature}")
    cand = cset.candidates()
    out = []
    for start in range(0, cset.num_pairs, batch_size):
        qids = cset.query_ids[start : start + batch_size]
        docs = [[cset.doc_ids[j] for j in row] for row in cand[start : start + batch_size]]
        s = _as_tensor(score_fn(qids, docs))
        if tuple(s.shape) != (len(qids), cand.shape[1]):
            raise ScalingNoteError(f"score_fn returned shape {tuple(s.shape)}, expected {(len(qids), cand.shape[1])}")
        out.append(contrastive_nll(s, temperature).cpu())
    per_pair = torch.cat(out).numpy()
    return per_pair if return_per_pair else float(per_pair.mean())
