"""The vector back ends, in one table: a name -> how to open its searcher, where it lives, how an
index is exported into it and how the service opens it for writing.

``scalingnote search --backend``, ``scalingnote index export --to``, ``scalingnote serve
--backend`` and :class:`scalingnote.serve.ServeSettings` (``backend``) all ask this table; what
an opened searcher can do (``nprobe`` / ``ef_search`` / ``rerank``, upsert / delete, a local
index directory for BM25 and fusion) is said by the capability flags of the searcher classes
(:class:`~scalingnote.index.searcher.SearcherBase`), which the service reads.

Built in: ``faiss`` (:class:`~scalingnote.index.DenseIndex` over an index directory) and
``milvus`` (:class:`~scalingnote.index.milvus.milvus.MilvusSearcher` on a collection). A back end
from user code is one call (nothing else to edit)::

    from scalingnote.index.backends import register_backend
    register_backend("numpy", NumpySearcher.open)   # open(location, query_tower=None, **options)

Wherever an option names a back end, a dotted path ``"package.module:attribute"`` naming a
:class:`Backend` (or an opener) is accepted too, imported on first use.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from scalingnote.errors import ScalingNoteError
from scalingnote.index.faiss.dense import DenseIndex
from scalingnote.index.layout import read_manifest
from scalingnote.index.milvus.milvus import MilvusSearcher  # pymilvus itself is imported on first connect
from scalingnote.index.milvus.milvus_export import export_to_milvus
from scalingnote.utils.registry import Registry, import_dotted

DEFAULT_COLLECTION = "scalingnote"


@dataclass(frozen=True)
class Backend:
    """One entry of the table.

    ``open(location, query_tower=None, **options)`` -> a searcher (the
    :class:`~scalingnote.index.searcher.Searcher` interface, with ``manifest``; its class says
    its capabilities). ``location``: what locates it, ``"index"`` (a directory: ``--index``) or
    ``"uri"`` (a service: ``--uri``, and the opener also takes ``collection=`` and ``token=``).
    ``manifest(location)``: reads the back end's manifest without loading anything (the service
    and ``scalingnote serve`` call it first, to fail fast on a wrong location), or None; one
    located by URI is also given ``collection=`` and ``token=`` when its signature declares them.
    ``export(source, location, **options)`` -> manifest: ``scalingnote index export --to NAME``
    (``source``: an index or embeddings directory), or None; it is given only the options its
    signature declares (all of them when it takes ``**options``), and options left unset are
    never passed. ``live``: the opener of its
    writable form the service uses when ``ServeSettings.live`` is on, called as
    ``live(location, query_tower, document_tower=..., corpus=..., writer=...)``, plus
    ``collection=``, ``token=`` and ``live_dir=`` (the local directory of its write-ahead log and
    BM25 side, ``serve --index``) for a back end located by URI (a dotted path when it sits above
    :mod:`scalingnote.index`: FAISS's is :class:`scalingnote.live.LiveIndex`, Milvus's
    :class:`scalingnote.live.milvus.MilvusLive`), or None. ``help``: one line for error messages.
    """

    name: str
    open: Callable[..., Any]
    location: Literal["index", "uri"] = "index"
    manifest: Callable[[Any], dict[str, Any]] | None = None
    export: Callable[..., dict[str, Any]] | None = None
    live: Callable[..., Any] | str | None = None
    help: str = ""


def _open_faiss(location: str | Path, query_tower: Any = None) -> DenseIndex:
    return DenseIndex.open(location, query_tower=query_tower)


def _open_milvus(
    location: str, query_tower: Any = None, *, collection: str = DEFAULT_COLLECTION, token: str | None = None
):
    return MilvusSearcher.open(location, collection or DEFAULT_COLLECTION, query_tower=query_tower, token=token)


def _export_milvus(
    source: str | Path,
    location: str,
    *,
    collection: str = DEFAULT_COLLECTION,
    index_type: str = "auto",
    dim: int | None = None,
    semantic_ids_layers: int | None = None,
    codebook_size: int | None = None,
    seed: int | None = None,
    token: str | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Milvus's export: the options it understands (``index export`` passes only these)."""
    sizes: dict[str, Any] = {
        "dim": dim,
        "semantic_ids_layers": semantic_ids_layers,
        "codebook_size": codebook_size,
        "seed": seed,
    }
    return export_to_milvus(
        source,
        location,
        collection,
        index_type=index_type,
        token=token,
        overwrite=overwrite,
        **{k: v for k, v in sizes.items() if v is not None},
    )


BACKENDS: Registry[Backend] = Registry(
    "back end",
    {
        "faiss": Backend(
            "faiss",
            _open_faiss,
            "index",
            manifest=read_manifest,
            live="scalingnote.live:LiveIndex.open",
            help="a FAISS index directory (`scalingnote index build`)",
        ),
        "milvus": Backend(
            "milvus",
            _open_milvus,
            "uri",
            export=_export_milvus,
            live="scalingnote.live.milvus:MilvusLive.open",
            help=(
                "a Milvus collection (`scalingnote index export --to milvus`): --uri ./file.db (Milvus Lite) or "
                "http://host:19530, --collection NAME; live: write-ahead log and BM25 beside --index DIR (default: "
                "the exported index)"
            ),
        ),
    },
)


