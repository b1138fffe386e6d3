"""Evaluation: ranking metrics (R@K as ScalingNote defines it, Recall@K, MRR, nDCG, MAP, P@K)
that agree with trec_eval, AUC over labelled pairs, contrastive perplexity, and paired
significance tests."""

from scalingnote.evaluation.auc import judged_pairs, pair_auc, run_auc
from scalingnote.evaluation.metrics import (
    DEFAULT_METRICS,
    EvalReport,
    MetricSpec,
    evaluate,
    evaluate_report,
    parse_metric,
    parse_metrics,
    per_query,
    rank_documents,
)
from scalingnote.evaluation.perplexity import (
    PAPER_NUM_NEGATIVES,
    ContrastiveSet,
    contrastive_nll,
    contrastive_perplexity,
    contrastive_perplexity_from_scorer,
    sample_contrastive_set,
)
from scalingnote.evaluation.significance import (
    BootstrapResult,
    Comparison,
    TTestResult,
    compare_runs,
    paired_bootstrap,
    paired_ttest,
    ratio_interval,
)

__all__ = [
    "DEFAULT_METRICS",
    "PAPER_NUM_NEGATIVES",
    "BootstrapResult",
    "Comparison",
    "ContrastiveSet",
    "EvalReport",
    "MetricSpec",
    "TTestResult",
    "compare_runs",
    "contrastive_nll",
    "contrastive_perplexity",
    "contrastive_perplexity_from_scorer",
    "evaluate",
    "evaluate_report",
    "judged_pairs",
    "pair_auc",
    "paired_bootstrap",
    "paired_ttest",
    "parse_metric",
    "parse_metrics",
    "per_query",
    "rank_documents",
    "ratio_interval",
    "run_auc",
    "sample_contrastive_set",
]
