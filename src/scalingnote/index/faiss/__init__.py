"""The FAISS engine: :class:`~scalingnote.index.faiss.dense.DenseIndex` over an index directory,
the index methods built and served through it (:mod:`~scalingnote.index.faiss.methods`: IVF-PQ,
HNSW over flat / PQ / SQ storage, IVF RaBitQ FastScan with refine), FAISS helpers and the adapters
that write a learned PQ into FAISS structures. FAISS itself is imported on first use."""
