"""scalingnote: LLM-scaled dense retrieval.

From Python (imported on first use, so ``import scalingnote`` stays cheap)::

    import scalingnote
    result = scalingnote.quickstart(out="runs/quickstart")      # the quick start; its table and choices
    retriever = scalingnote.load("runs/quickstart")             # its served configuration
    hits = retriever.search(["how do I renew a passport?"], k=3)
    print(hits[0][0].id, hits[0][0].score, hits[0][0].title)

:func:`scalingnote.load`, :class:`~scalingnote.api.Retriever` and :class:`~scalingnote.api.Hit` are in
:mod:`scalingnote.api`; ``scalingnote.quickstart`` is the quick-start package, callable
(:func:`~scalingnote.quickstart.results.run_quickstart`).

Stage packages, lowest layer first (``tests/test_layering.py`` checks the order):
:mod:`scalingnote.data`, :mod:`scalingnote.evaluation`, :mod:`scalingnote.sparse` (BM25),
:mod:`scalingnote.models`, :mod:`scalingnote.augment` (LLM pseudo-queries),
:mod:`scalingnote.training`, :mod:`scalingnote.distill`, :mod:`scalingnote.index`,
:mod:`scalingnote.pq` (learned PQ, TMJ), :mod:`scalingnote.scaling`, :mod:`scalingnote.serve`.
"""

import importlib

__version__ = "0.1.0"

#: names of the Python API, imported on first use (PEP 562); ``quickstart`` is the callable package
LAZY: dict[str, str] = {
    "load": "scalingnote.api",
    "Retriever": "scalingnote.api",
    "Hit": "scalingnote.api",
    "QuickstartResult": "scalingnote.api",
}


def __getattr__(name: str):
    if name in LAZY:
        return getattr(importlib.import_module(LAZY[name]), name)
    if name == "quickstart":  # the package is callable: scalingnote.quickstart(...) runs the quick start
        return importlib.import_module("scalingnote.quickstart")
    raise AttributeError(f"module 'scalingnote' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *LAZY, "quickstart"])


__all__ = ["Hit", "QuickstartResult", "Retriever", "__version__", "load", "quickstart"]
