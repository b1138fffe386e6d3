"""Stage I: LLM dual-tower training (ScalingNote §3.2) and the TwinBERT / ScalingDoc baselines.

The losses (the paper's Eq. 5–12 and the ``loss.name`` table) are in
:mod:`scalingnote.training.losses`."""

from scalingnote.training.config import (
    DataSpec,
    LoraSpec,
    LossSpec,
    MiningSpec,
    OptimSpec,
    TowerSpec,
    TrainConfig,
    load_train_config,
)
from scalingnote.training.driver import train
from scalingnote.training.evaluate import evaluate_pair
from scalingnote.training.losses import LOSSES, register_loss, scalingnote_loss
from scalingnote.training.towers import build_towers
from scalingnote.training.trainer import StopTraining, Trainer

__all__ = [
    "DataSpec",
    "LOSSES",
    "LoraSpec",
    "LossSpec",
    "MiningSpec",
    "OptimSpec",
    "StopTraining",
    "TowerSpec",
    "TrainConfig",
    "Trainer",
    "build_towers",
    "evaluate_pair",
    "load_train_config",
    "register_loss",
    "scalingnote_loss",
    "train",
]
