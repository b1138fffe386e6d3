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
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

import scalingnote.training.distributed as D
from scalingnote.config import save_config
from scalingnote.data import load_qrels, load_queries
from scalingnote.data.beir import qrels_path
from scalingnote.distill.cache import TeacherCache, build_teacher_cache, open_teacher_cache
from scalingnote.distill.config import DistillConfig, QuerySource
from scalingnote.distill.loss import qkd_loss, qkd_rank_loss
from scalingnote.distill.ranking import TeacherRanking, teacher_ranking
from scalingnote.errors import ScalingNoteError
from scalingnote.evaluation.dense import dense_metrics, truncate_normalize
from scalingnote.models import PrefixTower, load_tower
from scalingnote.models.towers import matryoshka_dims_for
from scalingnote.training.evaluate import heldout_queries
from scalingnote.training.fsdp import gather_towers, shard_towers
from scalingnote.training.heads import init_student_head
from scalingnote.training.loop import LoopSettings, TrainLoop, param_groups
from scalingnote.training.resume import OnChange, as_input_path, begin_run, config_inputs, finish_run
from scalingnote.utils import run_metadata, seed_everything, write_json

log = logging.getLogger(__name__)


def _norm_text(t: str) -> str:
    return " ".join(t.lower().split())


def collect_queries(
    sources: list[QuerySource], exclude: dict[str, tuple[set[str], set[str]]]
) -> tuple[list[str], list[str], dict[str, int]]:
    """Unique (id, text) from every source, minus each named set of ``exclude`` = {name: (ids,
    normalised texts)} (the evaluation queries, the teacher's validation queries), counted as
    ``dropped_<name>``. Ids are prefixed by the source index when two sources collide."""
    ids: list[str] = []
    texts: list[str] = []
    seen_text: set[str] = set()
    stats: dict[str, int] = {**{f"dropped_{name}": 0 for name in exclude}, "dropped_duplicate": 0}
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
            hit = next((name for name, (x_ids, x_texts) in exclude.items() if qid in x_ids or nt in x_texts), None)
            if hit is not None:
                stats[f"dropped_{hit}"] += 1
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


def teacher_holdout(teacher_dir: str | Path) -> tuple[set[str], set[str]] | None:
    """(ids, normalised texts) of the teacher run's held-out validation queries, or None for a
    teacher directory without a Stage I config (nothing is known to be held out)."""

    if not (Path(teacher_dir) / "config.yaml").exists():
        log.info("%s: no config.yaml, so no validation queries of the teacher to hold out of QKD", teacher_dir)
        return None
    texts, _ = heldout_queries(teacher_dir)
    return set(texts), {_norm_text(t) for t in texts.values()}


def load_stage1(teacher_dir: str | Path):
    t = Path(teacher_dir)
    for need in ("query_tower", "doc_embeddings.npy", "doc_ids.json"):
        if not (t / need).exists():
            raise ScalingNoteError(
                f"{t}: not a Stage I output directory (missing {need}); run `scalingnote train` first"
            )
    return load_tower(t / "query_tower")


@dataclass
class QKDData:
    """What Stage II trains on: the cached teacher targets of the collected queries, the
    train / validation split, and where it came from."""

    texts: list[str]
    targets: np.ndarray  #: [n, dim] float32, Eq. 15's q_i (L2-normalised with ``target: normalized``)
    train_idx: np.ndarray
    val_idx: np.ndarray
    compat_id: str  #: the Stage I document tower's compat id (the student inherits it)
    query_stats: dict[str, int]
    eval_queries: dict[str, str]
    eval_qrels: dict | None
    ranking: TeacherRanking | None = None  #: the teacher's top-k documents per query (``rank_weight > 0``)

    @property
    def dim(self) -> int:
        return int(self.targets.shape[1])


