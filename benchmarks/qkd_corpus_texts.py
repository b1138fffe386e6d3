"""QKD's query pool with and without the corpus's own text, at the run's and at an equal step budget.

    python -m benchmarks.qkd_corpus_texts [--run runs/quickstart] [--texts 0,10000] [--qkd-epochs 30 --qkd-epochs 1000]
    python -m benchmarks.qkd_corpus_texts --run runs/recipe/scifact --texts 10000
    python -m benchmarks.qkd_corpus_texts --texts 10000 --qkd-max-steps none --name synthetic_steps

From a finished quick-start (or ``benchmarks.recipe``) run: the first row is the run's own chosen
student as it was distilled (``as_run``); then the same teacher and student (family, size,
listwise weight) distilled once per ``qkd_corpus_texts`` value at today's QKD step budget
(``qkd_max_steps``; 0 = the labelled queries and ICT pseudo-queries only). Every row is scored
against the teacher's document embeddings on the run's validation queries (held out of Stage I
and QKD; the first row must reproduce the run's own validation figure) and on its test split, with
a paired t-test of each row against the first. ``--qkd-epochs`` (repeatable) sets the new rows' epoch
budget: a small pool at the run's epochs takes fewer steps than a large one, so a large value (the
step budget ``qkd_max_steps`` then binds) separates "more text" from "more steps". Writes
``benchmarks/results/qkd_corpus_texts_<data>.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from benchmarks._common import REPO_ROOT, write_results


def _row(label: str, n: int, m: dict, sc, base, chosen: str, teacher: str) -> dict:
    from scalingnote.evaluation import paired_ttest

    t = paired_ttest(sc.per_query, base.per_query) if base is not None else None
    return {
        "qkd_run": label,
        "corpus_texts": n,
        "student": chosen.split("_from_")[0],
        "teacher": teacher,
        "qkd_queries": m.get("train_queries"),
        "steps": m.get("steps_run"),
        "best_step": m.get("best_step"),
        "train_seconds": m.get("train_seconds"),
        "start_layers": "-".join(map(str, m.get("student_base_layers") or [])) or "bottom",
        "val_ndcg@10": sc.val_ndcg,
        "ndcg@10": round(sc.metrics["ndcg@10"], 4),
        "r@100": round(sc.metrics["r@100"], 4),
        "delta_vs_first": round(t.mean_diff, 4) if t else None,
        "p_vs_first": round(t.pvalue, 4) if t else None,
    }


def _texts_of(qkd_run: Path) -> int:
    """How many corpus texts a finished QKD run imitated (0: none among its query sources)."""
    srcs = [Path(q["path"]) for q in json.loads((qkd_run / "run.json").read_text())["config"]["queries"]]
    return sum(sum(1 for _ in p.open()) for p in srcs if p.parent.name == "corpus_texts")


def measure(
    run: Path,
    texts: list[int],
    epochs: list[float] | None = None,
    max_steps: list[int | None] | None = None,
    dropout: float | None = None,
    starts: list[str] | None = None,
) -> tuple[list[dict], dict]:
    """The ``as_run`` row, then one row per (step cap, student start, epoch budget, texts value);
    the run's student is scored once. A step cap of None = no cap: the epoch budget and
    ``qkd_patience`` decide. ``starts``: ``student_layers`` values (default: the run's)."""
    from scalingnote.config import load_config
    from scalingnote.quickstart import QuickstartConfig, family, runs
    from scalingnote.quickstart.report import BASELINES
    from scalingnote.quickstart.scoring import TowerPool, load_eval_set, score

    cfg = load_config(QuickstartConfig, run / "quickstart.yaml")  # a field the run predates takes today's default
    res = json.loads((run / "results.json").read_text())
    chosen = res["choices"]["student"]["chosen"]
    cand = next(c for c in res["choices"]["student"]["candidates"] if c["name"] == chosen)
    teacher = res["choices"]["teacher"]["family"]
    tdir = Path(res["choices"]["teacher"]["dir"])
    data = runs.prepare_data(cfg, run)
    # every Stage I run of a quick start holds out the same validation queries: the teacher's are the run's
    ev = load_eval_set(Path(data["beir"]), cfg.eval_split, tdir, cfg.max_eval_queries)
    pool = TowerPool()
    own = Path(cand["dir"]).parent
    sc0 = score(pool, own / "query_tower", tdir, ev)
    if sc0.val_ndcg != cand["val"]:
        raise SystemExit(
            f"{run}: the student validates {sc0.val_ndcg} here, {cand['val']} in results.json: not the run's "
            "validation set"
        )
    n0 = _texts_of(own)
    own_run = json.loads((own / "run.json").read_text())
    rows = [_row("as_run", n0, own_run["metrics"], sc0, None, chosen, teacher)]
    fam = family(cfg, cand["family"])
    own_cap = own_run["config"]["optim"]["max_steps"]  # the cap the run's student had
    caps = max_steps or [own_cap]
    own_start = cfg.student_layers
    for cap, start, qkd_epochs, n in [
        (s, st, e, n) for s in caps for st in (starts or [own_start]) for e in (epochs or [None]) for n in texts
    ]:
        if (
            n == n0
            and cfg.qkd_corpus_texts == n
            and not qkd_epochs
            and cap == own_cap
            and dropout is None
            and start == own_start
        ):
            continue  # that is the run's own QKD step
        c = dataclasses.replace(
            cfg,
            qkd_corpus_texts=n,
            qkd_epochs=qkd_epochs or cfg.qkd_epochs,
            qkd_max_steps=cap,
            qkd_dropout=dropout if dropout is not None else cfg.qkd_dropout,
            student_layers=start,
        )
        name = (
            f"{chosen}_texts{n}"
            + (f"_e{c.qkd_epochs:g}" if c.qkd_epochs != cfg.qkd_epochs else "")
            + (f"_cap{cap or 'none'}" if cap != own_cap else "")
            + (f"_drop{dropout:g}" if dropout is not None else "")
            + (f"_start{start}" if start != own_start else "")
        )
        m = runs.run_qkd(
            c,
            name,
            tdir,
            fam,
            cand["layers"],
            data,
            run,
            runs.pseudo_queries(c, data, run),
            rank_weight=cand["rank_weight"],
            pool=runs.layer_pool(res["choices"]["families"][cand["family"]]["tower_dir"]),
        )
        label = (
            f"qkd_epochs={c.qkd_epochs:g},qkd_max_steps={c.qkd_max_steps},"
            f"qkd_dropout={c.qkd_dropout},student_layers={start}"
        )
        rows.append(_row(label, n, m, score(pool, Path(m["run_dir"]) / "query_tower", tdir, ev), sc0, chosen, teacher))
        print(rows[-1], flush=True)
    baselines = [r for r in res["rows"] if r["method"].startswith(BASELINES)]
    config = {
        "run": str(run.relative_to(REPO_ROOT)) if run.is_relative_to(REPO_ROOT) else str(run),
        "texts": texts,
        "qkd_max_steps": own_cap,
        "qkd_epochs": cfg.qkd_epochs,
        "val_queries": len(ev.val_qids),
        "test_queries": len(ev.qids),
        "baselines_ndcg@10": {r["method"]: r["ndcg@10"] for r in baselines},
        "baselines_val_ndcg@10": {r["method"]: r.get("val_ndcg@10") for r in baselines},
        "qkd_epochs_of_new_rows": epochs or "the run's",
        "qkd_max_steps_of_new_rows": caps,
    }
    return rows, config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", type=Path, default=REPO_ROOT / "runs" / "quickstart")
    ap.add_argument(
        "--texts", default="0,10000", help="qkd_corpus_texts values, comma-separated, beside the run's own student"
    )
    ap.add_argument(
        "--qkd-epochs",
        type=float,
        action="append",
        default=[],
        help="epoch budget of the new rows (default: the run's); repeat for several, e.g. a large one so that "
        "qkd_max_steps binds and every row gets the same steps",
    )
    ap.add_argument(
        "--qkd-max-steps",
        action="append",
        default=[],
        help="step cap of the new rows (default: the run's); repeat for several; 'none' = no cap (epochs and "
        "patience decide)",
    )
    ap.add_argument(
        "--qkd-dropout", type=float, default=None, help="the new rows' student dropout (default: the run's)"
    )
    ap.add_argument(
        "--student-layers",
        action="append",
        default=[],
        choices=["choose", "bottom"],
        help="the new rows' student start (default: the run's); repeat for several",
    )
    ap.add_argument("--name", default=None, help="results name suffix (default: the run's data, or synthetic)")
    args = ap.parse_args()
    run = args.run.resolve()
    caps = [None if x.lower() == "none" else int(x) for x in args.qkd_max_steps]
    rows, config = measure(
        run,
        [int(x) for x in args.texts.split(",")],
        args.qkd_epochs,
        caps or None,
        args.qkd_dropout,
        args.student_layers or None,
    )
    data = json.loads((run / "results.json").read_text())["config"].get("data")
    name = args.name or (Path(data).name if data else "synthetic")
    print(write_results(f"qkd_corpus_texts_{name}", rows, config))


if __name__ == "__main__":
    main()
