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

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from scalingnote.config import save_config
from scalingnote.errors import ScalingNoteError
from scalingnote.training import distributed as D
from scalingnote.training.config import TrainConfig
from scalingnote.training.data import load_training_data
from scalingnote.training.resume import OnChange, begin_run, config_inputs, finish_run
from scalingnote.training.trainer import Trainer
from scalingnote.utils import run_metadata, seed_everything, write_json
from scalingnote.utils.io import atomic_path

log = logging.getLogger(__name__)


def build_towers(cfg: TrainConfig, device=None):
    """The (query, document) towers of ``cfg.method``, with a trainable projection to ``cfg.dim``."""
    import torch

    from scalingnote.models import load_tower, load_tower_pair
    from scalingnote.models.prompt import resolve_prompt

    q, d = cfg.query_tower, cfg.doc_tower
    # fp32 master weights on every device: bf16 compute on GPU comes from autocast / FSDP2's
    # MixedPrecisionPolicy, and AdamW keeps fp32 states (what `scaling plan-gpu` counts)
    common = dict(dim=cfg.dim, matryoshka_dims=list(cfg.loss.dims), device=device, dtype=torch.float32,
                  projection_seed=cfg.seed, doc_prompt=resolve_prompt(d.prompt))
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
    if d.prompt is not None and dt.kind != "llm":
        raise ScalingNoteError(f"doc_tower.prompt {d.prompt!r} is for LLM document towers; {d.model} is a {dt.kind} tower")
    # ScalingDoc (§4.1.3) = a small query tower + the LLM document tower; the paper's query tower is
    # a BERT, and a truncated LLM of the same family is the matched-cost one where BERT cannot read
    expect = {"scaling_dual": ("llm", "llm"), "scaling_doc": (qt.kind, "llm"), "twinbert": ("bert", "bert")}[cfg.method]
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


def _pooler(tower, prefix, tok, batch_size: int):
    """``items -> pooled states [n(*views), H]`` through the feature cache when there is one."""
    if prefix is None:
        return lambda items: pooled_states(tower, items, tok, batch_size)

    def pool(items):
        import torch

        with torch.no_grad():
            p = prefix.pooled(items).float()
        return p.reshape(-1, p.shape[-1]).cpu()

    return pool


def _ridge(x, y, ridge: float = 1e-3):
    """``W [out, in]`` minimising ``||x W^T - y||^2 + lam ||W||^2`` (lam relative to trace(x^T x)/in)."""
    import torch

    x, y = x.double(), y.double()
    gram = x.T @ x
    lam = ridge * float(torch.trace(gram)) / gram.shape[0]
    return torch.linalg.solve(gram + lam * torch.eye(gram.shape[0], dtype=gram.dtype), x.T @ y).T


def init_heads(qt, dt, examples, mode: str, *, n: int = 256, batch_size: int = 32, encoders=(None, None)) -> dict[str, float]:
    """Centre both towers and initialise their projections (``mode``: see ``TrainConfig.projection_init``).

    "pairs" (not in the paper): the document head = the top principal directions of the centred
    document states; the query head = the ridge least-squares map from the centred query states to
    the coordinates of their positive documents in that head — so a query tower from another base
    model (ScalingDoc: MiniLM queries, SmolLM2 documents) starts aligned with the document tower.
    Returns fit diagnostics (the relative squared error of the query fit).
    """

    same_base = qt.config.base_model == dt.config.base_model and qt.config.hidden_size == dt.config.hidden_size
    if mode == "auto":
        mode = "pca" if same_base else "pairs"
    if mode in ("pca", "orthogonal"):
        pools = {"q": _pooler(qt, encoders[0], lambda t, xs: t.tokenize_queries(xs), batch_size),
                 "d": _pooler(dt, encoders[1], lambda t, xs: t.tokenize_documents(xs), batch_size)}
        init_centers(qt, dt, examples, n=n, batch_size=batch_size, pca=mode == "pca", pools=pools)
        return {}
    if qt.projection is None or dt.projection is None:
        raise ScalingNoteError("projection_init='pairs' needs a projection on both towers")
    sample = examples[:n]
    hq = _pooler(qt, encoders[0], lambda t, xs: t.tokenize_queries(xs), batch_size)([e.query for e in sample])
    hd_all = _pooler(dt, encoders[1], lambda t, xs: t.tokenize_documents(xs), batch_size)([e.pos for e in sample])
    views = hd_all.shape[0] // len(sample)
    cq, cd = hq.mean(0), hd_all.mean(0)
    qt.set_center(cq)
    dt.set_center(cd)
    k = dt.projection.weight.shape[0]
    xd = hd_all - cd
    if xd.shape[0] < k or hq.shape[0] < 2:
        log.warning("projection_init='pairs' needs >= %d samples, got %d: keeping the random W", k, xd.shape[0])
        return {}
    wd = _top_directions(xd, k) * (xd.shape[1] / k) ** 0.5
    target = (xd.reshape(len(sample), views, -1)[:, -1] @ wd.T).double()  # the [EMB] view's coordinates
    wq = _ridge(hq - cq, target)
    err = float(((target - (hq - cq).double() @ wq.T) ** 2).sum() / (target**2).sum().clamp(min=1e-12))
    for tower, w in ((dt, wd), (qt, wq)):
        tower.set_projection("pairs", w)
    return {"init_query_fit_rel_err": round(err, 4), "init_samples": len(sample)}