def prepare_data(cfg: DistillConfig) -> QKDData:
    """Collect the training queries (minus evaluation queries), encode them once with the frozen
    Stage I query tower into the teacher cache (rank 0 only under torchrun; the other ranks read
    it after a barrier and never load the LLM), and split off the validation queries."""
    out = Path(cfg.output_dir)
    eval_qrels, eval_queries = None, {}
    if cfg.eval_data:
        qs = load_queries(Path(cfg.eval_data) / "queries.jsonl")
        eval_qrels = load_qrels(qrels_path(cfg.eval_data, cfg.eval_split), qs.keys())
        eval_queries = {q: qs[q].text for q in eval_qrels}
    held = teacher_holdout(cfg.teacher) if cfg.exclude_teacher_validation else None
    ids, texts, qstats = collect_queries(
        cfg.queries,
        {
            "eval": (set(eval_queries), {_norm_text(t) for t in eval_queries.values()}),
            "teacher_validation": held or (set(), set()),
        },
    )
    root = Path(cfg.cache_dir) if cfg.cache_dir else out / "teacher_cache"
    cache = _build_cache(cfg, ids, texts, root) if D.rank() == 0 else None
    D.barrier()
    if cache is None:
        cache = open_teacher_cache(root)
    if cache.ids != ids:
        raise ScalingNoteError(
            f"{root}: the teacher cache holds another query set than this run collected; use a new cache_dir"
        )
    targets = np.asarray(cache.emb, dtype=np.float32)
    if cfg.target == "normalized":
        targets = targets / np.maximum(np.linalg.norm(targets, axis=1, keepdims=True), 1e-12)
    perm = np.random.default_rng(cfg.seed).permutation(len(cache))
    n_val = int(round(len(cache) * cfg.validation_fraction)) if len(cache) > 10 else 0
    ranking = teacher_ranking(cfg.teacher, targets, cfg.rank_k) if cfg.rank_weight > 0 else None
    return QKDData(
        list(cache.texts),
        targets,
        np.sort(perm[n_val:]),
        np.sort(perm[:n_val]),
        cache.meta["compat_id"],
        qstats,
        eval_queries,
        eval_qrels,
        ranking,
    )


def forward_batch(cfg: DistillConfig) -> int:
    """The no-grad forward batch of the teacher cache and the head fits: ``teacher_batch_size``
    on a GPU, at most ``cpu_batch_size`` on a CPU (smaller length-sorted batches run faster there)."""
    return cfg.teacher_batch_size if torch.cuda.is_available() else min(cfg.teacher_batch_size, cfg.cpu_batch_size)


def _build_cache(cfg: DistillConfig, ids: list[str], texts: list[str], root: Path) -> TeacherCache:
    teacher = load_stage1(cfg.teacher)
    encode = None
    if cfg.feature_cache_dir:
        # a head-only (trainable_layers: 0) teacher: its pooled states may already be cached by Stage I
        t_prefix = PrefixTower(
            teacher, 0, cfg.feature_cache_dir, batch_size=forward_batch(cfg), show_progress=cfg.show_progress
        )

        def encode(xs: list[str]) -> np.ndarray:
            return t_prefix.encode(xs, normalize=False, batch_size=max(256, cfg.teacher_batch_size))

    cache = build_teacher_cache(
        teacher, ids, texts, root, batch_size=forward_batch(cfg), show_progress=cfg.show_progress, encode=encode
    )
    del teacher, encode  # the LLM is not needed any more: give its GPU memory back before the student trains
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return cache


def build_student(cfg: DistillConfig, data: QKDData, device: torch.device | None = None):
    """The student (Eq. 13-14) with its initial head, its :class:`PrefixTower` when its bottom
    layers are frozen and cached (``student.trainable_layers != "all"``; else None) and, with
    ``cfg.student_layer_candidates``, which of its base model's layers it starts from: each
    candidate gets its ``head_init`` head and the QKD validation loss, and the lowest is kept
    (None when there was nothing to choose)."""
    cands = cfg.student_layer_candidates or []
    if len(cands) < 2 or not len(data.val_idx):
        if len(cands) > 1:
            log.warning("student_layer_candidates: no validation queries to choose with; starting from %s", cands[0])
        return (*_student_start(cfg, data, device, cands[0] if cands else cfg.student.layers), None)
    tried, best = [], None
    for layers in cands:
        student, prefix = _student_start(cfg, data, device, layers)
        v = qkd_validation_loss(cfg, student, prefix, data, _device(student), _use_bf16(cfg, _device(student)))
        tried.append({"layers": list(layers), "val_loss": round(float(v), 6)})
        if best is None or v < best[2]:
            best = (student, prefix, v, list(layers))
        del student, prefix
    choice = {
        "layers": best[3],
        "tried": tried,
        "reason": "lowest QKD validation loss at the start (head fitted, before any step): "
        + ", ".join(f"{t['layers']} {t['val_loss']:.4f}" for t in tried),
    }
    log.info("student layers: %s (%s)", best[3], choice["reason"])
    return best[0], best[1], choice


