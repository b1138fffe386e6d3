"""Resumable steps that are reused only when their inputs are the same.

A step (a directory of outputs: a Stage I run, a QKD run, an encoded corpus, an index, a
quick-start stage) records the **inputs** it was built from — settings and input files — and
their digest:

* ``<step_dir>/STEP_INPUTS.json`` when the work starts (:func:`check_step` writes it when it
  answers "not done"), so partial work (checkpoints, finished shards) is attributed too;
* ``<step_dir>/DONE`` when it is finished (:func:`mark_step`, atomic): the inputs, their
  digest and the step's own ``info``.

:func:`step_state` compares a directory with the inputs of this run: ``missing`` (nothing
there), ``done`` (finished with the same inputs: reuse it), ``partial`` (started with the same
inputs, or older work with no record: resume it) or ``changed`` (made from other inputs, or a
``DONE`` marker without a digest, written before digests were recorded: it cannot be trusted).
:func:`check_step` acts on it: reuse, or redo (clear the marker, log one line naming the keys
that differ) or refuse (:class:`StepChangedError` naming them).

Digest of the inputs
--------------------
``inputs`` is a dict of JSON-able values (dataclasses, tuples and sets are converted); it is
written as canonical JSON (sorted keys, no spaces) and hashed with SHA-256. Values that are
:class:`pathlib.Path` objects (and only those: a path given as ``str`` is just text) are
replaced by a **fingerprint** of what they name, so that other data under the same name counts
as a change:

* a file: its resolved path and size, plus the SHA-256 of its content when it is at most
  :data:`SMALL_FILE` bytes, else its ``mtime_ns`` (hashing gigabytes on every resume would be
  slow; a rewritten large file counts as changed even if its bytes are the same);
* a directory: its resolved path and a digest over every file below it (relative name + the
  file fingerprint above; hidden files, ``__pycache__`` and the step markers are skipped);
* a missing path: its resolved path and ``"kind": "missing"``.

The resolved path is part of the fingerprint: the same data moved elsewhere counts as a change.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from scalingnote.errors import ScalingNoteError
from scalingnote.utils.io import write_json

log = logging.getLogger(__name__)

MARKER = "DONE"
RECORD = "STEP_INPUTS.json"
SMALL_FILE = 4 << 20  #: files up to this size are fingerprinted by content (SHA-256)
_FP = "$path"  #: the key that marks a path fingerprint (a leaf when keys are compared)

StepState = Literal["missing", "done", "changed", "partial"]


class StepChangedError(ScalingNoteError):
    """A step directory was made from other inputs than this run's; ``keys`` are the ones that differ."""

    def __init__(self, step_dir: str | Path, keys: list[str], message: str):
        self.step_dir = str(step_dir)
        self.keys = keys
        super().__init__(message)


# --------------------------------------------------------------------------- digests


