"""``scalingnote index add|delete|compact|rebuild``: the live-index verbs (thin wrappers over
:class:`scalingnote.live.LiveIndex`). Each takes the index's writer lock: while a service
serves the index, send documents to it (``POST /documents``) instead."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from tqdm.auto import tqdm

from scalingnote.live import LiveIndex, read_documents, read_ids


def _run(live, work, compact: bool) -> None:
    """``work(live)`` -> a JSON-able dict; then compaction (a new generation), the stats, close, print."""
    try:
        out = work(live)
        if compact:
            out["compaction"] = live.compact()
        out["stats"] = live.stats()
    finally:
        live.close()
    typer.echo(json.dumps(out))


def register_live(index_app: typer.Typer) -> None:
    @index_app.command("add")
    def add(
        index: Path = typer.Option(..., "--index", help="Index directory (`scalingnote index build`)."),
        docs: Path = typer.Option(
            ..., "--docs", help='JSONL of documents {"_id", "title", "text"}: added, or replaced when the id exists.'
        ),
        tower: str | None = typer.Option(
            None,
            "--tower",
            help="Document tower (default: the one the index records); its fingerprint must match the index's.",
        ),
        batch_size: int = typer.Option(64, "--batch-size", min=1, help="Documents per logged batch."),
        compact: bool = typer.Option(
            True,
            "--compact/--no-compact",
            help="Write a new generation at the end (else the log is replayed at the next open).",
        ),
    ) -> None:
        """Add or replace documents: every line is checked first (a bad line changes nothing), then
        batches are encoded, logged (fsync) and applied."""
        batch = read_documents(docs)  # all or nothing: refuse the file before any change

        def work(live) -> dict:
            _ = live.document_tower  # fingerprint check before anything is logged
            out = {"upserted": 0, "replaced": 0}
            with tqdm(total=len(batch), unit="doc", desc="add", dynamic_ncols=True) as bar:
                for s in range(0, len(batch), batch_size):
                    r = live.upsert(batch[s : s + batch_size])
                    out["upserted"] += r["upserted"]
                    out["replaced"] += r["replaced"]
                    bar.update(r["upserted"])
            return out

        _run(LiveIndex.open(index, document_tower=tower), work, compact)

    @index_app.command("delete")
    def delete(
        index: Path = typer.Option(..., "--index", help="Index directory."),
        ids: Path = typer.Option(..., "--ids", help="Text file: one document id per line."),
        compact: bool = typer.Option(True, "--compact/--no-compact", help="Write a new generation at the end."),
    ) -> None:
        """Delete documents from the dense index, the BM25 side and the document store."""
        wanted = read_ids(ids)
        _run(LiveIndex.open(index), lambda live: live.delete(wanted), compact)

    @index_app.command("rebuild")
    def rebuild(
        index: Path = typer.Option(..., "--index", help="Index directory."),
        retrain: bool = typer.Option(
            True,
            "--retrain/--compact-only",
            help="Retrain the coarse quantiser, PQ and semantic-ID codebooks on the live documents (default), or only "
            "compact.",
        ),
    ) -> None:
        """Write a new generation of the live documents (retrained codebooks by default) and swap it in."""
        _run(
            LiveIndex.open(index),
            lambda live: {"before": live.stats(), **live.compact(retrain=retrain, progress=True)},
            compact=False,
        )
