"""`data build`: one-hop + multi-hop triplets, dedup, split, leakage check, outputs."""

from __future__ import annotations

import json
import warnings

import pytest
import yaml
from typer.testing import CliRunner

from scalingnote.data import Document, Query, load_triplets, write_corpus, write_qrels, write_queries
from scalingnote.data.build import BuildConfig, build_triplets, load_build_config, run_build
from scalingnote.errors import ConfigError, DataError

QUERIES = {
    "q1": "apple pie recipe",
    "q2": "apple pie crust",
    "q3": "banana bread",
    "q4": "bread banana",
    "q5": "Apple  Pie!!",  # same normalised text as the evaluation query qe
    "q6": "cherry tart",  # its id is an evaluation id
    "qe": "apple pie",
}
# Hand-made planner scores (the planner is pluggable): see the expected associations below.
SCORES = {
    "apple pie recipe": {"apple": 1.0, "pie": 0.9, "recipe": 0.3},
    "apple pie crust": {"crust": 1.0, "apple": 0.9, "pie": 0.8},
    "banana bread": {"banana": 1.0, "bread": 0.9},
    "bread banana": {"bread": 1.0, "banana": 0.95},
    "Apple  Pie!!": {"apple": 1.0, "pie": 1.0},
    "cherry tart": {"cherry": 1.0, "tart": 0.7},
}
CLICKS = [
    # q1: clicks d1, sees d2
    ("q1", "d1", 1, 1),
    ("q1", "d2", 2, 0),
    # q2: clicks d1 and d3, sees d2
    ("q2", "d1", 1, 1),
    ("q2", "d2", 2, 0),
    ("q2", "d3", 3, 1),
    # leaked queries
    ("q5", "d1", 1, 1),
    ("q5", "d2", 2, 0),
    ("q6", "d9", 1, 1),
]
RELEVANCE = [
    ("q3", "d5", 0.9), ("q3", "d6", 0.8), ("q3", "d7", 0.7),
    ("q4", "d8", 0.95), ("q4", "d9", 0.5), ("q4", "d10", 0.4),
    ("q6", "d1", 0.9),
]  # fmt: skip


def planner(text: str) -> dict[str, float]:
    return SCORES[text]


@pytest.fixture()
def logs(tmp_path):
    write_queries(tmp_path / "queries.jsonl", [Query(q, t) for q, t in QUERIES.items()])
    write_corpus(tmp_path / "corpus.jsonl", [Document(f"d{i}", f"title {i}", "", f"text {i}") for i in range(1, 11)])
    with open(tmp_path / "clicks.tsv", "w") as fh:
        fh.write("query_id\tdoc_id\tposition\tclicked\n")
        fh.writelines(f"{q}\t{d}\t{p}\t{c}\n" for q, d, p, c in CLICKS)
    with open(tmp_path / "relevance.tsv", "w") as fh:
        fh.writelines(f"{q}\t{d}\t{s}\n" for q, d, s in RELEVANCE)
    write_qrels(tmp_path / "eval_qrels.tsv", {"qe": {"d1": 1}, "q6": {"d9": 1}})
    return tmp_path


def _cfg(root, **kw) -> BuildConfig:
    base = {
        "queries": "queries.jsonl",
        "corpus": "corpus.jsonl",
        "click_log": "clicks.tsv",
        "relevance_log": "relevance.tsv",
        "out": "out",
        "relevance": {"skip_top_k": 1, "top_t": 3},
        "association": {"th_click": 0.5, "th_rel": 0.5},
        "leakage": {"qrels": ["eval_qrels.tsv"]},
    }
    for k, v in kw.items():
        base[k] = {**base[k], **v} if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return load_build_config(base, base_dir=root)


def _by_source(triplets):
    out: dict[str, set] = {}
    for t in triplets:
        out.setdefault(t.source, set()).add((t.query_id, t.pos_id, t.neg_id))
    return out


def test_sources_directions_and_dedup(logs):
    with pytest.warns(UserWarning, match="dropped 2 logged queries"):
        res = build_triplets(_cfg(logs), planner=planner)
    got = _by_source(res.train + res.validation)
    assert got["click_one_hop"] == {("q1", "d1", "d2"), ("q2", "d1", "d2"), ("q2", "d3", "d2")}
    # ClickA_{q1<-q2} holds (q1's top-2 apple, pie are important in q2), ClickA_{q2<-q1} does not
    # ('crust' is absent from q1): q1 receives q2's click pairs, never the reverse. (q1, d1, d2)
    # is already a one-hop triplet and is de-duplicated.
    assert got["click_multi_hop"] == {("q1", "d3", "d2")}
    # relevance one-hop: top-1 positive, negative from ranks 2..3
    rel1 = got["relevance_one_hop"]
    assert {(q, p) for q, p, _ in rel1} == {("q3", "d5"), ("q4", "d8")}
    assert all(n in ({"d6", "d7"} if q == "q3" else {"d9", "d10"}) for q, _, n in rel1)
    # RelA(q3, q4) holds: relevance pairs flow both ways
    relm = got["relevance_multi_hop"]
    assert {(q, p) for q, p, _ in relm} == {("q3", "d8"), ("q4", "d5")}
    assert res.stats["removed"]["duplicates"] == 1
    assert res.stats["association"]["click_associations"] >= 1
    assert res.stats["sources"]["click_multi_hop"]["triplets"] == 1
    assert res.stats["sources_before_dedup"]["click_multi_hop"]["triplets"] == 2


