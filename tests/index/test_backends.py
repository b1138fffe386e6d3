"""The back-end table (scalingnote.index.backends): names, registration, dotted paths, locations,
and the capability flags of the built-in searchers."""

from __future__ import annotations

import re

import numpy as np
import pytest

from scalingnote.errors import ConfigError, ScalingNoteError
from scalingnote.index import backends
from scalingnote.index.backends import (
    Backend,
    backend_location,
    backend_names,
    get_backend,
    open_searcher,
    register_backend,
)


@pytest.fixture
def table():
    """Registrations made by a test do not leak into others."""
    with backends.BACKENDS.scoped() as t:
        yield t


def _opener(location, query_tower=None):
    return ("opened", location, query_tower)


#: a Backend entry importable as "tests.index.test_backends:ENTRY" (the dotted-path form)
ENTRY = Backend("dotted", _opener, help="a test back end")


def test_built_in_back_ends_and_their_locations():
    assert backend_names()[:2] == ["faiss", "milvus"]
    assert get_backend("faiss").location == "index" and get_backend("milvus").location == "uri"
    assert get_backend("FAISS") is get_backend("faiss")
    assert get_backend("milvus").export is not None and get_backend("faiss").export is None
    assert get_backend("faiss").manifest is not None  # fail fast on a wrong directory


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ScalingNoteError) as e:
        get_backend("qdrant", "--backend")
    msg = str(e.value)
    assert "--backend: unknown back end 'qdrant'" in msg and re.search(r"known: (.*, )?faiss, (.*, )?milvus", msg), msg
    with pytest.raises(ConfigError, match="field 'backend'.*known: (.*, )?faiss, (.*, )?milvus"):
        from scalingnote.serve import ServeSettings

        ServeSettings(backend="qdrant")


def test_register_refuses_a_duplicate_unless_replace(table):
    entry = register_backend("test_backends_np", _opener, help="exact numpy")
    assert get_backend("test_backends_np") is entry and "test_backends_np" in backend_names()
    with pytest.raises(ScalingNoteError, match="'test_backends_np' is already registered.*replace=True"):
        register_backend("test_backends_np", _opener)
    with pytest.raises(ScalingNoteError, match="'faiss' is already registered"):
        register_backend("faiss", _opener)
    again = register_backend("test_backends_np", _opener, location="uri", replace=True)
    assert get_backend("test_backends_np") is again and again.location == "uri"
    with pytest.raises(ScalingNoteError, match="location must be"):
        register_backend("bad", _opener, location="disk")  # type: ignore[arg-type]
    with pytest.raises(ScalingNoteError, match="open must be callable"):
        register_backend("bad", "not callable")  # type: ignore[arg-type]
    with pytest.raises(ScalingNoteError, match="without ':'"):
        register_backend("a:b", _opener)


def test_registered_back_end_opens_through_open_searcher(table, tmp_path):
    register_backend("test_backends_np", _opener)
    assert open_searcher("test_backends_np", index_dir=tmp_path, query_tower="T") == ("opened", tmp_path, "T")
    with pytest.raises(ScalingNoteError, match=r"--index DIR is required with --backend test_backends_np"):
        open_searcher("test_backends_np")
    register_backend(
        "test_backends_remote",
        lambda loc, query_tower=None, *, collection, token: (loc, collection, token),
        location="uri",
    )
    assert open_searcher("test_backends_remote", uri="http://127.0.0.1:1", collection="c", token="t") == (
        "http://127.0.0.1:1",
        "c",
        "t",
    )
    with pytest.raises(ScalingNoteError, match=r"--uri URI is required with --backend test_backends_remote"):
        open_searcher("test_backends_remote", index_dir=tmp_path)


def test_dotted_paths_name_an_entry_or_an_opener(tmp_path):
    # (pytest may hold this file under another module name: compare by value, not identity)
    entry = get_backend("tests.index.test_backends:ENTRY")
    assert (
        isinstance(entry, Backend)
        and entry.name == "dotted"
        and open_searcher(entry, index_dir=tmp_path)[0] == "opened"
    )
    wrapped = get_backend("tests.index.test_backends:_opener")
    assert (
        wrapped.name == "tests.index.test_backends:_opener"
        and wrapped.location == "index"
        and wrapped.open.__name__ == "_opener"
    )
    with pytest.raises(
        ScalingNoteError, match="--backend: cannot import back end 'no_such_module:X': ModuleNotFoundError"
    ):
        get_backend("no_such_module:X", "--backend")
    with pytest.raises(ScalingNoteError, match="has no attribute 'NOPE'"):
        get_backend("tests.index.test_backends:NOPE", "--backend")
    with pytest.raises(ScalingNoteError, match="not a Backend or an opener"):
        get_backend("tests.index.test_backends:__doc__", "--backend")
    with pytest.raises(ScalingNoteError, match="must look like 'package.module:attribute'"):
        get_backend(":ENTRY", "--backend")


def test_backend_location_names_the_missing_option():
    assert backend_location(get_backend("faiss"), "idx", None, "serve") == "idx"
    assert backend_location(get_backend("milvus"), None, "x.db", "serve") == "x.db"
    with pytest.raises(ScalingNoteError, match="serve: --index DIR is required with --backend faiss"):
        backend_location(get_backend("faiss"), None, "x.db", "serve")
    with pytest.raises(ScalingNoteError, match="search: --uri URI is required with --backend milvus"):
        backend_location(get_backend("milvus"), "idx", None, "search")


@pytest.mark.parametrize(
    ("factory", "ivf", "hnsw"),
    [("Flat", False, False), ("IVF4,Flat", True, False), ("HNSW8", False, True), ("IVF4_HNSW8,Flat", True, True)],
)
def test_faiss_capability_flags_follow_the_index(tmp_path, factory, ivf, hnsw):
    from scalingnote.index import build_index

    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 16)).astype(np.float32)
    idx = build_index(
        x, tmp_path / "idx", factory, doc_ids=[f"d{i}" for i in range(200)], semantic_ids_layers=0, progress=False
    )
    s = open_searcher("faiss", index_dir=idx)
    assert (s.has_ivf, s.has_hnsw) == (ivf, hnsw)
    assert s.supports_rerank and not s.supports_upsert and not s.supports_delete and s.local_dir == idx
