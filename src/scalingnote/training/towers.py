"""The towers of a Stage I run: built for ``cfg.method`` (ScalingNote §4.3), LoRA adapters set
up and merged, and the feature caches of towers that train only their top layers."""

from __future__ import annotations

from pathlib import Path

from scalingnote.errors import ScalingNoteError
from scalingnote.models import DocumentTower, PrefixTower, QueryTower, load_tower, load_tower_pair
from scalingnote.models.prefix import has_lora
from scalingnote.models.prefix import merge_lora as merge_top_lora
from scalingnote.models.prompt import resolve_prompt
from scalingnote.training import distributed
from scalingnote.training.config import TrainConfig


def build_towers(cfg: TrainConfig, device=None):
    """The (query, document) towers of ``cfg.method``, with a trainable projection to ``cfg.dim``."""
    import torch

    q, d = cfg.query_tower, cfg.doc_tower
    # fp32 master weights on every device: bf16 compute on GPU comes from autocast / FSDP2's
    # MixedPrecisionPolicy, and AdamW keeps fp32 states (what `scaling plan-gpu` counts)
    common = dict(
        dim=cfg.dim,
        matryoshka_dims=list(cfg.loss.dims),
        device=device,
        dtype=torch.float32,
        projection_seed=cfg.seed,
        doc_prompt=resolve_prompt(d.prompt),
    )
    # load_tower gives either kind (a saved tower keeps the role it was saved with)
    qt: QueryTower | DocumentTower
    dt: QueryTower | DocumentTower
    if cfg.method == "scaling_dual":
        if (q.model, q.num_layers, q.layers) != (d.model, d.num_layers, d.layers):
            raise ScalingNoteError(
                "scaling_dual starts both towers from the same LLM checkpoint: query_tower and doc_tower must name the "
                "same model, num_layers and layers "
                f"(got {q.model}/{q.num_layers}/{q.layers} and {d.model}/{d.num_layers}/{d.layers})"
            )
        qt, dt = load_tower_pair(
            q.model,
            num_layers=q.num_layers,
            layers=q.layers,
            max_query_length=q.max_length,
            max_doc_length=d.max_length,
            query_pooling=q.pooling,
            doc_pooling=d.pooling,
            **common,
        )
    else:
        qt = load_tower(
            q.model,
            "query",
            num_layers=q.num_layers,
            layers=q.layers,
            pooling=q.pooling,
            max_query_length=q.max_length,
            **common,
        )
        dt = load_tower(
            d.model,
            "document",
            num_layers=d.num_layers,
            layers=d.layers,
            pooling=d.pooling,
            max_doc_length=d.max_length,
            **common,
        )
    if d.prompt is not None and dt.kind != "llm":
        raise ScalingNoteError(
            f"doc_tower.prompt {d.prompt!r} is for LLM document towers; {d.model} is a {dt.kind} tower"
        )
    # ScalingDoc (§4.1.3) = a small query tower + the LLM document tower; the paper's query tower is
    # a BERT, and a truncated LLM of the same family is the matched-cost one where BERT cannot read
    expect = {"scaling_dual": ("llm", "llm"), "scaling_doc": (qt.kind, "llm"), "twinbert": ("bert", "bert")}[cfg.method]
    if (qt.kind, dt.kind) != expect:
        raise ScalingNoteError(
            f"method {cfg.method} expects a {expect[0]} query tower and a {expect[1]} document tower, "
            f"got {qt.kind} and {dt.kind}"
        )
    return qt, dt


def setup_lora(cfg: TrainConfig, towers) -> None:
    if cfg.lora is None:
        return
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as e:  # pragma: no cover - peft is a pinned dependency
        raise ScalingNoteError("lora: the peft package is not installed") from e
    for t in towers:
        if t.kind != "llm" or has_lora(t.backbone):  # towers over a cached prefix got adapters on their top layers
            continue
        lc = LoraConfig(
            r=cfg.lora.r,
            lora_alpha=cfg.lora.alpha,
            lora_dropout=cfg.lora.dropout,
            target_modules=cfg.lora.target_modules,
        )
        t.backbone = get_peft_model(t.backbone, lc)


def merge_lora(towers) -> None:
    for t in towers:
        if t is not None and hasattr(t.backbone, "merge_and_unload"):
            t.backbone = t.backbone.merge_and_unload()
        elif t is not None:
            merge_top_lora(t)  # adapters injected on the top layers of a cached-prefix tower


def prefix_encoders(cfg: TrainConfig, qt, dt, data):
    """(query, document) :class:`~scalingnote.models.PrefixTower` for towers with
    ``trainable_layers != "all"`` (None otherwise); their features for every training text and
    the whole corpus are cached up front (the expensive part of a CPU run happens once)."""

    root = Path(cfg.feature_cache_dir) if cfg.feature_cache_dir else Path(cfg.output_dir) / "feature_cache"
    show = cfg.show_progress and distributed.rank() == 0
    q_enc = d_enc = None

    def lora(k):  # LoRA on the top k layers of a tower over a cached prefix (k = 0: heads only)
        return cfg.lora if k else None

    if cfg.query_tower.prefix_k is not None:
        q_enc = PrefixTower(
            qt,
            cfg.query_tower.prefix_k,
            root,
            batch_size=cfg.eval_batch_size,
            lora=lora(cfg.query_tower.prefix_k),
            show_progress=show,
            dtype=cfg.feature_cache_dtype,
        )
        texts = sorted({e.query for e in data.train + data.validation} | set(data.eval_queries.values()))
        q_enc.ensure(texts)
    if cfg.doc_tower.prefix_k is not None:
        d_enc = PrefixTower(
            dt,
            cfg.doc_tower.prefix_k,
            root,
            batch_size=max(1, cfg.eval_batch_size // 4),
            lora=lora(cfg.doc_tower.prefix_k),
            show_progress=show,
            dtype=cfg.feature_cache_dtype,
        )
        d_enc.ensure(list(data.corpus.values()) + [d for e in data.train + data.validation for d in (e.pos, *e.negs)])
    return q_enc, d_enc


__all__ = ["build_towers", "merge_lora", "prefix_encoders", "setup_lora"]
