"""Pooling modes: one table, keyed by name, holding every way a tower pools hidden states into a
vector and what the rest of the code needs to know about it; plus the seeded projection ``W``.

A tower hands a mode the last hidden states ``h [B, L, H]``, the attention ``mask [B, L]`` and the
**spans** of its views, ``[B, S, 2]`` token positions ``(start, end)``: a view covers the real
tokens in ``(start, end]`` (``start = -1``: from the first token). Prompt code makes the spans:

* an LLM query tower: one span ending at the EOS it appended, the last real token (§3.2 Eq. 2,
  :func:`text_spans`);
* an LLM document tower: one span per view, ending just before the view's placeholder (§3.2
  Eq. 1, :meth:`~scalingnote.models.prompt.DocumentPrompt.spans`);
* a BERT tower embeds the text as given (§3.3): its one view is the whole text, ``spans=None``;
  a mode computes it with its ``whole`` formula, or from :func:`text_spans` when it has none.

A mode returns ``[B, S, H]``. The table (:data:`POOLING_MODES`, a
:class:`~scalingnote.utils.registry.Registry`) holds the built-in modes:

============  ===========  ==============  =========  ==========================================
name          towers       reads           ST mode    vector
============  ===========  ==============  =========  ==========================================
``cls``       BERT         first token     cls        the ``[CLS]`` state (§3.3 Eq. 13-14)
``mean``      LLM, BERT    every token     mean       mean over each view's real tokens
``last``      LLM query    span end        lasttoken  the state of the appended EOS (§3.2 Eq. 2)
``prompt``    LLM doc.     span end        --         the state before each placeholder (Eq. 1)
============  ===========  ==============  =========  ==========================================

What the export paths read from an entry: ``st_mode`` is the sentence-transformers ``Pooling``
mode that computes the same vector (``None``: the export refuses the tower; the import maps a
directory's mode back to the entry with that ``st_mode``); ``reads == "first"`` means the vector is
the first token's state, so a tower puts ``[CLS]`` first itself when its tokenizer does not, which
an export cannot do (refused). The ONNX export traces the mode's function into its graph and
checks the result against the tower; it needs no flag.

Users add a mode from their own code with :func:`register_pooling`, or name a
:class:`PoolingMode` object by a dotted path ``"package.module:attribute"`` wherever a pooling
is named (``load_tower(..., pooling=...)``, a config's ``pooling:``); see ``docs/extending.md``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from scalingnote.errors import ConfigError
from scalingnote.utils.registry import Registry, RegistryError

KINDS = ("llm", "bert")
ROLES = ("query", "document")
READS = ("first", "end", "span")

#: ``pool(h [B, L, H], mask [B, L], spans [B, S, 2]) -> [B, S, H]``
PoolFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
#: ``whole(h [B, L, H], mask [B, L]) -> [B, H]``: the one view of a tower that reads the whole text
WholeFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class PoolingMode:
    """One entry of the pooling table (see the module docstring)."""

    name: str
    pool: PoolFn
    kinds: tuple[str, ...] = KINDS  #: tower kinds ("llm", "bert") that may use it
    roles: tuple[str, ...] = ROLES  #: tower roles ("query", "document") that may use it
    reads: str = "span"  #: "first" (first token), "end" (each span's last token) or "span" (all its tokens)
    st_mode: str | None = None  #: the sentence-transformers Pooling mode computing the same vector, None = none
    whole: WholeFn | None = None  #: formula for a whole-text view (None: ``pool`` over :func:`text_spans`)
    #: kind -> embedding-space family hashed into a zero-shot tower's space id (default ``"<kind>-<name>"``)
    families: Mapping[str, str] = field(default_factory=dict)
    default_for: tuple[tuple[str, str], ...] = ()  #: (kind, role) pairs this mode is the default of
    description: str = ""

    def __post_init__(self) -> None:
        if not callable(self.pool) or (self.whole is not None and not callable(self.whole)):
            raise TypeError(f"pooling mode {self.name!r}: pool (and whole, when given) must be callable")
        bad = [k for k in self.kinds if k not in KINDS] + [r for r in self.roles if r not in ROLES]
        if bad or not self.kinds or not self.roles:
            raise ValueError(
                f"pooling mode {self.name!r}: kinds must be among {KINDS} and roles among {ROLES}, got {bad or 'none'}"
            )
        if self.reads not in READS:
            raise ValueError(f"pooling mode {self.name!r}: reads must be one of {READS}, got {self.reads!r}")

    def allows(self, kind: str, role: str) -> bool:
        return kind in self.kinds and role in self.roles

    def family(self, kind: str) -> str:
        """The embedding-space family of a ``kind`` tower pooled this way (hashed into its space id)."""
        return self.families.get(kind, f"{kind}-{self.name}")

    def __call__(self, h: torch.Tensor, mask: torch.Tensor, spans: torch.Tensor | None = None) -> torch.Tensor:
        """``[B, S, H]`` pooled views (``S = 1`` for ``spans=None``, the whole text)."""
        mask = mask.to(h.device)
        if spans is None:
            if self.whole is not None:
                return self.whole(h, mask).unsqueeze(1)
            spans = text_spans(mask)
        return self.pool(h, mask, spans.to(h.device))


# ====================================================================== positions and formulas


def last_positions(mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` index of each row's last real token (under left or right padding)."""
    pos = torch.arange(mask.shape[1], device=mask.device)
    return (mask * pos).argmax(-1)


