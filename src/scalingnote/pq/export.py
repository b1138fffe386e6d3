"""Export of a trained TMJ model: the paired towers, the learned codebooks and the FAISS indexes
built from them, each optionally searched once with the evaluation queries."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np

from scalingnote.data import Qrels
from scalingnote.errors import ScalingNoteError
from scalingnote.evaluation import evaluate
from scalingnote.index import DenseIndex, tower_identity
from scalingnote.index.faiss.learned_pq import export_index
from scalingnote.models import pair_towers
from scalingnote.pq.data import PQData
from scalingnote.pq.module import LearnedPQ

EVAL_METRICS = ("ndcg@10", "r@100", "recall@100", "mrr@10")


class ExportOwner(Protocol):
    """What the export uses of the trainer (:class:`scalingnote.pq.train.TMJTrainer`)."""

    cfg: Any  # PQTrainConfig: export, seed, eval_k
    out: Path
    data: PQData
    q_tower: Any
    d_tower: Any
    pq: LearnedPQ | None

    def doc_embeddings(self) -> np.ndarray: ...

    def query_embeddings(self, rows: np.ndarray) -> np.ndarray: ...

    def _split(self, split: str) -> tuple[np.ndarray, list[str], Qrels]: ...


def export_trained(owner: ExportOwner, out_dir: Path | None = None) -> dict[str, Any]:
    """Save the paired towers, the codebooks and one FAISS index per ``export.indexes`` kind;
    with ``export.verify`` search each index (via :class:`~scalingnote.index.DenseIndex`)
    with the evaluation queries and record ``served_<kind>_*`` metrics."""

    if owner.pq is None:
        raise ScalingNoteError("export: no product quantizer (run init_pq / training first)")
    out = Path(out_dir) if out_dir is not None else owner.out
    X = owner.doc_embeddings()
    pair_towers(owner.q_tower, owner.d_tower)
    owner.q_tower.save(out / "query_tower")
    owner.d_tower.save(out / "doc_tower")
    owner.pq.save(out / "learned_pq.npz")
    spec = owner.cfg.export
    info: dict[str, Any] = {"compat_id": owner.q_tower.compat_id}
    rows, qids, qrels = owner._split("eval")
    qv = owner.query_embeddings(rows) if len(rows) else None
    for kind in spec.indexes:
        slug = kind.replace(",", "_").lower()
        path = export_index(
            owner.pq,
            X,
            owner.data.doc_ids,
            out / "indexes" / slug,
            kind,
            tower_info=tower_identity(owner.d_tower),
            seed=owner.cfg.seed,
            nprobe=spec.nprobe if "IVF" in kind else None,
            ef_search=spec.ef_search if "HNSW" in kind else None,
            semantic_ids_layers=spec.semantic_ids_layers,
            overwrite=True,
        )
        info[f"index_{slug}"] = str(path)
        if spec.verify and qv is not None:
            idx = DenseIndex.open(path, query_tower=owner.q_tower)
            run = idx.search_run(qids, qv, k=owner.cfg.eval_k)
            for m, v in evaluate(run, qrels, list(EVAL_METRICS)).items():
                info[f"served_{slug}_{m}"] = round(float(v), 6)
    return info


__all__ = ["EVAL_METRICS", "ExportOwner", "export_trained"]
