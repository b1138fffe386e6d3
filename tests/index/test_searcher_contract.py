"""One searcher contract: a back end receives only the search options it declares (capability
flags), and a back end as small as docs/extending.md's example (only ``search(self, queries,
k=10)``) runs through ``scalingnote search --queries/--out``, ``--query`` and the service."""

from __future__ import annotations

import json
import re
import time

import numpy as np
import pytest
from typer.testing import CliRunner

from scalingnote.cli import app, main
from scalingnote.data import read_run, write_beir
from scalingnote.errors import ScalingNoteError
from scalingnote.index import DenseIndex, build_index
from scalingnote.index.backends import BACKENDS, register_backend
from scalingnote.index.pipeline import encode_with_tower, load_tower_for
from scalingnote.index.searcher import SEARCH_OPTIONS, SearcherBase, search_options
from tests.serve.test_serve_backends import NumpySearcher

NAME = "contract-test-numpy"  # a name no one else registers

# the doc's example back end (only ``search(self, queries, k=10)``), in a module a dotted path can name
DOTTED = "tests.serve.test_serve_backends:NumpySearcher.open"


@pytest.fixture
def registered():
    with BACKENDS.scoped():
        yield register_backend(NAME, NumpySearcher.open, help="exact numpy search (test)")


@pytest.fixture(scope="module")
def flat(tmp_path_factory, tiny_bert_dir, tiny_corpus, queries_factory):
    root = tmp_path_factory.mktemp("contract")
    queries = queries_factory(8)
    write_beir(
        root / "beir", tiny_corpus, queries, {"test": {q.id: {tiny_corpus[i].id: 1} for i, q in enumerate(queries)}}
    )
    encode_with_tower(tiny_bert_dir, root / "beir", root / "emb", shard_size=64, batch_size=16, progress=False)
    return build_index(root / "emb", root / "idx", "Flat", semantic_ids_layers=0, progress=False), root / "beir"


class _Recorder(SearcherBase):
    """Records the keyword arguments ``search`` receives; declares re-rank only."""

    supports_rerank = True

    def __init__(self):
        self.calls: list[dict] = []

    def search(self, queries, k=10, **kw):
        self.calls.append(kw)
        raise ScalingNoteError("recorded")


def test_search_options_pass_the_declared_ones_and_refuse_the_rest():
    s = _Recorder()
    assert search_options(s, "rec", nprobe=None, ef_search=None, rerank=None) == {}
    assert search_options(s, "rec", nprobe=None, rerank=50) == {"rerank": 50}
    for option in ("nprobe", "ef_search"):
        with pytest.raises(ScalingNoteError, match=rf"^{option}: index '_Recorder' has no .* \(back end rec\)$"):
            search_options(s, "rec", **{option: 4})
    with pytest.raises(ScalingNoteError, match="depth: not a search option"):
        search_options(s, "rec", depth=3)
    assert set(SEARCH_OPTIONS) == {"nprobe", "ef_search", "rerank"}


def test_search_run_passes_only_the_options_set():
    s = _Recorder()
    with pytest.raises(ScalingNoteError, match="recorded"):
        s.search_run(["q"], ["text"], k=5, nprobe=None, ef_search=None, rerank=None)
    with pytest.raises(ScalingNoteError, match="recorded"):
        s.search_run(["q"], ["text"], k=5, nprobe=None, rerank=7)
    assert s.calls == [{}, {"rerank": 7}]


def _flat_run(index_dir, tower_dir, beir):
    """FAISS Flat's score of every document for each test query."""
    from scalingnote.index.pipeline import read_search_queries

    qs = read_search_queries(beir, "test")
    flat = DenseIndex.open(index_dir, query_tower=load_tower_for(tower_dir, "query"))
    return flat.search([q.text for q in qs], len(flat)).to_run([q.id for q in qs])


def _assert_same_as_flat(run, every, k):
    """FAISS Flat's top-k scores, each hit with its own FAISS score (near-ties of the random
    tower may swap documents at the cut)."""
    assert set(run) == set(every)
    for qid, hits in run.items():
        assert len(hits) == k
        np.testing.assert_allclose(
            sorted(hits.values(), reverse=True), sorted(every[qid].values(), reverse=True)[:k], atol=1e-5
        )
        np.testing.assert_allclose([every[qid][d] for d in hits], list(hits.values()), atol=1e-5)


