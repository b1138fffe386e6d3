"""The cheap proxy the budgeted quick start compares its Stage I candidates on.

A sample of the user's data, drawn before any tower reads the corpus: every validation query with
all its judged documents (the held-out queries the full runs validate on: the same ones), a seeded
share of the training queries with their positives and hard negatives, and seeded distractors up
to the proxy's corpus size. Each candidate (family, depth, head learning rate, width) trains on it
for a fraction of the full run's steps (fewer training queries, the same epochs and patience);
:func:`scalingnote.quickstart.choose.halve` keeps those that can still win, and only they are
trained and encoded on the whole corpus. The proxy's features land in the shared feature cache
(keyed by text), so the winner's proxy pass is not paid twice. A candidate that lost keeps its
metrics only (``run.json``, its step marker, its curves): its towers, checkpoints and embeddings
are removed once the proxy has decided (:func:`prune_losers`).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

import scalingnote.quickstart.choose as choose
import scalingnote.quickstart.runs as runs
from scalingnote.config import load_config
from scalingnote.data.beir import write_corpus, write_queries
from scalingnote.data.triplets import write_triplets
from scalingnote.data.types import Query, Triplet
from scalingnote.quickstart.budget import Candidates, proxy_sizes
from scalingnote.quickstart.config import Family, QuickstartConfig
from scalingnote.training.config import DataSpec
from scalingnote.training.data import Example, load_training_data


@dataclass
class ProxySample:
    """What the proxy keeps: training examples (a share of the training queries, all their pairs),
    every validation example, and the corpus ids (required + distractors)."""

    train: list[Example]
    validation: list[Example]
    doc_ids: list[str]
    required_docs: int  #: judged (positive) documents of the kept queries
    distractors: int  #: the kept queries' hard negatives that fit, then documents drawn at random
    corpus_docs: int  #: documents of the whole corpus
    train_queries: int  #: training queries kept
    all_train_queries: int

    def summary(self) -> dict[str, Any]:
        return {
            "docs": len(self.doc_ids),
            "corpus_docs": self.corpus_docs,
            "required_docs": self.required_docs,
            "distractors": self.distractors,
            "train_queries": self.train_queries,
            "all_train_queries": self.all_train_queries,
            "train_examples": len(self.train),
            "validation_queries": len({e.query_id for e in self.validation}),
        }

    @property
    def cheaper(self) -> bool:
        """Worth it: at most 60% of the corpus and of the training queries (else the full runs are the proxy)."""
        return len(self.doc_ids) <= 0.6 * self.corpus_docs and self.train_queries <= 0.6 * max(
            1, self.all_train_queries
        )


def sample_proxy(
    train: list[Example],
    validation: list[Example],
    corpus_ids: list[str],
    *,
    fraction: float,
    min_docs: int,
    min_train_queries: int,
    seed: int,
) -> ProxySample:
    """Draw the proxy (:func:`~scalingnote.quickstart.budget.proxy_sizes`): every validation
    example, training queries drawn with ``seed`` (every pair of a drawn query kept), and the
    documents: every judged (positive) document of those examples, then their hard negatives
    (seeded order) while the proxy's size allows — the distractors the full corpus makes hard —
    then random distractors drawn with ``seed``. An example whose hard negative did not fit keeps
    its positive and loses the negative (in-batch negatives remain). Documents come in corpus order."""
    rng = np.random.default_rng(seed)
    tq = sorted({e.query_id for e in train})
    n_docs, n_q = proxy_sizes(len(corpus_ids), len(tq), fraction, min_docs, min_train_queries)
    keep_q = set(rng.choice(tq, size=n_q, replace=False).tolist()) if n_q < len(tq) else set(tq)
    kept = [e for e in train if e.query_id in keep_q]
    required = {e.pos.id for e in kept + validation}
    negs = sorted({d.id for e in validation + kept for d in e.negs} - required)
    negs = [negs[i] for i in rng.permutation(len(negs))][: max(0, n_docs - len(required))]
    chosen = required | set(negs)
    rest = [i for i in corpus_ids if i not in chosen]
    n_extra = max(0, min(len(rest), n_docs - len(chosen)))
    chosen |= {rest[i] for i in rng.choice(len(rest), size=n_extra, replace=False)} if n_extra else set()

    def fit(e: Example) -> Example:
        kept_negs = [d for d in e.negs if d.id in chosen]
        return replace(e, neg=kept_negs[0] if kept_negs else None, extra_negs=tuple(kept_negs[1:]))

    return ProxySample(
        [fit(e) for e in kept],
        [fit(e) for e in validation],
        [i for i in corpus_ids if i in chosen],
        len(required),
        len(chosen) - len(required),
        len(corpus_ids),
        len(keep_q),
        len(tq),
    )


def _full_spec(cfg: QuickstartConfig, data: dict) -> DataSpec:
    """The data spec every full Stage I run trains on (its training / validation split, negatives)."""
    return load_config(DataSpec, runs.data_spec(cfg, data))


def draw(cfg: QuickstartConfig, data: dict, out: Path) -> tuple[dict | None, dict[str, Any]]:
    """Write the proxy data set under ``out/proxy/data`` (a step: reused when the data and the
    size rule are the same). Returns (the proxy's ``data`` dict, or None when it would not be
    cheaper than the whole set; its summary)."""
    d = out / "proxy" / "data"
    inputs = {
        "fraction": cfg.proxy_fraction,
        "min_docs": cfg.proxy_min_docs,
        "min_train_queries": cfg.proxy_min_train_queries,
        "seed": cfg.seed,
        "data": runs.data_fingerprint(data),
        "eval_split": cfg.eval_split,
    }
    if not runs.step_done(d, inputs):
        runs.banner("proxy: a sample of the corpus for comparing the candidates cheaply")
        td = load_training_data(_full_spec(cfg, data), cfg.seed, show_progress=False)
        s = sample_proxy(
            td.train,
            td.validation,
            list(td.corpus),
            fraction=cfg.proxy_fraction,
            min_docs=cfg.proxy_min_docs,
            min_train_queries=cfg.proxy_min_train_queries,
            seed=cfg.seed,
        )
        info = {**s.summary(), "cheaper": s.cheaper}
        if s.cheaper:
            _write(d, s, td.corpus)
        d.mkdir(parents=True, exist_ok=True)
        runs.mark_done(d, inputs, info)
    info = json.loads((d / "DONE").read_text())["info"]
    if not info["cheaper"]:
        return None, info
    pdata = {
        "beir": str(d),
        "corpus": str(d / "corpus.jsonl"),
        "triplets": str(d / "triplets" / "train.jsonl"),
        "validation_triplets": str(d / "triplets" / "validation.jsonl"),
    }
    return {**pdata, "fingerprint": runs.data_fingerprint(pdata)}, info


def _write(d: Path, s: ProxySample, corpus: dict) -> None:
    write_corpus(d / "corpus.jsonl", (corpus[i] for i in s.doc_ids))
    qs = {e.query_id: e.query for e in s.train + s.validation}
    write_queries(d / "queries.jsonl", (Query(q, t) for q, t in sorted(qs.items())))

    def trip(e: Example) -> Triplet:
        return Triplet(e.query_id, e.pos.id, e.neg.id if e.neg is not None else None, e.source)

    write_triplets(d / "triplets" / "train.jsonl", (trip(e) for e in s.train))
    write_triplets(d / "triplets" / "validation.jsonl", (trip(e) for e in s.validation))


def proxy_config(cfg: QuickstartConfig) -> QuickstartConfig:
    """The proxy runs' settings: no reported split (the proxy's queries are training and
    validation queries only; the full data already dropped any test query from them)."""
    return replace(cfg, eval_split=None, max_eval_queries=None)  # type: ignore[arg-type]


def compare_on_proxy(
    cfg: QuickstartConfig, fams: list[Family], pdata: dict, out: Path, width_runs: dict[str, bool] | None = None
) -> tuple[Candidates, dict[str, Any]]:
    """Every Stage I candidate on the proxy (``out/proxy/stage1``), then one round of successive
    halving (:func:`~scalingnote.quickstart.choose.halve`, ``cfg.proxy_margin``): families, then
    each surviving family's depths, then each surviving depth's head learning rates, then the
    width run of the family's proxy-best (depth, lr) — unless ``width_runs`` says the budget cut
    that family's width run before the proxy. Returns the survivors — ordered best first,
    so a budget cut keeps the proxy's best — and the record of every candidate's proxy score."""
    pcfg, pout, m = proxy_config(cfg), out / "proxy", cfg.proxy_margin
    by_fam = {f.name: runs.large_tower_runs(pcfg, f, pdata, pout) for f in fams}
    fam_val = {n: max(r["best_val_score"] for r in v.values()) for n, v in by_fam.items()}
    keep_f, why_f = choose.halve(fam_val, m)
    rec: list[dict[str, Any]] = []
    reasons = {"families": why_f}
    depths: dict[str, dict[int | None, list[float]]] = {}
    width: dict[str, bool] = {}
    for fam in fams:
        v = by_fam[fam.name]
        keep_d: list[str]
        if fam.name not in keep_f:
            keep_d, why_d = [], ""
        else:
            keep_d, why_d = choose.halve({_dl(d): r["best_val_score"] for d, r in v.items()}, m)
            reasons[f"{fam.name} depths"] = why_d
        kept: dict[int | None, list[float]] = {}
        for d, r in sorted(v.items(), key=lambda kv: -kv[1]["best_val_score"]):
            lrs = r["lr_scores"]
            keep_l, why_l = choose.halve({f"{k:g}": x for k, x in lrs.items()}, m) if _dl(d) in keep_d else ([], "")
            if (
                keep_l and f"{r['head_lr']:g}" not in keep_l
            ):  # the rule's choice (the declared default, not separated) stays in
                keep_l.append(f"{r['head_lr']:g}")
                why_l += f"; {r['head_lr']:g} kept: {r.get('lr_choice', 'the head learning rate chosen')}"
            for lr, x in lrs.items():
                rec.append(
                    {
                        "family": fam.name,
                        "depth": d,
                        "head_lr": lr,
                        "dim": cfg.dim,
                        "proxy_val": round(x, 4),
                        "survived": f"{lr:g}" in keep_l,
                    }
                )
            if keep_l:
                reasons[f"{fam.name} depth {_dl(d)} head lrs"] = why_l
                # the rule's choice first (the declared default unless the evidence separated another): a
                # budget that trains one rate in full trains that one, not the proxy's noisiest lead
                kept[d] = sorted(
                    (lr for lr in lrs if f"{lr:g}" in keep_l), key=lambda lr: (lr != r["head_lr"], -lrs[lr])
                )
        if not kept:
            continue
        depths[fam.name] = kept
        best = max(v.values(), key=lambda r: r["best_val_score"])
        run_width = cfg.full_dim and (width_runs is None or width_runs.get(fam.name, True))
        full = runs.full_dim_run(pcfg, fam, best, pdata, pout) if run_width else None
        if cfg.full_dim and not run_width:
            reasons[f"{fam.name} width"] = (
                "not run on the proxy: the budget cannot train it after the proxy, whatever the proxy finds"
            )
        width[fam.name] = full is not None and full["best_val_score"] >= best["best_val_score"] - m
        if full is not None:
            rec.append(
                {
                    "family": fam.name,
                    "depth": best["depth"],
                    "head_lr": best["head_lr"],
                    "dim": full["dim"],
                    "proxy_val": round(full["best_val_score"], 4),
                    "survived": width[fam.name],
                }
            )
    prune_losers(pout, rec, cfg.dim)
    order = sorted(depths, key=lambda n: -fam_val[n])
    cands = Candidates({n: depths[n] for n in order}, {n: width[n] for n in order})
    return cands, {
        "margin": m,
        "rule": f"kept every candidate within {m:g} validation nDCG@10 of the proxy's best, "
        "at each level (family, depth, head learning rate, width)",
        "reasons": reasons,
        "candidates": rec,
    }


#: what a finished Stage I run holds besides its metrics (a lost proxy candidate's are removed)
TRAINED_OUTPUTS = ("query_tower", "doc_tower", "checkpoints", "doc_embeddings.npy")


def prune_losers(pout: Path, candidates: list[dict[str, Any]], dim: int) -> list[str]:
    """Remove what the proxy's lost candidates trained (:data:`TRAINED_OUTPUTS`), keeping their
    metrics: the record of the choice stays, the weights that lost go. Their steps stay done (a
    resumed run reads their ``run.json`` and redoes nothing). Returns the pruned run names."""
    pruned = []
    for c in candidates:
        if c["survived"]:
            continue
        name = f"{c['family']}_large_L{_dl(c['depth'])}_hlr{c['head_lr']:g}" + (
            "" if c["dim"] == dim else f"_d{c['dim']}"
        )
        d = pout / "stage1" / name
        for what in TRAINED_OUTPUTS:
            p = d / what
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
        if d.is_dir():
            pruned.append(name)
    return pruned


def _dl(depth: int | None) -> str:
    """A depth as the proxy's record names it (None: every layer of the model)."""
    return "all" if depth is None else str(depth)


