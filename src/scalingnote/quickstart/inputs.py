"""The quick start's inputs, checked before any work: the output directory and the data
(:func:`check_inputs`), then which model families can read the data and what each costs on this
machine (:func:`readable_families`)."""

from __future__ import annotations

import random
from itertools import islice
from pathlib import Path
from typing import Any

import scalingnote.quickstart.choose as choose
from scalingnote.data import iter_corpus, load_queries
from scalingnote.data.corpus import find_corpus_file, use_corpus_format
from scalingnote.errors import DataError, ScalingNoteError
from scalingnote.models import load_tower
from scalingnote.quickstart.budget import model_layers
from scalingnote.quickstart.calibrate import CAL_LAYERS, CAL_POOL, calibrate
from scalingnote.quickstart.config import QuickstartConfig, family


def say(msg: str) -> None:
    print(f"[quickstart] {msg}", flush=True)


def readable_families(
    cfg: QuickstartConfig, beir: Path, corpus: Path | None = None
) -> tuple[list[str], dict[str, Any]]:
    """Measure each family's tokenizer on a sample of the data's queries; skip those that cannot
    read it (with the reason). With a budget, also time each readable family on a sample of the
    corpus (``report[name]["calibration"]``: :func:`~scalingnote.quickstart.calibrate.calibrate`),
    which prices its work in the plan. ``corpus``: the corpus file (default: the directory's)."""
    texts = [q.text for q in load_queries(beir / "queries.jsonl").values()]
    sample = random.Random(cfg.seed).sample(texts, min(500, len(texts)))
    timed = not cfg.full and bool(cfg.budget_minutes)
    # the calibration samples the corpus's first documents (a 10M-note corpus is not read twice for it)
    docs = list(islice(iter_corpus(corpus or find_corpus_file(beir)), CAL_POOL)) if timed else []
    ok, report = [], {}
    for name in cfg.families:
        fam = family(cfg, name)
        # one load per family: its tokenizer reads the queries, its prompt (LLM towers) is checked
        # below, its first layers time this machine (with a budget)
        layers = min(CAL_LAYERS, model_layers(fam.model)) if timed else 1
        tower = load_tower(fam.model, "document", num_layers=layers, dim=None)
        rep = choose.tokenizer_report(tower.tokenizer, sample)
        readable, why = choose.readability(rep, cfg.max_unk_share)
        report[name] = {**rep, "model": fam.model, "readable": readable, "reason": why}
        say(f"{name} ({fam.model}): {'reads the data' if readable else 'SKIPPED'}: {why}")
        if readable:
            report[name].update(_prompt_budget(cfg, name, getattr(tower, "prompt", None)))
            ok.append(name)
            if timed:
                report[name]["calibration"] = cal = calibrate(cfg, name, tower, docs)
                say(f"{name}: this machine at {cal['speed']:g}x the cost model's time ({cal['note']})")
    if not ok:
        raise ScalingNoteError(
            f"no model family can read the queries of {beir}: "
            + "; ".join(f"{k}: {v['reason']}" for k, v in report.items())
        )
    return ok, report


def _prompt_budget(cfg: QuickstartConfig, name: str, prompt: Any) -> dict[str, int]:
    """How many of ``doc_max_length`` tokens a family's document prompt (ScalingNote §3.2's
    template, LLM towers) leaves to the document: an error when none, a warning when the template
    takes more than half (a 64-token budget left ~4 title tokens of KUAKE-QTR and scored 0.22)."""
    if prompt is None:
        return {}
    fixed, budget = prompt.fixed_length, cfg.doc_max_length
    if fixed >= budget:
        raise ScalingNoteError(
            f"doc_max_length={budget}: the {name} family's document prompt alone takes {fixed} tokens; "
            f"raise doc_max_length (e.g. --set doc_max_length={2 * fixed + 64})"
        )
    if 2 * fixed > budget:
        say(
            f"WARNING: the {name} family's document prompt takes {fixed} of doc_max_length={budget} tokens, leaving "
            f"{budget - fixed} to each document; raise doc_max_length if documents are longer"
        )
    return {"prompt_tokens": fixed, "document_tokens_left": budget - fixed}


def check_inputs(
    out: Path, data: Path | None, eval_split: str = "test", corpus_format: str | None = None
) -> Path | None:
    """Fail before any work: ``--out`` must be a directory (or not exist yet), ``--data`` a BEIR
    directory (one corpus file of a registered format, queries.jsonl, qrels/<eval_split>.tsv); the
    error names the path. ``corpus_format`` (a format name or ``package.module:reader``) is made
    readable first (:func:`~scalingnote.data.corpus.use_corpus_format`). Returns the corpus file."""
    if out.exists() and not out.is_dir():
        raise ScalingNoteError(f"--out {out}: exists and is not a directory")
    if data is None:
        return None
    if not data.exists():
        raise ScalingNoteError(f"--data {data}: no such directory")
    if not data.is_dir():
        raise ScalingNoteError(
            f"--data {data}: not a directory (give a BEIR directory: a corpus file, queries.jsonl, qrels/)"
        )
    fmt = use_corpus_format(corpus_format, data) if corpus_format else None
    try:
        corpus = find_corpus_file(data, fmt)
    except DataError as e:
        raise ScalingNoteError(f"--data {data}: not a BEIR directory: {e.reason}") from None
    missing = [name for name in ("queries.jsonl", "qrels") if not (data / name).exists()]
    if missing:
        raise ScalingNoteError(f"--data {data}: not a BEIR directory, missing {', '.join(missing)}")
    if not (data / "qrels" / f"{eval_split}.tsv").exists():
        raise ScalingNoteError(
            f"--data {data}: not a BEIR directory for eval_split={eval_split!r}, missing qrels/{eval_split}.tsv"
        )
    return corpus


__all__ = ["check_inputs", "readable_families", "say"]
