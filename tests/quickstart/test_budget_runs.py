"""The budgeted quick start against the exhaustive one (``--full``) end to end on tiny models, the
CLI's budget options, and the benchmark rows that compare the two (``benchmarks/quickstart_budget.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalingnote.errors import ConfigError
from scalingnote.quickstart import QuickstartConfig, quickstart


# ----------------------------------------------------------------------------- budgeted vs exhaustive, end to end
def _tiny_cfg(tiny_models, out, **over):
    llm, bert = tiny_models
    base = dict(
        out=str(out),
        llm=llm,
        bert=bert,
        llm_depths=[1, 2],
        llm_small_layers=1,
        bert_small_layers=1,
        dim=32,
        synth_docs=160,
        synth_queries=80,
        steps=3,
        batch_size=4,
        qkd_epochs=1.0,
        qkd_batch_size=16,
        qkd_max_pseudo_queries=60,
        semantic_id_layers=2,
        query_max_length=16,
        doc_max_length=64,
        show_progress=False,
        head_lrs=[1e-3, 3e-3],
        compare="none",
        qkd_rank_weights=[0.0, 1.0],
        qkd_corpus_texts=200,
        proxy_min_docs=20,
        proxy_min_train_queries=5,
        mining_round="off",
    )  # the mining round: tests/quickstart/test_mining_round.py
    base.update(over)
    return QuickstartConfig(**base)


def _steps(out: Path) -> dict[str, str]:
    """Every full-data step of a run: its path under the run and the digest of its inputs ($OUT-relative)."""
    return {
        str(m.parent.relative_to(out)): json.loads(m.read_text())["digest"]
        for m in out.glob("**/DONE")
        if m.parent.relative_to(out).parts[0] not in ("proxy", "index") and "checkpoints" not in m.parts
    }  # a trainer's own markers hold absolute paths


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    from scalingnote.models import build_tiny_model

    root = tmp_path_factory.mktemp("qs_budget_models")
    return str(build_tiny_model(root / "llm", "llm", num_layers=2)), str(
        build_tiny_model(root / "bert", "bert", num_layers=2)
    )


def test_the_budgeted_run_trains_only_the_survivors_and_full_reuses_them(tiny_models, tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    quickstart(_tiny_cfg(tiny_models, out))
    log = capsys.readouterr().out
    res = json.loads((out / "results.json").read_text())
    ch = res["choices"]
    proxy, budget = ch["proxy"], ch["budget"]
    assert proxy["drawn"] and proxy["margin"] == 0.02 and proxy["data"]["docs"] < proxy["data"]["corpus_docs"]
    # every candidate was compared on the proxy; only the survivors ran on the whole corpus, each with both scores
    names = {(c["family"], c["depth"], c["head_lr"]) for c in proxy["candidates"] if c["dim"] == 32}
    assert names == {
        ("bert", None, 1e-3),
        ("bert", None, 3e-3),
        ("llm", 1, 1e-3),
        ("llm", 1, 3e-3),
        ("llm", 2, 1e-3),
        ("llm", 2, 3e-3),
    }
    full_dirs = {p.name for p in (out / "stage1").glob("*_large_*")}
    for c in proxy["candidates"]:
        name = f"{c['family']}_large_L{c['depth'] or 'all'}_hlr{c['head_lr']:g}" + (
            "" if c["dim"] == 32 else f"_d{c['dim']}"
        )
        assert (out / "proxy" / "stage1" / name / "DONE").exists()
        # a candidate that lost keeps its metrics only: no towers, checkpoints or embeddings
        assert (out / "proxy" / "stage1" / name / "run.json").exists()
        assert (out / "proxy" / "stage1" / name / "query_tower").exists() == c["survived"]
        assert not c["survived"] or (out / "proxy" / "stage1" / name / "doc_tower" / "tower.json").exists()
        assert (name in full_dirs) == c["survived"] and (c["full_val"] is not None) == c["survived"]
    assert any(not c["survived"] for c in proxy["candidates"]) and set(proxy["agreed"]) >= {"teacher"}
    # the students too: each listwise weight distilled for a fraction of QKD's step cap first, the survivors in full
    sp = ch["student"]["proxy"]
    assert (
        sp["steps"] == 150
        and set(sp["proxy_val"]) == {"bert1_from_bert_rw0", "bert1_from_bert_rw1"}
        and "within 0.02" in sp["reason"]
    )
    assert set(sp["full_val"]) == set(sp["kept"]) and ch["student"]["chosen"] in sp["kept"]
    assert all((out / "proxy" / "qkd" / n / "DONE").exists() for n in sp["proxy_val"])
    # the plan was printed before the proxy ran; planned vs spent per phase; the mining round's slot is off
    assert log.index("plan:") < log.index("phase proxy:") and "ETA" in log
    assert budget["budget_minutes"] == 8 and budget["phases"]["mining_round"]["note"].startswith("off")
    assert all(budget["phases"][k]["spent_s"] == v for k, v in res["phase_seconds"].items())
    assert list(res["phase_seconds"]) == [
        "data",
        "proxy",
        "stage1_large_towers",
        "stage2_students",
        "comparison_runs",
        "index",
        "evaluation",
    ]
    # a re-run goes on with the plan the run made (plan/): a plan made again from a re-run's few spent
    # seconds is roomier (here: another QKD step cap) and would redo the finished student and its index
    from scalingnote.quickstart import early

    every, made = {m: m.stat().st_mtime_ns for m in out.glob("**/DONE")}, []
    real = early.second_plan

    def roomier(*a, **k):
        made.append(1)
        plan = real(*a, **k)
        plan.qkd_steps, plan.skipped = 7, [*plan.skipped, "QKD steps 150 -> 7"]
        return plan

    monkeypatch.setattr(early, "second_plan", roomier)
    capsys.readouterr()
    quickstart(_tiny_cfg(tiny_models, out))
    assert made == [] and {m: m.stat().st_mtime_ns for m in out.glob("**/DONE")} == every
    assert "plan: the one this run made before" in capsys.readouterr().out
    monkeypatch.undo()
    # --full on the same directory: the budgeted run's full-data steps are reused untouched,
    # the dropped candidates run now (the plan is made again: --full is other settings)
    stamps = {m: m.stat().st_mtime_ns for m in out.glob("**/DONE") if not {"proxy", "plan"} & set(m.parts)}
    quickstart(_tiny_cfg(tiny_models, out, full=True))
    assert all(m.stat().st_mtime_ns == t for m, t in stamps.items())
    dropped = {
        f"{c['family']}_large_L{c['depth'] or 'all'}_hlr{c['head_lr']:g}"
        for c in proxy["candidates"]
        if not c["survived"] and c["dim"] == 32
    }
    assert dropped and all((out / "stage1" / d / "DONE").exists() for d in dropped)
    # and it makes exactly the steps (same names, same input digests) a --full run makes from nothing
    fresh = tmp_path / "fresh"
    quickstart(_tiny_cfg(tiny_models, fresh, full=True))
    assert _steps(out) == _steps(fresh)
    assert json.loads((fresh / "results.json").read_text())["choices"]["proxy"] is None
    # benchmarks.retention_interval scores the run's teacher and student again, as the run did (else it stops)
    from benchmarks.retention_interval import measure
    from benchmarks.served_spread import served_per_query  # ... and its served configuration from its parts

    kept, row = json.loads((fresh / "results.json").read_text())["choices"]["retention"], measure(fresh)
    assert row["retention_val"] == pytest.approx(kept["retention_val"], abs=2e-3) and row["test_queries"] > 1
    assert len(served_per_query(fresh, {})[0]) == row["test_queries"]  # it stops where the run's own row differs


def test_the_cli_takes_the_budget_and_full_and_refuses_a_bad_budget_before_any_work(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import scalingnote.cli.quickstart as cli_qs
    from scalingnote.cli import app

    seen = []
    monkeypatch.setattr(cli_qs, "quickstart", seen.append)  # the options as the pipeline receives them, not a run
    r = CliRunner().invoke(app, ["quickstart", "--out", str(tmp_path / "a"), "--budget-minutes", "12.5"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["quickstart", "--out", str(tmp_path / "b"), "--full"])
    assert r.exit_code == 0, r.output
    assert [(c.budget_minutes, c.full) for c in seen] == [(12.5, False), (8.0, True)]
    r = CliRunner().invoke(app, ["quickstart", "--out", str(tmp_path / "c"), "--budget-minutes", "-1"])
    assert isinstance(r.exception, ConfigError) and "budget_minutes" in str(r.exception)
    assert not (tmp_path / "c").exists()


def test_the_benchmark_row_compares_the_budgeted_run_with_the_exhaustive_one():
    from benchmarks.quickstart_budget import compare_modes

    same = {"machine": "2-core CPU", "scalingnote_version": "0.1.0"}
    rows = [
        {
            "set": "default",
            "mode": "budgeted",
            "pipeline_minutes": 7.1,
            "target_minutes": 8.0,
            "teacher": "bert",
            "teacher_dir": "x",
            "width": 384,
            "student": "s",
            "fusion": "hybrid",
            "served_ndcg@10": 0.689,
            **same,
        },
        {
            "set": "default",
            "mode": "full",
            "pipeline_minutes": 9.5,
            "target_minutes": 8.0,
            "teacher": "bert",
            "teacher_dir": "x",
            "width": 384,
            "student": "s",
            "fusion": "dense",
            "served_ndcg@10": 0.692,
            **same,
        },
        {
            "set": "scifact",
            "mode": "budgeted",
            "pipeline_minutes": 12.0,
            "target_minutes": 10.0,
            "teacher": "bert",
            "teacher_dir": "x",
            "width": 384,
            "student": "s",
            "fusion": "dense",
            "served_ndcg@10": 0.7,
            **same,
        },
    ]
    compare_modes(rows)
    d, s = rows[0], rows[2]
    assert (
        d["same_choices_as_full"] is False and d["served_delta_vs_full"] == -0.003 and d["meets_target"] is True
    )  # within 0.005
    assert (
        s["within_time_target"] is False and s["minutes_over_target"] == 2.0 and s["meets_target"] is None
    )  # no exhaustive row yet
    worse, better = dict(rows[0], **{"served_ndcg@10": 0.68}), dict(rows[0], **{"served_ndcg@10": 0.72})
    compare_modes([worse, rows[1]])
    compare_modes([better, rows[1]])
    assert worse["meets_target"] is False  # 0.012 below the exhaustive run
    assert (
        better["meets_target"] is True and better["served_delta_vs_full"] == 0.028
    )  # above it: the budget cost no quality
    # rows from another machine or code version are never differenced
    for other in ({"machine": "a GPU host"}, {"scalingnote_version": "0.2.0"}, {"machine": None}):
        elsewhere = dict(rows[0])
        compare_modes([elsewhere, dict(rows[1], **other)])
        assert (
            elsewhere["served_delta_vs_full"] is None
            and elsewhere["meets_target"] is None
            and elsewhere["same_choices_as_full"] is None
        )
        assert "another machine or code version" in elsewhere["compared_with"]


def test_the_benchmark_reports_stability_and_never_mixes_machines_or_code(tmp_path):
    import json

    from benchmarks.quickstart_budget import _old_rows, carried_stability, compare_modes, stability, time_targets

    base = {
        "set": "default",
        "mode": "budgeted",
        "pipeline_minutes": 7.0,
        "target_minutes": 8.0,
        "teacher": "bert",
        "teacher_dir": "x",
        "width": 384,
        "student": "s",
        "fusion": "hybrid",
        "served_config": "bert/x -> s, hybrid",
        "retention_val": 0.9,
        "output_mb": 40.0,
    }
    rows = [
        dict(base, seed=0, cores=2, **{"served_ndcg@10": 0.690}),
        dict(base, seed=1, cores=2, **{"served_ndcg@10": 0.684}),
        dict(
            base,
            seed=0,
            cores=1,
            **{"served_ndcg@10": 0.671},
            served_config="bert/x -> s, dense",
            pipeline_minutes=13.0,
        ),
    ]
    st = stability(rows)["default"]
    assert st["served_spread"] == 0.019 and len(st["served_configs"]) == 2 and st["meets_stability_target"] is False
    assert st["seeds"] == [0, 1] and st["cores"] == [1, 2]
    assert stability(rows[:2])["default"]["meets_stability_target"] is True
    assert stability(rows[:1])["default"]["meets_stability_target"] is None  # one run: not measured
    compare_modes(rows)
    # the budget + 10% on one core as on two: a slower machine must cut more, not take longer
    assert rows[2]["within_time_target"] is False and rows[2]["minutes_over_target"] == 5.0
    assert rows[0]["within_time_target"] is True
    edge = [dict(base, seed=0, cores=c, pipeline_minutes=m) for c in (1, 2) for m in (8.8, 8.81)]
    time_targets(edge + [dict(base, mode="full", pipeline_minutes=30.0)])
    assert [r["within_time_target"] for r in edge] == [True, False, True, False]
    assert edge[0]["minutes_over_target"] == 0.8
    f = tmp_path / "r.json"
    f.write_text(
        json.dumps(
            {
                "rows": [dict(rows[0], machine="m", code="c"), dict(rows[1], machine="other", code="c")],
                "machine": "other",
                "created": "then",
            }
        )
    )
    assert [r["seed"] for r in _old_rows(f, "m", "c", carry=False)] == [0]
    carried = _old_rows(f, "m", "c", carry=True)
    assert [r.get("carried") for r in carried] == [None, True] and carried[1]["machine"] == "other"
    assert "default" not in stability([carried[1]])  # a carried row is never compared
    # ... but what each carried code showed on its machine is summarised on its own
    old = [dict(r, carried=True, machine="old", code="a") for r in rows[:2]]
    old.append(dict(rows[2], carried=True, machine="old", code="b"))
    groups = carried_stability(old)
    assert [(g["code"], g["runs"], g["meets_stability_target"]) for g in groups] == [("a", 2, True), ("b", 1, None)]


def test_a_row_s_code_is_the_last_commit_that_changed_what_the_run_executes(tmp_path, monkeypatch):
    import subprocess

    import benchmarks.quickstart_budget as qb

    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=tmp_path, check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    git("config", "user.email", "t@example.org")
    git("config", "user.name", "t")
    (tmp_path / "src").mkdir()
    (tmp_path / "docs").mkdir()
    (tmp_path / "src" / "a.py").write_text("x = 1\n")
    git("add", ".")
    git("commit", "-qm", "code")
    measured = git("log", "-1", "--format=%h")
    (tmp_path / "docs" / "notes.md").write_text("words\n")
    git("add", ".")
    git("commit", "-qm", "docs")
    monkeypatch.setattr(qb, "REPO_ROOT", tmp_path)
    assert qb.code_version() == measured  # a docs commit keeps the stamp: earlier rows stay this code's
    (tmp_path / "src" / "a.py").write_text("x = 2\n")
    changed = qb.code_version()
    assert changed.startswith(f"{measured}+changes-") and qb.code_version() == changed  # the same change, one digest
    git("commit", "-qam", "code again")
    assert qb.code_version() == git("log", "-1", "--format=%h") != measured
