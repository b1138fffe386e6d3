"""``scalingnote data ...``: training data from logs, pseudo-queries, the synthetic log, and the
audit of mined hard negatives.

Thin wrappers over :mod:`scalingnote.data.build`, :mod:`scalingnote.data.pseudo`,
:mod:`scalingnote.data.synth` and :mod:`scalingnote.training.audit`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from scalingnote.data.build import load_build_config, run_build
from scalingnote.data.pseudo import ICTConfig, ict_queries
from scalingnote.data.synth import SynthConfig, synthesize
from scalingnote.errors import ConfigError

data_app = typer.Typer(
    help="Data: triplets from search logs, pseudo-queries, synthetic note-search log, the mined-negatives audit.",
    no_args_is_help=True,
)


@data_app.command("build")
def build_command(
    config: Annotated[
        Path, typer.Option("--config", "-c", help="YAML build config (see scalingnote.data.build.BuildConfig).")
    ],
    out: Annotated[Path | None, typer.Option("--out", help="Override the config's output directory.")] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="Override the config's seed.")] = None,
) -> None:
    """Build triplets (click/relevance one-hop + multi-hop via query association) from search logs.

    Writes train.jsonl, validation.jsonl, stats.json, config.yaml and run.json.
    """
    cfg = load_build_config(config)
    if out is not None:
        cfg = dataclasses.replace(cfg, out=out)
    if seed is not None:
        cfg = dataclasses.replace(cfg, seed=seed)
    result = run_build(cfg, progress=True)
    summary = {s: v["triplets"] for s, v in result.stats["sources"].items()}
    typer.echo(
        f"wrote {cfg.out}: {len(result.train)} train / {len(result.validation)} validation triplets; "
        f"per source {json.dumps(summary)}; leaked queries dropped: {result.stats['leakage']['leaked_queries']}",
        err=True,
    )


@data_app.command("pseudo")
def pseudo_command(
    data: Annotated[
        Path,
        typer.Option(
            "--data",
            help="BEIR directory, or a corpus file in a registered corpus format (scalingnote.data.corpus.FORMATS).",
        ),
    ],
    method: Annotated[str, typer.Option("--method", help="ict | llm")],
    out: Annotated[Path, typer.Option("--out", help="Output directory.")],
    max_docs: Annotated[
        int | None, typer.Option("--max-docs", min=1, help="Use a seeded sample of this many documents.")
    ] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    write_corpus: Annotated[
        bool,
        typer.Option(
            "--write-corpus/--no-write-corpus", help="ICT: also write the corpus without the query sentences."
        ),
    ] = False,
    min_words: Annotated[int, typer.Option("--min-words", min=1, help="ICT: shortest sentence used as a query.")] = 4,
    model: Annotated[
        str, typer.Option("--model", help="LLM: packaged name, .gguf file or HF directory.")
    ] = "smollm2-135m",
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="LLM: documents per generation batch.")] = 8,
    max_new_tokens: Annotated[
        int, typer.Option("--max-new-tokens", min=1, help="LLM: tokens generated per query.")
    ] = 24,
    sample: Annotated[
        bool, typer.Option("--sample/--greedy", help="LLM: seeded sampling instead of greedy decoding.")
    ] = False,
    temperature: Annotated[float, typer.Option("--temperature", help="LLM: sampling temperature.")] = 0.7,
) -> None:
    """Pseudo-queries from a corpus: inverse cloze task (ict) or LLM generation (llm, resumable)."""
    corpus = data  # a BEIR directory or a corpus file in any registered format (scalingnote.data.corpus)
    if method == "ict":
        pairs = ict_queries(
            corpus, out, ICTConfig(seed=seed, max_docs=max_docs, min_words=min_words, write_corpus=write_corpus)
        )
    elif method == "llm":
        # why: loads torch and a causal LM stack; the other data verbs need neither
        from scalingnote.augment.llm_queries import (
            LLMQueryConfig,
            llm_queries,
        )

        cfg = LLMQueryConfig(
            model=model,
            seed=seed,
            max_docs=max_docs,
            batch_size=batch_size,
            max_new_tokens=max_new_tokens,
            do_sample=sample,
            temperature=temperature,
        )
        pairs = llm_queries(corpus, out, cfg)
    else:
        raise ConfigError(None, None, "--method", f"must be 'ict' or 'llm', got {method!r}")
    typer.echo(f"wrote {out}: {len(pairs)} {method} queries", err=True)


@data_app.command("synth")
def synth_command(
    out: Annotated[Path, typer.Option("--out", help="Output directory (BEIR layout + logs/ + build.yaml).")],
    seed: Annotated[int, typer.Option("--seed")] = 0,
    num_docs: Annotated[int, typer.Option("--num-docs", min=50, help="Number of notes.")] = 3000,
    num_queries: Annotated[int, typer.Option("--num-queries", min=10, help="Number of queries (train + test).")] = 1500,
    test_fraction: Annotated[
        float, typer.Option("--test-fraction", help="Fraction of queries held out for testing.")
    ] = 0.2,
) -> None:
    """Generate the SYNTHETIC note-search log (notes, queries, qrels, click and relevance logs)."""
    try:
        cfg = SynthConfig(seed=seed, num_docs=num_docs, num_queries=num_queries, test_fraction=test_fraction)
    except ValueError as e:
        raise ConfigError(None, None, None, str(e)) from None
    log = synthesize(out, cfg, progress=True)
    typer.echo(
        f"wrote {out}: {len(log.corpus)} notes, {len(log.queries)} queries ({len(log.test_ids)} test), "
        f"{len(log.clicks)} impressions, {len(log.relevance)} relevance scores. "
        f"Next: scalingnote data build --config {out / 'build.yaml'}",
        err=True,
    )


def _cell(x, chars: int = 160) -> str:
    text = "" if x is None else str(x)
    return text if len(text) <= chars else text[: chars - 1] + "…"


def audit_table(records: list[dict], rule: str | None, limit: int | None) -> Table:
    """The audit's candidate lines as a table (``rule``: only those; ``limit``: at most that many rows)."""
    rows = [r for r in records if rule is None or r.get("rule") == rule]
    table = Table(title=f"mined candidates ({len(rows)}{' ' + rule if rule else ''})", show_lines=False)
    for col in ("query", "positive", "candidate", "dense", "pos score", "rank", "bm25", "bm25 rank", "rule"):
        table.add_column(col, overflow="fold", max_width=40 if col in ("query", "positive", "candidate") else None)
    for r in rows[:limit] if limit else rows:
        table.add_row(
            _cell(r.get("query")),
            _cell(r.get("positive")),
            _cell(r.get("candidate")),
            _cell(r.get("dense")),
            _cell(r.get("positive_score")),
            _cell(r.get("dense_rank")),
            _cell(r.get("bm25")),
            _cell(r.get("bm25_rank")),
            _cell(r.get("rule")),
        )
    return table


@data_app.command("audit")
def audit_command(
    run: Annotated[Path, typer.Argument(help="A Stage I run directory (its mining_audit.jsonl) or an audit file.")],
    rule: Annotated[
        str | None, typer.Option("--rule", help="Only candidates this rule dropped ('kept': only the kept ones).")
    ] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="Print at most this many candidate rows.")] = None,
) -> None:
    """Print the false-negative audit of mined hard negatives (data.negatives: dense | mixed) as a table:
    query, positive, candidate, scores, rank and the guard rule that fired (or "kept"); then the summary."""
    # why: scalingnote.training imports torch; the other data verbs do not need it
    from scalingnote.training.audit import read_audit

    records, summary = read_audit(run)
    console = Console(width=max(Console().width, 160))
    console.print(audit_table(records, rule, limit))
    table = Table(title="summary")
    table.add_column("key")
    table.add_column("value", overflow="fold")
    for k, v in summary.items():
        table.add_row(k, json.dumps(v, ensure_ascii=False) if isinstance(v, (dict, list)) else _cell(v))
    console.print(table)


def register(app: typer.Typer) -> None:
    app.add_typer(data_app, name="data")
