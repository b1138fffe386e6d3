"""How fast this machine runs each family, measured before the first plan (the budget's cost model,
:mod:`scalingnote.quickstart.budget`, counts work at per-unit costs measured on one 2-core machine).

The budget used to learn the machine's speed only from the proxy, after it had run: on a CPU that
runs SmolLM2 1.45x slower than the model (an AMD EPYC where the constants came from an Intel Xeon;
MiniLM only ~1.1x slower there), KUAKE-QTR's 15-minute budget planned 14.4 minutes, its proxy
(30% of the budget at the modelled speed) took 6.6 minutes, and nothing that was left could be
cut: the run took 21.0 minutes. Here the document tower the readability check loads anyway (its
first :data:`CAL_LAYERS` layers) encodes a seeded sample of the corpus as the Stage I feature pass
does (length-sorted batches), and forward hooks around its transformer layers time what a layer
costs per token on this machine (tokenising, embeddings and pooling left out: they vary with the
data, not the machine; two whole passes differenced, as first written, read MiniLM 25-31 us on the
same data from one run to the next). Over the family's reference (:data:`CAL_REF_US`: the same
reading on a machine whose runs were timed against the model) it prices that family's work in the first plan
(:attr:`~scalingnote.quickstart.budget.Sizes.speed_by`), so the proxy is drawn, and the budget cut,
for the machine the run is on. The proxy's measured speed still corrects the plan after it.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from typing import Any

import torch

from scalingnote.data import Document
from scalingnote.errors import ScalingNoteError
from scalingnote.models.prefix import layer_list
from scalingnote.quickstart.config import QuickstartConfig

CAL_DOCS = (
    64  #: documents timed per family (~0.3 s of SmolLM2 on KUAKE-QTR's titles, ~1 s of MiniLM on SciFact's abstracts)
)
CAL_BATCH = 16
CAL_POOL = 2000  #: the sample is drawn from the corpus's first documents (as the cost model's token counts)
CAL_REPEATS = 3  #: the fastest of these passes counts (a moment of load elsewhere does not)
CAL_LAYERS = 3  #: the readability check loads this many layers (at most the model's) for the calibration
MIN_MEASURED_S = 0.05  #: layers quicker than this (a tiny test model) are too short to time: speed 1
#: a layer's seconds per token (us) at the speed the cost model is priced at, per family: this
#: calibration's reading on a machine whose runs were timed against the model, divided by the multiple
#: they ran at (2026-11-28, the AMD EPYC, median of 3: SmolLM2 54.5 us on KUAKE-QTR's titles, 53.6 on
#: SciFact's abstracts, 50.1 on the embedded default, where KUAKE-QTR's budgeted phases ran 1.5-1.6x
#: their model; MiniLM 26.7 on SciFact, 29.4 on the default, where the default's --full phases ran
#: 1.09-1.17x theirs — and SciFact's QKD ~1.8x: a forward pass does not predict every phase alike)
CAL_REF_US = {"llm": 34.0, "bert": 23.0}
SPEED_RANGE = (1.0, 3.0)  #: never below 1 (as the proxy's speed: a short plan breaks the budget), at most 3


def _layer_seconds(tower: Any, batches: Sequence[Sequence[Document]], max_length: int) -> tuple[float, int]:
    """One pass as the feature pass runs it (tokenise, forward, pool); returns the seconds spent
    inside the transformer layers (forward hooks around each) and the pass's real tokens."""
    blocks = list(layer_list(tower.backbone))
    spent, started = [0.0], [0.0]

    def before(*_: Any) -> None:
        started[0] = time.perf_counter()

    def after(*_: Any) -> None:
        spent[0] += time.perf_counter() - started[0]

    hooks = [b.register_forward_pre_hook(before) for b in blocks] + [b.register_forward_hook(after) for b in blocks]
    tokens = 0
    try:
        with torch.inference_mode():
            for b in batches:
                enc = tower.tokenize_documents(list(b), max_length=max_length)
                tower.pooled(enc)
                tokens += int(enc["attention_mask"].sum())
    finally:
        for h in hooks:
            h.remove()
    return spent[0], tokens


def calibrate(cfg: QuickstartConfig, name: str, tower: Any, docs: Sequence[Document]) -> dict[str, Any]:
    """Time ``tower``'s transformer layers (a family's document tower) over a seeded sample of
    ``docs``, the fastest of :data:`CAL_REPEATS` passes; ``speed``: its seconds per token and layer
    over the family's :data:`CAL_REF_US`, in :data:`SPEED_RANGE` (1.0 when too short to time)."""
    sample = random.Random(cfg.seed).sample(list(docs), min(CAL_DOCS, len(docs)))
    sample.sort(key=lambda d: -len(d.text))
    batches = [sample[i : i + CAL_BATCH] for i in range(0, len(sample), CAL_BATCH)]
    if not batches or name not in CAL_REF_US:
        return {"speed": 1.0, "note": "nothing to time (no documents or an unknown family): priced at the model"}
    try:
        layers = len(layer_list(tower.backbone))
    except (AttributeError, ScalingNoteError) as e:  # a backbone whose blocks are not found: the model's price
        return {"speed": 1.0, "note": f"cannot time its layers ({e}): priced at the model"}
    _layer_seconds(tower, [batches[-1][:4]], cfg.doc_max_length)  # warm-up: allocations, kernels chosen
    seconds, tokens = math.inf, 0
    for _ in range(CAL_REPEATS):
        s, tokens = _layer_seconds(tower, batches, cfg.doc_max_length)
        seconds = min(seconds, s)
    per = seconds / max(1, tokens * layers)
    ratio = per * 1e6 / CAL_REF_US[name]
    rec = {
        "docs": len(sample),
        "tokens": tokens,
        "layers": layers,
        "layer_seconds": round(seconds, 3),
        "layer_token_us": round(per * 1e6, 2),
        "reference_us": CAL_REF_US[name],
        "ratio": round(ratio, 3),
    }
    if seconds < MIN_MEASURED_S:
        return {
            **rec,
            "speed": 1.0,
            "note": f"{seconds * 1e3:.0f} ms of layers is too short to time: priced at the model",
        }
    speed = min(SPEED_RANGE[1], max(SPEED_RANGE[0], ratio))
    return {
        **rec,
        "speed": round(speed, 3),
        "note": f"a layer costs {per * 1e6:.1f} us per token here, {CAL_REF_US[name]} on the machine the "
        "cost model is priced at",
    }


__all__ = ["CAL_LAYERS", "CAL_POOL", "CAL_REF_US", "calibrate"]
