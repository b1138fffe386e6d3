"""How fast this machine runs each family, measured before the first plan (the budget's cost model,
:mod:`scalingnote.quickstart.budget`, counts work at per-unit costs measured on one 2-core machine).

The budget used to learn the machine's speed only from the proxy, after it had run: on a CPU that
runs SmolLM2 1.45x slower than the model (an AMD EPYC where the constants came from an Intel Xeon;
MiniLM only ~1.1x slower there), KUAKE-QTR's 15-minute budget planned 14.4 minutes, its proxy
(30% of the budget at the modelled speed) took 6.6 minutes, and nothing that was left could be
cut: the run took 21.0 minutes. Here the document tower the readability check loads anyway (its
first :data:`CAL_LAYERS` layers) encodes a seeded sample of the corpus as the Stage I feature pass
does (length-sorted batches, tokenisation included), once whole and once cut to one layer: the
difference is what a layer costs per token on this machine (tokenising, embeddings and pooling
cancel out). Over the family's reference (:data:`CAL_REF_US`: the same reading on a machine whose
runs were timed against the model) it prices that family's work in the first plan
(:attr:`~scalingnote.quickstart.budget.Sizes.speed_by`), so the proxy is drawn, and the budget cut,
for the machine the run is on. The proxy's measured speed still corrects the plan after it.
"""

from __future__ import annotations

import math
import random
import time
from typing import Any, Sequence

import torch

from scalingnote.data import Document
from scalingnote.models import truncate_layers
from scalingnote.quickstart.config import QuickstartConfig

CAL_DOCS = 64  #: documents timed per family (~0.3 s of SmolLM2 on KUAKE-QTR's titles, ~1 s of MiniLM on SciFact's abstracts)
CAL_BATCH = 16
CAL_REPEATS = 2  #: the fastest of these passes counts (a moment of load elsewhere does not)
CAL_LAYERS = 3  #: the readability check loads this many layers (at most the model's) for the calibration
MIN_MEASURED_S = 0.05  #: layers quicker than this (a tiny test model) are too short to time: speed 1
#: a layer's seconds per token (us) at the speed the cost model is priced at, per family: measured by
#: :func:`calibrate` on the machine whose budgeted runs ran at a measured multiple of the model
#: (see the module docstring), divided by that multiple
#: (2026-11-28, the AMD EPYC: SmolLM2 44-53 us on SciFact's abstracts, KUAKE-QTR's titles and the
#: embedded default, where KUAKE-QTR's budgeted phases ran 1.45-1.6x their model; MiniLM 25-26 us, where
#: the embedded default's --full phases ran 1.09-1.12x theirs)
CAL_REF_US = {"llm": 34.0, "bert": 23.0}
SPEED_RANGE = (1.0, 3.0)  #: never below 1 (as the proxy's speed: a short plan breaks the budget), at most 3


def _pass(tower: Any, batches: Sequence[Sequence[Document]], max_length: int) -> tuple[float, int]:
    """Seconds of one pass (tokenise + forward + pool, as the feature pass) and its real tokens."""
    tokens, t0 = 0, time.perf_counter()
    with torch.inference_mode():
        for b in batches:
            enc = tower.tokenize_documents(list(b), max_length=max_length)
            tower.pooled(enc)
            tokens += int(enc["attention_mask"].sum())
    return time.perf_counter() - t0, tokens


def calibrate(cfg: QuickstartConfig, name: str, tower: Any, docs: Sequence[Document]) -> dict[str, Any]:
    """Time ``tower`` (a family's document tower of :data:`CAL_LAYERS` layers; truncated to one
    here, in place) over a seeded sample of ``docs``: a layer's seconds per token are the difference
    of the two passes (tokenising, embeddings and pooling cancel out). ``speed``: that over the
    family's :data:`CAL_REF_US`, in :data:`SPEED_RANGE` (1.0 when the pass is too short to time)."""
    sample = random.Random(cfg.seed).sample(list(docs), min(CAL_DOCS, len(docs)))
    sample.sort(key=lambda d: -len(d.text))
    batches = [sample[i : i + CAL_BATCH] for i in range(0, len(sample), CAL_BATCH)]
    deep = int(getattr(getattr(tower, "config", None), "num_layers", 1) or 1)
    if not batches or deep < 2 or name not in CAL_REF_US:
        return {"speed": 1.0, "note": "nothing to time (no documents, a one-layer tower or an unknown family): priced at the model"}
    _pass(tower, [batches[-1][:4]], cfg.doc_max_length)  # warm-up: allocations, kernels chosen
    t_deep, tokens = _fastest(tower, batches, cfg.doc_max_length)
    truncate_layers(tower.backbone, 1)
    t_one, _ = _fastest(tower, batches, cfg.doc_max_length)
    per = max(0.0, t_deep - t_one) / max(1, tokens * (deep - 1))
    ratio = per / CAL_REF_US[name] * 1e6
    rec = {"docs": len(sample), "tokens": tokens, "layers": deep, "seconds": round(t_deep, 3), "seconds_one_layer": round(t_one, 3),
           "layer_token_us": round(per * 1e6, 2), "reference_us": CAL_REF_US[name], "ratio": round(ratio, 3)}
    if t_deep - t_one < MIN_MEASURED_S:
        return {**rec, "speed": 1.0, "note": f"{(t_deep - t_one) * 1e3:.0f} ms of layers is too short to time: priced at the model"}
    speed = min(SPEED_RANGE[1], max(SPEED_RANGE[0], ratio))
    return {**rec, "speed": round(speed, 3),
            "note": f"a layer costs {per * 1e6:.1f} us per token here, {CAL_REF_US[name]} on the machine the cost model is priced at"}


def _fastest(tower: Any, batches: Sequence[Sequence[Document]], max_length: int) -> tuple[float, int]:
    best, tokens = math.inf, 0
    for _ in range(CAL_REPEATS):
        s, tokens = _pass(tower, batches, max_length)
        best = min(best, s)
    return best, tokens


__all__ = ["CAL_LAYERS", "CAL_REF_US", "calibrate"]
