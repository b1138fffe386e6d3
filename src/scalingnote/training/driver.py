"""``train(config)``: build the towers for a method, train Stage I, save, evaluate.

Methods (ScalingNote §4.3), all through one trainer and one loss:

- ``scaling_dual``: query and document towers both start from the same LLM checkpoint
  (independent copies of the weights) — Stage I of ScalingNote.
- ``scaling_doc``: a small BERT query tower + the LLM document tower, trained jointly.
- ``twinbert``: BERT query tower + BERT document tower.

Outputs in ``output_dir``: ``query_tower/``, ``doc_tower/`` (paired: the query tower's
compat id is the document tower's fingerprint), ``config.yaml`` (resolved),
``run.json`` (versions, machine, metrics), ``metrics.jsonl`` (training log),
``checkpoints/`` (for ``--resume``), ``doc_embeddings.npy`` + ``doc_ids.json`` (the
evaluation corpus encoded by the final document tower, reused by QKD).
"""

from __future__ import annotations

import dataclasses

import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from scalingnote.config import save_config
from scalingnote.errors import ScalingNoteError
from scalingnote.training import distributed as D
from scalingnote.training.config import TowerSpec, TrainConfig
from scalingnote.training.data import load_training_data
from scalingnote.training.trainer import Trainer
from scalingnote.utils import run_metadata, seed_everything, write_json
from scalingnote.utils.io import atomic_path

log = logging.getLogger(__name__)


def build_towers(cfg: TrainConfig, device=None):
    """The (query, document) towers of ``cfg.method``, with a trainable projection to ``cfg.dim``."""
    from scalingnote.models import load_tower, load_tower_pair

    q, d = cfg.query_tower, cfg.doc_tower
    common = dict(dim=cfg.dim, matryoshka_dims=list(cfg.loss.dims), device=device, projection_seed=cfg.seed)
    if cfg.method == "scaling_dual":
        if (q.model, q.num_layers) != (d.model, d.num_layers):
            raise ScalingNoteError(
                "scaling_dual starts both towers from the same LLM checkpoint: query_tower and doc_tower must name the "
                f"same model and num_layers (got {q.model}/{q.num_layers} and {d.model}/{d.num_layers})"
            )
        qt, dt = load_tower_pair(
            q.model, num_layers=q.num_layers, max_query_length=q.max_length, max_doc_length=d.max_length,
            query_pooling=q.pooling, doc_pooling=d.pooling, **common
        )
    else:
        qt = load_tower(q.model, "query", num_layers=q.num_layers, pooling=q.pooling, max_query_length=q.max_length, **common)
        dt = load_tower(d.model, "document", num_layers=d.num_layers, pooling=d.pooling, max_doc_length=d.max_length, **common)
    expect = {"scaling_dual": ("llm", "llm"), "scaling_doc": ("bert", "llm"), "twinbert": ("bert", "bert")}[cfg.method]
    if (qt.kind, dt.kind) != expect:
        raise ScalingNoteError(
            f"method {cfg.method} expects a {expect[0]} query tower and a {expect[1]} document tower, "
            f"got {qt.kind} and {dt.kind}"
        )
    return qt, dt


def pooled_states(tower, items, tok, batch_size: int):
    """Pooled hidden states (before the projection) of ``items``, tokenised by ``tok(tower, batch)``,
    in eval mode without grad; rows flattened (an LLM document gives one row per view), on CPU."""
    import torch

    was_training = tower.training
    tower.eval()
    parts = []
    with torch.no_grad():
        for i in range(0, len(items), batch_size):
            batch = tok(tower, items[i : i + batch_size])
            p = tower.pooled({k: v.to(tower.device) for k, v in batch.items()}).float()
            parts.append(p.reshape(-1, p.shape[-1]).cpu())
    tower.train(was_training)
    return torch.cat(parts)


def _top_directions(x, k: int):
    """``[k, H]``: the top-``k`` principal directions of the (already centred) rows of ``x``, each
    with its sign fixed so that its largest-magnitude coordinate is positive (deterministic)."""
    import torch

    _, _, vh = torch.linalg.svd(x.double(), full_matrices=False)
    v = vh[:k]
    idx = v.abs().argmax(dim=1, keepdim=True)
    return (v * torch.sign(v.gather(1, idx))).float()


