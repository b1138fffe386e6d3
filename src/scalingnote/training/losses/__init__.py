"""Stage I losses, one per file (ScalingNote §3.2 Eq. 5–12 in ``scalingnote_loss.py``; a plain
single-vector InfoNCE in ``infonce.py``), each registering itself in the table ``loss.name``
chooses from (``registry.py``); ``spec.py`` holds the config's ``loss:`` block. A built-in loss
is its own file plus one import line here."""

from scalingnote.training.losses.batch import LossBatch
from scalingnote.training.losses.infonce import infonce_loss, infonce_stage1_loss
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
    scalingnote_stage1_loss,
)
from scalingnote.training.losses.spec import LossSpec

__all__ = [
    "DEFAULT_DIMS",
    "LOSSES",
    "LossBatch",
    "LossSpec",
    "StageOneLoss",
    "VIEWS",
    "get_loss",
    "info_nce_d2q",
    "info_nce_q2d",
    "infonce_loss",
    "infonce_stage1_loss",
    "margin_loss",
    "matryoshka_contrastive",
    "matryoshka_margin",
    "register_loss",
    "scalingnote_loss",
    "scalingnote_stage1_loss",
]
