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

from _results_catalog import TABLES

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PLOTS = RESULTS / "plots"
DOCS = ROOT / "docs" / "results.md"
START, END = "<!-- results:start -->", "<!-- results:end -->"
QS_START, QS_END = "<!-- quickstart-time:start -->", "<!-- quickstart-time:end -->"

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


def _first(rows: list[dict], key: str, value: object) -> dict:
    """The first row whose ``key`` is ``value``; ``{}`` when none is."""
    return next((r for r in rows if r.get(key) == value), {})


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
        teacher, student, served = (_first(rows, "chosen", role) for role in ("teacher", "student", "served"))
        speed = (student.get("query_qps") or 0) / teacher["query_qps"] if teacher.get("query_qps") else None
        cells = [
            name,
            _first(rows, "method", "bm25").get("ndcg@10"),
            _first(rows, "method", "zero_shot_minilm-l6").get("ndcg@10"),
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


def _cpu(machine: str | None) -> str:
    """The processor of a results row's ``machine`` ("Linux x86_64, Intel(R) Xeon(R) Processor, 2 cores, ...")."""
    parts = str(machine or "?").split(", ")
    cpu = parts[1] if len(parts) > 1 else parts[0]
    return re.sub(r"\s+", " ", re.sub(r"\((R|TM)\)|\bProcessor\b|\bCPU\b", "", cpu)).strip()


def _newest_budgeted(rows: list[dict], order: list[str]) -> list[dict]:
    """The newest budgeted row of each (set, seed, cores), whichever code and machine measured it (each
    row names both): a later measurement of only some runs does not hide the others'."""
    newest: dict[tuple, dict] = {}
    for r in sorted((r for r in rows if r.get("mode") == "budgeted"), key=lambda r: str(r.get("created"))):
        newest[(r.get("set"), r.get("seed"), r.get("cores"))] = r
    rank = {name: i for i, name in enumerate(order)}
    return sorted(
        newest.values(), key=lambda r: (rank.get(r.get("set"), len(rank)), r.get("seed") or 0, -(r.get("cores") or 0))
    )


def quickstart_time_table() -> list[str]:
    """How long the quick start takes: the first command from a fresh clone (set-up included) and the
    budgeted runs on each data set, with the served nDCG@10 each run reached."""
    out = [
        "| run | budget (min) | took (min) | within budget + 10% | served nDCG@10 | student / teacher (val) "
        "| output (MB) | results file |",
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
        # the budget bounds the quick start, not the set-up; the target allows a tenth over it, as the
        # budgeted rows' ``within_time_target`` (benchmarks/quickstart_budget.py: TIME_SLACK)
        within = pipeline / 60 <= 8 * 1.1 if pipeline is not None else None
        out.append(
            f"| {label} | 8 | {_minutes(total.get('minutes'))} | {_yes(within)} "
            "|  |  |  | `quickstart_fresh_clone.json` |"
        )
        stamps.append(f"`quickstart_fresh_clone.json`: {_stamp(clone)}")
    budget = _load("quickstart_budget")
    if budget is not None:
        names = {"default": "default data", "scifact": "SciFact", "kuake_qtr": "KUAKE-QTR"}
        for r in _newest_budgeted(budget["rows"], list(names)):
            run = [
                f"seed {r['seed']}" if r.get("seed") is not None else "",
                {1: "1 core (`taskset -c 0`)", 2: "2 cores"}.get(r.get("cores"), ""),
                f"{_cpu(r.get('machine'))}, code {r.get('code')}",
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
