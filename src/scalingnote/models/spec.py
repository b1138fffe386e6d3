"""The one description of a tower to build (:class:`TowerSpec`): Stage I, QKD's student, and the
Ray encoder's actors all name their towers with it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from scalingnote.models.towers.io import load_tower


@dataclass
class TowerSpec:
    """Where a tower's backbone comes from.

    ``model``: a packaged name (``smollm2-135m``, ``minilm-l6``), a Hugging Face
    directory, a ``.gguf`` file, or a saved scalingnote tower directory.
    """

    model: str
    num_layers: int | None = None
    #: None = the tower default. BERT: "cls" (paper Eq. 13–14) or "mean"; LLM: "last" (query) /
    #: "prompt" (document), the paper's placeholder pooling (§3.2), or "mean" (not in the paper)
    pooling: str | None = None
    max_length: int = 64
    #: Layers that train: "all" (the paper's full fine-tuning, the default on GPU) or ``k`` in
    #: 0..L: the embeddings and the bottom L-k layers are frozen and their outputs cached on disk
    #: (``scalingnote.models.prefix``); ``0`` trains the projection head only, over cached pooled states.
    trainable_layers: int | Literal["all"] = "all"
    #: LLM document towers: the document prompt — a preset of ``scalingnote.models.prompt.PROMPT_PRESETS``
    #: (``full`` = the paper's §3.2 prompt, ``no_title``, ``no_content``, ``no_summarize``, ``plain``) or a
    #: template; None = ``full``
    prompt: str | None = None
    #: the base model's layers to keep, in order (e.g. ``[0, 5]`` of a 6-layer model); None = the
    #: first ``num_layers`` (``num_layers``, when also set, must be their count)
    layers: list[int] | None = None

    @property
    def prefix_k(self) -> int | None:
        """``trainable_layers`` as an int, None for "all"."""
        return None if self.trainable_layers == "all" else int(self.trainable_layers)

    def load(self, role: str, **kw: Any):
        """The tower (:func:`scalingnote.models.load_tower`) for ``role`` ("query" / "document");
        ``kw`` passes further options (``dim``, ``matryoshka_dims``, ...)."""

        opts = {"num_layers": self.num_layers, "pooling": self.pooling, "layers": self.layers, **kw}
        return load_tower(self.model, role, **{k: v for k, v in opts.items() if v is not None})


__all__ = ["TowerSpec"]
