"""The main job: ``scalingnote quickstart`` runs the whole ScalingNote pipeline end to end, making
every choice on validation queries held out from the user's training split.

    data (synthetic note-search log -> triplets, or a BEIR directory)
      -> which model families can read the queries (tokenizer check; a family that cannot is skipped)
      -> the plan against the time budget (``budget_minutes``), then every Stage I candidate on a
         proxy sample; only those within ``proxy_margin`` of the proxy's best run in full
         (:mod:`~scalingnote.quickstart.early`; ``full``: every candidate in full, no budget)
      -> Stage I per family: the large dual tower (depth and head learning rate chosen on validation;
         never worse than its zero-shot start), the teacher = the best large tower on validation
      -> Stage II: QKD of the teacher into the student(s); the best-validating student within the
         latency budget is ScalingNote
      -> the paper's comparison at matched online cost per family (twinbert_small, scaling_doc,
         scalingnote, scaling_dual; ScalingNote Tables 3-4)
      -> IVFPQ index over the teacher's document embeddings, with semantic IDs
      -> the served default (student alone or fused with BM25, chosen on validation), the table
         and the `scalingnote serve` command for it.

Everything goes under one output directory; each step records the digest of its inputs, so a
re-run resumes, and a step made from other inputs is redone. Sizes are reduced for a 2-core CPU.

The package is callable: ``scalingnote.quickstart(data=None, out="runs/quickstart", budget_minutes=8,
**options)`` is :func:`~scalingnote.quickstart.results.run_quickstart` (it returns a
:class:`~scalingnote.quickstart.results.QuickstartResult`).
"""

import inspect
import sys
import types

from scalingnote.quickstart.config import FAMILIES, Family, QuickstartConfig, family, parse_student
from scalingnote.quickstart.index_choice import default_factory
from scalingnote.quickstart.main import quickstart
from scalingnote.quickstart.results import QuickstartResult, read_results, run_quickstart
from scalingnote.quickstart.runs import prepare_data, stage1_config
from scalingnote.quickstart.scoring import query_qps


class _CallablePackage(types.ModuleType):
    """This package's type: calling it runs the quick start (``scalingnote.quickstart(...)``)."""

    def __call__(self, *args, **kwargs) -> QuickstartResult:
        return run_quickstart(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
__signature__ = inspect.signature(run_quickstart)

__all__ = [
    "FAMILIES",
    "Family",
    "QuickstartConfig",
    "default_factory",
    "family",
    "parse_student",
    "prepare_data",
    "query_qps",
    "QuickstartResult",
    "quickstart",
    "read_results",
    "run_quickstart",
    "stage1_config",
]
