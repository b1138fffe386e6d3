"""The model card (``README.md``) of an exported tower, as sentence-transformers writes one: YAML
metadata (library, base model, tags), the model's details, how to load and use it, what it was
trained on and the choices its run made, and its evaluation (nDCG@10 on the run's test queries,
its retention of the teacher's nDCG@10 and its speed-up over the teacher's query tower, where the
run measured them).

What the card says of the run comes from the quick start's ``results.json`` when the tower sits
in a quick start's (or recipe's) output directory (``<out>/qkd/<student>/query_tower``,
``<out>/stage1/<run>/{query,doc}_tower``); a tower elsewhere gets a card without them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from scalingnote.utils.io import relocated

CARD = "README.md"


def _same(a: str | Path, b: Path) -> bool:
    try:
        return Path(a).resolve() == b.resolve()
    except OSError:
        return False


def find_run(tower_dir: str | Path, max_up: int = 4) -> dict[str, Any] | None:
    """What the quick start whose output holds ``tower_dir`` says of it: ``results.json`` in one
    of its ``max_up`` parent directories whose chosen student, teacher or a candidate is this
    tower. Returns ``{"results": ..., "role": "student" | "teacher" | "candidate", "name": ...}``
    or None (no such run, or an unreadable ``results.json``)."""
    tower_dir = Path(tower_dir)
    for root in list(tower_dir.resolve().parents)[:max_up]:
        f = root / "results.json"
        if not f.is_file():
            continue
        try:
            res = json.loads(f.read_text(encoding="utf-8"))
            ch = res["choices"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        student = ch.get("student") or {}
        for c in student.get("candidates") or []:
            if _same(relocated(c.get("dir", ""), root), tower_dir):
                return {
                    "results": res,
                    "role": "student" if c.get("name") == student.get("chosen") else "candidate",
                    "name": c.get("name"),
                    "candidate": c,
                    "root": root,
                }
        teacher = ch.get("teacher") or {}
        if teacher.get("dir") and _same(relocated(teacher["dir"], root), tower_dir.parent):
            return {"results": res, "role": "teacher", "name": Path(teacher["dir"]).name, "root": root}
        return None
    return None


def _row(rows: list[dict[str, Any]], chosen: str) -> dict[str, Any] | None:
    """The results-table row chosen as ``chosen`` (``student``, ``teacher``, ``served``: one of the
    ``+``-joined choices)."""
    return next((r for r in rows if chosen in str(r.get("chosen") or "").split("+")), None)


def evaluation(run: dict[str, Any]) -> dict[str, Any]:
    """The card's figures from a run (:func:`find_run`): the tower's nDCG@10 and R@100 on the
    run's test queries, the teacher's, the retention (student / teacher nDCG@10) and the speed-up
    (student / teacher query tower, queries per second on the run's machine), each None where the
    run did not measure it."""
    rows = run["results"].get("rows") or []
    own = (
        _row(rows, "student")
        if run["role"] == "student"
        else _row(rows, "teacher")
        if run["role"] == "teacher"
        else None
    )
    teacher = _row(rows, "teacher")
    out: dict[str, Any] = {
        "ndcg@10": None,
        "r@100": None,
        "teacher_ndcg@10": None,
        "retention": None,
        "speedup": None,
        "served_ndcg@10": None,
        "test_queries": None,
    }
    if own is not None:
        out["ndcg@10"], out["r@100"] = own.get("ndcg@10"), own.get("r@100")
    if teacher is not None and run["role"] == "student":
        out["teacher_ndcg@10"] = teacher.get("ndcg@10")
        if own is not None and own.get("ndcg@10") is not None and teacher.get("ndcg@10"):
            out["retention"] = own["ndcg@10"] / teacher["ndcg@10"]
        if own is not None and own.get("query_qps") and teacher.get("query_qps"):
            out["speedup"] = own["query_qps"] / teacher["query_qps"]
    served = _row(rows, "served")
    if served is not None and run["role"] == "student":
        out["served_ndcg@10"] = served.get("ndcg@10")
    return out


def _fmt(x: Any, spec: str = ".4f") -> str:
    return "not measured" if x is None else format(x, spec)


def _front_matter(identity: dict[str, Any], fmt: str) -> list[str]:
    base = Path(str(identity.get("base_model") or "unknown")).name
    tags = ["scalingnote", "dense-retrieval", "sentence-similarity", "feature-extraction"]
    lib = "sentence-transformers" if fmt == "sentence-transformers" else "onnx"
    if fmt == "sentence-transformers":
        tags.insert(0, "sentence-transformers")
    return [
        "---",
        f"library_name: {lib}",
        f"base_model: {base}",
        "pipeline_tag: sentence-similarity",
        "tags:",
        *[f"- {t}" for t in tags],
        "---",
        "",
    ]


def _usage(identity: dict[str, Any], fmt: str, out_name: str) -> list[str]:
    role = identity.get("role")
    if fmt == "sentence-transformers":
        encode = "model.encode_query" if role == "query" else "model.encode_document"
        return [
            "```python",
            "from sentence_transformers import SentenceTransformer",
            "",
            f'model = SentenceTransformer("{out_name}")  # this directory',
            "vectors = "
            f'{encode}(["{"what causes fractures?" if role == "query" else "a document title and its text"}"])',
            f"print(vectors.shape)  # ({1}, {identity.get('out_dim')}), unit length: the dot product is the cosine",
            "```",
        ]
    return [
        "```python",
        "import onnxruntime as ort",
        "from tokenizers import Tokenizer",
        "",
        f'tok = Tokenizer.from_file("{out_name}/tokenizer.json")',
        f'session = ort.InferenceSession("{out_name}/model.onnx")  # model_int8.onnx where exported',
        f'enc = tok.encode("{"what causes fractures?" if role == "query" else "a document title and its text"}")',
        'vec = session.run(None, {"input_ids": [enc.ids], "attention_mask": [enc.attention_mask]})[0]',
        "```",
        "",
        "Or serve it: `scalingnote serve --index <index> --query-tower <tower> --query-backend onnx --onnx-model "
        f"{out_name}`.",
    ]


def _training(run: dict[str, Any] | None) -> list[str]:
    if run is None:
        return ["Not exported from a quick start's output: its training data and choices are not recorded here."]
    res, ch = run["results"], run["results"].get("choices") or {}
    cfg = res.get("config") or {}
    data = cfg.get("data")
    source = (
        "the synthetic note-search log generated by the quick start"
        if not data
        else f"the BEIR directory `{Path(data).name}`"
    )
    lines = [f"- Data: {source} (choices made on validation queries held out from its training split)"]
    teacher = ch.get("teacher") or {}
    fams = ch.get("families") or {}
    if teacher.get("family"):
        model = (fams.get(teacher["family"]) or {}).get("model")
        lines.append(
            f"- Teacher (large dual tower, Stage I): the {teacher['family']} family"
            + (f" (`{Path(str(model)).name}`)" if model else "")
            + f": {teacher.get('reason', '')}"
        )
    student = ch.get("student") or {}
    if run["role"] in ("student", "candidate"):
        c = run.get("candidate") or {}
        lines.append(
            f"- This tower: the QKD student `{run['name']}` ({c.get('layers')} layers, listwise weight "
            f"{c.get('rank_weight')}; validation nDCG@10 {_fmt(c.get('val'))}, "
            f"single-query p99 {_fmt(c.get('p99_ms'), '.2f')} ms)"
        )
        if student.get("reason"):
            lines.append(f"- Student chosen: `{student.get('chosen')}`: {student['reason']}")
    served = ch.get("served") or {}
    if served.get("choice"):
        lines.append(f"- Served default: {served['choice']} ({served.get('reason', '')})")
    created = res.get("created")
    if created:
        lines.append(f"- Run finished: {created} on {res.get('machine', 'an unnamed machine')}")
    return lines


def _evaluation(run: dict[str, Any] | None) -> list[str]:
    if run is None or run["role"] == "candidate":
        return (
            ["No test-set figures: the run's results table scores the chosen student and the teacher only."]
            if run
            else ["No test-set figures recorded for this tower."]
        )
    ev = evaluation(run)
    lines = [
        "On the run's own test queries (nDCG@10; retention = this tower / the teacher; speed-up = queries per second "
        "of this query tower / the teacher's, batch encoding on the run's machine):",
        "",
        "| metric | value |",
        "|---|---|",
        f"| nDCG@10 | {_fmt(ev['ndcg@10'])} |",
        f"| R@100 | {_fmt(ev['r@100'])} |",
    ]
    if run["role"] == "student":
        lines += [
            f"| teacher nDCG@10 | {_fmt(ev['teacher_ndcg@10'])} |",
            "| retention of the teacher | "
            f"{'not measured' if ev['retention'] is None else format(ev['retention'], '.1%')} |",
            "| speed-up over the teacher | "
            f"{'not measured' if ev['speedup'] is None else format(ev['speedup'], '.2f') + 'x'} |",
            f"| served configuration nDCG@10 | {_fmt(ev['served_ndcg@10'])} |",
        ]
    return lines


def model_card(
    identity: dict[str, Any],
    fmt: str,
    out: str | Path,
    tower_dir: str | Path | None = None,
    versions: dict[str, str] | None = None,
) -> str:
    """The card's Markdown for an export of the tower ``identity`` (its fingerprint, kind, role,
    pooling, base model, layers, dimensions) in format ``fmt`` to ``out``; ``tower_dir``: the
    saved tower it was exported from (its run, if any, gives the training and evaluation sections)."""
    run = find_run(tower_dir) if tower_dir is not None else None
    role = identity.get("role", "query")
    name = run["name"] if run else Path(str(out)).name
    base = Path(str(identity.get("base_model") or "unknown")).name
    other_tower = (
        "documents must be encoded by the matching document tower (the index it was served with)."
        if role == "query"
        else "queries are encoded by the matching query tower."
    )
    lines = _front_matter(identity, fmt)
    lines += [
        f"# {name}: scalingnote {role} tower ({fmt})",
        "",
        f"A {identity.get('kind')} {role} tower of scalingnote (LLM-scaled dense retrieval: a large LLM document "
        "tower and a small query tower distilled from it by query-side knowledge distillation), exported for use "
        "outside scalingnote. "
        f"It maps {'a query' if role == 'query' else 'a document'} to a {identity.get('out_dim')}-dimensional unit "
        f"vector; {other_tower}",
        "",
        "## Model details",
        "",
        f"- Base model: `{base}`, {identity.get('num_layers')} transformer layers kept",
        f"- Pooling: {identity.get('pooling')}; then a trained linear head and L2 normalisation",
        f"- Maximum sequence length: {identity.get('max_length')} tokens",
        f"- Output dimension: {identity.get('out_dim')} (Matryoshka prefixes: {identity.get('matryoshka_dims')}, "
        "re-normalised)",
        "- Similarity: dot product of unit vectors (cosine)",
        f"- Fingerprint: `{identity.get('fingerprint')}` (compatibility id `{identity.get('compat_id')}`)",
        "",
        "## Usage",
        "",
        *_usage(identity, fmt, Path(str(out)).name),
        "",
        "## Training",
        "",
        *_training(run),
        "",
        "## Evaluation",
        "",
        *_evaluation(run),
    ]
    if versions:
        lines += ["", "## Framework versions", "", *[f"- {k}: {v}" for k, v in sorted(versions.items())]]
    return "\n".join(lines) + "\n"


def write_model_card(
    directory: Path,
    identity: dict[str, Any],
    fmt: str,
    out: str | Path,
    tower_dir: str | Path | None = None,
    versions: dict[str, str] | None = None,
) -> Path:
    """Write :func:`model_card` to ``directory / README.md`` (the export's temporary directory,
    renamed into place with the rest)."""
    path = directory / CARD
    path.write_text(model_card(identity, fmt, out, tower_dir, versions), encoding="utf-8")
    return path
