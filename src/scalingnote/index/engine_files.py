"""Read and write the searched structure of an index directory, whichever engine holds it: a FAISS
index is one file (``index.faiss``, ``faiss.write_index``); an SVS Vamana graph a directory
(``index.svs/``, :class:`~scalingnote.index.svs.vamana.SvsVamanaIndex`), a ScaNN searcher another
(``index.scann/``, :class:`~scalingnote.index.scann.soar.ScannSoar`). The manifest's ``files.index``
names which."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scalingnote.errors import ScalingNoteError
from scalingnote.index.faiss.faiss_utils import _faiss_message
from scalingnote.index.layout import INDEX_FILE
from scalingnote.index.scann.soar import SCANN_INDEX_DIR, ScannSoar
from scalingnote.index.svs.vamana import SVS_INDEX_DIR, SvsVamanaIndex, dir_bytes


def is_engine(index: Any) -> bool:
    """True for a structure of another engine shaped as a FAISS index (it names its ``engine``)."""
    return getattr(index, "engine", None) is not None


def write_structure(index: Any, root: Path) -> str:
    """Write ``index`` into the directory ``root``; returns its name there (``files.index``)."""
    for kind, name in ((SvsVamanaIndex, SVS_INDEX_DIR), (ScannSoar, SCANN_INDEX_DIR)):
        if isinstance(index, kind):
            index.save(root / name)
            return name
    import faiss  # why: FAISS loads with the index package's searchers, not at import

    faiss.write_index(index, str(root / INDEX_FILE))
    return INDEX_FILE


def read_structure(path: Path) -> Any:
    """The structure saved at ``path`` (a directory: SVS or ScaNN; a file: FAISS), with a clear error."""
    path = Path(path)
    if path.is_dir():
        return ScannSoar.load(path) if (path / "scann_assets.pbtxt").exists() else SvsVamanaIndex.load(path)
    import faiss

    try:
        return faiss.read_index(str(path))
    except RuntimeError as e:
        raise ScalingNoteError(f"{path}: cannot read FAISS index: {_faiss_message(e)}") from None


def structure_bytes(path: Path) -> int:
    """Bytes of the saved structure (a file or a directory)."""
    path = Path(path)
    return dir_bytes(path) if path.is_dir() else path.stat().st_size


__all__ = ["is_engine", "read_structure", "structure_bytes", "write_structure"]
