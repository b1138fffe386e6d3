"""Learned product quantization (TMJ, Huang et al., KDD'23): a torch PQ module initialised from
FAISS, the TMJ losses (Eq. 4–9), two-stage joint training with PQ-oriented negative mining,
and export of the learned codebooks into FAISS IndexPQ / IVFPQ / HNSW-PQ indexes that
:class:`scalingnote.index.DenseIndex` serves unchanged.

    from scalingnote.pq import LearnedPQ, TMJTrainer, load_pq_config
    res = TMJTrainer(load_pq_config("configs/tmj_scifact.yaml")).run()

Training and export import torch / FAISS lazily where they can.
"""

from scalingnote.index.faiss.learned_pq import export_index, factory_label, faiss_codes, faiss_index, parse_kind
from scalingnote.pq.config import (
    ExportSpec,
    PhaseOptim,
    PQDataSpec,
    PQTowers,
    PQTrainConfig,
    QuantizerSpec,
    Stage1Spec,
    Stage2Spec,
    WarmupSpec,
)
from scalingnote.pq.losses import (
    dense_retrieval_loss,
    joint_loss,
    multitask_loss,
    pq_retrieval_loss,
    reconstruction_loss,
    retrieval_loss,
    stage1_loss,
    straight_through,
)
from scalingnote.pq.mining import pq_oriented_negatives, sample_negatives, search, top_negatives
from scalingnote.pq.module import LearnedPQ
from scalingnote.pq.train import PQData, TMJTrainer, build_towers, load_pq_config, load_pq_data, train

__all__ = [
    "ExportSpec",
    "LearnedPQ",
    "PQData",
    "PQDataSpec",
    "PQTowers",
    "PQTrainConfig",
    "PhaseOptim",
    "QuantizerSpec",
    "Stage1Spec",
    "Stage2Spec",
    "TMJTrainer",
    "WarmupSpec",
    "build_towers",
    "dense_retrieval_loss",
    "export_index",
    "factory_label",
    "faiss_codes",
    "faiss_index",
    "joint_loss",
    "load_pq_config",
    "load_pq_data",
    "multitask_loss",
    "parse_kind",
    "pq_oriented_negatives",
    "pq_retrieval_loss",
    "reconstruction_loss",
    "retrieval_loss",
    "sample_negatives",
    "search",
    "stage1_loss",
    "straight_through",
    "top_negatives",
    "train",
]
