"""The Milvus engine: the searcher on a collection (:mod:`~scalingnote.index.milvus.milvus`), the
export of an index or embeddings directory into a collection and an embedded standalone server.
pymilvus is imported on first connect."""
