"""Regenerate the results from benchmarks/results/*.json.

Usage: python scripts/gen_results.py [--check]

* ``README.md``, between the markers <!-- results:start --> and <!-- results:end -->: one
  summary row per headline data set (at most 8 columns) and the speed-vs-quality plots; between
  <!-- quickstart-time:start --> and <!-- quickstart-time:end -->: how long the quick start took
  (the first command from a fresh clone, and each budgeted run);
* ``docs/results.md``: every table, all columns (the whole file is generated);
* ``benchmarks/results/plots/quality_vs_qps_<dataset>.png``: query tower speed vs quality
  (matplotlib; skipped with a note when matplotlib is absent).

``--check`` only compares: exit 1 when README.md or docs/results.md is stale.
No absolute path of the machine that ran a benchmark is printed (:func:`portable`).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PLOTS = RESULTS / "plots"
DOCS = ROOT / "docs" / "results.md"
START, END = "<!-- results:start -->", "<!-- results:end -->"
QS_START, QS_END = "<!-- quickstart-time:start -->", "<!-- quickstart-time:end -->"

#: (results file, title, columns to show; None = all scalar columns)
#: the columns of every quick-start / recipe table and of every QKD-ablation table
QUICKSTART_COLUMNS = [
    "method",
    "large_tower",
    "query_tower",
    "query_layers",
    "val_ndcg@10",
    "ndcg@10",
    "r@100",
    "p_vs_prev",
    "p_vs_best_baseline",
    "query_qps",
    "p99_ms",
    "chosen",
]
QKD_ABLATION_COLUMNS = [
    "qkd_run",
    "corpus_texts",
    "student",
    "teacher",
    "qkd_queries",
    "steps",
    "best_step",
    "train_seconds",
    "val_ndcg@10",
    "ndcg@10",
    "r@100",
    "delta_vs_first",
    "p_vs_first",
]

TABLES: list[tuple[str, str, list[str] | None]] = [
    (
        "recipe_scifact",
        "The quick-start recipe on SciFact (`python -m benchmarks.recipe --data scifact`: every choice on validation queries; the paper's comparison at matched online cost per family; full test split and corpus)",
        QUICKSTART_COLUMNS,
    ),
    (
        "recipe_kuake_qtr",
        "The quick-start recipe on KUAKE-QTR (`python -m benchmarks.recipe --data kuake_qtr`)",
        QUICKSTART_COLUMNS,
    ),
    (
        "recipe_synthetic",
        "The quick-start recipe on the synthetic note-search log (`python -m benchmarks.recipe --data synthetic`)",
        QUICKSTART_COLUMNS,
    ),
    (
        "recipe_scifact_p99_5ms",
        'The SciFact recipe with a latency budget (`python -m benchmarks.recipe --data scifact --student-p99-ms 5 --set \'students=["bert:1","bert:2"]\' --tag p99_5ms`: the best-validating student whose single-query p99 is under 5 ms is served)',
        QUICKSTART_COLUMNS,
    ),
    (
        "recipe_synthetic_p99_3.5ms",
        "The synthetic recipe with a latency budget (`python -m benchmarks.recipe --data synthetic --student-p99-ms 3.5 --tag p99_3.5ms`: every readable family's student at 1..its small size; the best-validating one whose single-query p99 is under 3.5 ms is served)",
        QUICKSTART_COLUMNS,
    ),
    (
        "recipe_synthetic_p99_3ms",
        "The synthetic recipe with a 3 ms latency budget (`python -m benchmarks.recipe --data synthetic --student-p99-ms 3 --tag p99_3ms`)",
        QUICKSTART_COLUMNS,
    ),
    (
        "qkd_listwise",
        "QKD with and without its listwise term, same teacher and steps (`python -m benchmarks.qkd_listwise`; val = the teacher's held-out validation queries, never distilled on; p = paired t-test vs the first row of the data set)",
        [
            "data",
            "student",
            "rank_weight",
            "epochs",
            "steps_run",
            "best_step",
            "train_queries",
            "train_seconds",
            "val_ndcg@10",
            "val_p_vs_first",
            "ndcg@10",
            "r@100",
            "p_vs_first",
        ],
    ),
    (
        "qkd_corpus_texts_synthetic",
        "QKD's query pool with and without the corpus's titles and sentences (synthetic log, quick start) (`python -m benchmarks.qkd_corpus_texts`; row as_run = the run's own student; p = paired t-test vs it)",
        QKD_ABLATION_COLUMNS,
    ),
    (
        "qkd_corpus_texts_scifact",
        "QKD's query pool with and without the corpus's titles and sentences (SciFact recipe) (`python -m benchmarks.qkd_corpus_texts --run runs/recipe/scifact --texts 10000`; row as_run = the run's own student; p = paired t-test vs it)",
        QKD_ABLATION_COLUMNS,
    ),
    (
        "qkd_corpus_texts_kuake_qtr",
        "QKD's query pool with and without the corpus's titles and sentences (KUAKE-QTR recipe) (`python -m benchmarks.qkd_corpus_texts --run runs/recipe/kuake_qtr --texts 10000`; row as_run = the run's own student; p = paired t-test vs it)",
        QKD_ABLATION_COLUMNS,
    ),
    (
        "qkd_corpus_texts_synthetic_steps",
        "QKD with and without its 1,000-step cap, the quick start's teacher and student (synthetic log) (`python -m benchmarks.qkd_corpus_texts --texts 10000 --qkd-max-steps none --name synthetic_steps`; row as_run = the run's own student; p = paired t-test vs it)",
        QKD_ABLATION_COLUMNS,
    ),
    (
        "qkd_corpus_texts_synthetic_dropout",
        "QKD with the student's dropout off beside the base model's 0.1 (synthetic log, 900 steps) (`python -m benchmarks.qkd_corpus_texts --run runs/quickstart_s15 --texts 10000 --qkd-dropout 0 --name synthetic_dropout`; row as_run = the run's own student; p = paired t-test vs it)",
        QKD_ABLATION_COLUMNS,
    ),
    (
        "qkd_corpus_texts_synthetic_cap",
        "QKD at 800 and 900 steps beside the run's 1,000 (synthetic log, the CPU cap of `qkd_max_steps: auto`) (`python -m benchmarks.qkd_corpus_texts --run runs/quickstart_s14 --texts 10000 --qkd-max-steps 800 --qkd-max-steps 900 --name synthetic_cap`; row as_run = the run's own student; p = paired t-test vs it)",
        QKD_ABLATION_COLUMNS,
    ),
    (
        "hybrid_scifact",
        "Hybrid BM25 + dense on SciFact (`python -m benchmarks.hybrid --dataset scifact`; dense side in the config)",
        None,
    ),
    ("hybrid_kuake_qtr", "Hybrid BM25 + dense on KUAKE-QTR", None),
    ("fsdp_memory", "FSDP2 vs DDP memory per process (SmolLM2 full depth + MiniLM, 2 processes, gloo, CPU)", None),
    (
        "qkd_distributed",
        "QKD in one process vs two torchrun processes (DDP, FSDP2) on SciFact (`python -m benchmarks.qkd_distributed`; MiniLM-2L student of the depth-2 ScalingDual teacher; row `start` = after the head fit, before training)",
        [
            "run",
            "processes",
            "distributed",
            "steps_run",
            "best_step",
            "start_val_loss",
            "qkd_val_loss",
            "ndcg@10",
            "r@100",
            "ndcg@10_minus_1proc",
            "train_seconds",
            "steps_per_s",
        ],
    ),
    ("export", "Exported query towers: torch vs ONNX fp32 / int8", None),
    (
        "bm25",
        "BM25 baseline (test splits)",
        ["dataset", "language", "queries", "ndcg@10", "recall@100", "r@100", "mrr@10", "map"],
    ),
    ("stage1_scifact", "Stage I on SciFact (train -> test; SmolLM2 mean pooling, centre + PCA head init)", None),
    (
        "llm_pooling_scifact",
        "Zero-shot SmolLM2 by depth and pooling (SciFact sub-corpus; why the LLM towers mean-pool on CPU)",
        None,
    ),
    (
        "stage1_scifact_placeholder",
        "Stage I on SciFact with the paper's placeholder pooling (earlier run: random head, 2 layers)",
        None,
    ),
    ("stage1_kuake_qtr", "Stage I on KUAKE-QTR (train -> test)", None),
    ("qkd_scifact", "Stage II (QKD) students on SciFact", None),
    (
        "quickstart_synthetic",
        "Quick start on the embedded defaults (synthetic note-search log; `bash scripts/quickstart.sh`)",
        QUICKSTART_COLUMNS,
    ),
    (
        "quickstart_synthetic_gpu",
        "Quick start on the embedded defaults on an NVIDIA H100 (`scripts/device_quickstart.sh`: bf16 autocast, `unfreeze_layers: auto` = 1; query_qps = batch encoding on the GPU)",
        QUICKSTART_COLUMNS,
    ),
    (
        "quickstart_synthetic_gpu_top2",
        "The same on the H100 with `--set unfreeze_layers=2` (the chosen large towers' top two layers trained from their heads)",
        QUICKSTART_COLUMNS,
    ),
    (
        "quickstart_synthetic_unfreeze1",
        "The quick start's CPU run with `--set unfreeze_layers=1` (every other step reused; `python -m benchmarks.quickstart --from-run ... --tag unfreeze1 --reused`): val_curve = step:validation nDCG@10 of each large tower's Stage I run, step 0 = its start (the heads, for the top-layer rows)",
        [
            "method",
            "large_tower",
            "query_tower",
            "val_ndcg@10",
            "ndcg@10",
            "best_step",
            "train_seconds",
            "val_curve",
            "chosen",
        ],
    ),
    (
        "quickstart_equivalence",
        "Quick start before the restructuring (commit 318a7af) vs now, embedded defaults, full precision (`python -m benchmarks.quickstart_equivalence`)",
        None,
    ),
    ("quickstart_fresh_clone", "README command 1 on a fresh clone, timed (`python -m benchmarks.fresh_clone`)", None),
    (
        "quickstart_scifact",
        "Quick start on SciFact (`scalingnote quickstart --data ../shared/data/scifact --set evaluate_start=true`: start_* columns = each method before training; the other columns are what the default command gives)",
        None,
    ),
    (
        "quickstart_kuake_qtr",
        "Quick start on KUAKE-QTR (`scalingnote quickstart --data ../shared/data/kuake_qtr`)",
        None,
    ),
    ("index_scifact", "Indexes on SciFact (MiniLM embeddings)", None),
    ("index_synthetic_1m", "Indexes on 1M synthetic clustered vectors", None),
    ("tmj_scifact", "Learned PQ (TMJ) on SciFact", None),
    ("encode_throughput", "Encoding throughput (CPU, fp32, 2 threads)", None),
    ("data_stats", "Training-data statistics", None),
    ("learnability", "Is the synthetic log learnable? TwinBERT on real vs shuffled triplets", None),
    ("serve_loadtest", "Online service load test", None),
    (
        "fuzz",
        "Fuzzing: readers (hypothesis) and the service (schemathesis); failures must be 0",
        ["kind", "target", "mode", "examples", "ok", "data_error", "failures", "seconds"],
    ),
    (
        "chaos",
        "Chaos: SIGKILL at a seeded random moment, then the same command again",
        [
            "trial",
            "stage",
            "kill_at_s",
            "reference_s",
            "killed",
            "half_written_files",
            "resumed_ok",
            "outputs_identical",
            "differing",
        ],
    ),
    ("soak", "Soak: the service under closed-loop load (per window)", None),
    (
        "faults",
        "Write faults on the live index: every write point fails once in turn (in-process), and a real 8 MB tmpfs filled, freed, SIGKILLed "
        "(`python -m benchmarks.faults`); after each restart a history checker counts lost, resurrected and duplicated documents (all must be 0)",
        None,
    ),
    ("scaling_fit", "Scaling-law fits (heads only over frozen towers: `python -m benchmarks.scaling_sweep`)", None),
    (
        "scaling_trained_fit",
        "Scaling laws over towers whose every layer trains (`python -m benchmarks.scaling_trained`; MiniLM 1-6 and SmolLM2 1-6 layers on SciFact; "
        "held-out points predicted before they were trained, see `scaling_trained_predictions.json`)",
        [
            "fit",
            "check",
            "law",
            "points",
            "r2",
            "A",
            "alpha",
            "B",
            "beta",
            "delta",
            "at_bound",
            "depth",
            "N",
            "D",
            "budget",
            "predicted",
            "measured",
            "rel_err",
            "within_5pct",
        ],
    ),
    (
        "scaling_trained_sweep",
        "Points of the trained scaling sweep (loss = test contrastive perplexity; dev curve = step:dev loss)",
        [
            "role",
            "depth",
            "N",
            "D",
            "human_pairs",
            "loss",
            "ndcg@10",
            "r@100",
            "start_dev_contrastive_ppl",
            "dev_contrastive_ppl",
            "best_step",
            "steps_run",
            "train_seconds",
            "dev_curve",
        ],
    ),
    (
        "scaling_trained_gpu200_fit",
        "The SmolLM2 model-size law up to the whole 30-layer tower, every layer trained, on an NVIDIA H200 "
        "(`bash scripts/device_scaling_trained.sh`: family `smollm2_full`, 1-16 layers fitted, 30 held out and predicted before it trained; "
        "the protocol of `scaling_trained_fit`, 200 steps, bf16 autocast)",
        [
            "fit",
            "check",
            "law",
            "points",
            "r2",
            "A",
            "alpha",
            "delta",
            "depth",
            "N",
            "D",
            "predicted",
            "measured",
            "rel_err",
            "within_5pct",
        ],
    ),
    (
        "scaling_trained_gpu200_sweep",
        "Its points (loss = test contrastive perplexity; p = paired t-test of the per-query loss against the next shallower depth)",
        [
            "role",
            "depth",
            "N",
            "D",
            "loss",
            "loss_se",
            "ndcg@10",
            "r@100",
            "delta_loss_vs_shallower",
            "p_vs_shallower",
            "start_dev_contrastive_ppl",
            "dev_contrastive_ppl",
            "best_step",
            "steps_run",
            "train_seconds",
        ],
    ),
    (
        "llm_layers_scifact",
        "The document-tower depth curve with trained LLM layers (ScalingNote §4.4; `python -m benchmarks.llm_layers`): SmolLM2 "
        "ScalingDual, heads only vs the top k layers of both towers trained from those heads",
        [
            "depth",
            "trainable_layers",
            "tower",
            "ndcg@10",
            "r@100",
            "contrastive_ppl",
            "start_ndcg@10",
            "val_ndcg@10",
            "val_curve",
            "best_step",
            "steps_run",
            "train_seconds",
            "cache_gb",
            "delta_ndcg@10_vs_heads",
            "p_vs_heads",
            "delta_ndcg@10_vs_shallower",
            "p_vs_shallower",
        ],
    ),
    (
        "llm_layers_scifact_gpu",
        "The same depth curve with every SmolLM2 layer of both towers trained end to end, on an NVIDIA H200 "
        "(`bash scripts/device_llm_layers.sh`: SmolLM2 cut to its bottom 12 layers (`LAYERS=12`); bf16 autocast; two layer learning rates, "
        "`chosen` = best validation nDCG@10 of its depth; heads-only rows from the same run)",
        [
            "depth",
            "trainable_layers",
            "lr",
            "chosen",
            "ndcg@10",
            "r@100",
            "contrastive_ppl",
            "start_ndcg@10",
            "val_ndcg@10",
            "val_curve",
            "best_step",
            "steps_run",
            "train_seconds",
            "delta_ndcg@10_vs_heads",
            "p_vs_heads",
            "delta_ndcg@10_vs_shallower",
            "p_vs_shallower",
        ],
    ),
    (
        "llm_layers_scifact_twinbert_doc128",
        "TwinBERT under the depth grid's own rules (`python -m benchmarks.llm_layers --depths 4 --k 0 --doc-max 128 "
        "--twinbert-row --max-epochs 3 --tag twinbert_doc128`: MiniLM-L6, every layer, 128 document tokens; the grid's depth-4 heads-only row beside it)",
        [
            "method",
            "depth",
            "trainable_layers",
            "ndcg@10",
            "r@100",
            "start_ndcg@10",
            "val_ndcg@10",
            "val_curve",
            "best_step",
            "steps_run",
            "train_seconds",
            "delta_ndcg@10_vs_scaling_dual",
            "p_vs_scaling_dual",
        ],
    ),
    (
        "prompt_ablation_scifact",
        "Document-prompt ablations on SciFact (ScalingNote Table 5; `python -m benchmarks.prompt_ablation`)",
        None,
    ),
    (
        "fusion_synthetic",
        "Fusion towers on the synthetic note-search log (ScalingNote §3.5; `python -m benchmarks.fusion`)",
        None,
    ),
    (
        "annotation_scifact",
        "Annotation types at matched sizes on SciFact (scaling-laws paper §5; `python -m benchmarks.annotation`)",
        None,
    ),
    ("scaleout", "Scale-out engines: Ray encoding, Milvus Lite and a real Milvus server vs FAISS", None),
]


#: an absolute directory prefix two levels deep or more (a home or work directory), not an endpoint ("/documents/x"),
#: a URL's "//" nor a ratio's "1/3"
_ABS_DIR = re.compile(r"(?<![\w.:/])/(?:[\w.@+-]+/){2,}")
#: an absolute prefix in front of a repository-relative path (runs/, .cache/, benchmarks/)
_ABS_TO_REPO = re.compile(r"(?<![\w.:/])/(?:[\w.@+-]+/)*?(?=(?:runs|\.cache|benchmarks)/)")


def portable(text: str) -> str:
    """``text`` without one machine's absolute paths: a path into a run directory keeps its part from
    ``runs/``, ``.cache/`` or ``benchmarks/`` on; any other absolute directory becomes ``.../``."""
    return _ABS_DIR.sub(".../", _ABS_TO_REPO.sub("", text))


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4f}" if abs(v) < 10 else f"{v:.1f}"
    if v is None:
        return ""
    text = portable(str(v)).replace("|", "\\|").replace("\n", " ")
    return text.replace("[", "\\[").replace("]", "\\]")  # "curve[0][1]" is no Markdown link


def _load(name: str) -> dict | None:
    path = RESULTS / f"{name}.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if data.get("rows") else None


def _table(cols: list[str], rows: list[dict], header: list[str] | None = None) -> list[str]:
    out = ["| " + " | ".join(header or cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |" for r in rows]
    return out


#: The headline datasets: (results-file suffix, name).
HEADLINE: list[tuple[str, str]] = [
    ("scifact", "SciFact (English, BEIR)"),
    ("kuake_qtr", "KUAKE-QTR (Chinese query -> title)"),
    ("synthetic", "Synthetic note-search log (the quick start's default data)"),
]
SUMMARY_HEADER = [
    "data (test split)",
    "BM25",
    "zero-shot MiniLM-L6",
    "teacher (large tower)",
    "student (QKD)",
    "served",
    "student / teacher query QPS",
    "results file",
]
assert len(SUMMARY_HEADER) <= 8


def headline_rows(dataset: str) -> list[dict]:
    """The recipe's rows on ``dataset`` (its depth and embedding-size candidates and other students are in
    docs/results.md), in the file's order: baselines, the matched-cost comparison per family,
    the served rows."""
    rec = _load(f"recipe_{dataset}")
    if rec is None:
        return []
    return [
        {**r, "source": f"recipe_{dataset}"}
        for r in rec["rows"]
        if not str(r.get("method", "")).startswith(
            ("scaling_dual_depth_", "scaling_dual_dim_", "scalingnote_candidate")
        )
    ]


def _stamp(data: dict) -> str:
    """``machine, date`` of a results file."""
    return f"{data.get('machine', '?')}, {str(data.get('created', '?'))[:10]}"


def summary_table() -> list[str]:
    """One row per headline dataset: nDCG@10 of the baselines, the teacher, the student and the served
    configuration (each chosen on validation queries), and the student's query speed over the teacher's."""
    out = ["| " + " | ".join(SUMMARY_HEADER) + " |", "|" + "---|" * len(SUMMARY_HEADER)]
    stamps = []
    for dataset, name in HEADLINE:
        rec = _load(f"recipe_{dataset}")
        if rec is None:
            continue
        rows = rec["rows"]
        pick = lambda key, val: next((r for r in rows if r.get(key) == val), {})  # noqa: E731
        teacher, student, served = pick("chosen", "teacher"), pick("chosen", "student"), pick("chosen", "served")
        speed = (student.get("query_qps") or 0) / teacher["query_qps"] if teacher.get("query_qps") else None
        cells = [
            name,
            pick("method", "bm25").get("ndcg@10"),
            pick("method", "zero_shot_minilm-l6").get("ndcg@10"),
            teacher.get("ndcg@10"),
            student.get("ndcg@10"),
            served.get("ndcg@10"),
            f"{speed:.2f}x" if speed else None,
            f"`recipe_{dataset}.json`",
        ]
        out.append("| " + " | ".join(_fmt(c) for c in cells) + " |")
        stamps.append(f"`recipe_{dataset}.json`: {_stamp(rec)}")
    return out + ["", "Measured on: " + "; ".join(stamps) + "."] if stamps else []


def _minutes(v) -> str:
    return "" if v is None else f"{v:g}" if float(v).is_integer() else f"{v:.2f}"


def _yes(v) -> str:
    return "" if v is None else "yes" if v else "**no**"


def quickstart_time_table() -> list[str]:
    """How long the quick start takes: the first command from a fresh clone (set-up included) and the
    budgeted runs on each data set, with the served nDCG@10 each run reached."""
    out = [
        "| run | budget (min) | took (min) | within budget | served nDCG@10 | student / teacher (val) | output (MB) | results file |",
        "|---|---|---|---|---|---|---|---|",
    ]
    stamps = []
    clone = _load("quickstart_fresh_clone")
    total = next((r for r in clone["rows"] if str(r.get("phase", "")).startswith("total")), None) if clone else None
    if total is not None:
        setup = next((r.get("seconds") for r in clone["rows"] if str(r.get("phase", "")).startswith("setup")), None)
        label = "`bash scripts/quickstart.sh` from a fresh clone" + (
            f" (set-up {setup / 60:.1f} min included)" if setup else ""
        )
        pipeline = next(
            (r.get("seconds") for r in clone["rows"] if str(r.get("phase", "")).startswith("pipeline (")), None
        )
        within = (
            pipeline / 60 <= 8 if pipeline is not None else None
        )  # the budget bounds the quick start, not the set-up
        out.append(
            f"| {label} | 8 | {_minutes(total.get('minutes'))} | {_yes(within)} |  |  |  | `quickstart_fresh_clone.json` |"
        )
        stamps.append(f"`quickstart_fresh_clone.json`: {_stamp(clone)}")
    budget = _load("quickstart_budget")
    if budget is not None:
        names = {"default": "default data", "scifact": "SciFact", "kuake_qtr": "KUAKE-QTR"}
        for r in budget["rows"]:
            if r.get("mode") != "budgeted" or r.get("carried"):  # a carried row ran other code: not today's time
                continue
            run = [
                f"seed {r['seed']}" if r.get("seed") is not None else "",
                {1: "1 core (`taskset -c 0`)", 2: "2 cores"}.get(r.get("cores"), ""),
            ]
            cells = [
                f"`--budget-minutes {_minutes(r.get('budget_minutes'))}` on {names.get(r.get('set'), r.get('set'))}"
                + (f" ({', '.join(x for x in run if x)})" if any(run) else ""),
                _minutes(r.get("budget_minutes")),
                _minutes(r.get("pipeline_minutes")),
                _yes(r.get("within_time_target")),
                r.get("served_ndcg@10"),
                r.get("retention_val"),
                r.get("output_mb"),
                "`quickstart_budget.json`",
            ]
            out.append("| " + " | ".join(_fmt(c) for c in cells) + " |")
        stamps.append(f"`quickstart_budget.json`: {_stamp(budget)}")
    return out + ["", "Measured on: " + "; ".join(stamps) + "."] if stamps else []


def plot_quality_vs_qps(dataset: str, rows: list[dict]) -> Path | None:
    """Scatter: query QPS (log) vs nDCG@10, one labelled point per method with a query tower."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    # the recipe's towers only: one benchmark, one measurement of QPS (the hybrid rows come from another run)
    pts = [
        r
        for r in rows
        if str(r.get("source", "")).startswith("recipe_")
        and r.get("query_qps")
        and r.get("ndcg@10") is not None
        and r.get("query_tower") not in (None, "-")
    ]
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    for i, r in enumerate(sorted(pts, key=lambda r: r["query_qps"])):
        student = "QKD" in str(r.get("query_tower"))
        ax.scatter(
            r["query_qps"],
            r["ndcg@10"],
            s=40,
            marker="o" if student else "s",
            color="tab:orange" if student else "tab:blue",
        )
        ax.annotate(
            f"{r['method']}\n{r['query_tower']}",
            (r["query_qps"], r["ndcg@10"]),
            fontsize=6,
            xytext=(4, 3 if i % 2 else -12),
            textcoords="offset points",
        )
    ax.set_xscale("log")
    for r in rows:
        if r.get("method") == "bm25" and r.get("ndcg@10") is not None:
            ax.axhline(r["ndcg@10"], color="grey", ls="--", lw=0.8)
            ax.text(
                0.01, r["ndcg@10"], " BM25", transform=ax.get_yaxis_transform(), fontsize=7, color="grey", va="bottom"
            )
    ax.set_xlabel("query encoding + search, queries/s (log; CPU, shared machine)")
    ax.set_ylabel("nDCG@10 (test)")
    ax.set_title(f"{dataset}: query tower speed vs quality (orange: QKD students)", fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out = PLOTS / f"quality_vs_qps_{dataset}.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def render_headline(plots: bool = True) -> str:
    """The README's results block: the summary table, then the speed-vs-quality plots."""
    out = [
        START,
        "",
        "_Generated by `python scripts/gen_results.py` from `benchmarks/results/*.json`; do not edit by hand. "
        "Every table with all its columns: [docs/results.md](docs/results.md)._",
        "",
    ]
    out += summary_table()
    out.append("")
    images = []
    for dataset, _ in HEADLINE:
        rows = headline_rows(dataset)
        png = PLOTS / f"quality_vs_qps_{dataset}.png"
        if plots and rows:
            plot_quality_vs_qps(dataset, rows)
        if rows and png.exists():
            images.append(f"![{dataset}: query QPS vs nDCG@10]({png.relative_to(ROOT).as_posix()})")
    if images:
        out += [" ".join(images), ""]
    out.append(END)
    return "\n".join(out)


def render_quickstart_time() -> str:
    """The README's quick-start timing block."""
    return "\n".join(
        [
            QS_START,
            "",
            "_Generated by `python scripts/gen_results.py`; do not edit by hand._",
            "",
            *quickstart_time_table(),
            "",
            QS_END,
        ]
    )


def render() -> str:
    """docs/results.md: every table of :data:`TABLES`, all its columns."""
    out = [
        "# Results: every benchmark table",
        "",
        "_Generated by `python scripts/gen_results.py` from `benchmarks/results/*.json`; do not edit by hand._ "
        "Each table names its results file; each file records its config, package versions and machine. "
        "Measured on a 2-core CPU machine shared with other jobs: throughput numbers are noisy.",
        "",
    ]
    out += ['<a id="summary"></a>', "", "## Summary: the quick-start recipe on each data set", "", *summary_table(), ""]
    out += ['<a id="quickstart-time"></a>', "", "## How long the quick start takes", "", *quickstart_time_table(), ""]
    listed = {n for n, _, _ in TABLES}
    rest = [(p.stem, f"`{p.stem}`", None) for p in sorted(RESULTS.glob("*.json")) if p.stem not in listed]
    for name, title, cols in TABLES + rest:  # every results file gets a table
        path = RESULTS / f"{name}.json"
        if not path.exists():
            continue
        data = json.loads(path.read_text(encoding="utf-8"))
        rows = data.get("rows", [])
        if not rows:
            continue
        if cols is None:
            cols = []
            for r in rows:
                cols += [k for k in r if k not in cols and not isinstance(r[k], (dict, list))]
        out.append(f'<a id="{name}"></a>')  # a stable link target: the results file's name
        out.append("")
        out.append(f"## {title}")
        out.append("")
        out.append(f"`benchmarks/results/{name}.json` — {data.get('machine', '?')}, {data.get('created', '?')}")
        out.append("")
        out += _table(cols, rows)
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def replace_block(text: str, start: str, end: str, block: str, name: str) -> str:
    """``text`` with the part from ``start`` to ``end`` (markers included) replaced by ``block``."""
    if start not in text or end not in text:
        raise SystemExit(f"README.md has no {name} markers ({start} ... {end})")
    return text[: text.index(start)] + block + text[text.index(end) + len(end) :]


def main() -> int:
    check = "--check" in sys.argv
    readme = ROOT / "README.md"
    text = readme.read_text(encoding="utf-8")
    new = replace_block(text, START, END, render_headline(plots=not check), "results")
    new = replace_block(new, QS_START, QS_END, render_quickstart_time(), "quick-start time")
    full = render()
    old_full = DOCS.read_text(encoding="utf-8") if DOCS.exists() else ""
    if check:
        stale = [p for p, a, b in ((readme, new, text), (DOCS, full, old_full)) if a != b]
        for p in stale:
            print(f"{p.relative_to(ROOT)} is stale: run python scripts/gen_results.py", file=sys.stderr)
        return 1 if stale else 0
    atomic_write(readme, new)
    atomic_write(DOCS, full)
    return 0


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary name, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


if __name__ == "__main__":
    sys.exit(main())