def text_spans(mask: torch.Tensor) -> torch.Tensor:
    """``[B, 1, 2]`` one span per row: every real token, ending at the last one."""
    last = last_positions(mask)
    return torch.stack([torch.full_like(last, -1), last], dim=-1).unsqueeze(1)


def _rows(h: torch.Tensor) -> torch.Tensor:
    return torch.arange(h.shape[0], device=h.device).unsqueeze(1)


def _first_token(h: torch.Tensor, mask: torch.Tensor, spans: torch.Tensor) -> torch.Tensor:
    return h[_rows(h), spans[..., 0] + 1]  # [CLS] is the first token (right padding), §3.3 Eq. 13-14


def _span_end(h: torch.Tensor, mask: torch.Tensor, spans: torch.Tensor) -> torch.Tensor:
    return h[_rows(h), spans[..., 1]]  # §3.2 Eq. 1-2: the state at the EOS / just before a placeholder


def _span_means(h: torch.Tensor, mask: torch.Tensor, spans: torch.Tensor) -> torch.Tensor:
    """Mean of the real tokens of each span, from cumulative sums (one pass for all views).

    The ``"mean"`` pooling of LLM towers is **not the paper's** placeholder pooling (§3.2 reads one
    hidden state before each placeholder). A truncated, untrained decoder's last-token states are
    nearly identical across texts (zero-shot SmolLM2 at 1-16 layers: see
    ``benchmarks/results/llm_pooling_scifact.json``), and mean pooling over a causal decoder is
    the usual remedy (SGPT, Muennighoff 2022).
    """
    m = mask.to(h.dtype).unsqueeze(-1)
    csum = torch.cat([torch.zeros_like(h[:, :1]), torch.cumsum(h * m, dim=1)], dim=1)  # csum[:, j+1] = sum up to j
    count = torch.cat([torch.zeros_like(m[:, :1]), torch.cumsum(m, dim=1)], dim=1)
    rows, a, b = _rows(h), spans[..., 0] + 1, spans[..., 1] + 1
    return (csum[rows, b] - csum[rows, a]) / (count[rows, b] - count[rows, a]).clamp(min=1)