def file_sha256(p: str | Path) -> str:
    """SHA-256 of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(p, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _file_fp(p: Path, st: os.stat_result, every_byte: bool = False) -> dict[str, Any]:
    if every_byte or st.st_size <= SMALL_FILE:
        return {"size": st.st_size, "sha256": file_sha256(p)}
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def fingerprint(path: str | Path, every_byte: bool = False) -> dict[str, Any]:
    """What :func:`input_digest` records for a :class:`~pathlib.Path` value (see the module doc);
    ``every_byte``: large files by content too, not by their ``mtime_ns``."""
    p = Path(path).expanduser().resolve()
    out: dict[str, Any] = {_FP: str(p)}
    try:
        st = p.stat()
    except FileNotFoundError:
        return {**out, "kind": "missing"}
    if p.is_file():
        return {**out, "kind": "file", **_file_fp(p, st, every_byte)}
    h = hashlib.sha256()
    n = size = 0
    for root, dirs, files in os.walk(p):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
        for name in sorted(files):
            if name.startswith(".") or name in (MARKER, RECORD):
                continue
            f = Path(root) / name
            try:
                fp = _file_fp(f, f.stat(), every_byte)
            except FileNotFoundError:  # vanished while walking
                continue
            h.update(json.dumps([str(f.relative_to(p)), fp], sort_keys=True).encode())
            n += 1
            size += fp["size"]
    return {**out, "kind": "dir", "files": n, "size": size, "tree_sha256": h.hexdigest()}


def content_fingerprint(path: str | Path) -> dict[str, Any]:
    """:func:`fingerprint` without the resolved path and by every byte: what ``path`` holds, wherever it
    lies and whenever it was written (a move, or a copy that does not keep the times, matches)."""
    return {k: v for k, v in fingerprint(path, every_byte=True).items() if k != _FP}


def canonical(obj: Any) -> Any:
    """``obj`` as plain JSON values: dataclasses -> dicts, Paths -> :func:`fingerprint`,
    tuples / sets -> lists, numpy scalars -> numbers, non-finite floats -> strings."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return canonical(dataclasses.asdict(obj))
    if isinstance(obj, Path):
        return fingerprint(obj)
    if isinstance(obj, Mapping):
        return {str(k): canonical(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [canonical(v) for v in obj]
    if isinstance(obj, (set, frozenset)):
        return sorted((canonical(v) for v in obj), key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return canonical(obj.item())
    raise ScalingNoteError(
        f"step inputs: cannot record a {type(obj).__name__} value ({obj!r:.80}); pass JSON values, dataclasses or Paths"
    )


def _digest_of(canon: Any) -> str:
    text = json.dumps(canon, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def input_digest(inputs: dict) -> str:
    """SHA-256 of ``inputs`` as canonical JSON, Path values fingerprinted (see the module doc)."""
    return _digest_of(canonical(inputs))


def _flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted key (list items by index: ``queries.0.path``) -> leaf value."""
    if isinstance(obj, list) and obj:
        obj = {str(i): v for i, v in enumerate(obj)}
    if isinstance(obj, dict) and _FP not in obj and obj:
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix or "<inputs>": obj}


def _value(flat: dict[str, Any], key: str) -> Any:
    """A key's value; absent, null and ``{}`` read alike (a setting added or retired at its empty
    default does not change what a step was made from)."""
    v = flat.get(key)
    return None if v == {} else v


DEFAULTS = "$defaults"  #: inputs key: {dotted key: the config field's default} (see :func:`with_defaults`)


def _field_defaults(cls: type, prefix: str) -> dict[str, Any]:
    """Canonical leaf defaults of a dataclass's fields (nested dataclass defaults recursed into;
    fields without a default skipped)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            continue
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out.update(_field_defaults(type(value), key + "."))
        else:
            out.update(_flatten(canonical(value), key))
    return out


def with_defaults(inputs: dict[str, Any], cfg: Any, prefix: str = "") -> dict[str, Any]:
    """``inputs`` plus the defaults of ``cfg``'s dataclass fields (under ``prefix``, e.g.
    ``"config."`` where the config sits under ``inputs["config"]``), so that a step recorded
    before a setting existed still matches while that setting has its default: a field added
    later at a non-empty default (``optim.schedule: "linear"``) does not redo older steps."""
    known = dict(inputs.get(DEFAULTS) or {})
    known.update(_field_defaults(type(cfg), prefix))
    return {**inputs, DEFAULTS: known}


def diff_keys(old: Any, new: Any) -> list[str]:
    """Dotted keys whose values differ between two canonical input dicts (a path fingerprint is
    one value: ``data.data_dir``, not its parts; absent, null and ``{}`` are the same value; a
    key the old record lacks whose new value is its field's default, :func:`with_defaults`, is
    no difference)."""
    defaults = (new.get(DEFAULTS) if isinstance(new, dict) else None) or {}
    a, b = _flatten(_without_defaults(old)), _flatten(_without_defaults(new))

    def differs(k: str) -> bool:
        if _value(a, k) == _value(b, k):
            return False
        return not (k not in a and k in defaults and defaults[k] == b.get(k))  # added since, at its default

    return sorted(k for k in set(a) | set(b) if differs(k))


def _without_defaults(obj: Any) -> Any:
    return {k: v for k, v in obj.items() if k != DEFAULTS} if isinstance(obj, dict) else obj


def _show(v: Any) -> str:
    if isinstance(v, dict) and _FP in v:
        v = v[_FP] if v.get("kind") != "missing" else f"{v[_FP]} (missing)"
    text = json.dumps(v, ensure_ascii=False) if not isinstance(v, str) else v
    return text if len(text) <= 80 else text[:77] + "..."


def describe_changes(old: Any, new: Any, limit: int = 6) -> str:
    """``key: old -> new`` for the differing keys (paths whose content changed say so)."""
    a, b = _flatten(_without_defaults(old)), _flatten(_without_defaults(new))
    parts = []
    keys = diff_keys(old, new)
    for k in keys[:limit]:
        x, y = a.get(k, "<absent>"), b.get(k, "<absent>")
        if isinstance(x, dict) and isinstance(y, dict) and x.get(_FP) == y.get(_FP):
            parts.append(f"{k}: {_show(y)} (its content changed)")
        else:
            parts.append(f"{k}: {_show(x)} -> {_show(y)}")
    if len(keys) > limit:
        parts.append(f"... {len(keys) - limit} more")
    return "; ".join(parts)


# --------------------------------------------------------------------------- step markers


def _read(path: Path) -> dict[str, Any] | None:
    """A marker's JSON; ``{}`` when it exists but holds no readable record; None when absent."""
    if not path.exists():
        return None
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return rec if isinstance(rec, dict) else {}


def _recorded(step_dir: Path) -> tuple[str | None, dict[str, Any] | None]:
    """``(which marker, its record)`` of ``step_dir``: DONE first, else the start record."""
    for name in (MARKER, RECORD):
        rec = _read(step_dir / name)
        if rec is not None:
            return name, rec
    return None, None


def _compare(step_dir: Path, canon: dict[str, Any]) -> tuple[StepState, list[str], str]:
    """(state, differing keys, a description of the change)."""
    which, rec = _recorded(step_dir)
    if which is None or rec is None:  # both None together
        busy = step_dir.is_dir() and any(not p.name.startswith(".") for p in step_dir.iterdir())
        return ("partial" if busy else "missing"), [], ""
    if "digest" not in rec or "inputs" not in rec:
        return (
            "changed",
            ["<unrecorded>"],
            f"{step_dir / which} records no inputs (written before input digests were kept)",
        )
    keys = [] if rec["digest"] == _digest_of(canon) else diff_keys(rec["inputs"], canon)
    if not keys:  # the same inputs (up to settings added or retired at an empty default)
        return ("done" if which == MARKER else "partial"), [], ""
    return "changed", keys, describe_changes(rec["inputs"], canon)


def step_state(step_dir: str | Path, inputs: dict) -> StepState:
    """``missing`` / ``done`` / ``partial`` / ``changed`` (see the module doc)."""
    return _compare(Path(step_dir), canonical(inputs))[0]


def changed_keys(step_dir: str | Path, inputs: dict) -> list[str]:
    """The keys whose values differ from what ``step_dir`` records ([] unless ``changed``)."""
    return _compare(Path(step_dir), canonical(inputs))[1]


def check_step(step_dir: str | Path, inputs: dict, *, on_change: Literal["redo", "refuse"] = "redo") -> bool:
    """True when ``step_dir`` is done with the same inputs (reuse it). Otherwise False, after
    recording ``inputs`` as the ones the step is (re)built from; a step made from other inputs
    is either redone (its ``DONE`` marker removed, one log line naming the keys that changed:
    the caller redoes the step, clearing its own partial work, see :func:`changed_keys`) or
    refused (``on_change="refuse"``: :class:`StepChangedError` naming them)."""
    if on_change not in ("redo", "refuse"):
        raise ValueError(f"on_change must be 'redo' or 'refuse', got {on_change!r}")
    d = Path(step_dir)
    canon = canonical(inputs)
    state, keys, what = _compare(d, canon)
    if state == "done":
        return True
    if state == "changed":
        if on_change == "refuse":
            raise StepChangedError(
                d,
                keys,
                f"{d}: made from other inputs than this run's ({what}); "
                f"use a new output directory, or delete {d} to redo it",
            )
        log.warning("%s: inputs changed (%s): redoing this step", d, what)
        (d / MARKER).unlink(missing_ok=True)
    write_json(d / RECORD, {"inputs": canon, "digest": _digest_of(canon)})
    return False


def mark_step(step_dir: str | Path, inputs: dict, info: dict | None = None) -> None:
    """Mark ``step_dir`` done (atomically): ``DONE`` holds the inputs, their digest and ``info``."""
    d = Path(step_dir)
    canon = canonical(inputs)
    rec = {"inputs": canon, "digest": _digest_of(canon)}
    write_json(d / RECORD, rec)
    write_json(
        d / MARKER, {**rec, "info": info or {}, "finished": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")}
    )


__all__ = [
    "DEFAULTS",
    "StepChangedError",
    "canonical",
    "changed_keys",
    "check_step",
    "describe_changes",
    "diff_keys",
    "fingerprint",
    "with_defaults",
    "input_digest",
    "mark_step",
    "step_state",
]