def init_centers(qt, dt, examples, n: int = 256, batch_size: int = 32, pca: bool = False) -> None:
    """Set each tower's centre ``c`` to the mean pooled hidden state over (up to) ``n`` training
    queries / positive documents (all three document views pooled together).

    With ``pca``, also set ``W`` to the top principal directions of the centred states (largest
    first, so Matryoshka prefixes keep the most variance). When both towers have the same
    base model and hidden size, one PCA over both towers' states keeps their spaces aligned;
    otherwise each tower gets its own (there is nothing to align to).
    """
    import torch

    sample = examples[:n]
    towers = []
    for tower, items, tok in (
        (qt, [e.query for e in sample], lambda t, xs: t.tokenize_queries(xs)),
        (dt, [e.pos for e in sample], lambda t, xs: t.tokenize_documents(xs)),
    ):
        if tower.projection is None or not items:
            continue
        p = pooled_states(tower, items, tok, batch_size)
        c = p.mean(0)
        tower.set_center(c)
        towers.append((tower, p - c))
    if not pca or not towers:
        return
    same_space = len(towers) == 2 and qt.config.base_model == dt.config.base_model and qt.config.hidden_size == dt.config.hidden_size
    groups = [towers] if same_space else [[t] for t in towers]
    for group in groups:
        k = group[0][0].projection.weight.shape[0]
        x = torch.cat([p for _, p in group])
        if x.shape[0] < k:
            log.warning("projection_init='pca' needs >= %d pooled samples, got %d: keeping the random W", k, x.shape[0])
            continue
        # same scale as the random init (orthogonal_projection): norm-preserving in expectation
        w = _top_directions(x, k) * (x.shape[1] / k) ** 0.5
        for tower, _ in group:
            with torch.no_grad():
                tower.projection.weight.copy_(w.to(tower.projection.weight.device, tower.projection.weight.dtype))
            tower.config = dataclasses.replace(tower.config, projection_init="pca")
            tower._ids = None


def _setup_lora(cfg: TrainConfig, towers) -> None:
    if cfg.lora is None:
        return
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as e:  # pragma: no cover - peft is a pinned dependency
        raise ScalingNoteError("lora: the peft package is not installed") from e
    for t in towers:
        if t.kind != "llm":
            continue
        lc = LoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout, target_modules=cfg.lora.target_modules)
        t.backbone = get_peft_model(t.backbone, lc)


def _merge_lora(towers) -> None:
    for t in towers:
        if t is not None and hasattr(t.backbone, "merge_and_unload"):
            t.backbone = t.backbone.merge_and_unload()