def init_centers(qt, dt, examples, n: int = 256, batch_size: int = 32, pca: bool = False, pools=None) -> None:
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
    pools = pools or {}
    for key, tower, items, tok in (
        ("q", qt, [e.query for e in sample], lambda t, xs: t.tokenize_queries(xs)),
        ("d", dt, [e.pos for e in sample], lambda t, xs: t.tokenize_documents(xs)),
    ):
        if tower.projection is None or not items:
            continue
        p = pools[key](items) if key in pools else pooled_states(tower, items, tok, batch_size)
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
            tower.set_projection("pca", w)


def _setup_lora(cfg: TrainConfig, towers) -> None:
    if cfg.lora is None:
        return
    try:
        from peft import LoraConfig, get_peft_model

        from scalingnote.models.prefix import has_lora
    except ImportError as e:  # pragma: no cover - peft is a pinned dependency
        raise ScalingNoteError("lora: the peft package is not installed") from e
    for t in towers:
        if t.kind != "llm" or has_lora(t.backbone):  # towers over a cached prefix got adapters on their top layers
            continue
        lc = LoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout, target_modules=cfg.lora.target_modules)
        t.backbone = get_peft_model(t.backbone, lc)


def _merge_lora(towers) -> None:
    from scalingnote.models.prefix import merge_lora

    for t in towers:
        if t is not None and hasattr(t.backbone, "merge_and_unload"):
            t.backbone = t.backbone.merge_and_unload()
        elif t is not None:
            merge_lora(t)  # adapters injected on the top layers of a cached-prefix tower


def stage1_inputs(cfg: TrainConfig) -> dict[str, Any]:
    """What a Stage I run's checkpoints depend on (:mod:`scalingnote.training.resume`): the config
    with the data files and local model directories fingerprinted."""
    d = cfg.data
    return config_inputs(cfg, {"data.data_dir": d.data_dir, "data.triplets": d.triplets, "data.validation_triplets": d.validation_triplets,
                               "query_tower.model": cfg.query_tower.model, "doc_tower.model": cfg.doc_tower.model})


