"""The settings an index is built with that the FAISS build (:func:`~scalingnote.index.build_index`,
``scalingnote index build``) and the Milvus export (:func:`~scalingnote.index.milvus.milvus_export.export_to_milvus`)
share: the Matryoshka prefix, the seeded training sample and the residual-K-means semantic IDs
fitted on it (ScalingNote §3.5). Both take them as keywords named like the fields, or as one
``settings=IndexBuildSettings(...)``."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from scalingnote.config import cli_meta
from scalingnote.errors import ScalingNoteError
from scalingnote.index.semantic_ids import ResidualKMeans

T = TypeVar("T")
S = TypeVar("S", bound="IndexBuildSettings")


def with_options(cls: type[T], base: T | None, options: Mapping[str, Any], caller: str) -> T:
    """The dataclass ``base`` (default: ``cls()``) with the fields named in ``options`` replaced:
    the keywords of a function that takes a settings object or its fields. A keyword that is no
    field is refused as Python refuses an unknown keyword of ``caller``."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = [k for k in options if k not in names]
    if unknown:
        raise TypeError(f"{caller}() got an unexpected keyword argument {unknown[0]!r}")
    out = cls() if base is None else base
    return dataclasses.replace(out, **options) if options else out  # type: ignore[type-var]


@dataclass(frozen=True)
class IndexBuildSettings:
    """Matryoshka prefix, training sample and semantic IDs of an index build or export."""

    dim: int | None = field(default=None, metadata=cli_meta("Matryoshka prefix to index (default: full dim).", min=1))
    semantic_ids_layers: int = field(default=6, metadata=cli_meta("Residual K-means layers (0 = none).", min=0))
    codebook_size: int = field(
        default=256, metadata=cli_meta("Centroids per semantic-ID layer (clamped to the training size).", min=1)
    )
    train_size: int = field(default=100_000, metadata=cli_meta("Seeded training sample size.", min=1))
    seed: int = field(default=0, metadata=cli_meta("Seed of the training sample and the k-means."))

    @classmethod
    def resolve(cls: type[S], settings: S | None, options: Mapping[str, Any], caller: str) -> S:
        """``settings`` (default: the defaults) with the fields named in ``options`` replaced."""
        return with_options(cls, settings, options, caller)

    def prefix_dim(self, source_dim: int) -> int:
        """The dimension indexed from ``source_dim``-d embeddings (``dim``, default all of them)."""
        d = source_dim if self.dim is None else int(self.dim)
        if not 1 <= d <= source_dim:
            raise ScalingNoteError(
                f"dim: {d} is not a valid Matryoshka prefix of {source_dim}-d embeddings (1..{source_dim})"
            )
        return d

    def training_rows(self, n: int) -> np.ndarray:
        """The seeded training sample of ``n`` rows: ``train_size`` of them, sorted (all when fewer)."""
        rng = np.random.default_rng(self.seed)
        n_train = min(int(self.train_size), n)
        return np.sort(rng.choice(n, size=n_train, replace=False)) if n_train < n else np.arange(n)

    def fit_semantic_ids(self, train_x: np.ndarray) -> ResidualKMeans | None:
        """Residual K-means codebooks fitted on ``train_x``; None with 0 semantic-ID layers."""
        if not self.semantic_ids_layers or self.semantic_ids_layers <= 0:
            return None
        return ResidualKMeans(n_layers=self.semantic_ids_layers, codebook_size=self.codebook_size, seed=self.seed).fit(
            train_x
        )


__all__ = ["IndexBuildSettings", "with_options"]
