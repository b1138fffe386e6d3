"""Stage I losses, one per file (ScalingNote §3.2 Eq. 5–12 in ``scalingnote_loss.py``; a plain
single-vector InfoNCE in ``infonce.py``), and the table ``loss.name`` chooses from
(``registry.py``)."""

from scalingnote.training.losses.batch import LossBatch
from scalingnote.training.losses.registry import LOSSES, StageOneLoss, get_loss, register_loss
from scalingnote.training.losses.scalingnote_loss import (
    DEFAULT_DIMS,
    VIEWS,
    info_nce_d2q,
    info_nce_q2d,
    margin_loss,
    matryoshka_contrastive,
    matryoshka_margin,
    scalingnote_loss,
)

__all__ = [
    "DEFAULT_DIMS",
    "LOSSES",
    "LossBatch",
    "StageOneLoss",
    "VIEWS",
    "get_loss",
    "info_nce_d2q",
    "info_nce_q2d",
    "margin_loss",
    "matryoshka_contrastive",
    "matryoshka_margin",
    "register_loss",
    "scalingnote_loss",
]
