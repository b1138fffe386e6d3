"""The ScaNN engine (package ``scann-core``: ScaNN without TensorFlow): a partition tree with SOAR
spilled assignments searched over anisotropic-quantised codes (:mod:`~scalingnote.index.scann.soar`).
ScaNN is imported on first use."""
