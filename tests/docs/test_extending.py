"""The worked examples of ``docs/extending.md`` run: each ``## `` section's ```` ```python ````
blocks are joined in order and executed in a fresh interpreter, in an empty directory, with the
repository's ``src`` on the path. A section without code fails (the doc promises an example).

Beside them, four additions a contributor makes as built-ins in a copy of the repository (issue
48's acceptance): a second pooling mode (SGPT's position-weighted mean), a margin ranking loss,
an exact numpy back end and a CSV corpus format. Each touches at most two product files (counted
against the tree before it), each runs through the commands a user types (`scalingnote search`,
`scalingnote serve`, `scalingnote quickstart --data`), and the registry, CLI and extension tests
(and, marked slow, the whole default suite) still pass in the copy with all four registered.
The copy is one module-scoped fixture; every check runs in a fresh interpreter with the copy's
``src`` on the path, so nothing registered there leaks into the rest of the run."""

from __future__ import annotations

import filecmp
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from benchmarks._common import ServeProcess

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "extending.md"
SECTIONS = ("A pooling mode", "A loss", "A vector back end", "A corpus format")


def section_code(text: str, heading: str) -> str:
    """The Python blocks under ``## heading`` (up to the next ``## ``), joined in order."""
    m = re.search(rf"^## {re.escape(heading)}\s*$(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    if m is None:
        raise AssertionError(f"{DOC}: no section '## {heading}'")
    return "\n\n".join(re.findall(r"^```python\n(.*?)^```", m.group(1), flags=re.M | re.S))


def test_section_code_reads_only_its_own_section():
    text = "## A\n```python\nx = 1\n```\n## B\n```python\ny = 2\n```\n"
    assert section_code(text, "A") == "x = 1\n" and section_code(text, "B") == "y = 2\n"


@pytest.mark.parametrize("heading", SECTIONS)
def test_worked_example_runs(heading, tmp_path):
    code = section_code(DOC.read_text(encoding="utf-8"), heading)
    assert code.strip(), f"{DOC}: section '{heading}' has no ```python example"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(tmp_path)]), "PYTHONHASHSEED": "0"}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, f"'{heading}' example failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def test_builtin_tables_are_made_from_the_registries():
    """The doc's tables of built-in pooling modes, losses, back ends and corpus formats are
    generated from the registries (``scripts/gen_registry_docs.py``) and current."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_registry_docs.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr


# ------------------------------------------------------------------ built-in additions of each kind
PKG = Path("src/scalingnote")
IN_COPY = "SCALINGNOTE_TEST_ADDITIONS_COPY"  #: set for the suite run inside the copy (its own copy is not made again)

# ------------------------------------------------------------------ the four additions
# Each: {product file (relative to the repository): (mode, text)}, mode "new" or "append".
WEIGHTED_MEAN = {
    PKG / "models/towers/pooling.py": (
        "append",
        '''

def _weighted_means(h: torch.Tensor, mask: torch.Tensor, spans: torch.Tensor) -> torch.Tensor:
    """Position-weighted mean over each view's real tokens, token i weighted i + 1 (SGPT,
    Muennighoff 2022 §2.1: later tokens of a causal model have seen more of the text)."""
    pos = torch.arange(h.shape[1], device=h.device)
    inside = (pos > spans[..., :1]) & (pos <= spans[..., 1:]) & mask.bool().unsqueeze(1)  # [B, S, L]
    w = (inside * (pos + 1)).to(h.dtype)
    return torch.einsum("bsl,blh->bsh", w, h) / w.sum(-1, keepdim=True).clamp(min=1.0)


register_pooling("weightedmean", _weighted_means, st_mode="weightedmean", description="position-weighted mean (SGPT)")
''',
    ),
}

MARGIN_LOSS = {
    PKG / "training/losses/margin_ranking.py": (
        "new",
        '''"""Margin ranking loss on the ``[EMB]`` view: a hinge on the gap between the positive's and the
hard negative's cosine similarity (the pairwise loss of RankNet-style training with a margin).

    L = mean_i max(0, margin - (cos(q_i, d_i+) - cos(q_i, d_i-)))

