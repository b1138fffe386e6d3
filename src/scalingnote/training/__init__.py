"""Stage I: LLM dual-tower training (ScalingNote §3.2) and the TwinBERT / ScalingDoc baselines."""

from scalingnote.training.config import DataSpec, LoraSpec, LossSpec, OptimSpec, TowerSpec, TrainConfig
from scalingnote.training.config import load_train_config
from scalingnote.training.driver import train
from scalingnote.training.evaluate import evaluate_pair
from scalingnote.training.towers import build_towers
from scalingnote.training.losses import (
    info_nce_d2q,
    info_nce_q2d,
    margin_loss,
    matryoshka_contrastive,
    matryoshka_margin,
    scalingnote_loss,
)
from scalingnote.training.trainer import StopTraining, Trainer

__all__ = [
    "DataSpec",
    "LoraSpec",
    "LossSpec",
    "OptimSpec",
    "StopTraining",
    "TowerSpec",
    "TrainConfig",
    "Trainer",
    "build_towers",
    "evaluate_pair",
    "info_nce_d2q",
    "info_nce_q2d",
    "load_train_config",
    "margin_loss",
    "matryoshka_contrastive",
    "matryoshka_margin",
    "scalingnote_loss",
    "train",
]
