"""The ``loss:`` block of a Stage I config (:class:`LossSpec`): which loss, and its settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scalingnote.training.losses.registry import get_loss
from scalingnote.utils.registry import RegistryError


@dataclass
class LossSpec:
    """The Stage I loss: ``name`` chooses it from :data:`scalingnote.training.losses.LOSSES` (or is a
    dotted path ``"package.module:function"``); the rest are ScalingNote Eq. 5–12 hyper-parameters
    (§4.2: dims 16..128, all weights 1, margin 0.2, α 0.5), and ``options`` a loss's own settings.
    In YAML, ``loss: infonce`` is short for ``loss: {name: infonce}``."""

    __config_shorthand__ = "name"

    #: None means ``scalingnote`` (the paper's Eq. 12); None, not the name, is the default so that a
    #: config without ``loss.name`` hashes to the same step inputs as one without the field
    name: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    dims: list[int] = field(default_factory=lambda: [16, 32, 64, 128])
    weights: list[float] | None = None
    hard_weights: list[float] | None = None
    tau: float = 0.05
    margin: float = 0.2
    alpha: float = 0.5
    hard_in_denominator: bool = False
    #: several hard negatives per query (``data.num_negatives`` > 1): Eq. 9's hinge averaged over a
    #: query's negatives ("mean": every (q, d+, d−) triplet counts once, as the paper's one-negative
    #: triplets do) or its hardest one ("max"); one negative per query is Eq. 9 either way
    hard_reduce: str = "mean"

    @property
    def loss_name(self) -> str:
        """The loss this spec chooses (``name``, or the default ``scalingnote``)."""
        return self.name or "scalingnote"

    def __post_init__(self) -> None:
        if self.hard_reduce not in ("mean", "max"):
            raise ValueError(f"hard_reduce must be 'mean' or 'max', got {self.hard_reduce!r}")
        try:
            get_loss(self.loss_name, option="name")
        except RegistryError as e:  # -> ConfigError naming loss.name and its line
            raise ValueError(str(e)) from None


__all__ = ["LossSpec"]
