"""``scalingnote eval`` (metrics of a TREC run against qrels) and ``scalingnote compare``
(paired significance of two runs). Thin wrappers over :mod:`scalingnote.evaluation`."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.console import Console
from rich.table import Table

from scalingnote.data import load_qrels, read_run
from scalingnote.errors import DataError
from scalingnote.evaluation import compare_runs, evaluate_report, parse_metric, parse_metrics
from scalingnote.utils import atomic_write, run_metadata, write_json

_DEFAULT = "ndcg@10,recall@100,r@100,mrr@10,map"


def _load(run_path: Path, qrels_path: Path):
    run = read_run(run_path)
    for qid, docs in run.items():
        for did, s in docs.items():
            if math.isnan(s):
                raise DataError(run_path, None, "score", f"NaN score for query {qid!r}, document {did!r}")
    return run, load_qrels(qrels_path)


def _stdout_json(obj) -> None:
    typer.echo(json.dumps(obj, ensure_ascii=False))


def _write_per_query(path: Path, pq: dict[str, dict[str, float]], metrics: list[str]) -> None:
    """TSV ``qid<TAB>metric...`` with a header, or JSON ``{qid: {metric: value}}`` for *.json."""
    if path.suffix.lower() == ".json":
        write_json(path, pq)
        return
    with atomic_write(path) as fh:
        fh.write("\t".join(["query-id", *metrics]) + "\n")
        for qid, vals in pq.items():
            fh.write("\t".join([qid, *(f"{vals[m]:.6f}" for m in metrics)]) + "\n")


def eval_command(
    run: Annotated[Path, typer.Option("--run", help="TREC run file (qid Q0 docid rank score tag).")],
    qrels: Annotated[
        Path, typer.Option("--qrels", help="Qrels TSV (query-id, corpus-id, score; header optional) or TREC qrels.")
    ],
    metrics: Annotated[
        str,
        typer.Option(
            "--metrics", "-m", help="Comma-separated: ndcg@K, recall@K, r@K, mrr@K, map, map@K, p@K, auc, qauc."
        ),
    ] = _DEFAULT,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object {metric: value} and nothing else on stdout.")
    ] = False,
    per_query_out: Annotated[
        Path | None,
        typer.Option("--per-query", help="Write per-query values here (TSV, or JSON if the name ends in .json)."),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Write a JSON record: metrics, query counts, settings, package versions, machine."),
    ] = None,
    relevance_level: Annotated[
        int, typer.Option("--relevance-level", help="Minimum grade counted as relevant (trec_eval -l).")
    ] = 1,
    missing_as_zero: Annotated[
        bool,
        typer.Option(
            "--missing-as-zero",
            help="Count qrels queries absent from the run as 0 (trec_eval -c); default: ignore them.",
        ),
    ] = False,
) -> None:
    """Evaluate a run: R@K (ScalingNote: hit if any relevant doc in the top K), Recall@K, MRR, nDCG, MAP, P@K, AUC.

    Values agree with trec_eval/pytrec_eval. Queries without a relevant document are skipped.
    """
    specs = parse_metrics(metrics)  # fail on a bad name before reading big files
    run_d, qrels_d = _load(run, qrels)
    missing: Literal["ignore", "zero"] = "zero" if missing_as_zero else "ignore"
    rep = evaluate_report(run_d, qrels_d, [s.name for s in specs], relevance_level=relevance_level, missing=missing)
    if per_query_out is not None:
        _write_per_query(per_query_out, rep.per_query, [s.name for s in specs if s.per_query])
    if out is not None:
        config = {
            "run": str(run),
            "qrels": str(qrels),
            "metrics": [s.name for s in specs],
            "relevance_level": relevance_level,
            "missing": missing,
        }
        meta = run_metadata(config)
        write_json(
            out,
            {
                "metrics": rep.metrics,
                "num_queries": rep.num_queries,
                "num_missing": rep.num_missing,
                "num_no_relevant": rep.num_no_relevant,
                **meta,
            },
        )
    if as_json:
        _stdout_json(rep.metrics)
        return
    table = Table(title=f"{run.name} vs {qrels.name}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k, v in rep.metrics.items():
        table.add_row(k, f"{v:.4f}")
    note = f"{rep.num_queries} queries evaluated"
    if rep.num_missing:
        note += f"; {rep.num_missing} absent from the run ({'counted as 0' if missing == 'zero' else 'ignored'})"
    if rep.num_no_relevant:
        note += f"; {rep.num_no_relevant} without relevant documents skipped"
    console = Console()
    console.print(table)
    console.print(note, soft_wrap=True)


def compare_command(
    run: Annotated[Path, typer.Option("--run", help="Run A (TREC).")],
    run_b: Annotated[Path, typer.Option("--run-b", help="Run B (TREC); differences are A - B.")],
    qrels: Annotated[Path, typer.Option("--qrels", help="Qrels TSV.")],
    metric: Annotated[
        str, typer.Option("--metric", "-m", help="Per-query metric, e.g. ndcg@10, r@100, mrr@10.")
    ] = "ndcg@10",
    n_resamples: Annotated[int, typer.Option("--n-resamples", help="Bootstrap resamples.")] = 10000,
    confidence: Annotated[
        float, typer.Option("--confidence", help="Confidence level of the bootstrap interval.")
    ] = 0.95,
    seed: Annotated[int, typer.Option("--seed", help="Bootstrap seed.")] = 0,
    relevance_level: Annotated[int, typer.Option("--relevance-level", help="Minimum grade counted as relevant.")] = 1,
    ignore_missing: Annotated[
        bool,
        typer.Option(
            "--ignore-missing", help="Require both runs to cover the same queries instead of scoring absent ones 0."
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object and nothing else on stdout.")] = False,
) -> None:
    parse_metric(metric)
    run_a, qrels_d = _load(run, qrels)
    run_bd, _ = _load(run_b, qrels)
    cmp = compare_runs(
        run_a,
        run_bd,
        qrels_d,
        metric,
        relevance_level=relevance_level,
        missing="ignore" if ignore_missing else "zero",
        n_resamples=n_resamples,
        confidence=confidence,
        seed=seed,
    )
    d = cmp.to_dict()
    if as_json:
        _stdout_json(d)
        return
    table = Table(title=f"{cmp.metric}: {run.name} (A) vs {run_b.name} (B), {cmp.n} queries")
    table.add_column("")
    table.add_column("value", justify="right")
    table.add_row("mean A", f"{cmp.mean_a:.4f}")
    table.add_row("mean B", f"{cmp.mean_b:.4f}")
    table.add_row("A - B", f"{cmp.ttest.mean_diff:+.4f}")
    table.add_row(f"{confidence:.0%} bootstrap CI", f"[{cmp.bootstrap.low:+.4f}, {cmp.bootstrap.high:+.4f}]")
    table.add_row("paired t-test p", f"{cmp.ttest.pvalue:.4g} (t = {cmp.ttest.statistic:.3f})")
    table.add_row("bootstrap p", f"{cmp.bootstrap.pvalue:.4g}")
    Console().print(table)


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_command)
    app.command(
        "compare",
        help="Paired significance of run A vs run B on one metric: two-sided paired t-test and bootstrap CI of the "
        "mean difference.",
    )(compare_command)
