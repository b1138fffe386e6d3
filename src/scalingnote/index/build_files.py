"""The files of a built index besides the vectors (see :mod:`scalingnote.index.build`): the searched
structure (a FAISS index, SVS's graph or ScaNN's tree), the document ids, the document store and the manifest."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from scalingnote.index.build_source import BuildSource
from scalingnote.index.docstore import _corpus_of_embeddings, write_document_store
from scalingnote.index.engine_files import is_engine, structure_bytes, write_structure
from scalingnote.index.faiss.faiss_utils import code_bytes_per_vector, find_ivf
from scalingnote.index.layout import DOC_IDS_FILE, DOCS_FILE, FORMAT, MANIFEST, VECTORS_FILE, _now, anchor_paths
from scalingnote.utils import machine_description, package_versions


def write_index_files(
    tmp_dir: Path,
    index: Any,
    factory: str,
    src: BuildSource,
    dim: int,
    documents: Any,
    sampling: dict[str, Any],
    timings: dict[str, float],
    t_start: float,
) -> None:
    """The searched structure (FAISS: a file; SVS, ScaNN: a directory), the document ids, the document store and the
    manifest into ``tmp_dir``."""
    name = write_structure(index, tmp_dir)
    (tmp_dir / DOC_IDS_FILE).write_text(json.dumps(src.ids, ensure_ascii=False), encoding="utf-8")
    files = {"index": name, "vectors": VECTORS_FILE, "doc_ids": DOC_IDS_FILE}
    docs_info = _write_docs(tmp_dir, src, documents, files)
    # tmp_dir is renamed to the index directory beside it: the same relative paths
    manifest = anchor_paths(
        tmp_dir, _manifest(index, factory, tmp_dir, src, dim, files, docs_info, sampling, timings, t_start)
    )
    with open(tmp_dir / MANIFEST, "w", encoding="utf-8") as fh:
        json.dump(manifest, fh, indent=2, ensure_ascii=False)
        fh.write("\n")


def _write_docs(tmp_dir: Path, src: BuildSource, documents: Any, files: dict[str, str]) -> dict[str, Any] | None:
    """The document store (titles + snippets) of ``documents`` (default: the corpus recorded by
    the embeddings directory); adds it to ``files``. None when there is no corpus."""
    if documents is None:
        documents = _corpus_of_embeddings(src.embeddings_dir)
    if documents is None:
        return None
    files["docs"] = DOCS_FILE
    return write_document_store(tmp_dir / DOCS_FILE, src.ids, documents)


def _partitioned_engine(index: Any) -> bool:
    """Another engine's structure searched by partitions (ScaNN's tree: its ``nlist`` is the leaves)."""
    return is_engine(index) and index.partitioned


def _manifest(
    index,
    factory: str,
    tmp_dir: Path,
    src: BuildSource,
    dim: int,
    files: dict[str, str],
    docs_info,
    sampling: dict[str, Any],
    timings: dict[str, float],
    t_start: float,
) -> dict[str, Any]:
    import faiss

    n = len(src.ids)
    ivf = find_ivf(index)
    index_bytes = structure_bytes(tmp_dir / files["index"])
    code_bytes = code_bytes_per_vector(index)
    return {
        "format": FORMAT,
        "factory": factory.strip(),
        "faiss_class": type(index if is_engine(index) else faiss.downcast_index(index)).__name__,
        "metric": "inner_product",
        "faiss_metric": "inner_product" if index.metric_type == faiss.METRIC_INNER_PRODUCT else "l2",
        "normalized": True,
        "dim": dim,
        "source_dim": src.dim,
        "matryoshka_prefix": dim < src.dim,
        "n_vectors": n,
        "nlist": int(ivf.nlist) if ivf is not None else (index.nlist if _partitioned_engine(index) else None),
        "tower": src.tower,
        "embeddings_dir": src.embeddings_dir,
        "files": files,
        "documents": docs_info,
        "code_bytes_per_vector": code_bytes,
        "index_bytes": index_bytes,
        "index_bytes_per_vector": round(index_bytes / n, 3),
        "float_bytes_per_vector": 4 * dim,
        "compression": round(4 * dim / code_bytes, 3) if code_bytes else None,
        **sampling,
        **{k: round(v, 3) for k, v in timings.items()},
        "build_seconds": round(time.perf_counter() - t_start, 3),
        "faiss_version": faiss.__version__,
        "versions": package_versions(),
        "machine": machine_description(),
        "created": _now(),
    }