@pytest.mark.parametrize("by", ["name", "dotted path"])
def test_cli_search_queries_and_query_on_a_minimal_back_end(by, registered, flat, tiny_bert_dir, tmp_path):
    index_dir, beir = flat
    backend = NAME if by == "name" else DOTTED
    runner = CliRunner()
    out = tmp_path / "run.tsv"
    common = [
        "search",
        "--backend",
        backend,
        "--index",
        str(index_dir),
        "--query-tower",
        str(tiny_bert_dir),
        "--k",
        "5",
    ]
    r = runner.invoke(app, [*common, "--queries", str(beir), "--out", str(out)])
    assert r.exit_code == 0, r.output
    _assert_same_as_flat(read_run(out), _flat_run(index_dir, tiny_bert_dir, beir), 5)

    r = runner.invoke(app, [*common, "--query", "vector index query"])
    assert r.exit_code == 0, r.output
    hits = [json.loads(line) for line in r.stdout.splitlines()]
    ref = DenseIndex.open(index_dir, query_tower=load_tower_for(tiny_bert_dir, "query")).search(
        ["vector index query"], 5
    )
    assert [h["rank"] for h in hits] == [1, 2, 3, 4, 5]
    np.testing.assert_allclose([h["score"] for h in hits], ref.scores[0], atol=1e-4)


def test_cli_refuses_an_option_the_back_end_does_not_declare(registered, flat, tiny_bert_dir, tmp_path, capsys):
    index_dir, beir = flat
    with pytest.raises(SystemExit) as e:
        main(
            [
                "search",
                "--backend",
                NAME,
                "--index",
                str(index_dir),
                "--query-tower",
                str(tiny_bert_dir),
                "--queries",
                str(beir),
                "--out",
                str(tmp_path / "run.tsv"),
                "--nprobe",
                "4",
            ]
        )
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: nprobe: index 'numpy:exact' has no IVF layer (back end {NAME})"
    assert not (tmp_path / "run.tsv").exists()


def test_a_registered_back_end_is_in_the_help_and_the_errors(registered, capsys):
    runner = CliRunner()
    for command in (["search", "--help"], ["serve", "--help"]):
        r = runner.invoke(app, command, env={"COLUMNS": "400"})
        flat = re.sub(r"[\s│]+", "", r.stdout)  # the help as one string: rich wraps long lines
        assert r.exit_code == 0 and f"{NAME}(--indexDIR)" in flat, r.stdout
    with pytest.raises(SystemExit) as e:
        main(["search", "--backend", "no-such-back-end", "--index", ".", "--query-tower", "x", "--query", "q"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "no-such-back-end" in err and NAME in err and len(err.strip().splitlines()) == 1


def test_service_serves_the_minimal_back_end_and_refuses_what_it_lacks(registered, flat, tiny_bert_dir):
    from fastapi.testclient import TestClient

    from scalingnote.serve import ServeSettings, create_app

    index_dir, _ = flat
    queries = ["vector index query", "protein cell gene"]
    ref = DenseIndex.open(index_dir, query_tower=load_tower_for(tiny_bert_dir, "query")).search(queries, 5)
    with TestClient(
        create_app(index_dir, tiny_bert_dir, ServeSettings(port=0, backend=NAME, admin_token="t" * 16))
    ) as client:
        t0 = time.monotonic()
        while (h := client.get("/healthz")).status_code != 200:
            assert h.json()["status"] != "failed" and time.monotonic() - t0 < 60, h.json()
            time.sleep(0.05)
        rows = client.post("/search/batch", json={"queries": queries, "k": 5}).json()["results"]
        for option, value, lacks in (
            ("nprobe", 2, "has no IVF layer"),
            ("ef_search", 16, "has no HNSW graph"),
            ("rerank", 10, "does not re-rank"),
        ):
            r = client.post("/search", json={"query": "fox", option: value})
            assert r.status_code == 422, r.text
            assert (
                r.json()["detail"].startswith(f"{option}: index 'numpy:exact' {lacks}")
                and f"(back end {NAME})" in r.json()["detail"]
            )
    for row, scores in zip(rows, ref.scores, strict=True):
        np.testing.assert_allclose([h["score"] for h in row], scores, atol=1e-4)
