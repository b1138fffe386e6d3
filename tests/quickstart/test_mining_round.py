"""Issue #50 in the quick start: a second Stage I round on negatives the teacher mines itself, kept
only when it validates above the first; the students and the teacher family's matched-cost rows
follow the winner; the budget plans it and skips it with a reason; ``mining_round: off`` leaves
every step of a run without it untouched (tiny random models)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import yaml

import scalingnote.quickstart.mining_round as MR
from scalingnote.errors import ConfigError
from scalingnote.quickstart import QuickstartConfig, quickstart
from scalingnote.quickstart.budget import Sizes, make_plan
from scalingnote.quickstart.config import family
from scalingnote.training.evaluate import heldout_queries
from tests.quickstart.test_quickstart import _cfg as _base_cfg


def _cfg(tiny_models, out, **over):
    """test_quickstart's tiny run, one family, with the mining round on (small window, one guard rule)."""
    mining = dict(
        families=["bert"],
        qkd_corpus_texts=100,
        compare="teacher",
        qkd_rank_weights=[1.0],
        full_dim=False,
        mining_round="on",
        mining_num_negatives=2,
        mining_window=[2, 30],
        mining_guard=["agree_top"],
    )  # near_positive drops every candidate of a random tiny tower (its scores are all alike)
    return _base_cfg(tiny_models, out, **{**mining, **over})


def _steps(out: Path) -> dict[str, str]:
    return {
        str(m.parent.relative_to(out)): json.loads(m.read_text())["digest"]
        for m in out.glob("**/DONE")
        if m.parent.relative_to(out).parts[0] not in ("proxy", "index", "plan") and "checkpoints" not in m.parts
    }  # the plan is made again: the round is another setting


def _prefer(round_: str, monkeypatch):
    """Validation that prefers ``round_`` ("round1" / "round2") by a clear lead: the real scores,
    with 0.5 added to the preferred round's validation nDCG@10 (the keep rule's input, nothing else)."""
    real = MR.score

    def score(pool, qdir, ddir, ev):
        sc = real(pool, qdir, ddir, ev)
        is_r2 = "_mined_" in Path(ddir).name
        return (
            dataclasses.replace(sc, val_ndcg=sc.val_ndcg + 0.5) if is_r2 == (round_ == "round2") else sc
        )  # a copy: the pool caches scores

    monkeypatch.setattr(MR, "score", score)


@pytest.fixture(scope="module")
def off_run(tiny_models, tmp_path_factory):
    out = tmp_path_factory.mktemp("qs_mining") / "off"
    quickstart(_cfg(tiny_models, out, mining_round="off"))
    return out


def test_off_is_no_phase_and_no_step_and_the_plan_says_why(off_run):
    res = json.loads((off_run / "results.json").read_text())
    ch = res["choices"]["mining_round"]
    assert ch == {"tried": False, "kept": False, "reason": "mining_round: off in the config"}
    assert "mining_round" not in res["phase_seconds"]
    assert res["choices"]["budget"]["phases"]["mining_round"]["note"] == "off: mining_round: off in the config"
    assert not any("_mined" in p or p.startswith(("mining_round", "mined_negatives")) for p in _steps(off_run))
    assert not (off_run / "mined_negatives").exists()


