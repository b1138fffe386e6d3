"""The ScalingNote document prompt (paper §3.2) and its token-level construction.

The prompt is tokenized segment by segment (template text, document fields,
placeholders) so that

* the positions of the three placeholders ``[TITLE_QUERY]``, ``[CONTENT_QUERY]`` and
  ``[EMB]`` are known exactly, without searching;
* over-long documents are cut **inside** the title/topic/content fields (a token budget
  per field), never inside the template, so the placeholders always survive.

Each view's embedding is the last hidden state at the position just *before* its
placeholder ("the previous last hidden state of the special placeholders", §3.2, Eq. 1).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from scalingnote.data import Document
from scalingnote.errors import ConfigError

#: The document prompt of ScalingNote §3.2, verbatim (curly quotes included). ``{title}``,
#: ``{topic}`` and ``{content}`` are filled with the document's fields (t_i, tp_i, c_i).
#: The paper typesets the two sentences on two lines; we join them with a newline.
PAPER_DOCUMENT_PROMPT = (
    "Document: {‘title’: {title}}. Predict a query term: “[TITLE_QUERY]”.\n"
    "Document: {‘topic’: {topic}, ‘content’: {content}}. Predict a query term: “[CONTENT_QUERY]”, "
    "combine the predicted query terms, and compress the above content into one word: “[EMB]”."
)

#: Named document prompts (``doc_tower.prompt`` of a Stage I config), for the prompt ablations of
#: ScalingNote §4.5.1 / Table 5. ``full`` is the paper's prompt; the others drop one
#: part of it and otherwise keep its wording:
#:
#: - ``no_title``: no title view: the title joins the content sentence, no [TITLE_QUERY] prediction
#:   ("w/o title loss" in Table 5);
#: - ``no_content``: no content view: the content sentence has no [CONTENT_QUERY] prediction;
#: - ``no_summarize``: no inductive "combine ... compress into one word" instruction and no [EMB]:
#:   the content view is the final embedding ("w/o summarize": "directly use the predicted query
#:   term embedding of the content as the final embedding");
#: - ``plain``: the document as plain text (title, topic, content on three lines), no instruction
#:   and no placeholder: one view pooled over the whole text is the embedding.
#:
#: A view a preset lacks has no loss term (:attr:`DocumentPrompt.loss_views`); its output slot
#: repeats the embedding so that every tower keeps the (title, content, emb) layout.
PROMPT_PRESETS: dict[str, str] = {
    "full": PAPER_DOCUMENT_PROMPT,
    "no_title": (
        "Document: {‘title’: {title}, ‘topic’: {topic}, ‘content’: {content}}. Predict a query term: "
        "“[CONTENT_QUERY]”, "
        "combine the predicted query terms, and compress the above content into one word: “[EMB]”."
    ),
    "no_content": (
        "Document: {‘title’: {title}}. Predict a query term: “[TITLE_QUERY]”.\n"
        "Document: {‘topic’: {topic}, ‘content’: {content}}. Combine the predicted query terms, "
        "and compress the above content into one word: “[EMB]”."
    ),
    "no_summarize": (
        "Document: {‘title’: {title}}. Predict a query term: “[TITLE_QUERY]”.\n"
        "Document: {‘topic’: {topic}, ‘content’: {content}}. Predict a query term: “[CONTENT_QUERY]”."
    ),
    "plain": "{title}\n{topic}\n{content}",
}
_PRESET_TEMPLATES = frozenset(PROMPT_PRESETS.values())


def resolve_prompt(name_or_template: str | None) -> str | None:
    """A preset name -> its template; a template (it has a ``{field}`` or a placeholder) or None -> itself."""
    if name_or_template is None or name_or_template in _PRESET_TEMPLATES:
        return name_or_template
    if name_or_template in PROMPT_PRESETS:
        return PROMPT_PRESETS[name_or_template]
    if "{" in name_or_template or "[" in name_or_template:
        return name_or_template
    raise ConfigError(
        None,
        None,
        "prompt",
        f"unknown prompt preset {name_or_template!r} (presets: {', '.join(PROMPT_PRESETS)}; "
        "or give a template with {title}/{topic}/{content} fields and the three placeholders)",
    )


#: Document views, in output order, and their placeholder tokens.
VIEWS: tuple[str, ...] = ("title", "content", "emb")
PLACEHOLDERS: dict[str, str] = {"title": "[TITLE_QUERY]", "content": "[CONTENT_QUERY]", "emb": "[EMB]"}
SPECIAL_TOKENS: tuple[str, ...] = tuple(PLACEHOLDERS[v] for v in VIEWS)
#: Document fields that can appear in a template.
FIELDS: tuple[str, ...] = ("title", "topic", "content")
#: Default per-field token caps applied before sharing the remaining budget (None = no cap).
DEFAULT_FIELD_CAPS: dict[str, int | None] = {"title": 64, "topic": 32, "content": None}

_TOKEN_RE = re.compile(r"(\{(?:title|topic|content)\}|" + "|".join(re.escape(t) for t in SPECIAL_TOKENS) + r")")
_VIEW_OF = {tok: view for view, tok in PLACEHOLDERS.items()}


def parse_template(template: str) -> list[tuple[str, str]]:
    """Split a template into ``("text", s)``, ``("field", name)`` and ``("view", name)`` segments.

    Each placeholder must occur exactly once (the named presets of :data:`PROMPT_PRESETS` may lack
    some: see there); each field at most once.
    """
    segs: list[tuple[str, str]] = []
    for part in _TOKEN_RE.split(template):
        if not part:
            continue
        if part in _VIEW_OF:
            segs.append(("view", _VIEW_OF[part]))
        elif part.startswith("{") and part.endswith("}") and part[1:-1] in FIELDS:
            segs.append(("field", part[1:-1]))
        else:
            segs.append(("text", part))
    for view in VIEWS:
        n = sum(1 for t, v in segs if t == "view" and v == view)
        if n != 1 and not (n == 0 and template in _PRESET_TEMPLATES):
            raise ConfigError(
                None, None, "doc_prompt", f"placeholder {PLACEHOLDERS[view]} must occur exactly once, found {n}"
            )
    for f in FIELDS:
        n = sum(1 for t, v in segs if t == "field" and v == f)
        if n > 1:
            raise ConfigError(None, None, "doc_prompt", f"field {{{f}}} occurs {n} times (at most once)")
    return segs


def allocate_budget(lengths: dict[str, int], budget: int, order: tuple[str, ...] = FIELDS) -> dict[str, int]:
    """Share ``budget`` tokens among fields: short fields are kept whole, long ones cut to equal length.

    This is water-filling: the largest cap ``c`` with ``sum(min(len, c)) <= budget``; the
    few tokens left by integer division go to the earliest fields in ``order``.
    """
    if budget < 0:
        raise ValueError("budget must be >= 0")
    if sum(lengths.values()) <= budget:
        return dict(lengths)
    alloc: dict[str, int] = {}
    remaining = budget
    pending = sorted(lengths, key=lambda k: (lengths[k], order.index(k) if k in order else len(order)))
    while pending:
        share = remaining // len(pending)
        k = pending[0]
        if lengths[k] <= share:
            alloc[k] = lengths[k]
            remaining -= lengths[k]
            pending.pop(0)
            continue
        # every pending field is longer than the equal share: cut them all to it
        extra = remaining - share * len(pending)
        for f in sorted(pending, key=lambda f: order.index(f) if f in order else len(order)):
            alloc[f] = share + (1 if extra > 0 else 0)
            extra -= 1
        break
    return alloc


@dataclass(frozen=True)
class EncodedDocument:
    """Token ids of one filled-in prompt, unpadded."""

    input_ids: list[int]
    #: index of the token just before each placeholder, in :data:`VIEWS` order
    view_positions: tuple[int, int, int]
    #: tokens kept per field, and whether any field was cut
    field_tokens: dict[str, int]
    truncated: bool


def special_prefix(tokenizer: Any) -> list[int]:
    """Special token ids the tokenizer puts *before* a text by default (e.g. BOS), possibly none."""
    probe = "hello"
    with_sp = list(tokenizer(probe, add_special_tokens=True)["input_ids"])
    without = list(tokenizer(probe, add_special_tokens=False)["input_ids"])
    for i in range(len(with_sp) - len(without) + 1):
        if with_sp[i : i + len(without)] == without:
            return with_sp[:i]
    return []


class DocumentPrompt:
    """Builds token ids of the §3.2 document prompt for a tokenizer.

    ``field_caps`` bounds individual fields (tokens) before the remaining budget is shared
    by :func:`allocate_budget`; the template text, the tokenizer's prefix (BOS) and the
    three placeholders are never cut.
    """

    def __init__(
        self,
        tokenizer: Any,
        template: str = PAPER_DOCUMENT_PROMPT,
        field_caps: dict[str, int | None] | None = None,
    ):
        self.tokenizer = tokenizer
        self.template = template
        self.segments = parse_template(template)
        caps = dict(DEFAULT_FIELD_CAPS if field_caps is None else field_caps)
        for k, v in caps.items():
            if k not in FIELDS:
                raise ConfigError(None, None, f"field_caps.{k}", f"unknown field (use {FIELDS})")
            if v is not None and (not isinstance(v, int) or v < 0):
                raise ConfigError(None, None, f"field_caps.{k}", f"must be a non-negative integer or null, got {v!r}")
        self.field_caps = {f: caps.get(f) for f in FIELDS}
        self.placeholder_ids: dict[str, int] = {}
        unk = getattr(tokenizer, "unk_token_id", None)
        for view, tok in PLACEHOLDERS.items():
            tid = tokenizer.convert_tokens_to_ids(tok)
            if tid is None or (unk is not None and tid == unk):
                raise ConfigError(
                    None, None, "tokenizer", f"placeholder {tok} is not a token of this tokenizer (add it first)"
                )
            self.placeholder_ids[view] = int(tid)
        self.prefix_ids = special_prefix(tokenizer)
        #: views whose placeholder is in the template (all three except for some presets)
        self.views_present: tuple[str, ...] = tuple(v for v in VIEWS if ("view", v) in self.segments)
        self.absent_views: tuple[str, ...] = tuple(v for v in VIEWS if v not in self.views_present)
        # Byte-level BPE tokenizers merge a leading space into the next word ("Ġword"); for those,
        # the space that ends a template text before a field is tokenized together with the field.
        plain = tokenizer("word", add_special_tokens=False)["input_ids"]
        spaced = tokenizer(" word", add_special_tokens=False)["input_ids"]
        self._space_joins_word = len(spaced) == len(plain) and spaced != plain
        self._text_cache: dict[tuple[int, bool], list[int]] = {}
        first = self._layout({f: [] for f in FIELDS})
        if min(first[1]) < 0:
            raise ConfigError(None, None, "doc_prompt", "a placeholder needs at least one token before it")

    # -- internals -----------------------------------------------------------------
    def _text_ids(self, idx: int, strip_space: bool) -> list[int]:
        key = (idx, strip_space)
        if key not in self._text_cache:
            text = self.segments[idx][1]
            if strip_space:
                text = text[:-1]
            self._text_cache[key] = list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []
        return self._text_cache[key]

    def _moves_space(self, idx: int) -> bool:
        """Whether text segment ``idx`` hands its trailing space to the field that follows it."""
        if not self._space_joins_word or idx + 1 >= len(self.segments):
            return False
        kind, text = self.segments[idx]
        return kind == "text" and text.endswith(" ") and self.segments[idx + 1][0] == "field"

    def _layout(self, field_ids: dict[str, list[int]]) -> tuple[list[int], tuple[int, int, int]]:
        ids = list(self.prefix_ids)
        pos: dict[str, int] = {}
        for i, (kind, val) in enumerate(self.segments):
            if kind == "text":
                ids.extend(self._text_ids(i, self._moves_space(i) and bool(field_ids[self.segments[i + 1][1]])))
            elif kind == "field":
                ids.extend(field_ids[val])
            else:
                pos[val] = len(ids) - 1
                ids.append(self.placeholder_ids[val])
        last = len(ids) - 1  # a view the template lacks points at the last token (see :meth:`spans`)
        return ids, (pos.get("title", last), pos.get("content", last), pos.get("emb", last))

    @property
    def loss_views(self) -> tuple[str, ...]:
        """The views that get a loss term: those in the template (``emb`` alone for a template without any)."""
        return self.views_present or ("emb",)

    def spans(self, batch: Any) -> Any:
        """``[B, 3, 2]``: the token span ``(start, end]`` of each view, in :data:`VIEWS` order, of a
        batch built from :meth:`encode` (the tower's ``view_positions``), for a pooling mode
        (:mod:`~scalingnote.models.towers.pooling`) to pool.

        A view ends just before its placeholder (§3.2 Eq. 1). Title: from the first token;
        content: after the title view (or from the first token without one); emb: the whole
        prompt up to [EMB]. Without [EMB] the embedding is the content view, or without that
        too, the whole text (up to the last token). A view the template lacks repeats the
        embedding's span (and has no loss term).
        """
        import torch

        vp, ids, mask = batch["view_positions"], batch["input_ids"], batch["attention_mask"]
        for i, v in enumerate(VIEWS):
            if v in self.views_present and not bool(
                (ids[:, 1:].gather(1, vp[:, i : i + 1]) == self.placeholder_ids[v]).all()
            ):
                raise RuntimeError(
                    "view_positions do not point just before the placeholders: batch was not built by this prompt"
                )
        start = torch.full_like(vp[:, 0], -1)
        last = torch.where(mask.bool(), torch.arange(mask.shape[1], device=mask.device), -1).max(dim=1).values
        present = self.views_present
        span = lambda a, b: torch.stack([a, b], dim=-1)  # noqa: E731
        t = span(start, vp[:, 0]) if "title" in present else None
        c = span(vp[:, 0] if t is not None else start, vp[:, 1]) if "content" in present else None
        e = span(start, vp[:, 2]) if "emb" in present else (c if c is not None else span(start, last))
        return torch.stack([t if t is not None else e, c if c is not None else e, e], dim=1)

    @property
    def fixed_length(self) -> int:
        """Tokens the prompt takes with empty fields (prefix + template + placeholders)."""
        return len(self._layout({f: [] for f in FIELDS})[0])

    # -- public --------------------------------------------------------------------
    def encode(self, docs: list[Document], max_length: int) -> list[EncodedDocument]:
        """Token ids + placeholder positions for each document, at most ``max_length`` tokens."""
        fixed = self.fixed_length
        if max_length < fixed:
            raise ConfigError(
                None,
                None,
                "max_doc_length",
                f"{max_length} is shorter than the prompt template itself ({fixed} tokens)",
            )
        budget = max_length - fixed
        present = [f for f in FIELDS if any(t == "field" and v == f for t, v in self.segments)]
        spaced = {
            f: any(
                self._moves_space(i)
                for i, (t, v) in enumerate(self.segments[:-1])
                if self.segments[i + 1] == ("field", f)
            )
            for f in present
        }
        tokenized: dict[str, list[list[int]]] = {}
        for f in present:
            texts = [(getattr(d, f) or "").strip() for d in docs]
            texts_in = [(" " + t if (spaced[f] and t) else t) for t in texts]
            enc = self.tokenizer(texts_in, add_special_tokens=False)["input_ids"] if docs else []
            tokenized[f] = [list(e) if t else [] for e, t in zip(enc, texts, strict=True)]
        out: list[EncodedDocument] = []
        for j in range(len(docs)):
            full = {f: tokenized[f][j] for f in present}
            capped = {f: full[f][: self.field_caps[f]] if self.field_caps[f] is not None else full[f] for f in present}
            # an empty field still costs nothing; a space moved into a field is counted in its budget
            alloc = allocate_budget({f: len(capped[f]) for f in present}, budget)
            kept = {f: capped[f][: alloc[f]] for f in present}
            for f in FIELDS:
                kept.setdefault(f, [])
            ids, pos = self._layout(kept)
            truncated = any(len(kept[f]) < len(full[f]) for f in present)
            out.append(EncodedDocument(ids, pos, {f: len(kept[f]) for f in present}, truncated))
        return out

    def render(self, doc: Document) -> str:
        """The filled-in prompt as text (for inspection; encoding goes through :meth:`encode`)."""
        parts = []
        for kind, val in self.segments:
            if kind == "text":
                parts.append(val)
            elif kind == "field":
                parts.append((getattr(doc, val) or "").strip())
            else:
                parts.append(PLACEHOLDERS[val])
        return "".join(parts)