def train(cfg: TrainConfig, resume: bool = True, on_step=None) -> dict[str, Any]:
    """Run Stage I end to end. Returns the metrics dict also written to ``run.json``."""
    import torch

    if cfg.deepspeed:
        try:
            import deepspeed  # noqa: F401
        except ImportError:
            raise ScalingNoteError(
                f"deepspeed config {cfg.deepspeed} given but the deepspeed package is not installed "
                "(pip install deepspeed on the GPU machines; CPU runs use plain torchrun)"
            ) from None
        raise ScalingNoteError(
            "DeepSpeed ZeRO-3 is not wired in; use `distributed: fsdp` (PyTorch FSDP2, the same ZeRO-3 sharding) under torchrun"
        )

    D.init_from_env()
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if D.rank() == 0:
        save_config(cfg, out / "config.yaml")
    seed_everything(cfg.seed)
    device = torch.device("cuda", D.rank() % max(1, torch.cuda.device_count())) if torch.cuda.is_available() else torch.device("cpu")
    data = load_training_data(cfg.data, cfg.seed, show_progress=cfg.show_progress and D.rank() == 0)
    qt, dt = build_towers(cfg, device)
    results: dict[str, Any] = {
        "method": cfg.method,
        "train_examples": len(data.train),
        "validation_examples": len(data.validation),
        "dropped_eval_overlap_queries": data.dropped_eval_overlap,
        "query_tower_non_embedding_params": qt.non_embedding_params,
        "doc_tower_non_embedding_params": dt.non_embedding_params,
    }
    corpus = data.corpus
    if cfg.center:
        import numpy as _np

        order = _np.random.default_rng(cfg.seed).permutation(len(data.train))
        init_centers(qt, dt, [data.train[i] for i in order[: cfg.center_samples]], pca=cfg.projection_init == "pca")
    if cfg.evaluate_zero_shot and data.eval_qrels and D.rank() == 0:
        # the starting point of training: pre-trained backbones + the initial centre / W
        results.update(evaluate_pair(cfg, qt, dt, data, prefix="zero_shot_"))
    _setup_lora(cfg, (qt, dt))
    trainer = Trainer(cfg, qt, dt, data.train, device)
    results["total_steps"] = trainer.total_steps
    seed_everything(cfg.seed)
    last = trainer.train(resume=resume, on_step=on_step)
    if trainer.sharded:  # FSDP2: rank 0 gets ordinary towers with the trained weights, other ranks None
        from scalingnote.training.fsdp import gather_towers

        def fresh():  # same architecture (LoRA included) to load the gathered weights into
            towers = build_towers(cfg, device)
            _setup_lora(cfg, towers)
            return towers

        qt, dt = gather_towers((qt, dt), fresh)
    _merge_lora((qt, dt))
    results["train_seconds"] = round(last.pop("train_seconds", 0.0), 2)
    results.update({f"final_{k}": v for k, v in last.items()})

    if D.rank() == 0:
        from scalingnote.models import pair_towers

        pair_towers(qt, dt)
        qt.save(out / "query_tower")
        dt.save(out / "doc_tower")
        results["compat_id"] = qt.compat_id
        if data.eval_qrels or data.validation:
            results.update(evaluate_pair(cfg, qt, dt, data, save_embeddings=out))
        meta = run_metadata(cfg)
        write_json(out / "run.json", {"metrics": results, **meta})
    return results


def evaluate_pair(cfg: TrainConfig, qt, dt, data, prefix: str = "", save_embeddings: Path | None = None) -> dict[str, float]:
    """Encode the corpus once; validation contrastive perplexity + test retrieval metrics."""
    from scalingnote.evaluation.dense import dense_metrics, truncate_normalize

    t0 = time.perf_counter()
    doc_ids = list(data.corpus)
    d_emb = dt.encode_documents([data.corpus[i] for i in doc_ids], batch_size=cfg.eval_batch_size, show_progress=cfg.show_progress)
    out: dict[str, float] = {}
    dn = truncate_normalize(d_emb, cfg.dim)
    if data.validation:
        from scalingnote.evaluation import contrastive_perplexity
        from scalingnote.evaluation.dense import perplexity_negatives

        vq = sorted({e.query_id for e in data.validation})
        q_emb = truncate_normalize(qt.encode_queries([data.queries[q] for q in vq], batch_size=cfg.eval_batch_size, show_progress=False), cfg.dim)
        out[f"{prefix}val_contrastive_ppl"] = contrastive_perplexity(
            q_emb, vq, dn, doc_ids, qrels=data.validation_qrels(), temperature=cfg.loss.tau, seed=cfg.seed,
            num_negatives=perplexity_negatives(len(doc_ids), data.validation_qrels()),
        )
    if data.eval_qrels:
        qids = list(data.eval_queries)
        q_emb = truncate_normalize(qt.encode_queries([data.eval_queries[q] for q in qids], batch_size=cfg.eval_batch_size, show_progress=False), cfg.dim)
        m = dense_metrics(q_emb, qids, dn, doc_ids, data.eval_qrels, tau=cfg.loss.tau, perplexity_seed=cfg.seed)
        out.update({f"{prefix}{k}": v for k, v in m.items()})
    out[f"{prefix}eval_seconds"] = round(time.perf_counter() - t0, 2)
    if save_embeddings is not None:
        with atomic_path(save_embeddings / "doc_embeddings.npy", suffix=".npy") as p:
            np.save(p, d_emb.astype(np.float32))
        write_json(save_embeddings / "doc_ids.json", doc_ids, indent=None)
    return out


def load_train_config(path: str | Path | None, **overrides: Any) -> TrainConfig:
    from scalingnote.config import load_config

    return load_config(TrainConfig, path, **overrides)


__all__ = ["build_towers", "evaluate_pair", "init_centers", "load_train_config", "train"]
