"""Scaling points whose every transformer layer trains (Fang et al., *Scaling Laws for Dense
Retrieval* §3.4: each model of the size axis is fine-tuned, not probed).

:class:`TowerSession` is the counterpart of :class:`~scalingnote.scaling.points.HeadSession`
for ``trainable_layers: all``: the towers of one Stage I configuration with **every**
transformer layer, norm and head trainable and only the ``nn.Embedding`` tables frozen (the
scaling-law N counts non-embedding parameters, §3.2, so what trains is exactly N). Each point
starts from the same pre-trained weights (:meth:`TowerSession.reset`), re-initialises its heads
from its own pairs and trains with a fresh optimizer through the same
:func:`~scalingnote.scaling.points.train_point` / :func:`~scalingnote.scaling.points.run_point`
as the head-only points, so the two kinds of sweep differ only in what trains.

Validations encode only the documents of their :class:`~scalingnote.scaling.points.EvalSet`
(a fixed pool, ``make_eval_set(..., pool=True)``): re-encoding a whole corpus with a trained
tower every few steps would cost more than the training on a CPU. The final score encodes the
whole corpus once (nDCG@10, R@100 and the test contrastive perplexity from the same encodings).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np

from scalingnote.errors import ConfigError
from scalingnote.evaluation.dense import truncate_normalize
from scalingnote.models.loading import default_device
from scalingnote.training.config import TrainConfig
from scalingnote.training.towers import build_towers


def freeze_embeddings(tower) -> int:
    """Freeze every ``nn.Embedding`` of ``tower`` (token, position, type tables); returns how
    many parameters stay trainable (= the tower's non-embedding parameters)."""
    from torch import nn

    for mod in tower.modules():
        if isinstance(mod, nn.Embedding):
            for p in mod.parameters(recurse=False):
                p.requires_grad_(False)
    return sum(p.numel() for p in tower.parameters() if p.requires_grad)


class TowerSession:
    """The towers of one Stage I configuration, trained end to end (``trainable_layers: all`` on
    both towers), embeddings frozen. ``corpus`` is the collection the final score searches."""

    def __init__(self, cfg: TrainConfig, corpus: dict[str, Any], *, batch_size: int = 64, device: str | None = None):
        import torch

        for name, spec in (("query_tower", cfg.query_tower), ("doc_tower", cfg.doc_tower)):
            if spec.prefix_k is not None:
                raise ConfigError(
                    None,
                    None,
                    f"{name}.trainable_layers",
                    f"a TowerSession trains every layer: it must be 'all', got {spec.trainable_layers!r}",
                )
        self.cfg = cfg
        # every layer trains: the GPU when there is one (the Trainer then autocasts to bf16, ``precision: auto``)
        self.device = torch.device(device) if device else default_device()
        self.qt, self.dt = build_towers(cfg, self.device)
        self.trainable = {"query": freeze_embeddings(self.qt), "doc": freeze_embeddings(self.dt)}
        self.batch_size = batch_size
        self.doc_ids = list(corpus)
        self.corpus = corpus
        self._initial = {id(t): copy.deepcopy(t.state_dict()) for t in (self.qt, self.dt)}
        self._configs = {id(t): t.config for t in (self.qt, self.dt)}

    @property
    def encoders(self) -> tuple[None, None]:
        """No prefix cache: every step runs the whole tower."""
        return None, None

    @property
    def non_embedding_params(self) -> dict[str, int]:
        return {"query": int(self.qt.non_embedding_params), "doc": int(self.dt.non_embedding_params)}

    def reset(self) -> None:
        """Back to the pre-trained weights (backbone and heads) the session started with."""
        for t in (self.qt, self.dt):
            t.load_state_dict(self._initial[id(t)])
            t.config = self._configs[id(t)]
            t._ids = None

    def encode(
        self, texts: Sequence[str] | None = None, *, docs: bool = False, doc_ids: Sequence[str] | None = None
    ) -> np.ndarray:
        """Normalised embeddings (truncated to ``cfg.dim``) of query ``texts``, or of the corpus
        documents ``doc_ids`` (all of them by default; ``[EMB]`` view for an LLM document)."""
        import torch

        with torch.no_grad():
            if docs:
                items = [self.corpus[i] for i in (self.doc_ids if doc_ids is None else doc_ids)]
                e = self.dt.encode_documents(items, batch_size=self.batch_size, show_progress=False)
            else:
                e = self.qt.encode_queries(list(texts or []), batch_size=self.batch_size, show_progress=False)
        return truncate_normalize(np.asarray(e, dtype=np.float32), self.cfg.dim)


__all__ = ["TowerSession", "freeze_embeddings"]
