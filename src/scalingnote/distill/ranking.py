"""The teacher's top-k documents of every distillation query, for the listwise term of QKD
(:func:`scalingnote.distill.loss.qkd_rank_loss`; not in the paper).

The documents are the frozen Stage I document embeddings the student is served against
(ScalingNote §3.3): an exact inner-product search (FAISS ``IndexFlatIP``) of the L2-normalised
teacher query embeddings over the L2-normalised document embeddings.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from scalingnote.errors import ScalingNoteError


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


@dataclass
class TeacherRanking:
    """Per query: the indices of its teacher top-k documents and their teacher cosine scores;
    ``docs`` = every document embedding, L2-normalised (float32, [n_docs, dim])."""

    docs: np.ndarray
    topk: np.ndarray  #: [n_queries, k] int64 rows of ``docs``
    scores: np.ndarray  #: [n_queries, k] float32 teacher cosines, best first

    def batch(self, idx: np.ndarray, q_student: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(teacher_scores, student_scores)`` [B, k] for the queries ``idx`` (rows of the teacher
        cache) and their student embeddings ``q_student`` [B, dim] (gradients flow through)."""
        d = torch.from_numpy(self.docs[self.topk[idx]]).to(q_student.device, q_student.dtype)  # [B, k, dim]
        q = torch.nn.functional.normalize(q_student, dim=-1)
        s = torch.einsum("bd,bkd->bk", q, d)
        return torch.from_numpy(self.scores[idx]).to(q_student.device, q_student.dtype), s


def teacher_ranking(teacher_dir: str | Path, targets: np.ndarray, k: int, batch_size: int = 4096) -> TeacherRanking:
    """Exact top-``k`` documents of every teacher query embedding (``targets``, [n, dim])."""
    import faiss

    path = Path(teacher_dir) / "doc_embeddings.npy"
    docs = _unit(np.load(path, mmap_mode="r"))
    if docs.shape[1] != targets.shape[1]:
        raise ScalingNoteError(
            f"{path}: document embeddings have dim {docs.shape[1]}, the teacher's query embeddings {targets.shape[1]}"
        )
    k = min(k, len(docs))
    index = faiss.IndexFlatIP(docs.shape[1])
    index.add(docs)
    q = _unit(targets)
    scores = np.empty((len(q), k), dtype=np.float32)
    topk = np.empty((len(q), k), dtype=np.int64)
    for i in range(0, len(q), batch_size):
        scores[i : i + batch_size], topk[i : i + batch_size] = index.search(q[i : i + batch_size], k)
    return TeacherRanking(docs, topk, scores)


__all__ = ["TeacherRanking", "teacher_ranking"]
