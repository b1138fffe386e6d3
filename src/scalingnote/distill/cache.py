"""Teacher-embedding cache for QKD: encode a query set once with the frozen Stage I query
tower, so students of any size train without loading the LLM again.

Layout of a cache directory::

    meta.json        teacher fingerprint + compat id, dim, count, normalised flag
    ids.json         query ids, row order
    texts.jsonl      the query texts (one JSON string per line, row order)
    emb.f32          float32 [count, dim], memory-mapped (np.memmap)
    progress.json    rows finished so far (written after each chunk)

Encoding is resumable: an interrupted run continues from ``progress.json``; the
cache is only marked complete (``meta.json["complete"]``) after the last chunk.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scalingnote.errors import ScalingNoteError
from scalingnote.utils import write_json
from scalingnote.utils.io import atomic_write


@dataclass
class TeacherCache:
    root: Path
    ids: list[str]
    texts: list[str]
    emb: np.ndarray  # memmap [N, dim]
    meta: dict

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def dim(self) -> int:
        return int(self.meta["dim"])


def _same_queries(root: Path, ids: Sequence[str]) -> bool:
    p = root / "ids.json"
    return p.exists() and json.loads(p.read_text(encoding="utf-8")) == list(ids)


def build_teacher_cache(
    teacher,
    ids: Sequence[str],
    texts: Sequence[str],
    out: str | Path,
    *,
    chunk: int = 2048,
    batch_size: int = 128,
    show_progress: bool = True,
    encode=None,
) -> TeacherCache:
    """Encode ``texts`` with ``teacher`` (a query tower) into ``out`` (resumable).

    ``encode(texts) -> [n, dim]`` raw (unnormalised) embeddings replaces ``teacher.encode_queries``
    (e.g. a :class:`~scalingnote.models.PrefixTower` reading cached features)."""
    from tqdm.auto import tqdm

    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    if len(ids) != len(texts):
        raise ScalingNoteError("teacher cache: ids and texts differ in length")
    if len(set(ids)) != len(ids):
        raise ScalingNoteError("teacher cache: duplicate query ids")
    n, dim = len(ids), int(teacher.out_dim)
    meta_p = root / "meta.json"
    if meta_p.exists():
        meta = json.loads(meta_p.read_text(encoding="utf-8"))
        if meta.get("teacher_fingerprint") != teacher.fingerprint or not _same_queries(root, ids):
            raise ScalingNoteError(
                f"{root}: cache holds another teacher ({meta.get('teacher_fingerprint')}) or query set; "
                "use a new cache directory"
            )
    else:
        meta = {
            "teacher_fingerprint": teacher.fingerprint,
            "compat_id": teacher.compat_id,
            "dim": dim,
            "count": n,
            "normalized": False,
            "complete": False,
        }
        write_json(root / "ids.json", list(ids), indent=None)
        with atomic_write(root / "texts.jsonl") as fh:
            for t in texts:
                fh.write(json.dumps(t, ensure_ascii=False) + "\n")
        np.memmap(root / "emb.f32", dtype=np.float32, mode="w+", shape=(max(n, 1), dim)).flush()
        write_json(meta_p, meta)
    prog_p = root / "progress.json"
    done = json.loads(prog_p.read_text())["rows"] if prog_p.exists() else 0
    if not meta["complete"]:
        mm = np.memmap(root / "emb.f32", dtype=np.float32, mode="r+", shape=(max(n, 1), dim))
        bar = tqdm(total=n, initial=done, desc="teacher cache", unit="q", disable=not show_progress)
        while done < n:
            end = min(n, done + chunk)
            # raw projected teacher outputs q_i = W^Q h (Eq. 4): Eq. 15's MSE needs the magnitude
            chunk_texts = list(texts[done:end])
            mm[done:end] = (
                encode(chunk_texts)
                if encode is not None
                else teacher.encode_queries(chunk_texts, batch_size=batch_size, normalize=False, show_progress=False)
            )
            mm.flush()
            done = end
            write_json(prog_p, {"rows": done})
            bar.update(end - bar.n)
        bar.close()
        meta["complete"] = True
        write_json(meta_p, meta)
    return open_teacher_cache(root)


def open_teacher_cache(root: str | Path) -> TeacherCache:
    root = Path(root)
    meta_p = root / "meta.json"
    if not meta_p.exists():
        raise ScalingNoteError(f"{root}: not a teacher cache (no meta.json)")
    meta = json.loads(meta_p.read_text(encoding="utf-8"))
    if not meta.get("complete"):
        raise ScalingNoteError(f"{root}: teacher cache is incomplete; rerun to resume encoding")
    ids = json.loads((root / "ids.json").read_text(encoding="utf-8"))
    texts = [json.loads(line) for line in (root / "texts.jsonl").read_text(encoding="utf-8").splitlines()]
    emb = np.memmap(root / "emb.f32", dtype=np.float32, mode="r", shape=(max(len(ids), 1), int(meta["dim"])))[
        : len(ids)
    ]
    return TeacherCache(root, ids, texts, emb, meta)