def train(cfg: TrainConfig, resume: bool = True, on_step=None, on_change: OnChange = "refuse") -> dict[str, Any]:
    """Run Stage I end to end. Returns the metrics dict also written to ``run.json``.

    ``resume``: continue from the newest checkpoint in ``output_dir`` when it was made from the
    same inputs (:func:`stage1_inputs`); checkpoints made from other inputs are refused with the
    keys that differ (``on_change="refuse"``) or cleared (``"redo"``)."""
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
    inputs = stage1_inputs(cfg)
    begin_run(out, inputs, resume=resume, on_change=on_change)  # before config.yaml is overwritten or any work
    if D.rank() == 0:
        save_config(cfg, out / "config.yaml")
    seed_everything(cfg.seed)
    device = D.local_device()
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
    encoders = prefix_encoders(cfg, qt, dt, data)
    results["query_trainable_layers"] = cfg.query_tower.trainable_layers
    results["doc_trainable_layers"] = cfg.doc_tower.trainable_layers
    if cfg.center:
        order = np.random.default_rng(cfg.seed).permutation(len(data.train))
        sample = [data.train[i] for i in order[: cfg.center_samples]]
        results.update(init_heads(qt, dt, sample, cfg.projection_init, n=cfg.center_samples, encoders=encoders))
    if cfg.evaluate_zero_shot and data.eval_qrels and D.rank() == 0:
        # the starting point of training: pre-trained backbones + the initial centre / W
        results.update(evaluate_pair(cfg, qt, dt, data, prefix="zero_shot_", encoders=encoders))
    _setup_lora(cfg, (qt, dt))
    trainer = Trainer(cfg, qt, dt, data.train, device, encoders=encoders)
    results["total_steps"] = trainer.total_steps
    validate = make_validator(cfg, qt, dt, data, encoders) if data.validation and (cfg.eval_every or cfg.patience) else None
    seed_everything(cfg.seed)
    last = trainer.train(resume=resume, on_step=on_step, validate=validate)
    if validate is not None:
        results["val_curve"] = trainer.best["curve"]
        for k in ("steps_run", "best_step", "best_val_score", "stopped_early"):
            results[k] = last.pop(k, None)
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
            results.update(evaluate_pair(cfg, qt, dt, data, save_embeddings=out, encoders=encoders))
        meta = run_metadata(cfg)
        write_json(out / "run.json", {"metrics": results, **meta})
    finish_run(out, inputs, {"total_steps": results.get("total_steps")})
    return results


