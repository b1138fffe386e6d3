"""scalingnote: LLM-scaled dense retrieval.

Stage packages, lowest layer first (``tests/test_layering.py`` checks the order):
:mod:`scalingnote.data`, :mod:`scalingnote.evaluation`, :mod:`scalingnote.sparse` (BM25),
:mod:`scalingnote.models`, :mod:`scalingnote.augment` (LLM pseudo-queries),
:mod:`scalingnote.training`, :mod:`scalingnote.distill`, :mod:`scalingnote.index`,
:mod:`scalingnote.pq` (learned PQ, TMJ), :mod:`scalingnote.scaling`, :mod:`scalingnote.serve`.
"""

__version__ = "0.1.0"
