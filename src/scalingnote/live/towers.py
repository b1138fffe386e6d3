"""The document tower of a live index: the one the index was built with (its fingerprint is
checked), loaded from the manifest's record or given."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scalingnote.errors import ScalingNoteError
from scalingnote.index.embeddings import tower_identity


def check_document_tower(manifest: dict[str, Any], tower, where: str | Path) -> None:
    """Refuse a document tower whose fingerprint is not the one the index was built with; the
    error names both fingerprints, where the index's tower was loaded from, and the fix."""
    doc = manifest.get("tower") or {}
    want, got = doc.get("fingerprint"), tower_identity(tower)
    if want is None:
        raise ScalingNoteError(
            f"{where}: the index records no document-tower fingerprint (built from raw vectors): new documents cannot "
            "be encoded consistently"
        )
    if str(got.get("fingerprint")) != str(want):
        built = doc.get("path") or doc.get("name", "?")
        raise ScalingNoteError(
            f"{where}: document tower {got.get('path') or got.get('name', '?')!r} (fingerprint "
            f"{got.get('fingerprint')!r}) is not the tower the index was built with ({built!r}, fingerprint "
            f"{want!r}): its embeddings would not be comparable. Pass the tower that made the index's vectors "
            "(`scalingnote serve --document-tower DIR`, `scalingnote index add --tower DIR`; the quick start's is "
            "<run>/stage1/<chosen run>/doc_tower) or rebuild the index with this tower"
        )


def load_document_tower(manifest: dict[str, Any], spec: Any = None):
    """``spec`` (a tower, or a name/path), else the tower the manifest records: its saved
    directory (``tower.path``) when that still exists, else its name (a packaged/base model)."""
    if spec is not None and not isinstance(spec, (str, Path)):
        return spec
    # why: scalingnote.models imports torch (~1.3 s); serve imports this module at start-up
    from scalingnote.models import load_tower

    if spec is not None:
        return load_tower(str(spec), role="document")
    t = manifest.get("tower") or {}
    if t.get("path") and Path(str(t["path"])).is_dir():
        return load_tower(str(t["path"]), role="document")
    if not t.get("name"):
        raise ScalingNoteError(
            "the index names no document tower: pass one (--document-tower / --tower / document_tower)"
        )
    return load_tower(str(t["name"]), role="document", num_layers=t.get("num_layers"), pooling=t.get("pooling"))