def prefix_encoders(cfg: TrainConfig, qt, dt, data):
    """(query, document) :class:`~scalingnote.models.PrefixTower` for towers with
    ``trainable_layers != "all"`` (None otherwise); their features for every training text and
    the whole corpus are cached up front (the expensive part of a CPU run happens once)."""
    from scalingnote.models import PrefixTower

    root = Path(cfg.feature_cache_dir) if cfg.feature_cache_dir else Path(cfg.output_dir) / "feature_cache"
    show = cfg.show_progress and D.rank() == 0
    q_enc = d_enc = None
    kw = {"show_progress": show, "dtype": cfg.feature_cache_dtype}

    def lora(k):  # LoRA on the top k layers of a tower over a cached prefix (k = 0: heads only)
        return cfg.lora if k else None

    if cfg.query_tower.prefix_k is not None:
        q_enc = PrefixTower(qt, cfg.query_tower.prefix_k, root, batch_size=cfg.eval_batch_size, lora=lora(cfg.query_tower.prefix_k), **kw)
        texts = sorted({e.query for e in data.train + data.validation} | set(data.eval_queries.values()))
        q_enc.ensure(texts)
    if cfg.doc_tower.prefix_k is not None:
        d_enc = PrefixTower(dt, cfg.doc_tower.prefix_k, root, batch_size=max(1, cfg.eval_batch_size // 4), lora=lora(cfg.doc_tower.prefix_k), **kw)
        d_enc.ensure(list(data.corpus.values()) + [d for e in data.train + data.validation for d in (e.pos, e.neg) if d is not None])
    return q_enc, d_enc


def encode_queries_with(qt, q_enc, texts: list[str], batch_size: int) -> np.ndarray:
    """Normalised query embeddings, through the feature cache when ``q_enc`` is set."""
    if q_enc is not None:
        return q_enc.encode(texts, batch_size=max(256, batch_size))
    return qt.encode_queries(texts, batch_size=batch_size, show_progress=False)


def encode_docs_with(dt, d_enc, docs: list, batch_size: int, show_progress: bool) -> np.ndarray:
    """Normalised ``[EMB]``-view document embeddings, through the feature cache when ``d_enc`` is set."""
    if d_enc is not None:
        return d_enc.encode(docs, batch_size=max(256, batch_size))
    return dt.encode_documents(docs, batch_size=batch_size, show_progress=show_progress)


def make_validator(cfg: TrainConfig, qt, dt, data, encoders=(None, None)):
    """``() -> score`` on the validation queries (held out from training) over the full corpus:
    nDCG@10, or minus the contrastive perplexity (higher is better for both)."""
    from scalingnote.evaluation import contrastive_perplexity
    from scalingnote.evaluation.dense import dense_metrics, perplexity_negatives, truncate_normalize

    doc_ids = list(data.corpus)
    docs = [data.corpus[i] for i in doc_ids]
    vq = sorted({e.query_id for e in data.validation})
    vtexts = [data.queries[q] for q in vq]
    qrels = data.validation_qrels()

    def validate() -> float:
        dn = truncate_normalize(encode_docs_with(dt, encoders[1], docs, cfg.eval_batch_size, False), cfg.dim)
        qn = truncate_normalize(encode_queries_with(qt, encoders[0], vtexts, cfg.eval_batch_size), cfg.dim)
        if cfg.validation_metric == "contrastive_ppl":
            return -contrastive_perplexity(qn, vq, dn, doc_ids, qrels=qrels, temperature=cfg.loss.tau, seed=cfg.seed,
                                           num_negatives=perplexity_negatives(len(doc_ids), qrels))
        return float(dense_metrics(qn, vq, dn, doc_ids, qrels, tau=cfg.loss.tau, perplexity_seed=cfg.seed)["ndcg@10"])

    return validate


def evaluate_pair(cfg: TrainConfig, qt, dt, data, prefix: str = "", save_embeddings: Path | None = None,
                  encoders=(None, None)) -> dict[str, float]:
    """Encode the corpus once; validation contrastive perplexity + test retrieval metrics."""
    from scalingnote.evaluation.dense import dense_metrics, truncate_normalize

    t0 = time.perf_counter()
    doc_ids = list(data.corpus)
    d_emb = encode_docs_with(dt, encoders[1], [data.corpus[i] for i in doc_ids], cfg.eval_batch_size, cfg.show_progress)
    out: dict[str, float] = {}
    dn = truncate_normalize(d_emb, cfg.dim)
    if data.validation:
        from scalingnote.evaluation import contrastive_perplexity
        from scalingnote.evaluation.dense import perplexity_negatives

        vq = sorted({e.query_id for e in data.validation})
        q_emb = truncate_normalize(encode_queries_with(qt, encoders[0], [data.queries[q] for q in vq], cfg.eval_batch_size), cfg.dim)
        out[f"{prefix}val_contrastive_ppl"] = contrastive_perplexity(
            q_emb, vq, dn, doc_ids, qrels=data.validation_qrels(), temperature=cfg.loss.tau, seed=cfg.seed,
            num_negatives=perplexity_negatives(len(doc_ids), data.validation_qrels()),
        )
    if data.eval_qrels:
        qids = list(data.eval_queries)
        q_emb = truncate_normalize(encode_queries_with(qt, encoders[0], [data.eval_queries[q] for q in qids], cfg.eval_batch_size), cfg.dim)
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


def heldout_queries(run_dir: str | Path, exclude: set[str] | None = None) -> tuple[dict[str, str], dict[str, dict[str, int]]]:
    """The validation queries of a Stage I output directory (its held-out split, or its
    validation triplets) as ``({query_id: text}, {query_id: {positive_id: 1}})``, minus
    ``exclude``: labels the run never trained on, e.g. to tune a fusion weight."""
    cfg = load_train_config(Path(run_dir) / "config.yaml")
    texts: dict[str, str] = {}
    qrels: dict[str, dict[str, int]] = {}
    for e in load_training_data(cfg.data, cfg.seed, show_progress=False).validation:
        if not exclude or e.query_id not in exclude:
            texts[e.query_id] = e.query
            qrels.setdefault(e.query_id, {})[e.pos.id] = 1
    return texts, qrels


__all__ = ["build_towers", "heldout_queries", "evaluate_pair", "init_centers", "init_heads", "load_train_config", "make_validator", "prefix_encoders", "train"]
