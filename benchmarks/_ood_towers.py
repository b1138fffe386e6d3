"""Cheap asymmetric towers for ``benchmarks.ood_routing`` (no ``runs/`` needed): document vectors
from a document tower, query vectors from a smaller query tower whose head is distilled onto the
large tower's query side. Everything is cached under ``.cache/ood_routing/<set>/`` (``.npy``).

* SciFact: documents = packaged all-MiniLM-L6-v2 (6 layers, mean pooling, zero-shot, 384-d);
  teacher queries = the same 6-layer tower; student = its first 2 layers + a linear head fitted
  by ridge least squares onto the teacher's normalised query vectors (the closed-form Eq. 15 MSE
  term, the distiller's ``head_init: lstsq``) on training queries + ICT pseudo-queries.
* KUAKE-QTR: frozen SmolLM2-135M pooled states (mean pooling, as the recipe): 4 layers for the
  large dual tower, with a query head and a document head (576 -> 576) fitted here with symmetric
  InfoNCE (ScalingNote Eq. 4 shape, tau 0.05) on the training pairs (heads only, like the recipe's
  ``trainable_layers: 0``); student = 1 layer + a ridge head onto the teacher's query vectors on
  training queries + 10,000 corpus texts used as pseudo-queries (ICT needs two sentences; KUAKE's
  documents are one title each; the recipe distils on corpus texts too).

Validation queries (10% of the training queries, seeded) are never used to fit a head or a router.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks._common import REPO_ROOT, chosen_student, shared_data_dir

CACHE = REPO_ROOT / ".cache" / "ood_routing"


@dataclass
class TowerSet:
    """Vectors of one data set: ``docs [N, d]``; ``queries[split] [n, d]`` from the student for
    ``train`` / ``val`` / ``test``; ``pseudo [m, d]`` student vectors of pseudo-queries; labels."""

    name: str
    docs: np.ndarray
    queries: dict[str, np.ndarray]
    pseudo: np.ndarray
    doc_tower: str
    query_tower: str
    pseudo_source: str
    doc_ids: list[str]
    query_ids: dict[str, list[str]]
    qrels_test: dict[str, dict[str, int]]


def _norm(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def _cached(path: Path, make) -> np.ndarray:
    if path.exists():
        return np.load(path)
    x = np.asarray(make(), dtype=np.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, x)
    tmp.rename(path)
    return x


def query_splits(data: Path, seed: int, val_fraction: float = 0.1) -> dict[str, list[str]]:
    """Query ids of ``train`` (router/head fitting), ``val`` (settings) and ``test`` (report)."""
    from scalingnote.data.beir import load_qrels

    test = sorted(load_qrels(data / "qrels" / "test.tsv"))
    # a test query that also has training judgements (KUAKE-QTR: 1329 of 1474) stays a test query
    # and leaves the training pool: no head or router is ever fitted on a query it is measured on
    train = sorted(set(load_qrels(data / "qrels" / "train.tsv")) - set(test))
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(train))
    n_val = max(1, int(round(val_fraction * len(train))))
    val = sorted(train[i] for i in perm[:n_val])
    return {"train": sorted(set(train) - set(val)), "val": val, "test": test}


def _encode_q(tower, texts: list[str]) -> np.ndarray:
    return tower.encode_queries(texts, batch_size=64, normalize=False, show_progress=True, max_length=64)


def _encode_d(tower, docs: list) -> np.ndarray:
    return tower.encode_documents(docs, batch_size=32, normalize=False, show_progress=True, max_length=256)


def ridge_head(x: np.ndarray, y: np.ndarray, ridge: float = 1e-3) -> tuple[np.ndarray, np.ndarray]:
    """(W, b) with ``x W^T + b ~ y`` (centred ridge least squares, the distiller's lstsq head)."""
    import torch

    from scalingnote.training.heads import ridge_fit

    mx, my = x.mean(0), y.mean(0)
    w = ridge_fit(torch.from_numpy(x - mx), torch.from_numpy(y - my), ridge).float().numpy()
    return w, my - mx @ w.T


def infonce_heads(q: np.ndarray, d: np.ndarray, pairs: np.ndarray, *, seed: int, epochs: int = 8, tau: float = 0.05):
    """Query and document heads (576 -> 576, identity start) fitted with symmetric in-batch InfoNCE on
    ``pairs`` [P, 2] (query row, doc row) over frozen pooled states; returns two numpy functions."""
    import torch

    torch.manual_seed(seed)
    dim = q.shape[1]
    mq, md = q.mean(0), d.mean(0)
    sq, sd = q.std() + 1e-6, d.std() + 1e-6
    lq, ld = torch.nn.Linear(dim, dim), torch.nn.Linear(dim, dim)
    for lin in (lq, ld):
        torch.nn.init.eye_(lin.weight)
        torch.nn.init.zeros_(lin.bias)
    opt = torch.optim.Adam([*lq.parameters(), *ld.parameters()], lr=1e-3)
    qt = torch.from_numpy((q - mq) / sq)
    dt = torch.from_numpy((d - md) / sd)
    rng = np.random.default_rng(seed)
    for _ in range(epochs):
        for b in np.array_split(rng.permutation(len(pairs)), max(1, len(pairs) // 256)):
            qi, di = pairs[b, 0], pairs[b, 1]
            a = torch.nn.functional.normalize(lq(qt[qi]), dim=1)
            c = torch.nn.functional.normalize(ld(dt[di]), dim=1)
            s = a @ c.T / tau
            same = torch.from_numpy(di[:, None] == di[None, :])  # duplicates of one doc are not negatives
            s = s.masked_fill(same & ~torch.eye(len(b), dtype=torch.bool), -1e4)
            lab = torch.arange(len(b))
            loss = torch.nn.functional.cross_entropy(s, lab) + torch.nn.functional.cross_entropy(s.T, lab)
            opt.zero_grad()
            loss.backward()
            opt.step()

    def apply(lin, m, s):
        def f(x: np.ndarray) -> np.ndarray:
            with torch.no_grad():
                return _norm(lin(torch.from_numpy((x - m) / s)).numpy())

        return f

    return apply(lq, mq, sq), apply(ld, md, sd)


def _all_queries(data: Path) -> tuple[list[str], list[str]]:
    from scalingnote.data.beir import load_queries

    qs = load_queries(data / "queries.jsonl")
    return list(qs), [q.text for q in qs.values()]


def _by_split(path: Path, tower_fn, data: Path, splits: dict[str, list[str]]) -> dict[str, np.ndarray]:
    """Every query of ``queries.jsonl`` encoded once (cached), sliced into the splits."""
    ids, texts = _all_queries(data)
    allq = _cached(path, lambda: _encode_q(tower_fn(), texts))
    row = {q: i for i, q in enumerate(ids)}
    return {s: allq[[row[q] for q in qids]] for s, qids in splits.items()}


def _ict_texts(name: str, data: Path, seed: int) -> list[str]:
    from scalingnote.data.pseudo import ICTConfig, ict_queries

    out = CACHE / name / "ict"
    if not (out / "queries.jsonl").exists():
        ict_queries(data / "corpus.jsonl", out, ICTConfig(seed=seed), progress=True)
    return [json.loads(line)["text"] for line in (out / "queries.jsonl").read_text().splitlines() if line.strip()]


def _test_qrels(data: Path) -> dict[str, dict[str, int]]:
    from scalingnote.data.beir import load_qrels

    return load_qrels(data / "qrels" / "test.tsv")


def _student_set(
    name: str,
    docs: np.ndarray,
    small: dict[str, np.ndarray],
    fit_x: np.ndarray,
    fit_y: np.ndarray,
    towers: tuple[str, str, str],
    doc_list: list,
    splits: dict[str, list[str]],
    data: Path,
) -> TowerSet:
    """The :class:`TowerSet` whose student is the small tower + a ridge head fitted from ``fit_x`` (small
    vectors) to ``fit_y`` (teacher vectors); ``towers``: (document tower, query tower, pseudo-query source)."""
    w, b = ridge_head(fit_x, fit_y)
    stu = {s: _norm(small[s] @ w.T + b) for s in small}
    return TowerSet(
        name,
        docs,
        {s: stu[s] for s in ("train", "val", "test")},
        stu["pseudo"],
        *towers,
        [x.id for x in doc_list],
        splits,
        _test_qrels(data),
    )


def scifact(seed: int = 0) -> TowerSet:
    from scalingnote.data.beir import load_corpus
    from scalingnote.models import load_tower

    data = shared_data_dir() / "scifact"
    c = CACHE / "scifact"
    splits = query_splits(data, seed)
    docs = list(load_corpus(data / "corpus.jsonl").values())
    pseudo_texts = _ict_texts("scifact", data, seed)
    d = _cached(c / "docs_minilm6.npy", lambda: _encode_d(load_tower("minilm-l6", "document", dim=None), docs))
    t6 = lambda: load_tower("minilm-l6", "query", dim=None)  # noqa: E731
    t2 = lambda: load_tower("minilm-l6", "query", num_layers=2, dim=None)  # noqa: E731
    big = _by_split(c / "queries_q6.npy", t6, data, splits)
    big["pseudo"] = _cached(c / "pseudo_q6.npy", lambda: _encode_q(t6(), pseudo_texts))
    small = _by_split(c / "queries_q2.npy", t2, data, splits)
    small["pseudo"] = _cached(c / "pseudo_q2.npy", lambda: _encode_q(t2(), pseudo_texts))
    fit_x = np.concatenate([small["train"], small["pseudo"]])
    fit_y = _norm(np.concatenate([big["train"], big["pseudo"]]))
    towers = (
        "minilm-l6 (all-MiniLM-L6-v2, 6 layers, mean pooling, zero-shot, 384-d)",
        "minilm-l6 first 2 layers + linear head (ridge fit to the 6-layer query vectors on training + ICT "
        "pseudo-queries)",
        f"ICT pseudo-queries over the corpus ({len(pseudo_texts)})",
    )
    return _student_set("scifact", _norm(d), small, fit_x, fit_y, towers, docs, splits, data)


def kuake(seed: int = 0) -> TowerSet:
    from scalingnote.data.beir import load_corpus, load_qrels
    from scalingnote.models import load_tower

    data = shared_data_dir() / "kuake_qtr"
    c = CACHE / "kuake_qtr"
    splits = query_splits(data, seed)
    corpus = load_corpus(data / "corpus.jsonl")
    docs = list(corpus.values())
    row = {d.id: i for i, d in enumerate(docs)}
    pseudo_texts = [d.text for d in docs]
    llm = "smollm2-135m"
    d4 = _cached(
        c / "docs_L4.npy", lambda: _encode_d(load_tower(llm, "document", num_layers=4, dim=None, pooling="mean"), docs)
    )
    t4 = lambda: load_tower(llm, "query", num_layers=4, dim=None, pooling="mean")  # noqa: E731
    t1 = lambda: load_tower(llm, "query", num_layers=1, dim=None, pooling="mean")  # noqa: E731
    q4 = _by_split(c / "queries_q4.npy", t4, data, {"train": splits["train"]})["train"]
    # the teacher labels a seeded 10,000 of the corpus texts (the recipe's qkd_corpus_texts);
    # the student encodes all of them (pseudo-queries for the routers)
    sub = np.sort(np.random.default_rng(seed).permutation(len(pseudo_texts))[:10_000])
    p4 = _cached(c / "pseudo10k_q4.npy", lambda: _encode_q(t4(), [pseudo_texts[i] for i in sub]))
    small = _by_split(c / "queries_q1.npy", t1, data, splits)
    small["pseudo"] = _cached(c / "pseudo_q1.npy", lambda: _encode_q(t1(), pseudo_texts))
    qrow = {q: i for i, q in enumerate(splits["train"])}
    qrels = load_qrels(data / "qrels" / "train.tsv")
    pairs = np.array([(qrow[q], row[d]) for q in splits["train"] for d, g in qrels[q].items() if g > 0 and d in row])
    fq, fd = infonce_heads(q4, d4, pairs, seed=seed)
    teacher_train, teacher_pseudo = fq(q4), fq(p4)
    towers = (
        "smollm2-135m first 4 layers, mean pooling, frozen + document head (InfoNCE-fitted here on training "
        "pairs, 576-d)",
        "smollm2-135m first layer, mean pooling + linear head (ridge fit to the 4-layer tower's query-head "
        "vectors on training queries + corpus texts)",
        f"corpus texts encoded by the query tower ({len(pseudo_texts)})",
    )
    return _student_set(
        "kuake_qtr",
        fd(d4),
        small,
        np.concatenate([small["train"], small["pseudo"][sub]]),
        np.concatenate([teacher_train, teacher_pseudo]),
        towers,
        docs,
        splits,
        data,
    )


def from_run(name: str, run: Path, seed: int = 0) -> TowerSet:
    """The towers of a finished quick-start / ``benchmarks.recipe`` run on ``name``: documents = the
    chosen teacher's document vectors (what the run's index holds, ``doc_embeddings.npy``), queries =
    the chosen student's vectors at the index's width (``student_vectors``, as the service encodes
    them); pseudo-queries as the stand-ins' (ICT on SciFact, corpus texts on KUAKE-QTR)."""
    from scalingnote.data.beir import load_corpus
    from scalingnote.models import load_tower
    from scalingnote.quickstart.index_choice import student_vectors

    ch = json.loads((run / "results.json").read_text(encoding="utf-8"))["choices"]
    teacher = Path(ch["teacher"]["dir"])
    cand = chosen_student(ch)
    docs = _norm(np.load(teacher / "doc_embeddings.npy"))
    ids = json.loads((teacher / "doc_ids.json").read_text(encoding="utf-8"))
    data = shared_data_dir() / name
    splits = query_splits(data, seed)
    pseudo_texts = (
        _ict_texts(name, data, seed)
        if name == "scifact"
        else [d.text for d in load_corpus(data / "corpus.jsonl").values()]
    )
    tower = load_tower(cand["dir"])
    q_ids, q_texts = _all_queries(data)
    allq = student_vectors(tower, q_texts, docs.shape[1])
    row = {q: i for i, q in enumerate(q_ids)}
    queries = {s: allq[[row[q] for q in qids]] for s, qids in splits.items()}
    towers = (
        f"the run's teacher: {ch['teacher']['family']} ({teacher.name}, {docs.shape[1]}-d; {run})",
        f"the run's chosen student: {cand['name']} ({cand['dir']})",
        f"{'ICT pseudo-queries' if name == 'scifact' else 'corpus texts'} encoded by the student ({len(pseudo_texts)})",
    )
    return TowerSet(
        name,
        docs,
        queries,
        student_vectors(tower, pseudo_texts, docs.shape[1]),
        *towers,
        ids,
        splits,
        _test_qrels(data),
    )


if __name__ == "__main__":  # warm the caches: python -m benchmarks._ood_towers
    for make in (scifact, kuake):
        t = make()
        mq, md = t.queries["test"].mean(0), t.docs.mean(0)
        cos = float(mq @ md / np.linalg.norm(mq) / np.linalg.norm(md))
        print(
            t.name,
            t.docs.shape,
            {k: v.shape for k, v in t.queries.items()},
            t.pseudo.shape,
            f"cos(mean q, mean d) {cos:.3f}",
            flush=True,
        )
