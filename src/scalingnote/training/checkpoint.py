"""Training checkpoints: model, optimizer, scheduler and every RNG state, written atomically.

Layout: ``<output_dir>/checkpoints/step-00000050/state.pt``. A checkpoint directory is
created under a temporary name and renamed when complete, so a crash mid-write never
leaves a checkpoint that looks valid.

Format: ``torch.save`` of a dict of tensors, numbers, strings, lists/tuples/dicts and numpy
arrays (RNG states, mined negatives). Loading never runs pickled code:
:func:`safe_torch_load` uses ``torch.load(..., weights_only=True)`` with an allow-list of
the numpy reconstructors those states need (:data:`ALLOWED_GLOBALS`); a file that holds
anything else is refused with a :class:`~scalingnote.errors.ScalingNoteError` naming it.
"""

from __future__ import annotations

import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from scalingnote.errors import ScalingNoteError
from scalingnote.utils.io import atomic_path

_STEP_RE = re.compile(r"^step-(\d+)$")


def _allowed_globals() -> list[Any]:
    """numpy pieces a checkpoint may hold (arrays of numbers / bools, numpy scalars, dtypes),
    under the module names numpy 1.x and 2.x pickle them with."""
    try:
        from numpy._core import multiarray as ma
    except ImportError:  # numpy < 2
        from numpy.core import multiarray as ma  # type: ignore[no-redef]
    out: list[Any] = [np.ndarray, np.dtype, bytes]  # bytes: protocol-2 pickles write b"" (empty arrays) as bytes()
    for name in ("_reconstruct", "scalar"):
        fn = getattr(ma, name)
        out += [(fn, f"numpy.core.multiarray.{name}"), (fn, f"numpy._core.multiarray.{name}")]
    numeric = (
        "Bool",
        "Int8",
        "Int16",
        "Int32",
        "Int64",
        "UInt8",
        "UInt16",
        "UInt32",
        "UInt64",
        "Float16",
        "Float32",
        "Float64",
        "LongDouble",
        "Complex64",
        "Complex128",
        "Byte",
        "UByte",
        "Short",
        "UShort",
        "Int",
        "UInt",
        "Long",
        "ULong",
        "LongLong",
        "ULongLong",
    )
    dtypes = getattr(np, "dtypes", None)
    if dtypes is not None:
        out += [getattr(dtypes, f"{n}DType") for n in numeric if hasattr(dtypes, f"{n}DType")]
    return out


ALLOWED_GLOBALS = _allowed_globals()


def safe_torch_load(path: str | Path) -> Any:
    """``torch.load(path, weights_only=True)`` with :data:`ALLOWED_GLOBALS`; errors name the file."""
    import pickle

    path = Path(path)
    try:
        with torch.serialization.safe_globals(ALLOWED_GLOBALS):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        m = re.search(r"Unsupported global: GLOBAL (\S+)", str(e))
        if m is None:
            raise ScalingNoteError(f"{path}: not a readable checkpoint ({_first_line(e)})") from None
        raise ScalingNoteError(
            f"{path}: refused to load: it holds {m.group(1)}, which is not in the checkpoint allow-list "
            "(checkpoints load with weights_only=True and never run pickled code)"
        ) from None
    except FileNotFoundError:
        raise ScalingNoteError(f"{path}: checkpoint file not found") from None
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        raise ScalingNoteError(f"{path}: not a readable checkpoint ({_first_line(e)})") from None


def _first_line(e: BaseException) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip()
    m = re.search(r"WeightsUnpickler error:\s*(.+?)(?:\n\s*\n|$)", text, re.S)
    if m:
        text = m.group(1)
    line = " ".join(text.split())[:200]
    return f"{type(e).__name__}: {line}" if line else type(e).__name__


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def checkpoint_dir(output_dir: str | Path, step: int) -> Path:
    return Path(output_dir) / "checkpoints" / f"step-{step:08d}"


def save_checkpoint(output_dir: str | Path, step: int, state: dict[str, Any], keep: int = 2) -> Path:
    final = checkpoint_dir(output_dir, step)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    with atomic_path(tmp / "state.pt") as p:
        torch.save(state, p)
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    # prune old checkpoints
    steps = list_checkpoints(output_dir)
    for s in steps[:-keep] if keep > 0 else []:
        shutil.rmtree(checkpoint_dir(output_dir, s), ignore_errors=True)
    return final


def list_checkpoints(output_dir: str | Path, marker: str = "state.pt") -> list[int]:
    """Steps of the complete checkpoints under ``<output_dir>/checkpoints`` (a ``step-N``
    directory holding ``marker``; sharded checkpoints pass theirs), ascending."""
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return []
    steps = []
    for p in root.iterdir():
        m = _STEP_RE.match(p.name)
        if m and (p / marker).exists():
            steps.append(int(m.group(1)))
    return sorted(steps)


def load_latest_checkpoint(output_dir: str | Path) -> tuple[int, dict[str, Any]] | None:
    steps = list_checkpoints(output_dir)
    if not steps:
        return None
    path = checkpoint_dir(output_dir, steps[-1]) / "state.pt"
    return steps[-1], safe_torch_load(path)
