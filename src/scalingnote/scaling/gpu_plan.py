"""GPU plan for a Stage I run: memory per GPU and GPU-hours (``scalingnote scaling plan-gpu``).

Compute follows the cost model of Fang et al. (*Scaling Laws for Dense Retrieval* §6,
Eq. 14-15, implemented in :class:`scalingnote.scaling.budget.CostModel`): training costs
6·N FLOPs per trained token, encoding 2·N per token, at ``utilization`` of the GPU's peak.
ScalingNote's Stage I (§3.2, §4.2, Table 7) trains a query tower on queries and a document
tower on a positive and a hard-negative document per example, so one step of global batch B
trains ``B·query_tokens`` tokens through the query tower and ``2·B·doc_tokens`` through the
document tower — Eq. 14's ``(query_tokens + 2·passage_tokens)·batch`` when the towers have
the same size. What this implementation adds on top, each an explicit factor:

- gradient caching (``micro_batch_size`` < local batch): one extra no-grad forward, +2·N;
- activation checkpointing: the forward is recomputed in backward, +2·N;
- LoRA: the frozen weights need no weight gradient, −2·N (activation gradients remain).

So FLOPs per trained token = N·(6 − 2·lora + 2·grad_cache + 2·checkpointing); with none of
them this is exactly Eq. 14 (unit-tested). Encoding the corpus once with the document tower
is Eq. 15 (``corpus_size · doc_tokens · 2·N``).

Memory per GPU (bytes), the usual ZeRO accounting (Rajbhandari et al. 2020, the ZeRO
paper ScalingNote uses: Table 7 note) for FSDP2 with bf16 compute and fp32 master weights:

- model states: fp32 parameters (4 B each, trainable or frozen), fp32 gradients (4 B per
  trainable parameter) and AdamW's two fp32 moments (8 B per trainable parameter) — divided
  by the number of GPUs under ``fsdp`` (ZeRO-3), replicated under ``ddp``;
- FSDP working set: the bf16 copy of the unsharded root (embeddings, norm, W) plus two
  transformer blocks (the running one and the prefetched one), 2 B per parameter;
- activations (bf16) per micro-batch for both towers, whose graphs coexist until backward:
  per transformer layer ``34·s·b·h`` bytes (Korthikanti et al. 2022, Eq. 2, with the
  ``5·a·s²·b`` attention-score term removed: SDPA / flash attention does not store it). With
  activation checkpointing only each layer's input (``2·s·b·h`` B) is kept, plus one layer's
  full activations during its recomputation;
- a fixed ``overhead_gib`` (CUDA context, allocator fragmentation, NCCL buffers) — an
  assumption, not a measurement.

These are estimates to size a run; the real peak also depends on the allocator and kernels.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from scalingnote.errors import ScalingNoteError
from scalingnote.scaling.budget import CostModel

GIB = 1024**3


@dataclass
class Architecture:
    """A decoder (Llama/Qwen2 style): enough to count parameters and activations."""

    name: str
    hidden_size: int
    num_layers: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    qkv_bias: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def block_params(self) -> int:
        """Parameters of one transformer block: q,k,v,o projections, SwiGLU MLP (3 matrices), 2 RMSNorms."""
        h, kv, i = self.hidden_size, self.kv_dim, self.intermediate_size
        attn = h * h + 2 * h * kv + h * h + ((h + 2 * kv) if self.qkv_bias else 0)
        return attn + 3 * h * i + 2 * h

    @property
    def non_embedding_params(self) -> int:
        """N of the scaling laws: every parameter but the token embeddings (blocks + final norm)."""
        return self.num_layers * self.block_params + self.hidden_size

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def total_params(self) -> int:
        return self.non_embedding_params + self.embedding_params

    def lora_params(self, r: int, targets: list[str]) -> int:
        """Trainable LoRA parameters: r·(in + out) per targeted matrix per layer."""
        h, kv, i = self.hidden_size, self.kv_dim, self.intermediate_size
        shapes = {
            "q_proj": (h, h),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (h, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }
        unknown = [t for t in targets if t not in shapes]
        if unknown:
            raise ScalingNoteError(f"lora target_modules {unknown} unknown to the GPU planner (knows {sorted(shapes)})")
        return self.num_layers * sum(r * (shapes[t][0] + shapes[t][1]) for t in targets)


#: Published configurations (config.json of each model).
ARCHITECTURES: dict[str, Architecture] = {
    a.name: a
    for a in (
        Architecture("smollm2-135m", 576, 30, 1536, 9, 3, 49152),
        Architecture("smollm2-1.7b", 2048, 24, 8192, 32, 32, 49152),
        Architecture("qwen2.5-0.5b", 896, 24, 4864, 14, 2, 151936, qkv_bias=True),
        Architecture("qwen2.5-1.5b", 1536, 28, 8960, 12, 2, 151936, qkv_bias=True),
        Architecture("qwen2.5-7b", 3584, 28, 18944, 28, 4, 152064, qkv_bias=True),  # ScalingNote Table 8
    )
}


@dataclass
class GpuPlanSpec:
    """What to plan. Token counts are the padded sequence lengths (the towers' ``max_length``)."""

    arch: str = "qwen2.5-7b"
    towers: Literal["dual", "doc"] = (
        "dual"  #: dual: both towers are the LLM (ScalingDual); doc: only the document tower
    )
    query_tokens: int = 64
    doc_tokens: int = 256
    global_batch: int = 480  #: Table 7, stage I
    micro_batch: int | None = None  #: per GPU; None = the whole local batch at once (no gradient caching)
    num_gpus: int = 8
    steps: int | None = None  #: None: from train_pairs and epochs
    train_pairs: float | None = None  #: training examples (query, positive, negative)
    epochs: float = 1.0  #: Table 7, stage I
    corpus_size: float = 0.0  #: documents encoded once by the document tower after training
    sharding: Literal["fsdp", "ddp"] = "fsdp"
    activation_checkpointing: bool = True
    lora_r: int | None = None
    lora_targets: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    gpu_memory_gib: float = 80.0
    peak_flops: float = 989e12  #: H100 SXM dense bf16 (A100: 312e12, the paper's cost model)
    utilization: float = 0.4
    gpu_price_per_hour: float = 3.93
    overhead_gib: float = 3.0

    def __post_init__(self) -> None:
        if self.arch not in ARCHITECTURES:
            raise ScalingNoteError(f"unknown arch {self.arch!r}; known: {sorted(ARCHITECTURES)}")
        if self.num_gpus < 1 or self.global_batch < 1:
            raise ScalingNoteError("num_gpus and global_batch must be >= 1")
        if self.global_batch % self.num_gpus:
            raise ScalingNoteError(f"global_batch={self.global_batch} must be divisible by num_gpus={self.num_gpus}")
        if self.micro_batch is not None and self.micro_batch < 1:
            raise ScalingNoteError("micro_batch must be >= 1")
        if self.steps is None and self.train_pairs is None:
            raise ScalingNoteError("give steps or train_pairs (with epochs)")


def flops_per_token_factor(lora: bool, grad_cache: bool, checkpointing: bool) -> int:
    """Multiple of N FLOPs per trained token (6 = Eq. 14; see the module docstring)."""
    return 6 - (2 if lora else 0) + (2 if grad_cache else 0) + (2 if checkpointing else 0)


def plan_gpu(spec: GpuPlanSpec) -> dict[str, Any]:
    a = ARCHITECTURES[spec.arch]
    n = spec.num_gpus
    local = spec.global_batch // n
    micro = min(spec.micro_batch or local, local)
    grad_cache = micro < local
    lora = spec.lora_r is not None
    if spec.steps is not None:
        steps = spec.steps
    else:
        assert spec.train_pairs is not None  # checked in __post_init__: steps or train_pairs
        steps = math.ceil(spec.epochs * float(spec.train_pairs) / spec.global_batch)
    llm_towers = 2 if spec.towers == "dual" else 1

    # -- compute (Eq. 14 / 15 through CostModel) -----------------------------------------
    factor = flops_per_token_factor(lora, grad_cache, spec.activation_checkpointing)
    N = a.non_embedding_params
    q_tokens = spec.query_tokens if spec.towers == "dual" else 0  # a small BERT query tower is not counted
    cm = CostModel(
        gpu_price_per_hour=spec.gpu_price_per_hour,
        peak_flops=spec.peak_flops,
        utilization=spec.utilization,
        train_steps=steps,
        train_batch_size=spec.global_batch,
        query_tokens=q_tokens,
        passage_tokens=spec.doc_tokens,
        corpus_size=spec.corpus_size,
        doc_tokens=spec.doc_tokens,
    )
    # CostModel.Z_train is Eq. 14 in $ per parameter at 6N FLOPs per token
    train_dollars = cm.Z_train * N * factor / 6
    encode_dollars = cm.Z_infer * N
    train_gpu_hours = train_dollars / spec.gpu_price_per_hour
    encode_gpu_hours = encode_dollars / spec.gpu_price_per_hour

    # -- memory per GPU --------------------------------------------------------------------
    total = a.total_params
    trainable = a.lora_params(spec.lora_r, spec.lora_targets) if spec.lora_r is not None else total
    shard = n if spec.sharding == "fsdp" else 1
    per_tower_states = (4 * (total + (trainable if lora else 0)) + 4 * trainable + 8 * trainable) / shard
    states = llm_towers * per_tower_states
    working = (
        llm_towers * 2 * (a.embedding_params + a.hidden_size + 2 * a.block_params) if spec.sharding == "fsdp" else 0.0
    )
    h, L = a.hidden_size, a.num_layers
    acts = 0.0
    for tokens in ([micro * spec.query_tokens] if spec.towers == "dual" else []) + [2 * micro * spec.doc_tokens]:
        full_layer = 34 * tokens * h
        acts += (L * 2 * tokens * h + full_layer) if spec.activation_checkpointing else L * full_layer
    overhead = spec.overhead_gib * GIB
    peak = states + working + acts + overhead
    return {
        "arch": a.name,
        "non_embedding_params": N,
        "total_params_per_tower": total,
        "trainable_params_per_tower": trainable,
        "llm_towers": llm_towers,
        "num_gpus": n,
        "local_batch": local,
        "micro_batch": micro,
        "gradient_cache": grad_cache,
        "steps": steps,
        "flops_per_token": f"{factor}N",
        "train_gpu_hours": train_gpu_hours,
        "train_wall_hours": train_gpu_hours / n,
        "train_dollars": train_dollars,
        "encode_gpu_hours": encode_gpu_hours,
        "encode_dollars": encode_dollars,
        "mem_model_states_gib": states / GIB,
        "mem_fsdp_working_gib": working / GIB,
        "mem_activations_gib": acts / GIB,
        "mem_overhead_gib": spec.overhead_gib,
        "mem_per_gpu_gib": peak / GIB,
        "fits": peak <= spec.gpu_memory_gib * GIB,
        "spec": asdict(spec),
    }


def spec_from_train_config(cfg, arch: str, **overrides: Any) -> GpuPlanSpec:
    """A plan spec from a Stage I :class:`~scalingnote.training.TrainConfig` (batch, micro-batch,
    lengths, LoRA, sharding, checkpointing) plus the architecture and any overrides."""
    kw: dict[str, Any] = {
        "arch": arch,
        "towers": "dual" if cfg.method == "scaling_dual" else "doc",
        "query_tokens": cfg.query_tower.max_length,
        "doc_tokens": cfg.doc_tower.max_length,
        "global_batch": cfg.optim.batch_size,
        "micro_batch": cfg.optim.micro_batch_size,
        "sharding": cfg.distributed,
        "activation_checkpointing": cfg.distributed == "fsdp" and cfg.fsdp.activation_checkpointing,
        "epochs": cfg.optim.epochs,
        "steps": cfg.optim.max_steps,
    }
    if cfg.lora is not None:
        kw["lora_r"], kw["lora_targets"] = cfg.lora.r, list(cfg.lora.target_modules)
    kw.update({k: v for k, v in overrides.items() if v is not None})
    return GpuPlanSpec(**kw)


__all__ = [
    "ARCHITECTURES",
    "Architecture",
    "GpuPlanSpec",
    "flops_per_token_factor",
    "plan_gpu",
    "spec_from_train_config",
]
