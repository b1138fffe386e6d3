"""``scalingnote scaling fit|predict|plan|plot`` on a synthetic results table."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from scalingnote.cli import app
from scalingnote.scaling.laws import PAPER_PARAMS, predict
from scalingnote.scaling.table import write_table

P = PAPER_PARAMS["fang_msmarco_joint"]


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    N, D = (a.ravel() for a in np.meshgrid(np.geomspace(5e5, 1e8, 4), np.geomspace(1e3, 5e5, 4)))
    loss = predict(P, "joint", N=N, D=D) * (1 + 0.002 * np.random.default_rng(0).standard_normal(N.size))
    rows = [
        {"N": float(n), "D": float(d), "loss": float(v), "layers": i % 4, "seconds": 1.0}
        for i, (n, d, v) in enumerate(zip(N, D, loss, strict=True))
    ]
    return write_table(tmp_path_factory.mktemp("tbl") / "results.csv", rows)


runner = CliRunner()


def _run(args):
    res = runner.invoke(app, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res.output


@pytest.mark.parametrize(
    "law,keys",
    [
        ("model", {"A", "alpha", "delta"}),
        ("data", {"B", "beta", "delta"}),
        ("joint", {"A", "alpha", "B", "beta", "delta"}),
    ],
)
def test_fit_json_has_required_keys(table, law, keys):
    out = json.loads(_run(["scaling", "fit", "--input", str(table), "--law", law, "--json"]))
    assert keys | {"r2", "law"} <= set(out)
    assert out["law"] == law
    assert set(out["stderr"]) == keys
    assert 0.9 < out["r2"] <= 1.0
    if law == "joint":
        for k, v in P.items():
            assert out[k] == pytest.approx(v, rel=0.3), k
    else:
        assert out["fixed"] == {"D" if law == "model" else "N": 5e5 if law == "model" else 1e8}


def test_fit_holdout_and_output_file(table, tmp_path):
    f = tmp_path / "fit.json"
    out = json.loads(
        _run(["scaling", "fit", "-i", str(table), "--law", "joint", "--json", "--holdout-largest", "1", "-o", str(f)])
    )
    assert out["holdout_n"] == 4 and out["n_fit"] == 12
    assert out["holdout_mape"] < 0.05
    assert json.loads(f.read_text()) == out
    text = _run(["scaling", "fit", "-i", str(table), "--law", "joint", "--holdout-frac", "0.25"])
    assert "R²" in text and "held out 4 rows" in text


def test_fit_bad_input_is_a_clean_error(tmp_path):
    from scalingnote.cli import main

    bad = tmp_path / "bad.csv"
    bad.write_text("N,D,loss\n1e6,10,2\n1e6,x,2\n")
    with pytest.raises(SystemExit) as e:
        main(["scaling", "fit", "-i", str(bad), "--law", "joint"])
    assert e.value.code == 2


def test_predict_and_plan(table, tmp_path):
    f = tmp_path / "fit.json"
    _run(["scaling", "fit", "-i", str(table), "--law", "joint", "--json", "-o", str(f)])
    pred = json.loads(_run(["scaling", "predict", "--fit", str(f), "--n", "1e9", "--d", "1e4", "--d", "1e5"]))
    assert [r["D"] for r in pred["predictions"]] == [1e4, 1e5]
    assert pred["predictions"][1]["loss"] < pred["predictions"][0]["loss"]

    params = ",".join(f"{k}={v}" for k, v in P.items())
    plan = json.loads(_run(["scaling", "plan", "--params", params, "--budget", "1e4", "--budget", "1e6", "--json"]))
    assert plan["cost_factors"]["Z_data"] == 0.6
    assert [p["budget"] for p in plan["plans"]] == [1e4, 1e6]
    big = plan["plans"][1]
    assert big["without_inference"]["N"] > 1e10 > big["with_inference"]["N"]
    # cost factors given directly, and from a fit file
    cheap = json.loads(
        _run(
            [
                "scaling",
                "plan",
                "--fit",
                str(f),
                "--budget",
                "1e5",
                "--z-infer",
                "0",
                "--annotation-cost",
                "1.2",
                "--cost",
                "gpu_price_per_hour=2.0",
                "--json",
            ]
        )
    )
    w = cheap["plans"][0]["with_inference"]
    assert cheap["cost_factors"]["Z_infer"] == 0 and cheap["cost_factors"]["Z_data"] == 1.2
    assert w["cost_data"] + w["cost_train"] + w["cost_infer"] == pytest.approx(1e5)
    text = _run(["scaling", "plan", "--params", params, "--budget", "1e5", "--query-volume", "1e12"])
    assert "with_inference" in text


def test_plot_writes_pngs(table, tmp_path):
    out = tmp_path / "plots"
    text = _run(
        [
            "scaling",
            "plot",
            "-i",
            str(table),
            "-o",
            str(out),
            "--budget",
            "1e4",
            "--budget",
            "1e6",
            "--holdout-largest",
            "1",
        ]
    )
    names = sorted(p.name for p in out.glob("*.png"))
    assert names == ["budget.png", "joint.png", "loss_vs_D.png", "loss_vs_N.png"]
    for p in out.glob("*.png"):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and 5_000 < p.stat().st_size < 400_000
    assert "loss_vs_N.png" in text
