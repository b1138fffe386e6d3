"""Build training triplets from search logs (ScalingNote §4.1.1).

Pipeline (:func:`build_triplets`):

1. read and validate the click log and/or the relevance log against the query
   file (and the corpus when given): unknown ids, bad positions, clicks that are
   not 0/1 and non-numeric scores are :class:`~scalingnote.errors.DataError`\\ s;
2. **leakage check**: a logged query whose id is an evaluation query (from the
   given qrels files / id list), or whose normalised text equals an evaluation
   query's, is dropped with a warning and counted (``on_leak: drop``, default) or
   is an error naming the log line (``on_leak: error``);
3. one-hop triplets: ``click_one_hop`` and ``relevance_one_hop``
   (:mod:`scalingnote.data.logs`);
4. query association (Algorithm 1, :mod:`scalingnote.data.association`) among
   the queries present in the logs, scored by a term-importance planner
   (:mod:`scalingnote.data.planner`), then multi-hop triplets:

   * ``click_multi_hop``: when ``ClickA_{q1<-q2}``, q2's click one-hop
     (positive, hard negative) pairs become triplets of q1 (directional);
   * ``relevance_multi_hop``: when ``RelA(q1, q2)``, each query receives the
     other's relevance one-hop pairs (both ways).

   At most ``max_neighbours`` associated queries per query and kind are used
   (a seeded sample), which bounds the expansion for very common intents. A
   multi-hop triplet whose positive is one of q1's own hard negatives (exposed
   and not clicked, or its relevance negative) or whose negative is one of q1's
   own positives is a conflict with q1's own evidence and is dropped (counted);
5. merge the four sources, de-duplicate identical (query, positive, negative)
   triplets keeping the first source in the order click_one_hop,
   relevance_one_hop, click_multi_hop, relevance_multi_hop;
6. split train / validation by query (9:1 by default, seeded).

:func:`write_build` writes ``train.jsonl``, ``validation.jsonl``, ``stats.json``
(counts per source, association and leakage counts), ``config.yaml`` (resolved
config) and ``run.json`` (config + package versions + machine), each atomically.
"""

from __future__ import annotations

import dataclasses
import random
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, overload

from scalingnote.config import load_config, save_config
from scalingnote.data.association import find_associations
from scalingnote.data.beir import load_qrels, load_queries
from scalingnote.data.corpus import iter_corpus
from scalingnote.data.logs import (
    aggregate_clicks,
    click_one_hop,
    rank_relevance,
    read_click_log,
    read_relevance_log,
    relevance_one_hop,
)
from scalingnote.data.planner import IDFPlanner, Tokenizer, load_planner_factory, normalize_text
from scalingnote.data.triplets import write_triplets
from scalingnote.data.types import Triplet
from scalingnote.errors import ConfigError, DataError
from scalingnote.utils import run_metadata, write_json

SOURCES = ("click_one_hop", "relevance_one_hop", "click_multi_hop", "relevance_multi_hop")


@dataclass
class PlannerConfig:
    """Term-importance planner. ``factory`` ("package.module:callable") overrides the
    built-in IDF planner: it is called with the list of reference texts and must
    return a callable ``text -> {term: score}``."""

    factory: str | None = None
    language: Literal["en", "zh", "auto"] = "auto"
    stem: bool = False
    chinese: Literal["jieba", "bigram"] = "jieba"
    stop_words: bool = True
    normalize: Literal["max", "sum"] = "max"
    min_score: float = 0.0  # drop terms scoring below this (after normalisation)
    idf_from: Literal["queries", "corpus"] = "queries"


@dataclass
class AssociationConfig:
    """Algorithm 1 thresholds (strict ``>``) for a max-normalised planner (top term = 1.0)."""

    enabled: bool = True
    th_click: float = 0.5
    th_rel: float = 0.5
    max_neighbours: int = 10  # associated queries used per query and kind; 0 = all
    planner: PlannerConfig = field(default_factory=PlannerConfig)

    def __post_init__(self):
        if self.th_click < 0 or self.th_rel < 0:
            raise ValueError("th_click and th_rel must be >= 0")
        if self.max_neighbours < 0:
            raise ValueError("max_neighbours must be >= 0")


