"""The back-end contract a new engine lives in: a back end is given only the options it declares
(unset ones never), its manifest reader gets the collection, and ``index export`` / ``search`` /
``serve`` speak of any back end (``--token``; ``--milvus-token`` a hidden, deprecated alias)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from scalingnote.cli import app as cli
from scalingnote.errors import ScalingNoteError
from scalingnote.index import backends
from scalingnote.index.backends import (
    declared_options,
    export_to_backend,
    get_backend,
    read_backend_manifest,
    register_backend,
)


@pytest.fixture
def table():
    with backends.BACKENDS.scoped() as t:
        yield t


def test_declared_options_passes_what_a_function_declares_and_nothing_unset():
    def narrow(source, location, *, collection):
        return collection

    def wide(source, location, **options):
        return options

    opts = {"collection": "c", "index_type": "HNSW", "token": None, "dim": 64}
    assert declared_options(narrow, opts) == {"collection": "c"}
    assert declared_options(wide, opts) == {
        "collection": "c",
        "index_type": "HNSW",
        "dim": 64,
    }  # unset token never passed
    # Milvus's export declares its own options: an unknown one is not forwarded to it
    assert set(declared_options(get_backend("milvus").export, {**opts, "shards": 3})) == {
        "collection",
        "index_type",
        "dim",
    }


def test_manifest_of_a_uri_back_end_gets_the_collection(table):
    register_backend(
        "t_uri",
        lambda loc, query_tower=None, **kw: None,
        location="uri",
        manifest=lambda loc, *, collection, token=None: {"where": loc, "collection": collection, "token": token},
    )
    register_backend(
        "t_uri_plain", lambda loc, query_tower=None, **kw: None, location="uri", manifest=lambda loc: {"where": loc}
    )
    assert read_backend_manifest(get_backend("t_uri"), "mem://x", collection="other", token="k") == {
        "where": "mem://x",
        "collection": "other",
        "token": "k",
    }
    assert read_backend_manifest(get_backend("t_uri_plain"), "mem://x", collection="other") == {
        "where": "mem://x"
    }  # declares none: gets none
    assert (
        read_backend_manifest(get_backend("milvus"), "mem://x", collection="other") is None
    )  # no reader: nothing to check


def test_export_passes_only_declared_options_and_prints_a_neutral_status(table, tmp_path):
    calls: list[tuple] = []

    def export(source, location, *, collection, overwrite=False):
        calls.append((str(source), location, collection, overwrite))
        return {"n_vectors": 7, "dim": 4, "factory": "exact"}

    register_backend("t_store", lambda loc, query_tower=None, **kw: None, location="uri", export=export)
    r = CliRunner().invoke(
        cli,
        [
            "index",
            "export",
            "--to",
            "t_store",
            "--uri",
            "mem://x",
            "--index",
            str(tmp_path),
            "--collection",
            "other",
            "--token",
            "k",
            "--dim",
            "8",
            "--overwrite",
        ],
    )
    assert r.exit_code == 0, r.output
    assert calls == [
        (str(tmp_path), "mem://x", "other", True)
    ]  # no index_type, dim, seed, token: it does not declare them
    assert "t_store mem://x collection 'other': 7 x 4-d vectors, exact" in r.output and "Milvus" not in r.output
    with pytest.raises(ScalingNoteError, match="has no export"):
        export_to_backend(get_backend("faiss"), tmp_path, "x")


def test_token_flag_is_back_end_neutral_with_a_hidden_deprecated_alias(table, tmp_path):
    got: list = []
    register_backend(
        "t_tok",
        lambda loc, query_tower=None, **kw: None,
        location="uri",
        export=lambda source, location, *, token=None: got.append(token) or {"n_vectors": 0, "dim": 1},
    )
    runner = CliRunner()
    base = ["index", "export", "--to", "t_tok", "--uri", "mem://x", "--index", str(tmp_path)]
    assert runner.invoke(cli, [*base, "--token", "a"]).exit_code == 0
    r = runner.invoke(cli, [*base, "--milvus-token", "b"])
    assert r.exit_code == 0 and "--milvus-token is deprecated; use --token" in r.output
    r = runner.invoke(cli, [*base], env={"SCALINGNOTE_BACKEND_TOKEN": "c"})
    assert r.exit_code == 0
    assert got == ["a", "b", "c"]
    r = runner.invoke(cli, [*base, "--token", "a", "--milvus-token", "b"])
    assert r.exit_code != 0 and "disagree" in str(r.exception)
    for command in (["search"], ["serve"], ["index", "export"]):
        text = runner.invoke(cli, [*command, "--help"], env={"COLUMNS": "200"}).output
        assert "--token" in text and "--milvus-token" not in text and "(milvus) Collection" not in text, command


def test_serve_maps_token_and_collection_to_the_settings(table, tmp_path, monkeypatch):
    import scalingnote.cli.serve as serve_cli

    register_backend("t_srv", lambda loc, query_tower=None, **kw: None, location="uri")
    got: list = []
    monkeypatch.setattr(serve_cli, "serve", lambda location, tower, settings: got.append((location, tower, settings)))
    args = ["serve", "--backend", "t_srv", "--uri", "mem://x", "--query-tower", str(tmp_path), "--collection", "other"]
    r = CliRunner().invoke(cli, [*args, "--token", "k", "--log-level", "DEBUG", "--shutdown-timeout", "3"])
    assert r.exit_code == 0, r.output
    (location, tower, s) = got[0]
    assert location == "mem://x" and s.backend_token == "k" and s.collection == "other" and s.backend == "t_srv"
    assert s.log_level == "debug" and s.shutdown_timeout_s == 3.0 and s.corpus is None
