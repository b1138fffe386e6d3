"""Tower configuration: :class:`TowerConfig` and the defaults (dim 128, Matryoshka prefixes
16/32/64/128 — ScalingNote §3.2 "MRL"). Which pooling a tower may use is the pooling table's
business (:mod:`scalingnote.models.towers.pooling`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from scalingnote.models.towers.pooling import ROLES, check_pooling

#: Default projection size and Matryoshka prefixes (ScalingNote §3.2, "MRL"; §4 uses dim=128).
DEFAULT_DIM = 128
DEFAULT_MATRYOSHKA_DIMS = (16, 32, 64, 128)
DEFAULT_MAX_QUERY_LENGTH = 128
DEFAULT_MAX_DOC_LENGTH = {"llm": 512, "bert": 256}

FORMAT = "scalingnote-tower"
FORMAT_VERSION = 1


def matryoshka_dims_for(dim: int, low: int = 16) -> list[int]:
    """{dim_low, 2 dim_low, ..., dim/2, dim} (§3.2); just ``[dim]`` when dim < 2*low."""
    dims = [dim]
    while dims[-1] % 2 == 0 and dims[-1] // 2 >= low:
        dims.append(dims[-1] // 2)
    return sorted(dims)


@dataclass
class TowerConfig:
    """Everything needed to rebuild a tower from its saved weights (stored in ``tower.json``)."""

    kind: str  #: "llm" (decoder-only) or "bert" (bidirectional encoder)
    role: str  #: "query" or "document"
    base_model: str  #: packaged name or path the backbone came from (informational)
    hidden_size: int
    num_layers: int  #: transformer layers actually used
    base_num_layers: int  #: layers of the base checkpoint (before truncation)
    dim: int | None  #: projection size; None = no projection (output = hidden size)
    matryoshka_dims: list[int]
    #: a name in the pooling table (:data:`~scalingnote.models.towers.pooling.POOLING_MODES`:
    #: "last" / "prompt" / "mean" for LLMs, "cls" / "mean" for BERT) or a dotted path to a PoolingMode
    pooling: str
    max_query_length: int = DEFAULT_MAX_QUERY_LENGTH
    max_doc_length: int = 512
    doc_prompt: str | None = None  #: LLM document towers: the §3.2 template
    field_caps: dict[str, int | None] | None = None  #: LLM document towers: per-field token caps
    special_tokens: list[str] = field(default_factory=list)  #: tokens added to the base tokenizer
    projection_init: str | None = None  #: "orthogonal" when dim is set
    projection_seed: int = 0
    padding_side: str = "right"  #: "right" or "left" (LLM only; results do not depend on it)
    base_layers: list[int] | None = None  #: the base checkpoint's layers kept, in order (None = the first num_layers)

    def __post_init__(self) -> None:
        if self.kind not in ("llm", "bert"):
            raise ValueError(f"kind must be 'llm' or 'bert', got {self.kind!r}")
        if self.role not in ROLES:
            raise ValueError(f"role must be 'query' or 'document', got {self.role!r}")
        check_pooling(self.pooling, self.kind, self.role)  # a ConfigError (a ValueError) naming the known modes
        if self.dim is not None and not 1 <= self.dim <= self.hidden_size:
            raise ValueError(f"dim must be in 1..hidden_size ({self.hidden_size}) or null, got {self.dim}")
        out = self.out_dim
        md = list(self.matryoshka_dims)
        if not md or md != sorted(set(md)) or md[-1] != out or md[0] < 1:
            raise ValueError(f"matryoshka_dims must be ascending, unique and end with the output dim {out}, got {md}")
        if self.max_query_length < 2 or self.max_doc_length < 2:
            raise ValueError("max_query_length and max_doc_length must be >= 2")
        if self.padding_side not in ("right", "left"):
            raise ValueError(f"padding_side must be 'right' or 'left', got {self.padding_side!r}")
        if self.kind == "bert" and self.padding_side != "right":
            raise ValueError("BERT towers pad on the right (absolute positions start at 0)")
        if self.kind == "llm" and self.role == "document" and not self.doc_prompt:
            raise ValueError("an LLM document tower needs doc_prompt")

    @property
    def out_dim(self) -> int:
        return self.dim if self.dim is not None else self.hidden_size

    def identity(self) -> dict[str, Any]:
        """The fields that determine the tower's outputs (hashed into the fingerprint)."""
        d = dataclasses.asdict(self)
        for k in ("base_model", "padding_side"):
            d.pop(k)
        if d["base_layers"] is None:  # towers saved before layers could be chosen keep their fingerprint
            d.pop("base_layers")
        return d