@dataclass
class RelevanceConfig:
    """Relevance one-hop: skip the top ``skip_top_k``, draw the negative from ranks K+1..T."""

    skip_top_k: int = 5
    top_t: int = 30

    def __post_init__(self):
        if self.skip_top_k < 1 or self.top_t <= self.skip_top_k:
            raise ValueError(f"need 1 <= skip_top_k < top_t, got {self.skip_top_k}, {self.top_t}")


@dataclass
class LeakageConfig:
    """Evaluation queries that must not appear in the training data."""

    qrels: list[Path] = field(default_factory=list)  # qrels files of evaluation splits
    query_ids: list[str] = field(default_factory=list)  # more evaluation query ids
    queries: Path | None = None  # texts of the evaluation queries (default: the build's queries file)
    check_text: bool = True  # also match identical normalised query text
    on_leak: Literal["drop", "error"] = "drop"


@dataclass
class BuildConfig:
    """``scalingnote data build`` configuration. Relative paths in a YAML file are
    resolved against the file's directory."""

    queries: Path  # queries.jsonl with the text of every logged query
    out: Path
    corpus: Path | None = None  # a corpus (any registered format): when given, log doc ids must exist in it
    click_log: Path | None = None
    relevance_log: Path | None = None
    seed: int = 0
    validation_fraction: float = 0.1
    deduplicate: bool = True
    drop_conflicts: bool = False
    relevance: RelevanceConfig = field(default_factory=RelevanceConfig)
    association: AssociationConfig = field(default_factory=AssociationConfig)
    leakage: LeakageConfig = field(default_factory=LeakageConfig)

    def __post_init__(self):
        if self.click_log is None and self.relevance_log is None:
            raise ValueError("give at least one of click_log, relevance_log")
        if not 0.0 <= self.validation_fraction < 1.0:
            raise ValueError("validation_fraction must be in [0, 1)")


@overload
def _resolve(p: Path, base: Path) -> Path: ...
@overload
def _resolve(p: Path | None, base: Path) -> Path | None: ...
def _resolve(p: Path | None, base: Path) -> Path | None:
    if p is None:
        return None
    p = Path(p).expanduser()
    return p if p.is_absolute() else base / p


def load_build_config(
    source: str | Path | dict[str, Any], base_dir: str | Path | None = None, **overrides: Any
) -> BuildConfig:
    """Load a :class:`BuildConfig`; relative paths are resolved against the YAML file's
    directory (or ``base_dir`` / the current directory for a dict)."""
    cfg = load_config(BuildConfig, source, **overrides)
    if base_dir is None:
        base_dir = Path(source).parent if isinstance(source, (str, Path)) else Path.cwd()
    base = Path(base_dir).absolute()
    lk = cfg.leakage
    return dataclasses.replace(
        cfg,
        queries=_resolve(cfg.queries, base),
        out=_resolve(cfg.out, base),
        corpus=_resolve(cfg.corpus, base),
        click_log=_resolve(cfg.click_log, base),
        relevance_log=_resolve(cfg.relevance_log, base),
        leakage=dataclasses.replace(
            lk, qrels=[_resolve(p, base) for p in lk.qrels], queries=_resolve(lk.queries, base)
        ),
    )


@dataclass
class BuildResult:
    train: list[Triplet]
    validation: list[Triplet]
    stats: dict[str, Any]