def _device(module: torch.nn.Module) -> torch.device:
    return next(module.parameters()).device


def _use_bf16(cfg: DistillConfig, device: torch.device) -> bool:
    return cfg.precision == "bf16" or (cfg.precision == "auto" and device.type == "cuda")


def _student_start(cfg: DistillConfig, data: QKDData, device: torch.device | None, layers: list[int] | None):
    """One student start: the student with ``layers`` of its base model, its prefix and its head.
    Under torchrun rank 0 fills the feature cache and fits the head; the other ranks read the
    cache after it and receive rank 0's weights, so every replica starts identical."""

    s = cfg.student
    student = _load_student(cfg, data.dim, device, layers)
    if student.kind != "bert":
        log.info("the student is a %s tower (ScalingNote distils into a small BERT)", student.kind)
    s_prefix = None
    main = D.rank() == 0
    if s.prefix_k is not None:
        if not main:
            D.barrier()  # rank 0 fills the cache first
        s_prefix = PrefixTower(
            student,
            s.prefix_k,
            cfg.feature_cache_dir or Path(cfg.output_dir) / "feature_cache",
            batch_size=forward_batch(cfg),
            show_progress=cfg.show_progress and main,
        )
        s_prefix.ensure(list(data.texts))
        if main:
            D.barrier()
    train_idx = data.train_idx
    if cfg.head_init == "lstsq" and min(len(train_idx), cfg.head_init_samples) < 2 * student.config.hidden_size:
        log.warning(
            "head_init=lstsq needs >= 2x hidden size (%d) training queries; keeping the random W",
            2 * student.config.hidden_size,
        )
    elif cfg.head_init == "lstsq":
        if main:
            pick = np.sort(np.random.default_rng(cfg.seed).permutation(train_idx)[: cfg.head_init_samples])
            init_student_head(
                student,
                [data.texts[i] for i in pick],
                data.targets[pick],
                batch_size=forward_batch(cfg),
                prefix=s_prefix,
            )
        D.broadcast_module(student)  # rank 0's W and centre
        if not main:
            student.set_projection("lstsq")
    return student, s_prefix


def _load_student(cfg: DistillConfig, dim: int, device: torch.device | None, layers: list[int] | None = None):
    """A fresh student (``layers`` of its base model; None = ``student.layers`` or its first
    ``student.num_layers``) with a (seeded, random) projection to the teacher's ``dim``; fp32
    master weights (bf16 compute on GPU comes from autocast / FSDP2's MixedPrecisionPolicy)."""

    s = cfg.student
    layers = layers if layers is not None else s.layers
    student = load_tower(
        s.model,
        "query",
        num_layers=s.num_layers,
        pooling=s.pooling,
        dim=dim,
        matryoshka_dims=_mdims(dim),
        max_query_length=s.max_length,
        projection_seed=cfg.seed,
        device=device,
        dtype=torch.float32,
        layers=layers,
    )
    if cfg.student_dropout is not None:
        for m in student.modules():
            if isinstance(m, torch.nn.Dropout):
                m.p = float(cfg.student_dropout)
    return student


