"""The heads-only Stage I configuration shared by the paper-experiment benchmarks (annotation
types, prompt ablation, fusion towers): frozen SmolLM2 / MiniLM towers, projection heads over
cached pooled states (``trainable_layers: 0``), BM25 hard negatives, validation every epoch on
10% of the training queries. ``benchmarks.recipe`` runs the quick start instead; these
experiments keep the configuration they were measured with."""

from __future__ import annotations

from pathlib import Path

from benchmarks._common import REPO_ROOT, shared_data_dir

QUERY_MAX, DOC_MAX = 64, 256
LLM, BERT = "smollm2-135m", "minilm-l6"


def work_dir(data: str) -> Path:
    return REPO_ROOT / "runs" / "recipe" / data


def ict_dir(out: Path, data: str, seed: int) -> Path:
    """``out``, holding ICT pseudo-queries over every corpus document of ``data`` (made once)."""
    from scalingnote.data.pseudo import ICTConfig, ict_queries

    if not (out / "triplets.jsonl").exists():
        ict_queries(shared_data_dir() / data / "corpus.jsonl", out, ICTConfig(seed=seed), progress=True)
    return out


def pseudo_queries_path(data: str, seed: int) -> Path:
    """ICT pseudo-queries over every corpus document, made once (``<work>/pseudo_ict_all``)."""
    return ict_dir(work_dir(data) / "pseudo_ict_all", data, seed) / "queries.jsonl"


def stage1_config(data: str, method: str, depth: int, head_lr: float, seed: int, out: Path, *, max_epochs: float):
    from scalingnote.config import load_config
    from scalingnote.training import TrainConfig

    llm = {"model": LLM, "num_layers": depth, "pooling": "mean"}
    bert = {"model": BERT}
    q, d = {"scaling_dual": (llm, llm), "scaling_doc": (bert, llm), "twinbert": (bert, bert)}[method]
    return load_config(
        TrainConfig,
        {
            "method": method,
            "output_dir": str(out),
            "query_tower": {**q, "max_length": QUERY_MAX, "trainable_layers": 0},
            "doc_tower": {**d, "max_length": DOC_MAX, "trainable_layers": 0},
            "dim": 128,
            "data": {
                "data_dir": str(shared_data_dir() / data),
                "eval_split": "test",
                "eval_overlap": "drop",
                "validation_fraction": 0.1,
                "negatives": "bm25",
            },
            "optim": {"batch_size": 64, "epochs": max_epochs, "lr": 0.0, "head_lr": head_lr, "warmup_ratio": 0.02},
            "seed": seed,
            "center_samples": 100_000,  # every training pair: features are cached, the fit is cheap
            "feature_cache_dir": str(work_dir(data) / "features"),
            "eval_every": "epoch",
            "patience": 4,
            "save_every": 10_000,
            "evaluate_zero_shot": True,
            "show_progress": False,
        },
    )