def make_planner(cfg: PlannerConfig, texts: Iterable[str]) -> Callable[[str], dict[str, float]]:
    texts = list(texts)
    if cfg.factory:
        try:
            factory = load_planner_factory(cfg.factory)
        except ValueError as e:
            raise ConfigError(None, None, "association.planner.factory", str(e)) from None
        return factory(texts)
    tok = Tokenizer(cfg.language, stem=cfg.stem, chinese=cfg.chinese, stop_words=cfg.stop_words)
    return IDFPlanner(texts, tok, normalize=cfg.normalize, min_score=cfg.min_score)


def _eval_queries(cfg: BuildConfig, queries: dict) -> tuple[set[str], dict[str, str]]:
    """Evaluation query ids and {normalised text: eval id}."""
    ids: set[str] = set(cfg.leakage.query_ids)
    for p in cfg.leakage.qrels:
        ids.update(load_qrels(p).keys())
    texts: dict[str, str] = {}
    if cfg.leakage.check_text and ids:
        src = load_queries(cfg.leakage.queries) if cfg.leakage.queries is not None else queries
        for qid in sorted(ids):
            if qid in src:
                texts.setdefault(normalize_text(src[qid].text), qid)
    return ids, texts


def _source_stats(triplets: list[Triplet]) -> dict[str, int]:
    return {
        "triplets": len(triplets),
        "queries": len({t.query_id for t in triplets}),
        "unique_positives": len({t.pos_id for t in triplets}),
        "unique_pairs": len({(t.query_id, t.pos_id) for t in triplets}),
        "with_negative": sum(t.neg_id is not None for t in triplets),
    }


def _by_source(triplets: list[Triplet]) -> dict[str, dict[str, int]]:
    return {s: _source_stats([t for t in triplets if t.source == s]) for s in SOURCES}


def _cap(neigh: set[str], k: int, rng: random.Random) -> list[str]:
    ordered = sorted(neigh)
    if k and len(ordered) > k:
        ordered = sorted(rng.sample(ordered, k))
    return ordered


def _drop_leaked(cfg: BuildConfig, queries, clicks: list, rels: list) -> tuple[list, list, dict[str, Any]]:
    """Remove (or, with ``on_leak: error``, refuse) logged queries that are evaluation queries,
    by id or by normalised text; returns the kept records and the leakage statistics."""
    eval_ids, eval_texts = _eval_queries(cfg, queries)
    leaked: dict[str, str] = {}  # logged qid -> reason
    for qid in {r.query_id for r in clicks} | {r.query_id for r in rels}:
        if qid in eval_ids:
            leaked[qid] = f"query id {qid!r} is an evaluation query"
        elif eval_texts:
            hit = eval_texts.get(normalize_text(queries[qid].text))
            if hit is not None:
                leaked[qid] = f"query {qid!r} has the same text as evaluation query {hit!r}: {queries[qid].text!r:.80}"
    n_click_before, n_rel_before = len(clicks), len(rels)
    if leaked:
        if cfg.leakage.on_leak == "error":
            for path, recs in ((cfg.click_log, clicks), (cfg.relevance_log, rels)):
                for r in recs:
                    if r.query_id in leaked:
                        raise DataError(
                            path, r.line, "query_id", f"evaluation query leaks into training: {leaked[r.query_id]}"
                        )
        clicks = [r for r in clicks if r.query_id not in leaked]
        rels = [r for r in rels if r.query_id not in leaked]
        warnings.warn(
            f"dropped {len(leaked)} logged queries that are evaluation queries "
            f"({n_click_before - len(clicks)} click and {n_rel_before - len(rels)} relevance records)",
            stacklevel=2,
        )
    return (
        clicks,
        rels,
        {
            "eval_queries": len(eval_ids),
            "leaked_queries": len(leaked),
            "leaked_by_id": sum(q in eval_ids for q in leaked),
            "leaked_by_text": sum(q not in eval_ids for q in leaked),
            "dropped_click_records": n_click_before - len(clicks),
            "dropped_relevance_records": n_rel_before - len(rels),
            "on_leak": cfg.leakage.on_leak,
        },
    )