def test_a_kept_round_teaches_and_the_matched_cost_rows_train_on_the_one_mined_set(
    off_run, tiny_models, tmp_path, monkeypatch, capsys
):
    out = tmp_path / "run"
    shutil.copytree(off_run, out)
    before = {m: m.stat().st_mtime_ns for m in out.glob("**/DONE")}
    _prefer("round2", monkeypatch)
    rows = quickstart(_cfg(tiny_models, out))
    log = capsys.readouterr().out
    assert all(
        m.stat().st_mtime_ns == t for m, t in before.items() if not {"index", "plan"} & set(m.parts)
    )  # round 1's steps untouched (the plan is made again: the round is another setting)
    res = json.loads((out / "results.json").read_text())
    ch = res["choices"]["mining_round"]
    assert ch["tried"] and ch["kept"] and ch["val_round2"] > ch["val_round1"] and "kept, it teaches" in ch["reason"]
    assert ch["reason"] in log and "mining_round" in res["phase_seconds"]
    r2 = Path(ch["round2_dir"])
    assert r2.parent == out / "stage1" and "_mined_" in r2.name and res["choices"]["teacher"]["dir"] == str(r2)
    # round 2 = the teacher's config again, on 2 negatives per example mined by round 1's towers, guarded
    cfg1 = _yaml(Path(ch["round1_dir"]) / "config.yaml")
    cfg2 = _yaml(r2 / "config.yaml")
    assert cfg2["data"]["negatives"] == "dense" and cfg2["data"]["num_negatives"] == 2
    assert cfg2["data"]["mining"]["tower"] == ch["round1_dir"] and cfg2["data"]["mining"]["guard"] == ["agree_top"]
    # ... with the mined negatives in the Eq. 5 denominators (mining_hard_in_denominator: true), nothing else changed
    assert (
        cfg2["loss"]["hard_in_denominator"]
        and not cfg1["loss"]["hard_in_denominator"]
        and ch["settings"]["loss"] == {"hard_in_denominator": True}
    )
    assert cfg2["loss"] == {**cfg1["loss"], "hard_in_denominator": True}
    same = ("data", "output_dir", "loss")
    assert {k: v for k, v in cfg2.items() if k not in same} == {k: v for k, v in cfg1.items() if k not in same}
    # the mined set: exported in the `data build` triplet format, one line per negative, with the audit beside the run
    trip = [json.loads(x) for x in Path(ch["triplets"]).read_text().splitlines()]
    assert trip and set(trip[0]) >= {"query_id", "pos_id", "neg_id", "source"}
    a = ch["audit"]
    assert (
        len(trip) == 2 * (a["examples"] - a["examples_without_negative"]) + a["examples_without_negative"]
        and a["kept"] > 0
    )
    assert Path(ch["audit_file"]).exists() and ch["mining_seconds"] >= 0
    assert a["document_embeddings"] == "stored"  # round 1's own corpus embeddings, no second pass over the corpus
    # the validation queries are held out exactly as in round 1: never a mined training query
    val = {json.loads(x)["query_id"] for x in (out / "data" / "triplets" / "validation.jsonl").read_text().splitlines()}
    assert val and not val & {t["query_id"] for t in trip}
    train_q = {ln.split("\t")[0] for ln in (Path(ch["data_dir"]) / "qrels" / "train.tsv").read_text().splitlines()[1:]}
    assert not val & train_q
    # the students are distilled from the winner, under new step names
    st = res["choices"]["student"]
    assert st["chosen"].endswith("_from_bert_mined_rw1")
    qkd = json.loads((out / "qkd" / st["chosen"] / "run.json").read_text())
    assert Path(qkd["config"]["teacher"]) == r2
    # the teacher family's matched-cost rows train on the same mined set (one cache entry, read by every run)
    small = [
        d
        for d in (out / "stage1").iterdir()
        if ("_small_dual_" in d.name or "_scaling_doc_" in d.name) and d.name.endswith("_mined")
    ]
    assert len(small) == 2
    caches = {json.loads((d / "run.json").read_text())["metrics"]["mining"]["cache"] for d in [*small, r2]}
    assert all(_yaml(d / "config.yaml")["loss"]["hard_in_denominator"] for d in small)  # and with the round's loss
    assert caches == {str(Path(ch["triplets"]).parent)} and len(list((out / "mined_negatives").iterdir())) == 1
    comp = {r["method"]: r for r in rows if r.get("family") == "bert"}
    assert "teacher" in comp["scaling_dual"]["chosen"] and comp["scaling_dual_round1"]["note"].startswith(
        "the first round"
    )


def test_a_round_that_does_not_validate_higher_is_dropped_and_nothing_else_changes(
    off_run, tiny_models, tmp_path, monkeypatch
):
    out = tmp_path / "run"
    shutil.copytree(off_run, out)
    before = _steps(out)
    stamps = {m: m.stat().st_mtime_ns for m in out.glob("**/DONE")}
    _prefer("round1", monkeypatch)
    rows = quickstart(_cfg(tiny_models, out))
    res = json.loads((out / "results.json").read_text())
    ch = res["choices"]["mining_round"]
    assert ch["tried"] and not ch["kept"] and ch["val_round2"] <= ch["val_round1"] and "keeping round 1" in ch["reason"]
    assert res["choices"]["teacher"]["dir"] == ch["round1_dir"]
    # every step of the run without the round was reused as it was (same digests, not redone);
    # the new ones are the round's
    assert all(m.stat().st_mtime_ns == t for m, t in stamps.items() if "plan" not in m.parts)
    after = _steps(out)
    assert {k: after[k] for k in before} == before
    mined = str(
        Path(ch["triplets"]).parent.relative_to(out)
    )  # the cache entry: mined_negatives/<key of towers + settings>
    assert {k for k in after if k not in before} == {
        str(Path(ch["round2_dir"]).relative_to(out)),
        "mining_round/data",
        mined,
    }
    assert next(r for r in rows if r["method"] == "scaling_dual_round2_mined")["val_ndcg@10"] is not None


