"""What a service answers with, loaded once: the query encoder, the index (its live, writable form
where the back end has one), the titles and snippets, and the searcher of the served default
(``fusion.json``'s mode and fusion, the BM25 side). :class:`~scalingnote.serve.service.SearchService`
loads through :func:`load_served`, and so does the Python API (:func:`scalingnote.load`): both
answer a query with the same configuration."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalingnote.index.backends import get_backend, read_backend_manifest
from scalingnote.index.pipeline import load_tower_for
from scalingnote.serve.corpus import load_documents, resolve_corpus_path, served_searcher
from scalingnote.serve.documents import open_serving_index
from scalingnote.serve.settings import ServeSettings


def query_encoder(tower: Any, settings: ServeSettings) -> Any:
    """The query encoder ``settings.query_backend`` names over ``tower`` (the torch tower itself,
    or ONNX Runtime): :func:`scalingnote.serve.query_backend.wrap_query_tower`."""
    # why: loads torch and the ONNX export stack, after serve() sets OMP_WAIT_POLICY
    from scalingnote.serve.query_backend import wrap_query_tower

    return wrap_query_tower(tower, settings)


@dataclass
class Served:
    """A loaded service configuration. ``searcher``: the hybrid searcher over an index with a local
    directory (modes bm25 / hybrid), else None (dense only); ``default_mode``: a search without a mode."""

    index: Any
    tower: Any
    searcher: Any | None = None
    default_mode: str = "dense"
    titles: dict[str, str] = field(default_factory=dict)
    snippets: dict[str, str] = field(default_factory=dict)
    corpus_path: Path | None = None

    @property
    def modes(self) -> tuple[str, ...]:
        """Search modes answered: dense always; bm25 and hybrid with a BM25 index."""
        return self.searcher.modes if self.searcher is not None else ("dense",)


def load_served(location: str | Path, query_tower: str | Path, settings: ServeSettings) -> Served:
    """Load what ``scalingnote serve`` answers with at ``location`` (an index directory, or the URI
    of a back end located by URI) with ``query_tower``: the back end of ``settings.backend``, the
    index opened as the service opens it (:func:`~scalingnote.serve.documents.open_serving_index`:
    an incompatible tower is refused), the titles from its document store or corpus, the served
    default (:func:`~scalingnote.serve.corpus.served_searcher`) and the query encoder of
    ``settings.query_backend``."""
    backend = get_backend(settings.backend, "backend")
    # fail fast on a wrong location, before loading a model; its corpus gives the titles
    manifest = read_backend_manifest(backend, location, collection=settings.collection, token=settings.backend_token)
    corpus_path = resolve_corpus_path(manifest, settings.corpus) if manifest is not None else None
    tower = load_tower_for(str(query_tower), "query")
    index = open_serving_index(backend, location, tower, settings)  # refuses an incompatible tower
    if manifest is None:
        corpus_path = resolve_corpus_path(index.manifest, settings.corpus)
    docs = load_documents(corpus_path, index.doc_ids, index)
    served = Served(
        index=index,
        tower=None,
        titles={d: t for d, (t, _) in docs.items()},
        snippets={d: sn for d, (_, sn) in docs.items()},
        corpus_path=corpus_path,
    )
    if getattr(index, "local_dir", None) is not None:  # an index directory: the BM25 index and fusion.json beside it
        served.searcher, served.default_mode = served_searcher(index, corpus_path)  # the quick start's choice
    served.tower = query_encoder(tower, settings)  # ONNX Runtime when query_backend is onnx
    return served
