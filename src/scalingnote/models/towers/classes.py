"""The two towers: :class:`QueryTower` (Eq. 2, 4; BERT: Eq. 13-14) and :class:`DocumentTower`
(the §3.2 prompt, one view per placeholder, Eq. 1, 3)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from scalingnote.data.types import Document
from scalingnote.errors import ConfigError, ScalingNoteError
from scalingnote.models.prompt import PAPER_DOCUMENT_PROMPT, VIEWS, DocumentPrompt, EncodedDocument
from scalingnote.models.towers.base import Tower, _as_docs, _as_texts
from scalingnote.models.towers.config import TowerConfig
from scalingnote.models.towers.pooling import text_spans


class QueryTower(Tower):
    """Query encoder: ``tower(tower.tokenize_queries(texts)) -> Tensor[B, out_dim]``."""

    role = "query"

    def __init__(self, config: TowerConfig, backbone: nn.Module, tokenizer: Any, projection: nn.Linear | None = None):
        super().__init__(config, backbone, tokenizer, projection)
        if self.kind == "llm" and tokenizer.eos_token_id is None:
            raise ConfigError(None, None, "tokenizer", "an LLM query tower needs an EOS token (§3.2 appends [EOS])")

    def query_ids(self, texts: list[str], max_length: int | None = None) -> list[list[int]]:
        """Unpadded token ids per query (LLM: text + EOS; BERT: [CLS] text [SEP]), at most ``max_length``."""
        texts = _as_texts(texts, "texts")
        length = int(max_length or self.config.max_query_length)
        if not texts:
            return []
        if self.kind == "llm":
            eos = int(self.tokenizer.eos_token_id)
            enc = self.tokenizer(texts, add_special_tokens=True)["input_ids"]
            return [list(e)[: length - 1] + [eos] for e in enc]  # §3.2: [EOS] appended after the query
        return self._bert_ids(texts, length)

    def tokenize_queries(self, texts: list[str], max_length: int | None = None, padding_side: str | None = None) -> Any:
        """A padded ``BatchEncoding`` (CPU tensors) ready for :meth:`forward`."""
        batch, _ = self._batch(self.query_ids(texts, max_length), padding_side)
        return batch

    def pooled(self, batch: Any) -> torch.Tensor:
        """Pooled hidden states ``[B, hidden]`` before the projection."""
        return self.pool_hidden(self.hidden_states(batch), batch)

    def pool_hidden(self, h: torch.Tensor, batch: Any) -> torch.Tensor:
        """Pool last hidden states ``h [B, L, H]`` of ``batch`` (see :meth:`pooled`)."""
        mask = batch["attention_mask"].to(h.device)
        # LLM: one view ending at the EOS appended to the query (§3.2 Eq. 2); BERT: the whole text
        spans = text_spans(mask) if self.kind == "llm" else None
        return self.pooling_mode(h, mask, spans)[:, 0]

    def forward(self, batch: Any) -> torch.Tensor:
        """Projected (not normalised) query embeddings ``[B, out_dim]``, with grad when training."""
        return self.project(self.pooled(batch))

    def encode_queries(
        self,
        texts: list[str],
        *,
        batch_size: int = 64,
        dim: int | None = None,
        normalize: bool = True,
        show_progress: bool = True,
        max_length: int | None = None,
    ) -> np.ndarray:
        """float32 ``[N, dim]`` embeddings (L2-normalised unless ``normalize=False``).

        ``dim`` selects a Matryoshka prefix (default: the full output). Batched by sorted
        length, no grad, eval mode; results do not depend on the batch composition.
        """
        seqs = self.query_ids(texts, max_length)
        return self._run(
            seqs,
            lambda idx: self._batch([seqs[i] for i in idx])[0],
            self,  # the module call (not .forward): FSDP2 all-gathers a sharded tower in its pre-forward hook
            batch_size=batch_size,
            dim=dim,
            normalize=normalize,
            show_progress=show_progress,
            desc="encode queries",
            views=None,
        )


class DocumentTower(Tower):
    """Document encoder: ``tower(tower.tokenize_documents(docs)) -> {"title", "content", "emb"}``.

    For a BERT document tower the three views are the same tensor (one pooled vector of
    ``Document.text``).
    """

    role = "document"

    def __init__(self, config: TowerConfig, backbone: nn.Module, tokenizer: Any, projection: nn.Linear | None = None):
        super().__init__(config, backbone, tokenizer, projection)
        self.prompt: DocumentPrompt | None = None
        if self.kind == "llm":
            self.prompt = DocumentPrompt(tokenizer, config.doc_prompt or PAPER_DOCUMENT_PROMPT, config.field_caps)

    def document_encodings(self, docs: list[Document], max_length: int | None = None) -> list[EncodedDocument]:
        """Unpadded ids (and, for LLMs, positions before each placeholder) per document."""
        docs = _as_docs(docs)
        length = int(max_length or self.config.max_doc_length)
        if self.prompt is not None:
            return self.prompt.encode(docs, length)
        ids = self._bert_ids([d.text for d in docs], length) if docs else []
        return [EncodedDocument(e, (0, 0, 0), {}, False) for e in ids]

    def collate_documents(self, encs: list[EncodedDocument], padding_side: str | None = None) -> Any:
        """Pad encodings into a ``BatchEncoding``; LLM batches carry ``view_positions [B, 3]``."""
        batch, offsets = self._batch([e.input_ids for e in encs], padding_side)
        if self.kind == "llm":
            vp = torch.tensor([e.view_positions for e in encs], dtype=torch.long).reshape(len(encs), 3)
            batch["view_positions"] = vp + torch.tensor(offsets, dtype=torch.long).unsqueeze(1)
        return batch

    def tokenize_documents(
        self, docs: list[Document], max_length: int | None = None, padding_side: str | None = None
    ) -> Any:
        """A padded ``BatchEncoding`` (CPU tensors) ready for :meth:`forward`."""
        return self.collate_documents(self.document_encodings(docs, max_length), padding_side)

    def pooled(self, batch: Any) -> torch.Tensor:
        """Pooled hidden states before the projection: ``[B, 3, hidden]`` (title, content, emb
        positions) for an LLM tower, ``[B, hidden]`` for a BERT tower."""
        return self.pool_hidden(self.hidden_states(batch), batch)

    def pool_hidden(self, h: torch.Tensor, batch: Any) -> torch.Tensor:
        """Pool last hidden states ``h [B, L, H]`` of ``batch`` (see :meth:`pooled`)."""
        mask = batch["attention_mask"].to(h.device)
        if self.prompt is not None:  # one span per view, ending just before its placeholder (§3.2 Eq. 1)
            return self.pooling_mode(h, mask, self.prompt.spans(batch))
        return self.pooling_mode(h, mask)[:, 0]  # BERT: the whole text

    def forward(self, batch: Any) -> dict[str, torch.Tensor]:
        """Projected (not normalised) views ``{"title", "content", "emb"}``, each ``[B, out_dim]``."""
        p = self.project(self.pooled(batch))  # Eq. 3
        if self.kind == "llm":
            return {v: p[:, i] for i, v in enumerate(VIEWS)}
        return {v: p for v in VIEWS}

    def _encode_views(self, docs, views, batch_size, dim, normalize, show_progress, max_length):
        encs = self.document_encodings(docs, max_length)
        return self._run(
            [e.input_ids for e in encs],
            lambda idx: self.collate_documents([encs[i] for i in idx]),
            self,  # the module call: hooks run (FSDP2)
            batch_size=batch_size,
            dim=dim,
            normalize=normalize,
            show_progress=show_progress,
            desc="encode documents",
            views=views,
        )

    def encode_documents(
        self,
        docs: list[Document],
        *,
        view: str = "emb",
        batch_size: int = 16,
        dim: int | None = None,
        normalize: bool = True,
        show_progress: bool = True,
        max_length: int | None = None,
    ) -> np.ndarray:
        """float32 ``[N, dim]`` embeddings of one view (default the final ``[EMB]`` view)."""
        if view not in VIEWS:
            raise ValueError(f"view must be one of {VIEWS}, got {view!r}")
        return self._encode_views(docs, (view,), batch_size, dim, normalize, show_progress, max_length)[view]

    def encode_document_views(
        self,
        docs: list[Document],
        *,
        batch_size: int = 16,
        dim: int | None = None,
        normalize: bool = True,
        show_progress: bool = True,
        max_length: int | None = None,
    ) -> dict[str, np.ndarray]:
        """All three views ``{"title", "content", "emb"}`` as float32 ``[N, dim]`` arrays."""
        return self._encode_views(docs, VIEWS, batch_size, dim, normalize, show_progress, max_length)


TOWER_CLASSES: dict[str, type[QueryTower] | type[DocumentTower]] = {"query": QueryTower, "document": DocumentTower}


# ====================================================================== compatibility


def pair_towers(query: QueryTower, document: DocumentTower) -> str:
    """Tie towers trained together (rule 2): both get the document tower's fresh fingerprint."""
    if query.role != "query" or document.role != "document":
        raise ValueError("pair_towers(query_tower, document_tower)")
    if query.out_dim != document.out_dim:
        raise ConfigError(None, None, "dim", f"query out_dim {query.out_dim} != document out_dim {document.out_dim}")
    cid = document.refresh_fingerprint()
    document.compat_id = cid
    query.compat_id = cid
    return cid


def check_compatible(query: Tower, compat_id: str, *, out_dim: int | None = None, where: str | None = None) -> None:
    """Raise :class:`~scalingnote.errors.ScalingNoteError` unless ``query`` can search an index
    built with document embeddings of ``compat_id`` (and ``out_dim``)."""
    prefix = f"{where}: " if where else ""
    if query.compat_id != compat_id:
        raise ScalingNoteError(
            f"{prefix}query tower (compat_id {query.compat_id}) is not compatible with document embeddings "
            f"of compat_id {compat_id}: use the query tower trained or distilled with that document tower"
        )
    if out_dim is not None and out_dim > query.out_dim:
        raise ScalingNoteError(f"{prefix}index dim {out_dim} exceeds the query tower's output dim {query.out_dim}")