Inputs: a :class:`LossBatch` with hard negatives (``neg`` set); ``spec.options["margin"]``
(default 0.2). Example::

    >>> import torch
    >>> from scalingnote.training.losses import LossBatch, LossSpec
    >>> b = LossBatch(torch.eye(2), {"emb": torch.eye(2)}, {"emb": torch.eye(2).flip(0)})
    >>> float(margin_ranking_loss(b, LossSpec(name="margin_ranking"))[0])
    0.0
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from scalingnote.errors import ConfigError
from scalingnote.training.losses.batch import LossBatch
from scalingnote.training.losses.registry import register_loss
from scalingnote.training.losses.spec import LossSpec


def margin_ranking_loss(batch: LossBatch, spec: LossSpec) -> tuple[torch.Tensor, dict[str, float]]:
    if batch.neg is None:
        raise ConfigError("loss margin_ranking needs hard negatives (data.negatives other than none)")
    q, pos, neg = (F.normalize(x, dim=-1) for x in (batch.q, batch.pos["emb"], batch.neg["emb"]))
    loss = F.margin_ranking_loss((q * pos).sum(-1), (q * neg).sum(-1), torch.ones_like(batch.q[:, 0]), margin=float(spec.options.get("margin", 0.2)))
    return loss, {"loss": float(loss.detach())}


register_loss("margin_ranking", margin_ranking_loss)
''',
    ),
    PKG / "training/losses/__init__.py": (
        "append",
        "\nfrom scalingnote.training.losses.margin_ranking import margin_ranking_loss  # noqa: E402,F401\n",
    ),
}

NUMPY_BACKEND = {
    PKG / "index/numpy_exact.py": (
        "new",
        '''"""An exact brute-force back end in numpy over an index directory's full-precision vectors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from scalingnote.index.layout import check_query_tower, read_manifest
from scalingnote.index.searcher import SearchResult, VectorSearcher


class NumpySearcher(VectorSearcher):
    """Inner products with every vector, read memory-mapped in blocks (a corpus larger than RAM
    costs time, not memory); no IVF, no HNSW, no re-rank, read-only."""

    BLOCK = 65_536  # vectors scored at a time

    def __init__(self, root, query_tower=None):
        root = Path(root)
        self.manifest = {**read_manifest(root), "factory": "numpy:exact"}
        self.vectors = np.load(root / "vectors.npy", mmap_mode="r")
        self.doc_ids = json.loads((root / "doc_ids.json").read_text(encoding="utf-8"))
        self.root, self.query_tower = root, query_tower

    @classmethod
    def open(cls, location, query_tower=None, **_):
        if query_tower is not None:  # a query tower of another embedding space is refused
            check_query_tower(read_manifest(location), query_tower, location)
        return cls(location, query_tower)

    def search(self, queries, k=10):
        q = self.query_vectors(queries)
        best_s = np.full((len(q), 0), -np.inf, dtype=np.float32)
        best_i = np.zeros((len(q), 0), dtype=np.int64)
        for start in range(0, len(self.vectors), self.BLOCK):
            block = np.asarray(self.vectors[start : start + self.BLOCK]) @ q.T  # [block, Q]
            best_s = np.concatenate([best_s, block.T], axis=1)
            best_i = np.concatenate([best_i, np.broadcast_to(np.arange(start, start + len(block)), (len(q), len(block)))], axis=1)
            keep = np.argsort(-best_s, axis=1, kind="stable")[:, :k]
            best_s, best_i = np.take_along_axis(best_s, keep, 1), np.take_along_axis(best_i, keep, 1)
        return SearchResult(best_s, [[self.doc_ids[i] for i in row] for row in best_i], None, best_i)
''',
    ),
    PKG / "index/backends.py": (
        "append",
        """
from scalingnote.index.numpy_exact import NumpySearcher  # noqa: E402