def test_on_a_beir_set_round_two_mines_the_qrels_pairs_and_holds_out_the_same_validation_queries(
    off_run, tiny_models, tmp_path
):
    beir = tmp_path / "beir"
    shutil.copytree(
        off_run / "data", beir, ignore=shutil.ignore_patterns("DONE", "STEP_INPUTS.json", "triplets", "logs")
    )
    out = tmp_path / "run"
    quickstart(_cfg(tiny_models, out, data=str(beir)))
    ch = json.loads((out / "results.json").read_text())["choices"]["mining_round"]
    assert ch["tried"] and ch["data_dir"] == str(beir) and not (out / "mining_round").exists()
    r1, r2 = Path(ch["round1_dir"]), Path(ch["round2_dir"])
    cfg2 = _yaml(r2 / "config.yaml")["data"]
    assert cfg2["data_dir"] == str(beir) and cfg2["triplets"] is None and cfg2["negatives"] == "dense"
    # the same held-out split (by query, seeded) as the run it repeats: the keep rule compares like with like
    assert cfg2["mining"]["tower"] == str(r1) and Path(ch["repeats"]).parent == out / "stage1"
    assert heldout_queries(r2) == heldout_queries(Path(ch["repeats"])) == heldout_queries(r1)
    assert ch["audit"]["queries"] == len(
        {ln.split("\t")[0] for ln in (beir / "qrels" / "train.tsv").read_text().splitlines()[1:]}
    )


def test_the_budget_plans_the_round_and_a_short_budget_skips_it_with_a_reason():
    cfg = QuickstartConfig(out="unused", budget_minutes=600)
    fams = {f: family(cfg, f) for f in cfg.families}
    s = Sizes(docs=1500, doc_tokens=110, train_examples=2000, train_queries=550, val_queries=60)
    roomy = make_plan(cfg, fams, s, ("bert", 2))
    assert roomy.mining and roomy.phases["mining_round"] > 10 and "mining_round" in roomy.text()
    assert MR.go_now(cfg, roomy, {"data": 1.0}, 1.0, 60)[0]
    short_cfg = QuickstartConfig(out="unused", budget_minutes=1)
    short = make_plan(short_cfg, fams, s, ("bert", 2))
    assert not short.mining and short.skipped[1].startswith("the mining round (planned ")  # after the comparison runs
    go, why = MR.go_now(short_cfg, short, {"data": 1.0}, 1.0, 60)
    assert not go and why.startswith("skipped (budget)") and "--budget-minutes" in why
    assert "mining_round off: cut to hold the budget" in short.text()
    # the plan held it, but the run fell behind: cut late, with the minutes in the reason
    go, why = MR.go_now(
        QuickstartConfig(out="unused", budget_minutes=600), roomy, {"stage1_large_towers": 600 * 60.0}, 2.0, 60
    )
    assert not go and "at this run's pace" in why and not roomy.mining and roomy.skipped[-1] in why
    # --full and mining_round: on always try it; off never; no validation queries: nothing to decide it on
    full = QuickstartConfig(out="unused", full=True)
    assert make_plan(full, fams, s, ("bert", 2)).mining
    on = QuickstartConfig(out="unused", budget_minutes=1, mining_round="on")
    p = make_plan(on, fams, s, ("bert", 2))
    assert p.mining and MR.go_now(on, p, {"stage1_large_towers": 3600.0}, 3.0, 60)[0]
    assert not MR.go_now(on, p, {}, 1.0, 0)[0]
    off = QuickstartConfig(out="unused", mining_round="off")
    p = make_plan(off, fams, s, ("bert", 2))
    assert not p.mining and p.phases["mining_round"] == 0 and not MR.go_now(off, p, {}, 1.0, 60)[0]


def test_bad_mining_settings_name_their_field():
    for bad, field in (
        ({"mining_round": "maybe"}, "mining_round"),
        ({"mining_window": [100, 10]}, "mining_window"),
        ({"mining_guard": ["nearby"]}, "mining_guard"),
        ({"mining_num_negatives": 0}, "mining_num_negatives"),
        ({"mining_negatives": "bm25"}, "mining_negatives"),
        ({"mining_hard_in_denominator": "yes"}, "mining_hard_in_denominator"),
    ):
        with pytest.raises(ConfigError, match=field):
            QuickstartConfig(out="x", **bad)
    # YAML (a config file, `--set mining_round=on`) reads a bare on / off as a boolean
    assert [QuickstartConfig(out="x", mining_round=v).mining_round for v in (True, False)] == ["on", "off"]


def _yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())