def _masked_mean(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.to(h.dtype).unsqueeze(-1)
    return (h * m).sum(1) / m.sum(1).clamp(min=1e-9)  # sentence-transformers' mean pooling, exactly


# ====================================================================== the table

#: name -> :class:`PoolingMode` (the built-in modes are registered below)
POOLING_MODES: Registry[PoolingMode] = Registry("pooling mode")


def register_pooling(name: str, pool: PoolFn | PoolingMode, *, replace: bool = False, **fields: Any) -> PoolingMode:
    """Add a pooling mode to the table: ``pool`` is a :data:`PoolFn` (the other
    :class:`PoolingMode` fields as keywords) or a ready :class:`PoolingMode`. A name that is
    taken raises unless ``replace=True``. Returns the entry."""
    mode = pool if isinstance(pool, PoolingMode) else PoolingMode(name, pool, **fields)
    if mode.name != name:
        raise ValueError(f"the pooling mode object is named {mode.name!r}, registered as {name!r}")
    return POOLING_MODES.register(name, mode, replace=replace)


register_pooling(
    "cls",
    _first_token,
    kinds=("bert",),
    reads="first",
    st_mode="cls",
    families={"bert": "cls"},
    default_for=(("bert", "query"), ("bert", "document")),
    description="the [CLS] state (§3.3)",
)
register_pooling(
    "mean",
    _span_means,
    whole=_masked_mean,
    st_mode="mean",
    families={"llm": "llm-mean", "bert": "mean"},
    description="mean over each view's real tokens (LLM: not in the paper)",
)
register_pooling(
    "last",
    _span_end,
    kinds=("llm",),
    roles=("query",),
    reads="end",
    st_mode="lasttoken",
    families={"llm": "llm"},
    default_for=(("llm", "query"),),
    description="the appended EOS (§3.2 Eq. 2)",
)
register_pooling(
    "prompt",
    _span_end,
    kinds=("llm",),
    roles=("document",),
    reads="end",
    families={"llm": "llm"},
    default_for=(("llm", "document"),),
    description="the state before each placeholder (§3.2 Eq. 1)",
)


def pooling_modes(kind: str | None = None, role: str | None = None) -> list[PoolingMode]:
    """The table's entries (by name), those a ``kind`` ``role`` tower may use when given."""
    modes = [POOLING_MODES.get(n) for n in POOLING_MODES]
    return [m for m in modes if kind is None or (kind in m.kinds and (role is None or role in m.roles))]


def pooling_mode(name: str, option: str = "pooling") -> PoolingMode:
    """The table's entry ``name``, or the :class:`PoolingMode` a dotted path names; a clear
    :class:`~scalingnote.errors.ConfigError` naming ``option`` otherwise."""
    try:
        mode = POOLING_MODES.get(name)
    except RegistryError as e:
        raise ConfigError(None, None, option, str(e)) from None
    if not isinstance(mode, PoolingMode):
        raise ConfigError(None, None, option, f"{name!r} is a {type(mode).__name__}, not a scalingnote PoolingMode")
    return mode


def check_pooling(name: str, kind: str, role: str, option: str = "pooling") -> PoolingMode:
    """The entry for ``name`` if a ``kind`` ``role`` tower may use it, else a clear ConfigError."""
    mode = pooling_mode(name, option)
    if not mode.allows(kind, role):
        known = ", ".join(m.name for m in pooling_modes(kind, role))
        raise ConfigError(
            None,
            None,
            option,
            f"pooling {name!r} is not for a {kind} {role} tower; use one of: {known} "
            "(or a dotted path 'package.module:attribute' naming a PoolingMode)",
        )
    return mode


def default_pooling(kind: str, role: str, declared: str | None = None) -> str:
    """The pooling a tower gets when none is asked: ``declared`` (a sentence-transformers
    directory's own pooling) when the table allows it, else the mode marked default."""
    if declared is not None and declared in POOLING_MODES and POOLING_MODES.get(declared).allows(kind, role):
        return declared
    return next(m.name for m in pooling_modes() if (kind, role) in m.default_for)


def from_st_mode(st_mode: str | None, kind: str | None = None) -> str | None:
    """The table's name for a sentence-transformers ``Pooling`` mode (for ``kind`` towers when
    given; the entry named like the mode first), or None."""
    names = [m.name for m in pooling_modes(kind) if st_mode and m.st_mode == st_mode]
    return st_mode if st_mode in names else next(iter(names), None)


# ====================================================================== projection


def orthogonal_projection(hidden: int, dim: int, seed: int) -> torch.Tensor:
    """``W`` (dim x hidden) with orthonormal rows times ``sqrt(hidden/dim)`` from a seeded generator (Eq. 3-4).

    Norm-preserving in expectation: for ``x`` uniform on a sphere, E||Wx||^2 = ||x||^2.
    """
    g = torch.Generator().manual_seed(int(seed))
    a = torch.randn(hidden, dim, generator=g, dtype=torch.float64)
    q, r = torch.linalg.qr(a)  # q: hidden x dim, orthonormal columns
    q = q * torch.sign(torch.diagonal(r)).unsqueeze(0)  # make the factorisation unique
    return (q.T * math.sqrt(hidden / dim)).to(torch.float32).contiguous()


__all__ = [
    "POOLING_MODES",
    "PoolingMode",
    "check_pooling",
    "default_pooling",
    "from_st_mode",
    "last_positions",
    "orthogonal_projection",
    "pooling_mode",
    "pooling_modes",
    "register_pooling",
    "text_spans",
]