def _multi_hop(
    cfg: BuildConfig,
    queries,
    agg,
    ranked,
    click1: dict[str, list[Triplet]],
    rel1: dict[str, list[Triplet]],
    planner,
    progress: bool,
) -> tuple[list[Triplet], list[Triplet], int, dict[str, Any]]:
    """Query association (Algorithm 1) and the triplets of associated queries (multi-hop)."""
    click_m: list[Triplet] = []
    rel_m: list[Triplet] = []
    conflicts = 0
    population = sorted(set(agg) | set(ranked))
    acfg = cfg.association
    if acfg.enabled and population:
        if planner is None:
            if acfg.planner.idf_from == "corpus":
                if cfg.corpus is None:
                    raise ConfigError(None, None, "association.planner.idf_from", "'corpus' needs the 'corpus' path")
                ref = (d.text for d in iter_corpus(cfg.corpus))
            else:
                ref = (queries[q].text for q in population)
            planner = make_planner(acfg.planner, ref)
        scores = {q: planner(queries[q].text) for q in population}
        assoc = find_associations(scores, acfg.th_click, acfg.th_rel, progress=progress)
        own_pos: dict[str, set[str]] = {}
        own_neg: dict[str, set[str]] = {}
        for q, qc in agg.items():
            own_pos.setdefault(q, set()).update(qc.positives)
            own_neg.setdefault(q, set()).update(qc.negatives)
        for q, ts in rel1.items():
            own_pos.setdefault(q, set()).update(t.pos_id for t in ts)
            own_neg.setdefault(q, set()).update(t.neg_id for t in ts if t.neg_id is not None)

        def expand(
            q1: str, neighbours: Iterable[str], one_hop: dict[str, list[Triplet]], source: str, out: list[Triplet]
        ) -> None:
            nonlocal conflicts
            pos1, neg1 = own_pos.get(q1, set()), own_neg.get(q1, set())
            for q2 in neighbours:
                for t in one_hop.get(q2, ()):
                    if cfg.drop_conflicts and (t.pos_id in neg1 or (t.neg_id is not None and t.neg_id in pos1)):
                        conflicts += 1
                        continue
                    out.append(Triplet(q1, t.pos_id, t.neg_id, source))

        for q1 in population:
            rng = random.Random(f"{cfg.seed}\x1fneighbours\x1f{q1}")
            if q1 in assoc.click:
                expand(q1, _cap(assoc.click[q1], acfg.max_neighbours, rng), click1, "click_multi_hop", click_m)
            if q1 in assoc.rel:
                expand(q1, _cap(assoc.rel[q1], acfg.max_neighbours, rng), rel1, "relevance_multi_hop", rel_m)
        assoc_stats = {
            "queries": len(population),
            "queries_without_terms": sum(1 for s in scores.values() if not s),
            "candidate_pairs": assoc.candidate_pairs,
            "click_associations": assoc.num_click,
            "queries_with_click_association": len(assoc.click),
            "relevance_associations": assoc.num_rel_pairs,
            "queries_with_relevance_association": len(assoc.rel),
            "th_click": acfg.th_click,
            "th_rel": acfg.th_rel,
        }
    else:
        assoc_stats = {"queries": len(population), "enabled": acfg.enabled}
    return click_m, rel_m, conflicts, assoc_stats


