"""The four additions a contributor makes as built-ins (``test_extending_additions.py``): a second
pooling mode (SGPT's position-weighted mean), a margin ranking loss, an exact numpy back end and a
CSV corpus format, each as the product files it writes or appends to."""

from __future__ import annotations

from pathlib import Path

PKG = Path("src/scalingnote")

# ------------------------------------------------------------------ the four additions
# Each: {product file (relative to the repository): (mode, text)}, mode "new" or "append".
WEIGHTED_MEAN = {
    PKG / "models/towers/pooling.py": (
        "append",
        '''

def _weighted_means(h: torch.Tensor, mask: torch.Tensor, spans: torch.Tensor) -> torch.Tensor:
    """Position-weighted mean over each view's real tokens, token i weighted i + 1 (SGPT,
    Muennighoff 2022 §2.1: later tokens of a causal model have seen more of the text)."""
    pos = torch.arange(h.shape[1], device=h.device)
    inside = (pos > spans[..., :1]) & (pos <= spans[..., 1:]) & mask.bool().unsqueeze(1)  # [B, S, L]
    w = (inside * (pos + 1)).to(h.dtype)
    return torch.einsum("bsl,blh->bsh", w, h) / w.sum(-1, keepdim=True).clamp(min=1.0)


register_pooling("weightedmean", _weighted_means, st_mode="weightedmean", description="position-weighted mean (SGPT)")
''',
    ),
}

MARGIN_LOSS = {
    PKG / "training/losses/margin_ranking.py": (
        "new",
        '''"""Margin ranking loss on the ``[EMB]`` view: a hinge on the gap between the positive's and the
hard negative's cosine similarity (the pairwise loss of RankNet-style training with a margin).

    L = mean_i max(0, margin - (cos(q_i, d_i+) - cos(q_i, d_i-)))

Inputs: a :class:`LossBatch` with hard negatives (``neg`` set); ``spec.options["margin"]``
(default 0.2). Example::

    >>> import torch
    >>> from scalingnote.training.losses import LossBatch, LossSpec
    >>> b = LossBatch(torch.eye(2), {"emb": torch.eye(2)}, {"emb": torch.eye(2).flip(0)})
    >>> float(margin_ranking_loss(b, LossSpec(name="margin_ranking"))[0])
    0.0
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from scalingnote.errors import ConfigError
from scalingnote.training.losses.batch import LossBatch
from scalingnote.training.losses.registry import register_loss
from scalingnote.training.losses.spec import LossSpec


def margin_ranking_loss(batch: LossBatch, spec: LossSpec) -> tuple[torch.Tensor, dict[str, float]]:
    if batch.neg is None:
        raise ConfigError("loss margin_ranking needs hard negatives (data.negatives other than none)")
    q, pos, neg = (F.normalize(x, dim=-1) for x in (batch.q, batch.pos["emb"], batch.neg["emb"]))
    s_pos, s_neg = (q * pos).sum(-1), (q * neg).sum(-1)
    margin = float(spec.options.get("margin", 0.2))
    loss = F.margin_ranking_loss(s_pos, s_neg, torch.ones_like(batch.q[:, 0]), margin=margin)
    return loss, {"loss": float(loss.detach())}


register_loss("margin_ranking", margin_ranking_loss)
''',
    ),
    PKG / "training/losses/__init__.py": (
        "append",
        "\nfrom scalingnote.training.losses.margin_ranking import margin_ranking_loss  # noqa: E402,F401\n",
    ),
}

NUMPY_BACKEND = {
    PKG / "index/numpy_exact.py": (
        "new",
        '''"""An exact brute-force back end in numpy over an index directory's full-precision vectors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from scalingnote.index.layout import check_query_tower, read_manifest
from scalingnote.index.searcher import SearchResult, VectorSearcher


class NumpySearcher(VectorSearcher):
    """Inner products with every vector, read memory-mapped in blocks (a corpus larger than RAM
    costs time, not memory); no IVF, no HNSW, no re-rank, read-only."""

    BLOCK = 65_536  # vectors scored at a time

    def __init__(self, root, query_tower=None):
        root = Path(root)
        self.manifest = {**read_manifest(root), "factory": "numpy:exact"}
        self.vectors = np.load(root / "vectors.npy", mmap_mode="r")
        self.doc_ids = json.loads((root / "doc_ids.json").read_text(encoding="utf-8"))
        self.root, self.query_tower = root, query_tower

    @classmethod
    def open(cls, location, query_tower=None, **_):
        if query_tower is not None:  # a query tower of another embedding space is refused
            check_query_tower(read_manifest(location), query_tower, location)
        return cls(location, query_tower)

    def search(self, queries, k=10):
        q = self.query_vectors(queries)
        best_s = np.full((len(q), 0), -np.inf, dtype=np.float32)
        best_i = np.zeros((len(q), 0), dtype=np.int64)
        for start in range(0, len(self.vectors), self.BLOCK):
            block = np.asarray(self.vectors[start : start + self.BLOCK]) @ q.T  # [block, Q]
            best_s = np.concatenate([best_s, block.T], axis=1)
            block_ids = np.broadcast_to(np.arange(start, start + len(block)), (len(q), len(block)))
            best_i = np.concatenate([best_i, block_ids], axis=1)
            keep = np.argsort(-best_s, axis=1, kind="stable")[:, :k]
            best_s, best_i = np.take_along_axis(best_s, keep, 1), np.take_along_axis(best_i, keep, 1)
        return SearchResult(best_s, [[self.doc_ids[i] for i in row] for row in best_i], None, best_i)
''',
    ),
    PKG / "index/backends.py": (
        "append",
        """
from scalingnote.index.numpy_exact import NumpySearcher  # noqa: E402

register_backend("numpy_exact", NumpySearcher.open, help="exact numpy search over an index directory")
""",
    ),
}

CSV_CORPUS = {
    PKG / "data/corpus.py": (
        "append",
        '''

def _read_csv(path: Path) -> Iterator[Document]:
    """A CSV corpus with a header row naming ``id`` and ``text`` (``title`` optional)."""
    import csv  # the one reader that needs it

    with open(path, newline="", encoding="utf-8") as fh:
        rows = csv.DictReader(fh)
        missing = sorted({"id", "text"} - set(rows.fieldnames or ()))
        if missing:
            raise DataError(
                path, 1, missing[0], f"the header must name id and text (title optional), got {rows.fieldnames}"
            )
        for row in rows:
            yield Document(row["id"], row.get("title") or "", "", row["text"])


register_corpus_format("csv", _read_csv, suffixes=(".csv",))
''',
    ),
}

ADDITIONS = {
    "weightedmean pooling": WEIGHTED_MEAN,
    "margin ranking loss": MARGIN_LOSS,
    "numpy back end": NUMPY_BACKEND,
    "csv corpus": CSV_CORPUS,
}
