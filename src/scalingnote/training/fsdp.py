"""Sharded data-parallel training with PyTorch FSDP2 (``torch.distributed.fsdp.fully_shard``).

Selected by ``distributed: fsdp`` in the Stage I config (``scalingnote train``) and the QKD
config (``scalingnote distill``, the student), launched by ``torchrun``. What it does to each
tower, in order:

1. activation checkpointing (``fsdp.activation_checkpointing``): the backbone's own
   Hugging Face gradient checkpointing, non-reentrant (recomputes each transformer block in
   backward and replays its RNG, so dropout masks are identical);
2. ``fully_shard`` on every transformer block (the classes a Hugging Face model lists in
   ``_no_split_modules``, e.g. ``LlamaDecoderLayer``), then on the tower itself, which
   shards what is left (embeddings, final norm, projection W). Parameters, gradients and
   AdamW state then live 1/world_size on each rank; a block's full weights exist only while
   it runs. LoRA (PEFT) adapters are wrapped with their block (frozen base weights and
   trainable adapters share a shard group; FSDP2 allows mixed ``requires_grad``);
3. mixed precision (``MixedPrecisionPolicy``): bf16 parameters and bf16 gradient
   reduce-scatter on GPU (``precision: auto|bf16``; ``fsdp.reduce_dtype: fp32`` keeps the
   reduction in fp32), no casting (fp32, or the model's own dtype) on CPU.

Gradients are averaged across ranks by the reduce-scatter, which is what the DDP path's
all-reduce does, and the cross-process negatives (:mod:`scalingnote.training.distributed`)
are unchanged, so one FSDP step on N ranks equals one step of a single process on the
concatenated batch (``tests/training/test_fsdp.py``).

Checkpoints are sharded (``torch.distributed.checkpoint``): every rank writes its shards
of the towers and of the optimizer state into ``checkpoints/step-N/`` plus a small
``rank-R.pt`` with the scheduler, step, that rank's RNG states and its shards of the best
validated weights; the directory is built
under a temporary name and renamed by rank 0 after a barrier, so a killed run never leaves
a checkpoint that looks complete. Resuming loads them back into the sharded modules and
continues bit-identically.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, cast

import torch
import torch.distributed as dist
from torch import nn

from scalingnote.errors import ScalingNoteError
from scalingnote.training import distributed
from scalingnote.training.checkpoint import checkpoint_dir, list_checkpoints, rng_state, set_rng_state
from scalingnote.training.config import FsdpSpec
from scalingnote.training.timebox import check_resumed_total
from scalingnote.utils.io import atomic_path

log = logging.getLogger(__name__)

MARKER = "sharded.json"
FORMAT = "scalingnote-fsdp2/1"


class ShardedLoop(Protocol):
    """What the sharded checkpoints read and set on a training loop
    (:class:`scalingnote.training.loop.TrainLoop`, which calls them)."""

    out: Path
    step: int
    total_steps: int
    planned_steps: int
    optimizer: Any
    scheduler: Any
    best: dict[str, Any]
    prior_seconds: float
    settings: Any  # LoopSettings: keep_checkpoints

    def checkpoint_modules(self) -> dict[str, nn.Module]: ...

    def train_seconds(self) -> float: ...


# ----------------------------------------------------------------------------- wrapping
def transformer_blocks(module: nn.Module) -> list[nn.Module]:
    """The transformer blocks of ``module`` (outermost first): instances of the classes its
    Hugging Face models name in ``_no_split_modules``; failing that, the children of every
    ``nn.ModuleList`` (the usual ``layers`` / ``layer`` stack)."""
    names: set[str] = set()
    for m in module.modules():
        names.update(getattr(m, "_no_split_modules", None) or ())
    blocks = [m for m in module.modules() if type(m).__name__ in names]
    if not blocks:
        for m in module.modules():
            if isinstance(m, nn.ModuleList):
                blocks.extend(c for c in m if any(True for _ in c.parameters()))
    return blocks


def mixed_precision_policy(device: torch.device, precision: str, spec: FsdpSpec):
    """bf16 parameters (and reduction, unless ``spec.reduce_dtype == 'fp32'``) on GPU or with
    ``precision: bf16``; no casting otherwise (fp32 on CPU)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    bf16 = precision == "bf16" or (precision == "auto" and device.type == "cuda")
    if not bf16:
        return MixedPrecisionPolicy()
    reduce = torch.float32 if spec.reduce_dtype == "fp32" else torch.bfloat16
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce)


