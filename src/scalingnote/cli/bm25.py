"""``scalingnote bm25 search``: the lexical baseline."""

from __future__ import annotations

from pathlib import Path

import typer

from scalingnote.cli._options import corpus_format_option, use_corpus_format
from scalingnote.data import write_run
from scalingnote.errors import ScalingNoteError
from scalingnote.sparse.bm25 import BM25Config, bm25_search


def register(app: typer.Typer) -> None:
    bm25_app = typer.Typer(help="BM25 lexical baseline (bm25s).", no_args_is_help=True)

    @bm25_app.command("search")
    def search(
        data: Path = typer.Option(..., "--data", help="BEIR directory (a corpus file, queries.jsonl, qrels/)."),
        corpus_format: str | None = corpus_format_option(),
        split: str = typer.Option("test", help="Search the queries judged in qrels/<split>.tsv."),
        out: Path = typer.Option(..., "--out", help="TREC run file to write."),
        k: int = typer.Option(1000, "--k", min=1, help="Documents per query."),
        language: str = typer.Option("auto", help="auto | en | zh"),
        k1: float = typer.Option(1.5),
        b: float = typer.Option(0.75),
        save_index: Path | None = typer.Option(None, help="Also save the BM25 index to this directory."),
    ) -> None:
        """Search the queries of a split over the corpus and write a TREC run."""
        if language not in ("auto", "en", "zh"):
            raise ScalingNoteError(f"--language must be auto, en or zh, got {language!r}")
        use_corpus_format(corpus_format, data)
        run, retriever = bm25_search(data, split, k=k, config=BM25Config(language=language, k1=k1, b=b))  # type: ignore[arg-type]
        write_run(out, run, tag="bm25", k=k)
        if save_index is not None:
            retriever.save(save_index)
        typer.echo(f"wrote {out} ({len(run)} queries, language={retriever.language})", err=True)

    app.add_typer(bm25_app, name="bm25")
