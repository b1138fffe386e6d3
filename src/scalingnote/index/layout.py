"""The on-disk layout of a dense index directory (``scalingnote-index/1``): file names, search
defaults, the manifest reader, the query-tower check, and the atomic directory swap."""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
from pathlib import Path
from typing import Any

from scalingnote.errors import ScalingNoteError
from scalingnote.index.embeddings import tower_identity
from scalingnote.utils import write_json

FORMAT = "scalingnote-index/1"
MANIFEST = "manifest.json"
INDEX_FILE = "index.faiss"
VECTORS_FILE = "vectors.npy"
DOC_IDS_FILE = "doc_ids.json"
SEMANTIC_IDS_FILE = "semantic_ids.npy"
SEMANTIC_CODEBOOKS_FILE = "semantic_ids.npz"
DOCS_FILE = "docs.jsonl"
SNIPPET_CHARS = 240

DEFAULT_NPROBE = 16
DEFAULT_EF_SEARCH = 128


def read_manifest(root: str | Path) -> dict[str, Any]:
    root = Path(root)
    path = root / MANIFEST
    if not path.exists():
        raise ScalingNoteError(
            f"{root}: no {MANIFEST} — not an index directory (build one with `scalingnote index build`)"
        )
    try:
        man = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ScalingNoteError(f"{path}: unreadable index manifest ({e})") from None
    if man.get("format") != FORMAT:
        raise ScalingNoteError(f"{path}: field 'format' is {man.get('format')!r}, expected {FORMAT!r}")
    return _reanchor(root, man)


#: the manifest's recorded paths (section, field; section None: a top-level field): the document tower's
#: saved directory, the corpus the document store was written from and the embeddings the index was built
#: from (where a corpus is looked for when none was given); each is also recorded relative to the index
#: directory (``paths_from_index``), so an index moved or copied together with them still finds them
ANCHORED: dict[str, tuple[str | None, str]] = {
    "tower": ("tower", "path"),
    "documents": ("documents", "source"),
    "embeddings": (None, "embeddings_dir"),
}
PATHS_FROM_INDEX = "paths_from_index"


def anchor_paths(root: str | Path, man: dict[str, Any]) -> dict[str, Any]:
    """``man`` with ``paths_from_index``: each recorded path of :data:`ANCHORED` relative to ``root``
    (the index directory, or a sibling it is renamed from: the same parent gives the same relative path)."""
    rel: dict[str, str] = {}
    for name, (section, field) in ANCHORED.items():
        p = (man if section is None else man.get(section) or {}).get(field)
        if p:
            try:
                rel[name] = os.path.relpath(Path(str(p)).resolve(), Path(root).resolve())
            except ValueError:  # another drive (Windows): only the absolute path holds
                continue
    return {**man, PATHS_FROM_INDEX: rel} if rel else man


def _reanchor(root: Path, man: dict[str, Any]) -> dict[str, Any]:
    """The manifest's recorded paths as they are now: where an index was moved or copied with its tower
    and corpus, the path relative to the index (``paths_from_index``) names them; else the absolute one."""
    rels = man.get(PATHS_FROM_INDEX) or {}
    for name, (section, field) in ANCHORED.items():
        entry, rel = man if section is None else man.get(section), rels.get(name)
        if rel and isinstance(entry, dict) and (root / rel).exists():
            entry[field] = str((root / rel).resolve())
    return man


def record_tower_path(root: str | Path, tower_dir: str | Path) -> bool:
    """Record ``tower_dir`` as the saved directory of the index's document tower (manifest field
    ``tower.path``) when the index does not name one and that directory holds the very tower
    (same fingerprint in its ``tower.json``); returns whether the manifest changed. For indexes
    built before manifests recorded the path: the live index then re-encodes new documents with
    that tower without a ``--document-tower`` flag."""
    root, tower_dir = Path(root), Path(tower_dir)
    man = read_manifest(root)
    t = man.get("tower") or {}
    meta = tower_dir / "tower.json"
    saved = json.loads(meta.read_text(encoding="utf-8")) if meta.is_file() else {}
    if "path" in t or not t.get("fingerprint") or saved.get("fingerprint") != t["fingerprint"]:
        return False
    man["tower"] = {**t, "path": str(tower_dir.resolve())}
    write_json(root / MANIFEST, anchor_paths(root, man))
    return True


def check_query_tower(manifest: dict[str, Any], query_tower, where: str | Path = MANIFEST) -> None:
    """Raise :class:`ScalingNoteError` unless ``query_tower`` can search this index."""
    doc = manifest.get("tower") or {}
    q = tower_identity(query_tower)
    doc_compat, q_compat = doc.get("compat_id"), q.get("compat_id")
    if doc_compat is None:
        raise ScalingNoteError(
            f"{where}: the index records no document-tower compat id (built from raw vectors), so query tower "
            f"{q.get('name', '?')!r} cannot be checked; search it with precomputed query vectors instead"
        )
    if q_compat is None or str(q_compat) != str(doc_compat):
        raise ScalingNoteError(
            f"{where}: query tower {q.get('name', '?')!r} (compat id {q_compat!r}, fingerprint "
            f"{q.get('fingerprint')!r}) "
            f"is not compatible with the index's document tower {doc.get('name', '?')!r} "
            f"(compat id {doc_compat!r}, fingerprint {doc.get('fingerprint')!r})"
        )
    qdim = q.get("dim")
    dim, src = int(manifest["dim"]), int(manifest.get("source_dim", manifest["dim"]))
    if qdim is not None and int(qdim) not in (dim, src):
        raise ScalingNoteError(
            f"{where}: query tower {q.get('name', '?')!r} outputs {qdim}-d vectors, but the index dim is {dim} "
            f"(document tower dim {src})"
        )


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def _replace_dir(tmp_dir: Path, out_dir: Path) -> None:
    """Rename ``tmp_dir`` onto ``out_dir``; an existing ``out_dir`` is swapped out then removed."""
    if out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
        os.replace(out_dir, old)
        os.replace(tmp_dir, out_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp_dir, out_dir)