def register_backend(
    name: str,
    open: Callable[..., Any],
    *,
    location: Literal["index", "uri"] = "index",
    manifest: Callable[[Any], dict[str, Any]] | None = None,
    export: Callable[..., dict[str, Any]] | None = None,
    live: Callable[..., Any] | str | None = None,
    help: str = "",
    replace: bool = False,
) -> Backend:
    """Add the back end ``name`` (see :class:`Backend` for the fields); a name that exists is
    refused unless ``replace=True``. Returns the entry."""
    if not callable(open):
        raise ScalingNoteError(f"back end {name!r}: open must be callable, got {type(open).__name__}")
    if location not in ("index", "uri"):
        raise ScalingNoteError(f"back end {name!r}: location must be 'index' or 'uri', got {location!r}")
    return BACKENDS.register(name, Backend(name, open, location, manifest, export, live, help), replace=replace)


def backend_names() -> list[str]:
    """The registered back ends (sorted)."""
    return BACKENDS.names()


def load_attribute(spec: str, option: str) -> Any:
    """The object a dotted path ``"package.module:attr"`` names; a clear error naming ``option``."""
    return import_dotted(spec, option, "back end")


def get_backend(spec: str | Backend, option: str = "backend") -> Backend:
    """The entry ``spec`` names: a registered name, a dotted path to a :class:`Backend` or to an
    opener (a back end located by ``--index``), or an entry itself. An unknown name is an error
    naming ``option`` and listing the known back ends."""
    if isinstance(spec, Backend):
        return spec
    if not isinstance(spec, str):
        raise ScalingNoteError(f"{option}: expected a back-end name, got {type(spec).__name__}")
    if spec.lower() in BACKENDS and spec not in BACKENDS:  # --backend FAISS
        spec = spec.lower()
    obj = BACKENDS.get(spec, option)
    if isinstance(obj, Backend):
        return obj
    if callable(obj):
        return Backend(spec, obj)
    raise ScalingNoteError(f"{option} {spec!r}: names a {type(obj).__name__}, not a Backend or an opener")


def resolve_opener(fn: Callable[..., Any] | str, option: str) -> Callable[..., Any]:
    """``fn``, or the callable a dotted path names (an entry's ``live`` opener)."""
    return load_attribute(fn, option) if isinstance(fn, str) else fn


def backend_location(entry: Backend, index_dir: str | Path | None, uri: str | None, where: str) -> str | Path:
    """Where ``entry`` lives: ``index_dir`` or ``uri`` as its ``location`` says; an error naming
    the missing option otherwise."""
    if entry.location == "uri":
        if not uri:
            raise ScalingNoteError(
                f"{where}: --uri URI is required with --backend {entry.name} "
                f"({entry.help or 'the back end service URI'})"
            )
        return uri
    if index_dir is None:
        raise ScalingNoteError(
            f"{where}: --index DIR is required with --backend {entry.name} ({entry.help or 'its index directory'})"
        )
    return index_dir


def declared_options(fn: Callable[..., Any], options: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``options`` that ``fn`` declares as keyword parameters (all of them when it
    takes ``**options``), without those left unset (None): what a back end's ``export`` or
    ``manifest`` is called with, so a back end declares what it understands and nothing else
    reaches it."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: pass everything set
        return {k: v for k, v in options.items() if v is not None}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return {k: v for k, v in options.items() if v is not None}
    names = {
        p.name for p in params if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    }
    return {k: v for k, v in options.items() if k in names and v is not None}


def read_backend_manifest(
    entry: Backend, location: str | Path, *, collection: str | None = None, token: str | None = None
) -> dict[str, Any] | None:
    """``entry``'s manifest at ``location`` (None when it has no manifest reader), read before
    anything is loaded; a back end located by URI is given ``collection`` and ``token`` when its
    reader declares them (``serve --collection other`` checks that collection, not the default)."""
    if entry.manifest is None:
        return None
    if entry.location != "uri":
        return entry.manifest(location)
    return entry.manifest(location, **declared_options(entry.manifest, {"collection": collection, "token": token}))


def export_to_backend(entry: Backend, source: str | Path, location: str, **options: Any) -> dict[str, Any]:
    """Export ``source`` (an index or embeddings directory) into ``entry`` at ``location``, passing
    only the ``options`` its exporter declares (unset ones never); an error when it has none."""
    if entry.export is None:
        raise ScalingNoteError(f"back end {entry.name} has no export")
    return entry.export(source, location, **declared_options(entry.export, options))


def open_searcher(
    backend: str | Backend,
    *,
    index_dir: str | Path | None = None,
    uri: str | Path | None = None,
    collection: str = DEFAULT_COLLECTION,
    query_tower: Any = None,
    token: str | None = None,
) -> Any:
    """A searcher of the back end ``backend`` (a name, a dotted path or an entry): over
    ``index_dir`` (``faiss``: :class:`DenseIndex`) or on ``uri`` / ``collection`` (``milvus``:
    :class:`~scalingnote.index.milvus.milvus.MilvusSearcher`). Every built-in back end refuses a query
    tower incompatible with the document tower."""
    entry = get_backend(backend, "backend")
    location = backend_location(entry, index_dir, None if uri is None else str(uri), f"backend {entry.name}")
    if entry.location == "uri":
        return entry.open(location, query_tower=query_tower, collection=collection, token=token)
    return entry.open(location, query_tower=query_tower)


__all__ = [
    "BACKENDS",
    "Backend",
    "backend_location",
    "backend_names",
    "declared_options",
    "export_to_backend",
    "get_backend",
    "load_attribute",
    "open_searcher",
    "read_backend_manifest",
    "register_backend",
    "resolve_opener",
]
