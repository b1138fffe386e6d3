"""Stage II: query-based knowledge distillation (QKD) into a small online query tower."""

from scalingnote.distill.cache import TeacherCache, build_teacher_cache, open_teacher_cache
from scalingnote.distill.config import DistillConfig, DistillOptim, QuerySource
from scalingnote.distill.data import collect_queries
from scalingnote.distill.loss import qkd_loss
from scalingnote.distill.trainer import distill, evaluate_student

__all__ = [
    "DistillConfig",
    "DistillOptim",
    "QuerySource",
    "TeacherCache",
    "build_teacher_cache",
    "collect_queries",
    "distill",
    "evaluate_student",
    "open_teacher_cache",
    "qkd_loss",
]