def test_leaked_queries_are_dropped_and_counted(logs):
    with pytest.warns(UserWarning, match="evaluation queries"):
        res = build_triplets(_cfg(logs), planner=planner)
    qids = {t.query_id for t in res.train + res.validation}
    assert "q5" not in qids and "q6" not in qids  # q5: same text as qe; q6: an evaluation id
    lk = res.stats["leakage"]
    assert (lk["leaked_queries"], lk["leaked_by_id"], lk["leaked_by_text"]) == (2, 1, 1)
    assert lk["dropped_click_records"] == 3 and lk["dropped_relevance_records"] == 1


def test_leak_can_be_an_error_naming_the_log_line(logs):
    with pytest.raises(DataError) as ei:
        build_triplets(_cfg(logs, leakage={"on_leak": "error"}), planner=planner)
    e = ei.value
    assert e.path.endswith("clicks.tsv") and e.field == "query_id"
    assert e.line == 7  # header + 5 rows, then the first q5 row
    assert "evaluation query" in str(e)


def test_text_check_can_be_disabled(logs):
    with pytest.warns(UserWarning, match="dropped 1 "):
        res = build_triplets(_cfg(logs, leakage={"check_text": False}), planner=planner)
    assert "q5" in {t.query_id for t in res.train + res.validation}


def test_split_by_query_is_disjoint_seeded_and_complete(logs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = build_triplets(_cfg(logs), planner=planner)
        b = build_triplets(_cfg(logs), planner=planner)
    tq, vq = {t.query_id for t in a.train}, {t.query_id for t in a.validation}
    assert tq and vq and not tq & vq
    assert a.train == b.train and a.validation == b.validation
    assert a.stats["split"]["validation"]["queries"] == len(vq)


def test_outputs_written_atomically_with_config_and_versions(logs):
    cfg = _cfg(logs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = run_build(cfg, planner=planner)
    out = logs / "out"
    assert sorted(p.name for p in out.iterdir()) == [
        "config.yaml",
        "run.json",
        "stats.json",
        "train.jsonl",
        "validation.jsonl",
    ]
    assert load_triplets(out / "train.jsonl") == res.train
    assert load_triplets(out / "validation.jsonl") == res.validation
    stats = json.loads((out / "stats.json").read_text())
    assert set(stats["sources"]) == {"click_one_hop", "click_multi_hop", "relevance_one_hop", "relevance_multi_hop"}
    run = json.loads((out / "run.json").read_text())
    assert "torch" in run["versions"] and run["config"]["seed"] == 0
    again = load_build_config(out / "config.yaml")  # the resolved config loads back
    assert again == cfg


def test_idf_planner_default_and_custom_factory(logs, tmp_path, monkeypatch):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = build_triplets(_cfg(logs))  # built-in IDF planner
    assert res.stats["sources"]["click_one_hop"]["triplets"] == 3
    (tmp_path / "my_planner_mod.py").write_text(
        "def make(texts):\n    return lambda text: {w: 1.0 for w in text.lower().split()}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = build_triplets(_cfg(logs, association={"planner": {"factory": "my_planner_mod:make"}}))
    assert res.stats["association"]["queries"] == 4
    with (
        pytest.raises(ConfigError, match=r"association\.planner\.factory.*no_such_module_xyz"),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        build_triplets(_cfg(logs, association={"planner": {"factory": "no_such_module_xyz:make"}}))


def test_config_errors_name_the_key(tmp_path):
    p = tmp_path / "b.yaml"
    p.write_text(
        yaml.safe_dump(
            {"queries": "q.jsonl", "out": "o", "click_log": "c.tsv", "relevance": {"skip_top_k": 9, "top_t": 3}}
        )
    )
    with pytest.raises(ConfigError) as ei:
        load_build_config(p)
    assert "relevance" in str(ei.value)
    p.write_text(yaml.safe_dump({"queries": "q.jsonl", "out": "o"}))
    with pytest.raises(ConfigError, match="click_log"):
        load_build_config(p)
    p.write_text(yaml.safe_dump({"queries": "q.jsonl", "out": "o", "click_log": "c", "association": {"th_clik": 0.3}}))
    with pytest.raises(ConfigError, match="th_clik"):
        load_build_config(p)


def test_unknown_ids_in_logs_are_rejected(logs):
    with open(logs / "clicks.tsv", "a") as fh:
        fh.write("q1\tnot_a_doc\t4\t0\n")
    with pytest.raises(DataError) as ei:
        build_triplets(_cfg(logs), planner=planner)
    assert ei.value.field == "doc_id" and ei.value.line == len(CLICKS) + 2


def test_cli_build(logs):
    import typer

    from scalingnote.cli.data import register

    app = typer.Typer()
    register(app)
    cfg = {
        "queries": "queries.jsonl",
        "corpus": "corpus.jsonl",
        "click_log": "clicks.tsv",
        "relevance_log": "relevance.tsv",
        "out": "out_cli",
        "leakage": {"qrels": ["eval_qrels.tsv"]},
    }
    (logs / "build.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.warns(UserWarning, match="evaluation queries"):
        r = CliRunner().invoke(app, ["data", "build", "--config", str(logs / "build.yaml")])
    assert r.exit_code == 0, r.output
    assert (logs / "out_cli" / "train.jsonl").exists() and (logs / "out_cli" / "stats.json").exists()


def test_example_config_loads():
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "configs" / "data_build.example.yaml"
    cfg = load_build_config(path)
    assert cfg.relevance.top_t == 30 and cfg.association.planner.normalize == "max"
    assert cfg.out.is_absolute() and cfg.out.name == "triplets"