def enable_activation_checkpointing(backbone: nn.Module) -> str:
    """Recompute each transformer block in backward instead of storing its activations.
    Returns how: ``"hf"`` (the model's own non-reentrant gradient checkpointing) or
    ``"composable"`` (``torch.distributed._composable.checkpoint`` on each block)."""
    fn = getattr(backbone, "gradient_checkpointing_enable", None)
    if callable(fn) and getattr(backbone, "supports_gradient_checkpointing", True):
        fn(gradient_checkpointing_kwargs={"use_reentrant": False})
        return "hf"
    from torch.distributed._composable import checkpoint

    for block in transformer_blocks(backbone):
        checkpoint(block)
    return "composable"


def shard_towers(towers: Sequence[nn.Module], device: torch.device, spec: FsdpSpec, precision: str = "auto") -> bool:
    """Apply activation checkpointing and FSDP2 to each tower in place (call after LoRA and
    before building the optimizer). Returns False (and leaves the towers alone) when not
    running distributed: FSDP over one process only adds overhead."""
    if not distributed.is_distributed():
        log.warning("distributed: fsdp needs torchrun with more than one process; training unsharded")
        return False
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (distributed.world_size(),))
    mp = mixed_precision_policy(device, precision, spec)
    for tower in towers:
        backbone = getattr(tower, "backbone", tower)
        if spec.activation_checkpointing:
            enable_activation_checkpointing(backbone)
        blocks = transformer_blocks(backbone)
        if not blocks:
            log.warning("%s: no transformer blocks found; sharding it as one unit", type(backbone).__name__)
        for block in reversed(blocks):  # innermost first
            fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=spec.reshard_after_forward)
        fully_shard(tower, mesh=mesh, mp_policy=mp, reshard_after_forward=spec.reshard_after_forward)
    return True


# ----------------------------------------------------------------------------- state dicts
def full_state_dict(module: nn.Module) -> dict[str, torch.Tensor]:
    """Collective (every rank must call it): the unsharded state dict of a sharded module, on
    CPU, on rank 0 (other ranks get ``{}``)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    # full_state_dict=True: plain tensors (the declared type also allows sharded ones)
    state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return cast(dict[str, torch.Tensor], state)


def full_grads(module: nn.Module) -> dict[str, torch.Tensor]:
    """Collective: the unsharded gradients of a module's parameters (every rank gets them)."""
    from torch.distributed.tensor import DTensor

    out = {}
    for name, p in module.named_parameters():
        if p.grad is None:
            continue
        g = p.grad
        out[name] = (g.full_tensor() if isinstance(g, DTensor) else g).detach().cpu().clone()
    return out


def gather_towers(towers: Sequence[nn.Module], rebuild: Callable[[], Sequence[nn.Module]]) -> list[nn.Module | None]:
    """Collective: turn sharded towers back into ordinary modules for saving and evaluation.

    Rank 0 gets fresh towers from ``rebuild()`` (same architecture, LoRA included) loaded with
    the trained full weights and carrying the trained towers' configs; other ranks get None.
    """
    states = [full_state_dict(t) for t in towers]
    if distributed.rank() != 0:
        return [None] * len(towers)
    fresh: list[nn.Module | None] = []
    for old, new, sd in zip(towers, list(rebuild()), states, strict=True):
        dev = next(new.parameters()).device
        missing, unexpected = new.load_state_dict({k: v.to(dev) for k, v in sd.items()}, strict=False)
        if missing or unexpected:
            raise ScalingNoteError(
                "FSDP: gathered state does not fit the rebuilt tower "
                f"(missing {missing[:5]}, unexpected {unexpected[:5]})"
            )
        if hasattr(old, "config"):
            new.config = old.config
            new._ids = None  # type: ignore[assignment]  # nn.Module types unknown attributes as Tensor | Module
        fresh.append(new)
    return fresh


