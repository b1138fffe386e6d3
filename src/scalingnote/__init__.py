"""scalingnote: LLM-scaled dense retrieval.

Stage packages: :mod:`scalingnote.data`, :mod:`scalingnote.models`,
:mod:`scalingnote.training`, :mod:`scalingnote.distill`, :mod:`scalingnote.index`,
:mod:`scalingnote.serve`, :mod:`scalingnote.evaluation`, :mod:`scalingnote.scaling`.
"""

__version__ = "0.1.0"
