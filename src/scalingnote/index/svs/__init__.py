"""The SVS engine (package ``scalable-vs``, Intel's Scalable Vector Search): a dynamic Vamana graph
over float32 vectors, FAISS-shaped so the index directory serves it (:mod:`~scalingnote.index.svs.vamana`).
SVS is imported on first use."""