register_backend("numpy_exact", NumpySearcher.open, help="exact numpy search over an index directory")
""",
    ),
}

CSV_CORPUS = {
    PKG / "data/corpus.py": (
        "append",
        '''

def _read_csv(path: Path) -> Iterator[Document]:
    """A CSV corpus with a header row naming ``id`` and ``text`` (``title`` optional)."""
    import csv  # the one reader that needs it

    with open(path, newline="", encoding="utf-8") as fh:
        rows = csv.DictReader(fh)
        missing = sorted({"id", "text"} - set(rows.fieldnames or ()))
        if missing:
            raise DataError(path, 1, missing[0], f"the header must name id and text (title optional), got {rows.fieldnames}")
        for row in rows:
            yield Document(row["id"], row.get("title") or "", "", row["text"])


register_corpus_format("csv", _read_csv, suffixes=(".csv",))
''',
    ),
}

ADDITIONS = {
    "weightedmean pooling": WEIGHTED_MEAN,
    "margin ranking loss": MARGIN_LOSS,
    "numpy back end": NUMPY_BACKEND,
    "csv corpus": CSV_CORPUS,
}


def _apply(root: Path, files: dict) -> None:
    for rel, (mode, text) in files.items():
        path = root / rel
        if mode == "new":
            assert not path.exists(), f"{rel} exists already"
            path.write_text(text, encoding="utf-8")
        else:
            path.write_text(path.read_text(encoding="utf-8") + text, encoding="utf-8")


def _changed_files(a: Path, b: Path) -> list[str]:
    """Product files that differ between two ``src`` trees (new, removed or changed)."""
    out: list[str] = []

    def walk(cmp: filecmp.dircmp, rel: Path) -> None:
        out.extend(
            str(rel / n)
            for n in cmp.left_only + cmp.right_only + cmp.diff_files
            if not n.endswith(".pyc") and n != "__pycache__"
        )
        for name, sub in cmp.subdirs.items():
            if name != "__pycache__":
                walk(sub, rel / name)

    walk(filecmp.dircmp(a, b, ignore=["__pycache__"]), Path("src"))
    return sorted(out)


def _repo_files() -> list[str]:
    """The repository's files as a clone has them (tracked, plus new files not ignored)."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return [f for f in out.stdout.splitlines() if (ROOT / f).is_file()]


@pytest.fixture(scope="module")
def copy(tmp_path_factory) -> Path:
    """The repository's files copied (``../shared`` linked beside the copy, as beside a clone),
    then the four additions made one after another; the product files each touched are counted
    against the tree before it."""
    if os.environ.get(IN_COPY):
        pytest.skip("this run is the suite inside the copy: the additions are built in already")
    base = tmp_path_factory.mktemp("user_additions")
    root = base / "repo"
    for rel in _repo_files():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, root / rel)
    if (ROOT.parent / "shared").is_dir():
        (base / "shared").symlink_to(ROOT.parent / "shared")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    touched = {}
    for what, files in ADDITIONS.items():
        before = base / "before"
        shutil.copytree(root / "src", before, ignore=ignore)
        _apply(root, files)
        touched[what] = _changed_files(before, root / "src")
        shutil.rmtree(before)
    (base / "touched.json").write_text(json.dumps(touched, indent=1))
    # the doc's tables of built-ins are made from the registries: regenerate them as a contributor would
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    subprocess.run(
        [sys.executable, "scripts/gen_registry_docs.py"],
        cwd=root,
        env=env,
        check=True,
        capture_output=True,
        timeout=300,
    )
    return root


def _run(copy: Path, code: str, cwd: Path, timeout: int = 900) -> str:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(copy / "src"), str(copy)]),
        "PYTHONHASHSEED": "0",
        "OMP_WAIT_POLICY": "PASSIVE",
    }
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout


def _cli(copy: Path, args: list[str], cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(copy / "src"), str(copy)]),
        "PYTHONHASHSEED": "0",
        "OMP_WAIT_POLICY": "PASSIVE",
    }
    return subprocess.run(
        [sys.executable, "-m", "scalingnote", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_the_doc_tables_list_the_additions(copy):
    text = (copy / "docs" / "extending.md").read_text(encoding="utf-8")
    for name in ("`weightedmean`", "`margin_ranking`", "`numpy_exact`", "`csv`"):
        assert f"| {name} |" in text, name


def test_each_addition_touches_at_most_two_product_files(copy):
    touched = json.loads((copy.parent / "touched.json").read_text())
    for what, files in touched.items():
        assert files == sorted(str(p) for p in ADDITIONS[what]), (what, files)
        assert 1 <= len(files) <= 2, (what, files)


def test_weighted_mean_pooling_is_a_pooling_name_and_exports(copy, tmp_path):
    _run(
        copy,
        """
        import numpy as np, torch
        from sentence_transformers import SentenceTransformer
        from scalingnote.models import build_tiny_model, load_tower
        from scalingnote.models.export import export_tower

        bert = build_tiny_model("tiny-bert", "bert", seed=0)
        tower = load_tower(bert, "query", pooling="weightedmean", device="cpu", dtype="float32")
        texts = ["dense retrieval maps queries", "vitamin d and fractures", "a"]
        got = tower.encode_queries(texts, normalize=False, show_progress=False)
        batch = tower.tokenize_queries(texts)
        with torch.no_grad():
            h = tower.hidden_states(batch).numpy()
        w = batch["attention_mask"].numpy() * np.arange(1, h.shape[1] + 1)
        want = (w[..., None] * h).sum(1) / w.sum(1, keepdims=True)
        assert np.allclose(got, want, atol=1e-5), np.abs(got - want).max()
        export_tower(tower, "wm-st", "sentence-transformers")
        st = SentenceTransformer("wm-st", device="cpu", local_files_only=True)
        ref = tower.encode_queries(texts, show_progress=False)
        assert np.allclose(st.encode(texts, normalize_embeddings=True), ref, atol=1e-5)
        assert load_tower("wm-st", "query", device="cpu", dtype="float32").config.pooling == "weightedmean"
    """,
        tmp_path,
    )


def test_margin_ranking_loss_matches_torch_and_trains(copy, tmp_path):
    _run(
        copy,
        """
        import doctest, json, torch
        import torch.nn.functional as F
        from pathlib import Path
        from scalingnote.config import load_config
        from scalingnote.data import Document, Query, write_beir
        from scalingnote.models.tiny import build_tiny_model
        from scalingnote.training import TrainConfig, train
        from scalingnote.training.losses import LossBatch, LossSpec, get_loss
        from scalingnote.training.losses import margin_ranking

        result = doctest.testmod(margin_ranking)
        assert result.failed == 0 and result.attempted == 4, result
        g = torch.Generator().manual_seed(0)
        q, p, n = (torch.randn(8, 16, generator=g) for _ in range(3))
        loss, parts = get_loss("margin_ranking")(LossBatch(q, {"emb": p}, {"emb": n}), LossSpec(name="margin_ranking", options={"margin": 0.3}))
        cos = lambda a, b: F.cosine_similarity(a, b, dim=-1)
        want = torch.clamp(0.3 - cos(q, p) + cos(q, n), min=0).mean()
        assert torch.allclose(loss, want, atol=1e-6) and abs(parts["loss"] - float(want)) < 1e-6

        words = {"fox": "quick brown fox jumps", "pq": "product quantization compresses codes",
                 "vitamin": "vitamin deficiency fracture risk", "retrieval": "dense retrieval vector search"}
        docs, queries, qrels = [], [], {}
        for t, text in words.items():
            for i in range(6):
                docs.append(Document(f"{t}{i}", f"{t} {i}", t, f"{text} note {i}"))
                queries.append(Query(f"q{t}{i}", f"{t} {text.split()[i % 4]} {i}"))
                qrels[f"q{t}{i}"] = {f"{t}{i}": 1}
        write_beir("beir", docs, queries, {"train": qrels, "test": dict(list(qrels.items())[::4])})
        llm = str(build_tiny_model("tiny_llm", "llm", num_layers=2))
        cfg = load_config(TrainConfig, {
            "method": "scaling_dual", "output_dir": "run", "dim": 32,
            "query_tower": {"model": llm, "max_length": 16}, "doc_tower": {"model": llm, "max_length": 64},
            "data": {"data_dir": "beir", "neg_skip_top": 1, "neg_max_rank": 6, "validation_fraction": 0.0, "eval_overlap": "drop"},
            "loss": {"name": "margin_ranking", "dims": [16, 32], "options": {"margin": 0.3}},
            "optim": {"batch_size": 8, "epochs": 2.0, "max_steps": 4, "lr": 1e-3}, "show_progress": False, "log_every": 1,
        })
        train(cfg)
        logged = [json.loads(line) for line in Path("run/metrics.jsonl").read_text().splitlines()]
        losses = [x["loss"] for x in logged if "loss" in x]
        assert len(losses) == 4 and all(0.0 <= x <= 2.3 for x in losses), losses
    """,
        tmp_path,
    )


def _tiny_beir(copy: Path, where: Path, csv: bool = False) -> None:
    _run(
        copy,
        f"""
        import numpy as np
        from pathlib import Path
        from scalingnote.data import Document, Query, write_beir
        topics = ["vitamin fracture", "knee running", "coffee sleep", "heart rhythm", "liver enzyme", "lung function",
                  "fox jumps", "vector index", "scaling law", "dense query"]
        rng = np.random.default_rng(0)
        docs = [Document(f"d{{i}}", f"{{t}} note {{i}}", "", f"{{t}} " + " ".join(rng.choice(t.split() + ["study", "cohort", "adults"], 8)))
                for i, t in enumerate(topics * 6)]
        queries = [Query(f"q{{i}}", f"{{t}} {{i}}") for i, t in enumerate(topics * 6)]
        qrels = {{f"q{{i}}": {{f"d{{i}}": 1}} for i in range(len(docs))}}
        split = {{"train": dict(list(qrels.items())[:36]), "dev": dict(list(qrels.items())[36:48]), "test": dict(list(qrels.items())[48:])}}
        write_beir("beir", docs, queries, split)
        if {csv!r}:
            import csv
            with open("beir/corpus.csv", "w", newline="", encoding="utf-8") as fh:
                w = csv.writer(fh)
                w.writerow(["id", "title", "text"])
                w.writerows([d.id, d.title, d.content] for d in docs)
            Path("beir/corpus.jsonl").unlink()
        build = __import__("scalingnote.models", fromlist=["build_tiny_model"]).build_tiny_model
        build("tiny-bert", "bert", seed=0, num_layers=2)
        build("tiny-llm", "llm", seed=0, num_layers=1)
    """,
        where,
    )


def test_numpy_back_end_through_search_and_serve(copy, tmp_path):
    _tiny_beir(copy, tmp_path)
    _run(
        copy,
        """
        from scalingnote.index import build_index
        from scalingnote.index.pipeline import encode_with_tower
        encode_with_tower("tiny-bert", "beir", "emb", shard_size=64, batch_size=16, progress=False)
        build_index("emb", "idx", "Flat", semantic_ids_layers=0, progress=False)
    """,
        tmp_path,
    )
    runs = {}
    for backend in ("faiss", "numpy_exact"):
        out = tmp_path / f"{backend}.tsv"
        r = _cli(
            copy,
            [
                "search",
                "--backend",
                backend,
                "--index",
                "idx",
                "--query-tower",
                "tiny-bert",
                "--mode",
                "dense",
                "--queries",
                "beir",
                "--split",
                "test",
                "--k",
                "5",
                "--out",
                str(out),
            ],
            tmp_path,
        )
        assert r.returncode == 0, r.stderr[-3000:]
        runs[backend] = [line.split() for line in out.read_text().splitlines()]
    # the same queries, the same top-5 scores (equal scores may list their documents in another order)
    assert runs["numpy_exact"] and [r[0] for r in runs["numpy_exact"]] == [r[0] for r in runs["faiss"]]
    assert np.allclose([float(r[4]) for r in runs["numpy_exact"]], [float(r[4]) for r in runs["faiss"]], atol=1e-5)
    one = _cli(
        copy,
        [
            "search",
            "--backend",
            "numpy_exact",
            "--index",
            "idx",
            "--query-tower",
            "tiny-bert",
            "--mode",
            "dense",
            "--query",
            "coffee sleep",
            "--k",
            "3",
        ],
        tmp_path,
    )
    assert one.returncode == 0, one.stderr[-3000:]
    hits = [json.loads(line) for line in one.stdout.splitlines() if line.startswith("{")]
    assert len(hits) == 3, one.stdout
    refused = _cli(
        copy,
        [
            "search",
            "--backend",
            "numpy_exact",
            "--index",
            "idx",
            "--query-tower",
            "tiny-bert",
            "--mode",
            "dense",
            "--query",
            "x",
            "--nprobe",
            "4",
        ],
        tmp_path,
    )
    assert refused.returncode == 2 and "nprobe" in refused.stderr, refused.stderr[-2000:]

    import httpx

    svc = ServeProcess(
        ["--backend", "numpy_exact", "--index", str(tmp_path / "idx"), "--query-tower", str(tmp_path / "tiny-bert")],
        env={"PYTHONPATH": str(copy / "src")},
    )
    try:
        health = svc.wait_ready(timeout=300)
        assert health["index"]["factory"] == "numpy:exact", health
        r = httpx.post(svc.url + "/search", json={"query": "coffee sleep", "k": 3}, trust_env=False, timeout=60)
        assert r.status_code == 200, r.text
        served = r.json()["results"]
        assert [h["doc_id"] for h in served] == [h["doc_id"] for h in hits] or np.allclose(
            [h["score"] for h in served], [h["score"] for h in hits], atol=1e-5
        )
    finally:
        svc.stop()


def test_csv_corpus_through_quickstart_data(copy, tmp_path):
    _tiny_beir(copy, tmp_path, csv=True)
    tiny = [
        "bert=" + str(tmp_path / "tiny-bert"),
        "llm=" + str(tmp_path / "tiny-llm"),
        "llm_depths=[1]",
        "llm_small_layers=1",
        "bert_small_layers=1",
        "dim=32",
        "steps=3",
        "batch_size=4",
        "qkd_epochs=1.0",
        "qkd_batch_size=16",
        "qkd_max_pseudo_queries=60",
        "semantic_id_layers=2",
        "query_max_length=16",
        "doc_max_length=64",
        "head_lrs=[0.001]",
        "compare=none",
        "teacher=bert",
        "show_progress=false",
    ]
    r = _cli(
        copy,
        ["quickstart", "--data", "beir", "--out", "run", *[a for kv in tiny for a in ("--set", kv)]],
        tmp_path,
        timeout=1500,
    )
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["rows"], results
    manifests = list((tmp_path / "run").rglob("manifest.json"))
    n = {json.loads(m.read_text()).get("n_vectors") for m in manifests} - {None}
    assert 60 in n, n  # the served index holds every CSV document


#: the tests that read the registries, the CLI's help and the extension points
REGISTRY_TESTS = (
    "tests/models/test_pooling.py",
    "tests/models/test_st_import.py",
    "tests/training/test_loss_registry.py",
    "tests/index/test_backends.py",
    "tests/index/test_searcher_contract.py",
    "tests/data/test_corpus.py",
    "tests/cli",
    "tests/docs/test_extending.py",
)


def _pytest_in(copy: Path, args: list[str], timeout: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(copy / "src"), "OMP_WAIT_POLICY": "PASSIVE", IN_COPY: "1"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_registry_cli_and_extension_tests_pass_with_all_four_registered(copy):
    proc = _pytest_in(copy, ["-x", *REGISTRY_TESTS], timeout=1800)
    assert proc.returncode == 0, proc.stdout[-4000:]


@pytest.mark.slow
def test_the_default_suite_passes_with_all_four_registered(copy):
    """The whole default run (this file aside) in the copy with the four additions built in."""
    proc = _pytest_in(copy, ["-m", "not slow", "tests"], timeout=3000)
    assert proc.returncode == 0, proc.stdout[-6000:]