def agreement(report: dict[str, Any], large: dict[str, dict], teacher: str, dim: int) -> dict[str, Any]:
    """The proxy's record completed with the full runs: every survivor's full validation nDCG@10
    (``full_val``) beside its proxy score, and ``agreed``: whether each full choice (the teacher
    family; each family's depth and head learning rate; its width) is the proxy's best."""
    cands = report["candidates"]
    for c in cands:
        L, x = large.get(c["family"]), None
        if L is not None and c["survived"]:
            if c["dim"] == dim:
                x = L["depths"].get(c["depth"], {}).get("lr_scores", {}).get(c["head_lr"])
            elif L.get("dim_choice") and L["dim_choice"]["dim"] == c["dim"]:
                x = L["dim_choice"]["val"]
        c["full_val"] = None if x is None else round(float(x), 4)
    agreed: dict[str, bool] = {}
    if cands:
        agreed["teacher"] = max(cands, key=lambda c: c["proxy_val"])["family"] == teacher
    for f, L in large.items():
        base = [c for c in cands if c["family"] == f and c["dim"] == dim]
        if not base:
            continue
        b = max(base, key=lambda c: c["proxy_val"])
        agreed[f"{f}: depth and head lr"] = (b["depth"], b["head_lr"]) == (L["depth"], L["head_lr"])
        w = [c for c in cands if c["family"] == f and c["dim"] != dim]
        if w and L.get("dim_choice"):
            agreed[f"{f}: width"] = (w[0]["proxy_val"] > b["proxy_val"]) == bool(L["dim_choice"]["kept"])
    report["agreed"] = agreed
    return report


__all__ = ["ProxySample", "agreement", "compare_on_proxy", "draw", "prune_losers", "proxy_config", "sample_proxy"]
