"""The document store of an index (``docs.jsonl``): titles and snippets per FAISS row, so search
results carry them; written atomically, checked row by row against the index on read."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from scalingnote.data.corpus import find_corpus
from scalingnote.data.types import Document
from scalingnote.errors import ScalingNoteError
from scalingnote.index.layout import DOC_IDS_FILE, DOCS_FILE, MANIFEST, SNIPPET_CHARS, anchor_paths, read_manifest
from scalingnote.utils.io import atomic_write

# --------------------------------------------------------------------------- document store


def make_snippet(text: str, max_chars: int = SNIPPET_CHARS) -> str:
    """The first ``max_chars`` characters of ``text`` (whitespace collapsed), cut at a word
    boundary when one is near, with an ellipsis when cut."""
    t = " ".join(str(text).split())
    if len(t) <= max_chars:
        return t
    cut = t[:max_chars]
    space = cut.rfind(" ")
    if space >= max_chars * 0.6:
        cut = cut[:space]
    return cut.rstrip() + "\u2026"


def _documents_by_id(
    documents: str | Path | Mapping[str, Document] | Iterable[Document],
) -> tuple[dict[str, Document], str | None]:
    """``{id: Document}`` from a corpus (a BEIR directory or a corpus file in any registered
    format, :mod:`scalingnote.data.corpus`), a mapping or an iterable."""
    if isinstance(documents, (str, Path)):
        src = find_corpus(documents)
        # on_invalid="skip": a bad record costs one title, not the index
        return {d.id: d for d in src.read(on_invalid="skip")}, str(src.path.resolve())
    if isinstance(documents, Mapping):
        return dict(documents), None
    return {d.id: d for d in documents}, None


def _corpus_of_embeddings(embeddings_dir: str | None) -> Path | None:
    """The corpus file recorded by an embeddings directory's manifest, if it still exists."""
    if not embeddings_dir:
        return None
    try:
        man = json.loads((Path(embeddings_dir) / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    path = (man.get("corpus") or {}).get("path")
    return Path(path) if path and Path(path).exists() else None  # a file, or a directory of shards


def index_corpus(manifest: dict[str, Any]) -> Path | None:
    """The corpus an index's documents came from: its document store's source, else the corpus
    recorded by the embeddings it was built from; None when neither file still exists."""
    src = (manifest.get("documents") or {}).get("source")
    if src and Path(src).exists():
        return Path(src)
    return _corpus_of_embeddings(manifest.get("embeddings_dir"))


def write_document_store(
    path: Path, ids: Sequence[str], documents, snippet_chars: int = SNIPPET_CHARS
) -> dict[str, Any]:
    """Write ``docs.jsonl`` (``{"id", "title", "snippet"}`` per FAISS row, in row order) atomically;
    returns its manifest entry. Documents absent from ``documents`` get empty fields."""
    by_id, source = _documents_by_id(documents)
    n_found = n_titles = 0
    with atomic_write(path) as fh:
        for i in ids:
            d = by_id.get(i)
            if d is not None:
                n_found += 1
                n_titles += bool(d.title)
            rec = {
                "id": i,
                "title": d.title if d else "",
                "snippet": make_snippet(d.content or d.topic or "", snippet_chars) if d else "",
            }
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
    return {
        "file": path.name,
        "source": source,
        "n_documents": len(ids),
        "n_found": n_found,
        "n_titles": n_titles,
        "snippet_chars": snippet_chars,
    }


def read_document_store(path: Path, doc_ids: Sequence[str]) -> tuple[list[str], list[str]]:
    """Titles and snippets in FAISS row order; checks the ids line by line against the index."""
    titles: list[str] = []
    snippets: list[str] = []
    try:
        with open(path, encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, start=1):
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ScalingNoteError(f"{path}: line {lineno}: invalid JSON ({e.msg})") from None
                if not isinstance(rec, dict) or lineno > len(doc_ids) or rec.get("id") != doc_ids[lineno - 1]:
                    raise ScalingNoteError(
                        f"{path}: line {lineno}: field 'id' does not match FAISS row {lineno - 1} of the index"
                    )
                titles.append(str(rec.get("title") or ""))
                snippets.append(str(rec.get("snippet") or ""))
    except OSError as e:
        raise ScalingNoteError(f"{path}: cannot read the document store ({e})") from None
    if len(titles) != len(doc_ids):
        raise ScalingNoteError(f"{path}: {len(titles)} lines for {len(doc_ids)} indexed documents")
    return titles, snippets


def attach_documents(index_dir: str | Path, documents, snippet_chars: int = SNIPPET_CHARS) -> dict[str, Any]:
    """Store titles + snippets with an existing index (``docs.jsonl`` + manifest entry, each
    written atomically). ``documents``: a BEIR directory, a corpus.jsonl, or Documents."""
    root = Path(index_dir)
    man = read_manifest(root)
    files = man.get("files", {})
    doc_ids = json.loads((root / files.get("doc_ids", DOC_IDS_FILE)).read_text(encoding="utf-8"))
    info = write_document_store(root / DOCS_FILE, doc_ids, documents, snippet_chars)
    man["files"] = {**files, "docs": DOCS_FILE}
    man["documents"] = info
    with atomic_write(root / MANIFEST) as fh:
        json.dump(anchor_paths(root, man), fh, indent=2, ensure_ascii=False)
        fh.write("\n")
    return info
