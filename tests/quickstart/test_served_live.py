"""The live index on the quick start's own output, through the commands it prints: the
printed ``scalingnote serve`` command in its own process, ``POST /documents``, search in every
mode, ``DELETE``, a restart, and ``scalingnote index add`` without a tower flag. The index's
vectors come from the fine-tuned ``stage1/<run>/doc_tower``, not from the base model it is named
after; a service that re-encoded new documents with the base model would refuse every one."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from benchmarks._common import ServeProcess
from scalingnote.data import load_beir
from scalingnote.evaluation import evaluate
from scalingnote.models import build_tiny_model
from scalingnote.quickstart import QuickstartConfig, quickstart
from tests.helpers.tiny_quickstart import TINY

TOKEN = "quickstart-live-admin-token-0123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NEW = [
    {"_id": "new-1", "title": "zorblax quintrelle", "text": "the zorblax quintrelle note about a new travel plan"},
    {"_id": "new-2", "title": "flummoxine", "text": "a flummoxine recipe with a rare spice"},
]
UNIQUE = {"new-1": "zorblax", "new-2": "flummoxine"}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny quick start (random models, one family, no comparison rows) and the serve command it printed."""
    root = tmp_path_factory.mktemp("qs_live")
    bert = build_tiny_model(root / "bert", "bert", num_layers=2)
    out = root / "run"
    cfg = QuickstartConfig(
        out=str(out),
        bert=str(bert),
        llm=str(build_tiny_model(root / "llm", "llm", num_layers=1)),
        **TINY,
    )
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        quickstart(cfg)
    m = re.search(r"^\s*scalingnote serve (.+) --port 8080\s*$", buf.getvalue(), re.M)
    assert m, buf.getvalue()[-2000:]
    return out, shlex.split(m.group(1))


class _Service(ServeProcess):
    """The printed command as a user runs it (``--port 0`` for a free port, the admin token from the env)."""

    def __init__(self, args: list[str]):
        super().__init__([*args, "--log-level", "warning"], env={"SCALINGNOTE_ADMIN_TOKEN": TOKEN})
        try:
            self.wait_ready(timeout=300)  # loading both towers on a busy 2-core machine
        except RuntimeError:
            self.proc.kill()
            raise
        self.default_mode = "dense"

    def search(self, query: str, **kw) -> list[str]:
        r = httpx.post(self.url + "/search", json={"query": query, **kw}, trust_env=False, timeout=60)
        assert r.status_code == 200, r.text
        return [h["doc_id"] for h in r.json()["results"]]


def _found_everywhere(svc: _Service, wide: dict, n_docs: int) -> dict[str, dict[str, bool]]:
    """Per new document and mode: found by its unique word (bm25, hybrid, the served default) or by
    its own text (dense, searched exhaustively — every IVF list probed or the whole graph walked —
    ``wide``: whether it is in the dense index at all)."""
    out: dict[str, dict[str, bool]] = {}
    for doc in NEW:
        word, text = UNIQUE[doc["_id"]], f"{doc['title']} {doc['text']}"
        out[doc["_id"]] = {
            "bm25": svc.search(word, k=10, mode="bm25") == [doc["_id"]],
            "hybrid": doc["_id"] in svc.search(word, k=10, mode="hybrid"),
            "default": doc["_id"]
            in (svc.search(word, k=10) if svc.default_mode == "hybrid" else svc.search(text, k=n_docs, **wide)),
            "dense": doc["_id"] in svc.search(text, k=n_docs, mode="dense", **wide),
        }
    return out


def test_the_printed_serve_command_ingests_into_the_quick_starts_index(run):
    out, args = run
    index = Path(args[args.index("--index") + 1])
    man = json.loads((index / "manifest.json").read_text())
    # the index records the fine-tuned document tower that made its vectors, by its directory
    doc_tower = Path(man["tower"]["path"])
    assert doc_tower.parent.parent.name == "stage1" and doc_tower.name == "doc_tower"
    assert json.loads((doc_tower / "tower.json").read_text())["fingerprint"] == man["tower"]["fingerprint"]
    svc = _Service(args)
    try:
        health = httpx.get(svc.url + "/healthz", trust_env=False).json()
        n_docs = int(health["index"]["n_vectors"]) + len(NEW)
        # the quick start serves whichever structure was the fastest: IVF (probe every list) or a graph
        wide = {"nprobe": int(health["index"]["nlist"])} if health["index"]["nlist"] else {"ef_search": n_docs}
        svc.default_mode = (
            json.loads((index / "fusion.json").read_text())["default_mode"]
            if (index / "fusion.json").exists()
            else "dense"
        )
        # the table's served row is what the service answers: its test queries over HTTP give its nDCG@10
        served = next(r for r in json.loads((out / "results.json").read_text())["rows"] if r["chosen"] == "served")
        ds = load_beir(out / "data", "test")
        run = {}
        for q in sorted(ds.qrels):
            hits = httpx.post(
                svc.url + "/search", json={"query": ds.queries[q].text, "k": 100}, trust_env=False, timeout=60
            ).json()["results"]
            run[q] = {h["doc_id"]: float(h["score"]) for h in hits}
        assert evaluate(run, ds.qrels, ["ndcg@10"])["ndcg@10"] == pytest.approx(served["ndcg@10"], abs=1e-4)
        r = httpx.post(svc.url + "/documents", json={"documents": NEW}, headers=AUTH, trust_env=False, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["upserted"] == 2
        found = _found_everywhere(svc, wide, n_docs)
        assert all(all(modes.values()) for modes in found.values()), found
        assert httpx.delete(svc.url + "/documents/new-2", headers=AUTH, trust_env=False).status_code == 200
        assert svc.search("flummoxine", k=10, mode="bm25") == []
    finally:
        svc.stop()
    svc = _Service(args)  # restart: the write-ahead log replays the add and the delete
    try:
        assert svc.search("zorblax", k=10, mode="bm25") == ["new-1"]
        assert svc.search("flummoxine", k=10, mode="bm25") == []
        assert "new-2" not in svc.search("a flummoxine recipe with a rare spice", k=n_docs, mode="dense", **wide)
    finally:
        svc.stop()
    # `scalingnote index add` on the same index, no --tower: the recorded tower encodes the document
    docs = out / "more.jsonl"
    docs.write_text(json.dumps({"_id": "new-3", "title": "glimmerquat", "text": "a glimmerquat field guide"}) + "\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    res = subprocess.run(
        [sys.executable, "-m", "scalingnote", "index", "add", "--index", str(index), "--docs", str(docs)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads(res.stdout.strip().splitlines()[-1])["upserted"] == 1


def test_a_document_tower_of_another_space_is_refused_with_both_fingerprints_and_the_fix(run, tmp_path):
    out, args = run
    index = Path(args[args.index("--index") + 1])
    other = build_tiny_model(tmp_path / "other", "bert", seed=7, num_layers=1)
    docs = tmp_path / "d.jsonl"
    docs.write_text(json.dumps({"_id": "x1", "text": "anything"}) + "\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "scalingnote",
            "index",
            "add",
            "--index",
            str(index),
            "--docs",
            str(docs),
            "--tower",
            str(other),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert res.returncode != 0
    man = json.loads((index / "manifest.json").read_text())
    assert (
        man["tower"]["fingerprint"] in res.stderr and "--document-tower" in res.stderr and "Traceback" not in res.stderr
    )
