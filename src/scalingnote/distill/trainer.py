"""Stage II: distil the Stage I query tower into a small BERT student (ScalingNote §3.3).

The student (own tokenizer, [CLS] first, Eq. 13; projection to the teacher's dim,
Eq. 14) is trained with Eq. 15 on queries only, against cached teacher embeddings.
ScalingNote = the student + the frozen Stage I document embeddings: documents are
never re-encoded, and the student carries the document tower's compat id so an
index built from those embeddings accepts it.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from scalingnote.config import save_config
from scalingnote.data import load_qrels, load_queries
from scalingnote.data.beir import qrels_path
from scalingnote.distill.cache import build_teacher_cache
from scalingnote.distill.config import DistillConfig, QuerySource
from scalingnote.distill.loss import qkd_loss
from scalingnote.errors import ScalingNoteError
from scalingnote.training.loop import LoopSettings, TrainLoop, param_groups
from scalingnote.utils import run_metadata, seed_everything, write_json

log = logging.getLogger(__name__)


def _norm_text(t: str) -> str:
    return " ".join(t.lower().split())


def collect_queries(sources: list[QuerySource], exclude_ids: set[str], exclude_texts: set[str]) -> tuple[list[str], list[str], dict[str, int]]:
    """Unique (id, text) from every source, minus evaluation queries (by id and by normalised
    text). Ids are prefixed by the source index when two sources collide."""
    ids: list[str] = []
    texts: list[str] = []
    seen_text: set[str] = set()
    stats: dict[str, int] = {"dropped_eval": 0, "dropped_duplicate": 0}
    for si, src in enumerate(sources):
        p = Path(src.path)
        if p.is_dir():
            qs = load_queries(p / "queries.jsonl")
            if src.split:
                keep = load_qrels(qrels_path(p, src.split), qs.keys())
                items = [(q, qs[q].text) for q in qs if q in keep]
            else:
                items = [(q.id, q.text) for q in qs.values()]
        else:
            items = [(q.id, q.text) for q in load_queries(p).values()]
        if src.max_queries is not None:
            items = items[: src.max_queries]
        n_before = len(ids)
        for qid, text in items:
            nt = _norm_text(text)
            if qid in exclude_ids or nt in exclude_texts:
                stats["dropped_eval"] += 1
                continue
            if nt in seen_text:
                stats["dropped_duplicate"] += 1
                continue
            seen_text.add(nt)
            ids.append(f"s{si}:{qid}")
            texts.append(text)
        stats[f"source{si}:{p.name}"] = len(ids) - n_before
    if not ids:
        raise ScalingNoteError("distill: no training queries left after removing evaluation queries")
    return ids, texts, stats


def load_stage1(teacher_dir: str | Path):
    from scalingnote.models import load_tower

    t = Path(teacher_dir)
    for need in ("query_tower", "doc_embeddings.npy", "doc_ids.json"):
        if not (t / need).exists():
            raise ScalingNoteError(f"{t}: not a Stage I output directory (missing {need}); run `scalingnote train` first")
    return load_tower(t / "query_tower")


class QKDLoop(TrainLoop):
    """Stage II on the shared loop: Eq. 15 on a batch of queries against the cached teacher
    embeddings; validation = the loss on held-out queries (lower is better)."""

    desc = "QKD"
    higher_is_better = False
    save_when_stopping = False

    def __init__(self, cfg: DistillConfig, out: Path, student, prefix, texts, targets: np.ndarray, train_idx: np.ndarray, val_idx: np.ndarray,
                 batch_size: int, steps_per_epoch: int, total: int):
        o = cfg.optim
        settings = LoopSettings(o.max_grad_norm, cfg.log_every, cfg.save_every, cfg.keep_checkpoints, cfg.show_progress,
                                eval_every=cfg.eval_every or steps_per_epoch, patience=cfg.patience, restore_best=True)
        super().__init__(out, total, settings)
        self.cfg, self.student, self.prefix, self.texts, self.targets = cfg, student, prefix, texts, targets
        self.train_idx, self.val_idx, self.bs, self.steps_per_epoch = train_idx, val_idx, batch_size, steps_per_epoch
        self.device = next(student.parameters()).device
        self.build_optimizer(param_groups([student], o.lr, o.lr, o.weight_decay), o.warmup_ratio, o.betas, o.eps)

    def modules(self) -> list:
        return [self.student]

    def trainable_params(self) -> list[torch.Tensor]:
        return list(self.student.parameters())

    def batch_loss(self, idx: np.ndarray) -> torch.Tensor:
        batch_texts = [self.texts[i] for i in idx]
        if self.prefix is not None:
            q_stu = self.prefix.queries(batch_texts).float()
        else:
            enc = self.student.tokenize_queries(batch_texts)
            q_stu = self.student({k: v.to(self.device) for k, v in enc.items()}).float()
        return qkd_loss(torch.from_numpy(self.targets[idx]).to(self.device), q_stu, self.cfg.lam)

    def train_step(self, step: int) -> dict[str, float]:
        epoch, i = divmod(step, self.steps_per_epoch)
        order = np.random.default_rng([self.cfg.seed, epoch]).permutation(self.train_idx)
        loss = self.batch_loss(order[i * self.bs : (i + 1) * self.bs])
        loss.backward()
        return {"loss": float(loss.detach())}

    def has_validation(self) -> bool:
        return len(self.val_idx) > 0

    def validate(self) -> float | None:
        if not len(self.val_idx):
            return None
        was = self.student.training
        self.student.eval()
        with torch.no_grad():
            v = self.val_idx
            tot = sum(float(self.batch_loss(v[i : i + 512])) * len(v[i : i + 512]) for i in range(0, len(v), 512))
        self.student.train(was)
        return tot / len(v)

    def model_state(self) -> dict[str, Any]:
        return {"student": self.student.state_dict()}

    def load_model_state(self, state: dict[str, Any]) -> None:
        self.student.load_state_dict(state["student"])

    def log_record(self, comps: dict[str, float], validated: bool) -> dict[str, Any] | None:
        if not (self.step % self.cfg.log_every == 0 or self.step == self.total_steps or validated):
            return None
        rec: dict[str, Any] = {"step": self.step, "loss": comps["loss"], "lr": comps["lr"]}
        if validated:
            rec["val_loss"] = self.best["curve"][-1][1]
        return rec


def distill(cfg: DistillConfig, resume: bool = True) -> dict[str, Any]:
    """Run QKD end to end; returns the metrics also written to ``run.json``."""
    from scalingnote.models import load_tower

    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out / "config.yaml")
    seed_everything(cfg.seed)
    teacher = load_stage1(cfg.teacher)

    eval_qrels, eval_queries = None, {}
    if cfg.eval_data:
        qs = load_queries(Path(cfg.eval_data) / "queries.jsonl")
        eval_qrels = load_qrels(qrels_path(cfg.eval_data, cfg.eval_split), qs.keys())
        eval_queries = {q: qs[q].text for q in eval_qrels}
    ids, texts, qstats = collect_queries(cfg.queries, set(eval_queries), {_norm_text(t) for t in eval_queries.values()})
    encode = None
    if cfg.feature_cache_dir:
        from scalingnote.models import PrefixTower

        # a head-only (trainable_layers: 0) teacher: its pooled states may already be cached by Stage I
        t_prefix = PrefixTower(teacher, 0, cfg.feature_cache_dir, batch_size=cfg.teacher_batch_size, show_progress=cfg.show_progress)

        def encode(xs: list[str]) -> np.ndarray:
            return t_prefix.encode(xs, normalize=False, batch_size=max(256, cfg.teacher_batch_size))
    cache = build_teacher_cache(
        teacher, ids, texts, cfg.cache_dir or out / "teacher_cache", batch_size=cfg.teacher_batch_size, show_progress=cfg.show_progress,
        encode=encode,
    )
    del teacher, encode  # the LLM is not needed any more
    targets = np.asarray(cache.emb, dtype=np.float32)
    if cfg.target == "normalized":
        targets = targets / np.maximum(np.linalg.norm(targets, axis=1, keepdims=True), 1e-12)

    rng = np.random.default_rng(cfg.seed)
    perm = rng.permutation(len(cache))
    n_val = int(round(len(cache) * cfg.validation_fraction)) if len(cache) > 10 else 0
    val_idx, train_idx = np.sort(perm[:n_val]), np.sort(perm[n_val:])

    s = cfg.student
    student = load_tower(
        s.model, "query", num_layers=s.num_layers, pooling=s.pooling, dim=cache.dim,
        matryoshka_dims=_mdims(cache.dim), max_query_length=s.max_length, projection_seed=cfg.seed,
    )
    if student.kind != "bert":
        log.info("the student is a %s tower (ScalingNote distils into a small BERT)", student.kind)
    s_prefix = None
    if s.prefix_k is not None:
        from scalingnote.models import PrefixTower

        s_prefix = PrefixTower(student, s.prefix_k, cfg.feature_cache_dir or out / "feature_cache",
                               batch_size=cfg.teacher_batch_size, show_progress=cfg.show_progress)
        s_prefix.ensure(list(cache.texts))
    if cfg.head_init == "lstsq" and min(len(train_idx), cfg.head_init_samples) < 2 * student.config.hidden_size:
        log.warning("head_init=lstsq needs >= 2x hidden size (%d) training queries; keeping the random W", 2 * student.config.hidden_size)
    elif cfg.head_init == "lstsq":
        pick = np.sort(np.random.default_rng(cfg.seed).permutation(train_idx)[: cfg.head_init_samples])
        init_student_head(student, [cache.texts[i] for i in pick], targets[pick], batch_size=cfg.teacher_batch_size, prefix=s_prefix)
    o = cfg.optim
    bs = min(o.batch_size, len(train_idx))
    steps_per_epoch = max(1, len(train_idx) // bs)
    total = math.ceil(o.epochs * steps_per_epoch)
    total = min(total, o.max_steps) if o.max_steps else total
    loop = QKDLoop(cfg, out, student, s_prefix, cache.texts, targets, train_idx, val_idx, bs, steps_per_epoch, total)
    last = loop.run(resume=resume)
    step = loop.step
    train_seconds = loop.total_train_seconds  # summed over resumed runs
    train_loss = float(last.get("loss", float("nan")))
    best = loop.best
    student.eval()
    val = loop.validate()
    # ScalingNote: the student serves queries against the frozen Stage I document embeddings
    student.compat_id = cache.meta["compat_id"]
    student.save(out / "query_tower")
    res: dict[str, Any] = {
        "student": s.model,
        "student_layers": student.config.num_layers,
        "student_non_embedding_params": student.non_embedding_params,
        "train_queries": int(len(train_idx)),
        "validation_queries": int(len(val_idx)),
        "steps": total,
        "steps_run": step,
        "best_step": best["step"],
        "stopped_early": step < total,
        "val_curve": best["curve"],
        "target": cfg.target,
        "student_trainable_layers": s.trainable_layers,
        "train_seconds": round(train_seconds, 2),
        "qkd_train_loss": train_loss,
        "qkd_val_loss": val,
        "compat_id": student.compat_id,
        **{f"queries_{k}": v for k, v in qstats.items()},
    }
    if eval_qrels:
        res.update(evaluate_student(student, cfg.teacher, eval_queries, eval_qrels))
    write_json(out / "run.json", {"metrics": res, **run_metadata(cfg)})
    return res


def init_student_head(student, texts: list[str], targets: np.ndarray, batch_size: int = 128, ridge: float = 1e-3, prefix=None) -> float:
    """Linear-probe start for Eq. 14: ``c`` = mean pooled student state, ``W`` = the ridge
    least-squares map from the centred states to the teacher embeddings ``targets [n, dim]``.

    Returns the relative squared error ``sum||t - W(h - c)||^2 / sum||t||^2`` of the fit. Not in the
    paper: a random W_stu leaves a short CPU run far from the teacher (Eq. 15 must also learn the
    teacher's magnitude), while this start is the best linear map of the pre-trained states.
    """
    import dataclasses

    import torch

    if student.projection is None:
        raise ScalingNoteError("the student has no projection to initialise")
    from scalingnote.training.driver import pooled_states

    if prefix is not None:
        with torch.no_grad():
            h = torch.cat([prefix.pooled(texts[i : i + 512]).float().cpu() for i in range(0, len(texts), 512)]).double()
    else:
        h = pooled_states(student, texts, lambda t, xs: t.tokenize_queries(xs), batch_size).double()
    t = torch.as_tensor(np.asarray(targets), dtype=torch.float64)
    c = h.mean(0)
    x = h - c
    gram = x.T @ x
    lam = ridge * float(torch.trace(gram)) / gram.shape[0]
    w = torch.linalg.solve(gram + lam * torch.eye(gram.shape[0], dtype=gram.dtype), x.T @ t).T  # [dim, hidden]
    with torch.no_grad():
        student.projection.weight.copy_(w.to(student.projection.weight.dtype))
    student.set_center(c.float())
    student.config = dataclasses.replace(student.config, projection_init="lstsq")
    student._ids = None
    return float(((t - x @ w.T) ** 2).sum() / (t**2).sum().clamp(min=1e-12))


def _mdims(dim: int) -> list[int]:
    from scalingnote.models.towers import matryoshka_dims_for

    return matryoshka_dims_for(dim)


def evaluate_student(student, teacher_dir: str | Path, queries: dict[str, str], qrels, tau: float = 0.05) -> dict[str, float]:
    """ScalingNote retrieval: student query embeddings against the Stage I document embeddings."""
    from scalingnote.evaluation.dense import dense_metrics, truncate_normalize

    t = Path(teacher_dir)
    d_emb = np.load(t / "doc_embeddings.npy", mmap_mode="r")
    doc_ids = json.loads((t / "doc_ids.json").read_text(encoding="utf-8"))
    qids = list(queries)
    q = truncate_normalize(student.encode_queries([queries[x] for x in qids], batch_size=256, show_progress=False))
    return dense_metrics(q, qids, truncate_normalize(d_emb), doc_ids, qrels, tau=tau)