def qkd_batch_loss(
    cfg: DistillConfig, student, prefix, data: QKDData, idx: np.ndarray, device: torch.device, use_bf16: bool
) -> torch.Tensor:
    """Eq. 15 (+ the listwise term when ``data.ranking``) of the student on queries ``idx``."""
    batch_texts = [data.texts[i] for i in idx]
    ctx = torch.autocast(device_type=device.type, dtype=torch.bfloat16) if use_bf16 else nullcontext()
    with ctx:
        if prefix is not None:
            q_stu = prefix.queries(batch_texts)
        else:
            enc = student.tokenize_queries(batch_texts)
            q_stu = student({k: v.to(device) for k, v in enc.items()})
    q_stu = q_stu if q_stu.dtype == torch.float64 else q_stu.float()  # float64 stays (exactness tests)
    loss = qkd_loss(torch.from_numpy(data.targets[idx]).to(device, q_stu.dtype), q_stu, cfg.lam)
    if data.ranking is not None:
        t_scores, s_scores = data.ranking.batch(idx, q_stu)
        loss = loss + cfg.rank_weight * qkd_rank_loss(t_scores, s_scores, cfg.rank_tau)
    return loss


def qkd_validation_loss(
    cfg: DistillConfig, student, prefix, data: QKDData, device: torch.device, use_bf16: bool
) -> float | None:
    """Mean :func:`qkd_batch_loss` over the validation queries (eval mode, no grad); None without
    any. Every rank computes it over all of them: a sharded forward is collective."""
    v = data.val_idx
    if not len(v):
        return None
    v = v[
        np.argsort([len(data.texts[i]) for i in v], kind="stable")
    ]  # length-sorted: little padding (the mean is the same)
    ch = 512 if device.type == "cuda" else forward_batch(cfg)
    was = student.training
    student.eval()
    with torch.no_grad():
        tot = sum(
            float(qkd_batch_loss(cfg, student, prefix, data, v[i : i + ch], device, use_bf16)) * len(v[i : i + ch])
            for i in range(0, len(v), ch)
        )
    student.train(was)
    return tot / len(v)