def build_triplets(
    cfg: BuildConfig, planner: Callable[[str], dict[str, float]] | None = None, progress: bool = False
) -> BuildResult:
    """Run the whole pipeline in memory (see the module docstring)."""
    queries = load_queries(cfg.queries)
    doc_ids = {d.id for d in iter_corpus(cfg.corpus)} if cfg.corpus is not None else None
    clicks = read_click_log(cfg.click_log, queries, doc_ids) if cfg.click_log is not None else []
    rels = read_relevance_log(cfg.relevance_log, queries, doc_ids) if cfg.relevance_log is not None else []
    stats: dict[str, Any] = {"inputs": {}}
    if cfg.click_log is not None:
        stats["inputs"]["click_log"] = {
            "path": str(cfg.click_log),
            "impressions": len(clicks),
            "clicks": sum(r.clicked for r in clicks),
            "queries": len({r.query_id for r in clicks}),
            "documents": len({r.doc_id for r in clicks}),
        }
    if cfg.relevance_log is not None:
        stats["inputs"]["relevance_log"] = {
            "path": str(cfg.relevance_log),
            "scores": len(rels),
            "queries": len({r.query_id for r in rels}),
            "documents": len({r.doc_id for r in rels}),
        }

    # -- leakage ---------------------------------------------------------------------------
    clicks, rels, stats["leakage"] = _drop_leaked(cfg, queries, clicks, rels)

    # -- one hop -----------------------------------------------------------------------
    agg = aggregate_clicks(clicks)
    ranked = rank_relevance(rels)
    click1 = click_one_hop(agg, cfg.seed)
    rel1 = relevance_one_hop(ranked, cfg.relevance.skip_top_k, cfg.relevance.top_t, cfg.seed)

    # -- association + multi hop ------------------------------------------------------------
    click_m, rel_m, conflicts, stats["association"] = _multi_hop(
        cfg, queries, agg, ranked, click1, rel1, planner, progress
    )

    # -- merge + dedup -------------------------------------------------------------------
    merged: list[Triplet] = []
    for group in (click1, rel1):
        for q in sorted(group):
            merged.extend(group[q])
    merged.extend(click_m)
    merged.extend(rel_m)
    before = _by_source(merged)
    duplicates = 0
    if cfg.deduplicate:
        seen: set[tuple[str, str, str | None]] = set()
        kept: list[Triplet] = []
        for t in merged:
            key = (t.query_id, t.pos_id, t.neg_id)
            if key in seen:
                duplicates += 1
                continue
            seen.add(key)
            kept.append(t)
        merged = kept

    # -- split by query ------------------------------------------------------------------
    qids = sorted({t.query_id for t in merged})
    random.Random(cfg.seed).shuffle(qids)
    n_val = int(round(cfg.validation_fraction * len(qids)))
    if cfg.validation_fraction > 0 and n_val == 0 and len(qids) >= 2:
        n_val = 1
    val_q = set(qids[:n_val])
    train = [t for t in merged if t.query_id not in val_q]
    val = [t for t in merged if t.query_id in val_q]

    stats["removed"] = {"duplicates": duplicates, "conflicts": conflicts}
    stats["sources_before_dedup"] = before
    stats["sources"] = _by_source(merged)
    stats["total"] = _source_stats(merged)
    stats["split"] = {
        "seed": cfg.seed,
        "validation_fraction": cfg.validation_fraction,
        "train": {**_source_stats(train), "by_source": {s: sum(t.source == s for t in train) for s in SOURCES}},
        "validation": {**_source_stats(val), "by_source": {s: sum(t.source == s for t in val) for s in SOURCES}},
    }
    return BuildResult(train, val, stats)


def write_build(result: BuildResult, cfg: BuildConfig) -> dict[str, Path]:
    """Write triplets, stats, resolved config and run metadata into ``cfg.out`` (atomically)."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "train": out / "train.jsonl",
        "validation": out / "validation.jsonl",
        "stats": out / "stats.json",
        "config": out / "config.yaml",
        "run": out / "run.json",
    }
    write_triplets(paths["train"], result.train)
    write_triplets(paths["validation"], result.validation)
    write_json(paths["stats"], result.stats)
    save_config(cfg, paths["config"])
    write_json(paths["run"], run_metadata(cfg))
    return paths


def run_build(
    cfg: BuildConfig, planner: Callable[[str], dict[str, float]] | None = None, progress: bool = False
) -> BuildResult:
    """:func:`build_triplets` then :func:`write_build`."""
    result = build_triplets(cfg, planner, progress=progress)
    write_build(result, cfg)
    return result