# ----------------------------------------------------------------------------- checkpoints
def _container(loop: ShardedLoop) -> nn.Module:
    # A plain container so that FQNs are "<name>.…" (Stage I: "query_tower" / "doc_tower", QKD:
    # "student"); it does not change the modules.
    return nn.ModuleDict(loop.checkpoint_modules())


def list_sharded_checkpoints(output_dir: str | Path) -> list[int]:
    """Steps of the complete sharded checkpoints (those with the ``MARKER`` file), ascending."""
    return list_checkpoints(output_dir, marker=MARKER)


def save_sharded(trainer: ShardedLoop, rng: dict[str, Any] | None = None) -> Path:
    """Collective: write a sharded checkpoint of the loop ``trainer`` at its current step."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    final = checkpoint_dir(trainer.out, trainer.step)
    tmp = final.with_name(f".{final.name}.tmp")
    if distributed.rank() == 0:
        final.parent.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    dist.barrier()
    msd, osd = get_state_dict(_container(trainer), trainer.optimizer)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(tmp))
    extra = {
        "step": trainer.step,
        "total_steps": trainer.total_steps,
        "planned_steps": trainer.planned_steps,
        "warmup_steps": getattr(trainer, "warmup_steps", None),
        "scheduler": trainer.scheduler.state_dict(),
        "rng": rng if rng is not None else rng_state(),
        "best": trainer.best,  # its "state" holds this rank's shards (TrainLoop.trainable_state)
        "train_seconds": trainer.train_seconds(),
    }
    with atomic_path(tmp / f"rank-{distributed.rank():05d}.pt", suffix=".pt") as p:
        torch.save(extra, p)
    dist.barrier()
    if distributed.rank() == 0:
        (tmp / MARKER).write_text(
            json.dumps({"format": FORMAT, "step": trainer.step, "world_size": distributed.world_size()}),
            encoding="utf-8",
        )
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        keep = trainer.settings.keep_checkpoints
        for s in list_sharded_checkpoints(trainer.out)[:-keep] if keep > 0 else []:
            shutil.rmtree(checkpoint_dir(trainer.out, s), ignore_errors=True)
    dist.barrier()
    return final


def load_latest_sharded(trainer: ShardedLoop) -> int | None:
    """Collective: load the newest sharded checkpoint of ``trainer.out`` into the loop
    (modules, optimizer, scheduler, step, best weights, this rank's RNG). Returns the step, or None."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    steps = list_sharded_checkpoints(trainer.out)
    if not steps:
        return None
    path = checkpoint_dir(trainer.out, steps[-1])
    meta = json.loads((path / MARKER).read_text(encoding="utf-8"))
    if meta.get("world_size") != distributed.world_size():
        raise ScalingNoteError(
            f"{path}: sharded checkpoint written by {meta.get('world_size')} processes, "
            f"this run has {distributed.world_size()} "
            "(exact resume replays each rank's RNG: relaunch with the same --nproc_per_node)"
        )
    extra = torch.load(path / f"rank-{distributed.rank():05d}.pt", map_location="cpu", weights_only=False)
    check_resumed_total(trainer, extra, path)
    container = _container(trainer)
    msd, osd = get_state_dict(container, trainer.optimizer)
    state: dict[str, Any] = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(container, trainer.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    trainer.scheduler.load_state_dict(extra["scheduler"])
    set_rng_state(extra["rng"])
    trainer.step = int(extra["step"])
    trainer.best = extra.get("best") or trainer.best
    trainer.prior_seconds = float(extra.get("train_seconds", 0.0))
    return trainer.step


__all__ = [
    "enable_activation_checkpointing",
    "full_grads",
    "full_state_dict",
    "gather_towers",
    "list_sharded_checkpoints",
    "load_latest_sharded",
    "mixed_precision_policy",
    "save_sharded",
    "shard_towers",
    "transformer_blocks",
]