class QKDLoop(TrainLoop):
    """Stage II on the shared loop: Eq. 15 on a batch of queries against the cached teacher
    embeddings; validation = the loss on held-out queries (lower is better).

    Under torchrun each rank takes its slice of the global batch (``optim.batch_size``) and its
    loss is the slice's mean; the ranks' gradients are averaged (DDP all-reduce, or FSDP2's
    reduce-scatter with ``distributed: fsdp``), so a step equals one process's step on the whole
    batch (``tests/distill/test_qkd_distributed.py``)."""

    desc = "QKD"
    higher_is_better = False
    save_when_stopping = False

    def __init__(
        self,
        cfg: DistillConfig,
        out: Path,
        student,
        prefix,
        data: QKDData,
        on_step: Callable[[int], None] | None = None,
        *,
        deadline: float | None = None,
        min_steps: int = 0,
    ):
        o = cfg.optim
        ws = D.world_size()
        D.local_batch_size(o.batch_size)  # checks that the ranks split the global batch evenly
        bs = min(o.batch_size, len(data.train_idx))
        bs -= bs % ws
        if bs == 0:
            raise ScalingNoteError(f"distill: {len(data.train_idx)} training queries for {ws} processes")
        steps_per_epoch = max(1, len(data.train_idx) // bs)
        total = math.ceil(o.epochs * steps_per_epoch)
        total = min(total, o.max_steps) if o.max_steps else total
        settings = LoopSettings(
            **cfg.cadence(),
            max_grad_norm=o.max_grad_norm,
            eval_every=cfg.eval_every or steps_per_epoch,
            patience=cfg.patience,
            restore_best=True,
            max_seconds=o.max_seconds,
            deadline=deadline,
            min_steps=min(min_steps, total),
        )
        super().__init__(out, total, settings, is_main=D.rank() == 0)
        self.cfg, self.student, self.prefix = cfg, student, prefix
        self.data = data
        self.train_idx, self.val_idx, self.bs, self.steps_per_epoch = data.train_idx, data.val_idx, bs, steps_per_epoch
        self.device = next(student.parameters()).device
        self.use_bf16 = _use_bf16(cfg, self.device)
        self._on_step = on_step
        if cfg.distributed == "fsdp":  # shard before the optimizer sees the parameters
            self.sharded = shard_towers([student], self.device, cfg.fsdp, cfg.precision)
        self.build_optimizer(param_groups([student], o.lr, o.lr, o.weight_decay), o.warmup_ratio, o.betas, o.eps)

    def modules(self) -> list:
        return [self.student]

    def checkpoint_modules(self) -> dict:
        return {"student": self.student}

    def trainable_params(self) -> list[torch.Tensor]:
        return list(self.student.parameters())

    def batch_loss(self, idx: np.ndarray) -> torch.Tensor:
        return qkd_batch_loss(self.cfg, self.student, self.prefix, self.data, idx, self.device, self.use_bf16)

    def batch_for_step(self, step: int) -> np.ndarray:
        """This rank's rows of step ``step``: the global batch is a pure function of
        ``(seed, epoch)``; rank r takes its ``r``-th slice."""
        epoch, i = divmod(step, self.steps_per_epoch)
        order = np.random.default_rng([self.cfg.seed, epoch]).permutation(self.train_idx)
        return D.rank_slice(order[i * self.bs : (i + 1) * self.bs])

    def train_step(self, step: int) -> dict[str, float]:
        loss = self.batch_loss(self.batch_for_step(step))
        loss.backward()
        return {"loss": D.mean_over_ranks(float(loss.detach()))}  # the global batch's loss

    def has_validation(self) -> bool:
        return len(self.val_idx) > 0

    def validate(self) -> float | None:
        """Mean Eq. 15 loss over the validation queries (:func:`qkd_validation_loss`)."""
        return qkd_validation_loss(self.cfg, self.student, self.prefix, self.data, self.device, self.use_bf16)

    def model_state(self) -> dict[str, Any]:
        return {"student": self.student.state_dict()}

    def load_model_state(self, state: dict[str, Any]) -> None:
        self.student.load_state_dict(state["student"])

    def after_step(self, step: int) -> None:
        if self._on_step is not None:
            self._on_step(step)

    def examples_per_step(self) -> int:
        return self.bs

    def log_record(self, comps: dict[str, float], validated: bool) -> dict[str, Any] | None:
        if not (self.step % self.cfg.log_every == 0 or self.step == self.total_steps or validated):
            return None
        rec: dict[str, Any] = {"step": self.step, "loss": comps["loss"], "lr": comps["lr"]}
        if validated:
            rec["val_loss"] = self.best["curve"][-1][1]
        return rec


def qkd_inputs(cfg: DistillConfig) -> dict[str, Any]:
    """What a QKD run's checkpoints depend on (:mod:`scalingnote.training.resume`): the config
    (teacher-cache location and batch sizes aside) with the teacher's query tower and document
    embeddings, the query sources, the evaluation data and a local student model fingerprinted."""
    inputs = config_inputs(cfg, {"eval_data": cfg.eval_data, "student.model": cfg.student.model})
    inputs.pop("cache_dir", None)
    inputs.pop("teacher_batch_size", None)
    inputs.pop("cpu_batch_size", None)
    teacher = Path(cfg.teacher)
    inputs["teacher"] = {
        "dir": str(teacher.resolve()),
        "query_tower": teacher / "query_tower",
        "doc_embeddings": teacher / "doc_embeddings.npy",
    }
    inputs["queries"] = [{**q, "path": as_input_path(q["path"])} for q in inputs["queries"]]
    return inputs


def distill(
    cfg: DistillConfig,
    resume: bool = True,
    on_step: Callable[[int], None] | None = None,
    on_change: OnChange = "refuse",
    *,
    deadline: float | None = None,
    min_steps: int = 0,
) -> dict[str, Any]:
    """Run QKD end to end; returns the metrics also written to ``run.json`` (under torchrun: by
    rank 0, which also saves and evaluates the gathered student; other ranks return ``{}``).
    ``on_step(step)`` runs after every optimizer step (and its checkpoint). ``resume`` continues
    from checkpoints made from the same inputs (:func:`qkd_inputs`); others are refused with the
    keys that differ (``on_change="refuse"``) or cleared (``"redo"``). ``deadline`` (a
    ``time.monotonic()`` instant, e.g. a time budget's) boxes the loop like ``optim.max_seconds``,
    never below ``min_steps`` steps (:mod:`scalingnote.training.timebox`)."""
    D.init_from_env()
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    inputs = qkd_inputs(cfg)
    begin_run(
        out,
        inputs,
        resume=resume,
        on_change=on_change,  # before config.yaml is overwritten or any work
        stale=() if cfg.cache_dir else ("teacher_cache",),
    )  # a redo re-encodes its queries with the teacher
    main = D.rank() == 0
    if main:
        save_config(cfg, out / "config.yaml")
    seed_everything(cfg.seed)
    data = prepare_data(cfg)
    device = D.local_device()
    student, s_prefix, layer_choice = build_student(cfg, data, device)
    n_params, n_layers = student.non_embedding_params, student.config.num_layers
    loop = QKDLoop(cfg, out, student, s_prefix, data, on_step=on_step, deadline=deadline, min_steps=min_steps)
    last = loop.run(resume=resume)
    train_loss = float(last.get("loss", float("nan")))
    val = loop.validate()  # collective when sharded: every rank takes part
    if loop.sharded:  # FSDP2: rank 0 gets an ordinary student with the trained weights
        (student,) = gather_towers(
            [student], lambda: [_load_student(cfg, data.dim, device, student.config.base_layers)]
        )
    D.barrier()
    if not main:
        return {}
    student.eval()
    # ScalingNote: the student serves queries against the frozen Stage I document embeddings
    student.compat_id = data.compat_id
    student.save(out / "query_tower")
    best = loop.best
    res: dict[str, Any] = {
        "student": cfg.student.model,
        "student_layers": n_layers,
        "student_base_layers": student.config.base_layers,  #: None = the base model's first student_layers
        "student_layer_choice": layer_choice,
        "student_non_embedding_params": n_params,
        "train_queries": int(len(data.train_idx)),
        "validation_queries": int(len(data.val_idx)),
        "processes": D.world_size(),
        "distributed": cfg.distributed if D.is_distributed() else "none",
        "steps": loop.total_steps,
        "planned_steps": loop.planned_steps,  # before a time box re-planned them (= steps without one)
        "steps_run": loop.step,
        "best_step": best["step"],
        "stopped_early": loop.step < loop.total_steps,
        "val_curve": best["curve"],
        "target": cfg.target,
        "rank_weight": cfg.rank_weight,
        "student_trainable_layers": cfg.student.trainable_layers,
        "train_seconds": round(loop.total_train_seconds, 2),  # summed over resumed runs
        "qkd_train_loss": train_loss,
        "qkd_val_loss": val,
        "compat_id": student.compat_id,
        **{f"queries_{k}": v for k, v in data.query_stats.items()},
    }
    if data.eval_qrels:
        res.update(evaluate_student(student, cfg.teacher, data.eval_queries, data.eval_qrels))
    write_json(out / "run.json", {"metrics": res, **run_metadata(cfg)})
    finish_run(out, inputs, {"steps": loop.total_steps})
    return res


def _mdims(dim: int) -> list[int]:
    return matryoshka_dims_for(dim)


def evaluate_student(
    student, teacher_dir: str | Path, queries: dict[str, str], qrels, tau: float = 0.05
) -> dict[str, float]:
    """ScalingNote retrieval: student query embeddings against the Stage I document embeddings."""

    t = Path(teacher_dir)
    d_emb = np.load(t / "doc_embeddings.npy", mmap_mode="r")
    doc_ids = json.loads((t / "doc_ids.json").read_text(encoding="utf-8"))
    qids = list(queries)
    q = truncate_normalize(student.encode_queries([queries[x] for x in qids], batch_size=256, show_progress=False))
    return dense_metrics(q, qids, truncate_normalize(d_emb), doc_ids, qrels, tau=tau)
