"""LLM pseudo-query generation (the strongest annotation type of "Scaling Laws for Dense
Retrieval" §5): a causal LM (default: the packaged SmolLM2-135M-Instruct) is prompted through
its chat template to write one search query for each document (one worked example precedes
the document); batched, greedy or seeded sampling. Progress is appended to
``generations.jsonl`` after every batch, so an interrupted run resumes where it stopped
(already generated doc ids are skipped; a torn last line is dropped).
``generation_settings.json`` records the model and decoding settings, and a resume with
different settings is refused.

Writes the same BEIR-style directory as ICT (:mod:`scalingnote.data.pseudo`), with query ids
``llm-<doc>`` and triplet source ``llm``. This module sits above :mod:`scalingnote.models`
(it loads the LM through the model registry); the data layer stays free of model code.
"""

from __future__ import annotations

import json
import os
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalingnote.data.pseudo import PseudoQuery, select_documents, write_pseudo_outputs
from scalingnote.data.types import Document, Query
from scalingnote.errors import ConfigError, DataError
from scalingnote.models.loading import convert_gguf, quiet_transformers, resolve_source
from scalingnote.utils import atomic_write, write_json

SYSTEM_PROMPT = "You are a search engine user. You write short, specific search queries."
USER_PROMPT = (
    "Title: {title}\nText: {content}\n\n"
    "Write one search query (at most 12 words) that this document answers. Reply with the query only."
)
#: One worked example shown before the document (a 135M model follows a demonstration far
#: better than an instruction alone).
EXAMPLE_DOC = Document(
    "example",
    "How tyre pressure affects rolling resistance on road bikes",
    "",
    "We measured the rolling resistance of 25 mm road tyres at pressures from 60 to 120 psi on smooth "
    "and rough asphalt. On rough roads, lower pressures were faster because the tyre absorbs vibration "
    "instead of bouncing the rider.",
)
EXAMPLE_QUERY = "best tyre pressure for road bikes on rough roads"


@dataclass
class LLMQueryConfig:
    model: str = "smollm2-135m"  # packaged name, .gguf file or Hugging Face directory
    seed: int = 0
    max_docs: int | None = None
    batch_size: int = 8
    max_new_tokens: int = 24
    do_sample: bool = False  # greedy by default
    temperature: float = 0.7
    top_p: float = 0.9
    no_repeat_ngram_size: int = 4  # small models loop ("in early life in early life") without it
    max_doc_chars: int = 600  # document text is cut to this many characters in the prompt
    threads: int | None = None  # torch CPU threads (None: leave as is)

    def __post_init__(self):
        if self.batch_size < 1 or self.max_new_tokens < 1:
            raise ValueError("batch_size and max_new_tokens must be >= 1")


def load_causal_lm(model: str | os.PathLike = "smollm2-135m"):
    """``(model, tokenizer)`` for generation from a packaged model name, a GGUF file or a
    Hugging Face directory. GGUF files go through the shared de-quantised safetensors
    cache of :mod:`scalingnote.models` (converted once)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = resolve_source(model)
    if src.form == "tower":
        raise ConfigError(src.path, None, "model", "a saved retrieval tower cannot generate text; pass a causal LM")
    hf_dir = convert_gguf(src.path) if src.form == "gguf" else src.path
    with quiet_transformers():
        try:
            tok = AutoTokenizer.from_pretrained(hf_dir, local_files_only=True)
            lm = AutoModelForCausalLM.from_pretrained(hf_dir, local_files_only=True, dtype=torch.float32)
        except (OSError, ValueError) as e:
            raise ConfigError(hf_dir, None, "model", f"cannot load a causal language model: {e}") from None
    lm.eval()
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return lm, tok


def _user_message(doc: Document, max_doc_chars: int) -> str:
    content = doc.content
    if len(content) > max_doc_chars:
        content = content[:max_doc_chars].rsplit(" ", 1)[0] + " ..."
    return USER_PROMPT.format(title=doc.title or "(none)", content=content)


def build_prompt(doc: Document, tokenizer, max_doc_chars: int = 600) -> str:
    """The generation prompt (system message, one worked example, the document) through the
    tokenizer's chat template; plain text when the tokenizer has none."""
    if getattr(tokenizer, "chat_template", None):
        msgs = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": _user_message(EXAMPLE_DOC, max_doc_chars)},
            {"role": "assistant", "content": EXAMPLE_QUERY},
            {"role": "user", "content": _user_message(doc, max_doc_chars)},
        ]
        return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    return (
        f"{SYSTEM_PROMPT}\n\n{_user_message(EXAMPLE_DOC, max_doc_chars)}\nQuery: {EXAMPLE_QUERY}\n\n"
        f"{_user_message(doc, max_doc_chars)}\nQuery:"
    )


_PREFIX = re.compile(r"^.{0,40}?\b(?:search\s+)?query(?:\s+is)?\s*[:：]\s*", re.IGNORECASE)
_PREAMBLE = re.compile(r"^(here is|here's|sure|the (search )?query|search query|query)\b.*[:：]$", re.IGNORECASE)


def cut_repetition(text: str) -> str:
    """Cut a degenerate loop: keep the words before the first repeated word trigram
    (small models drift into "A B C A B C ..."; one cycle is kept)."""
    words = text.split()
    norm = [w.lower().strip(",.;:") for w in words]
    seen: set[tuple[str, ...]] = set()
    for i in range(len(words) - 2):
        tri = tuple(norm[i : i + 3])
        if tri in seen:
            return " ".join(words[:i]).rstrip(",;:")
        seen.add(tri)
    return text


def clean_generation(text: str) -> str:
    """First usable line: without a "...query:" prefix, preamble lines ("Here is a search
    query:"), list markers, quotes or a repetition loop."""
    for line in text.splitlines():
        line = line.strip()
        if not line or _PREAMBLE.match(line):
            continue
        line = _PREFIX.sub("", line)
        line = re.sub(r"^(?:[-*•]|\d+[.)])\s+", "", line)
        line = cut_repetition(line.strip().strip("\"'“”‘’`").strip())
        if line:
            return line[:300]
    return ""


def _read_generations(path: Path) -> dict[str, dict]:
    """Done records of an earlier (possibly interrupted) run; a torn last line is dropped."""
    done: dict[str, dict] = {}
    if not path.exists():
        return done
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    good: list[str] = []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            doc_id = rec["doc_id"]
            rec["query"]
        except (json.JSONDecodeError, KeyError, TypeError):
            if i == len(lines):  # interrupted while writing the last line
                break
            raise DataError(path, i, None, "malformed generation record (delete the file to start over)") from None
        if not line.endswith("\n"):
            break
        done[doc_id] = rec
        good.append(line)
    if len(good) != sum(1 for ln in lines if ln.strip()):
        with atomic_write(path) as fh:
            fh.writelines(good)
    return done


def _batches(items: list, size: int) -> Iterator[list]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def generate_queries(
    docs: list[Document], lm, tokenizer, cfg: LLMQueryConfig, log_path: Path, progress: bool = True
) -> dict[str, dict]:
    """Generate one query per document, appending to ``log_path`` after each batch and
    skipping documents already in it. Returns ``{doc_id: record}`` for all ``docs``."""
    import torch

    done = _read_generations(log_path)
    todo = [d for d in docs if d.id not in done]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(docs), initial=len(docs) - len(todo), desc="LLM queries", unit="doc")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    gen_kw: dict[str, Any] = dict(
        max_new_tokens=cfg.max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        no_repeat_ngram_size=cfg.no_repeat_ngram_size,
    )
    if cfg.do_sample:
        gen_kw.update(do_sample=True, temperature=cfg.temperature, top_p=cfg.top_p)
    else:
        gen_kw.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    with open(log_path, "a", encoding="utf-8") as fh:
        for batch in _batches(todo, cfg.batch_size):
            prompts = [build_prompt(d, tokenizer, cfg.max_doc_chars) for d in batch]
            enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
            # one seed per batch, derived from its first document: a resumed run samples the same way
            torch.manual_seed(zlib.crc32(f"{cfg.seed}\x1f{batch[0].id}".encode()))
            with torch.inference_mode():
                out = lm.generate(**enc, **gen_kw)
            new = out[:, enc["input_ids"].shape[1] :]
            texts = tokenizer.batch_decode(new, skip_special_tokens=True)
            for d, raw in zip(batch, texts, strict=True):
                q = clean_generation(raw)
                if q.lower() == EXAMPLE_QUERY:  # parroted the demonstration: not a query for this doc
                    q = ""
                rec = {"doc_id": d.id, "query": q, "raw": raw}
                done[d.id] = rec
                fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
            if bar is not None:
                bar.update(len(batch))
    if bar is not None:
        bar.close()
    return {d.id: done[d.id] for d in docs}


def _generation_settings(cfg: LLMQueryConfig) -> dict[str, Any]:
    """Settings that change what is generated: a resumed run must use the same ones."""
    return {
        "model": str(cfg.model),
        "seed": cfg.seed,
        "max_new_tokens": cfg.max_new_tokens,
        "do_sample": cfg.do_sample,
        "temperature": cfg.temperature if cfg.do_sample else None,
        "top_p": cfg.top_p if cfg.do_sample else None,
        "no_repeat_ngram_size": cfg.no_repeat_ngram_size,
        "max_doc_chars": cfg.max_doc_chars,
        "prompt": zlib.crc32((SYSTEM_PROMPT + USER_PROMPT + EXAMPLE_DOC.content + EXAMPLE_QUERY).encode()),
    }


def _check_resume(out: Path, cfg: LLMQueryConfig) -> dict[str, Any]:
    """Refuse to append to generations made with other settings; returns the settings."""
    path = out / "generation_settings.json"
    settings = _generation_settings(cfg)
    if path.exists():
        old = json.loads(path.read_text(encoding="utf-8"))
        diff = sorted(k for k in set(old) | set(settings) if old.get(k) != settings.get(k))
        if diff and (out / "generations.jsonl").exists():
            raise ConfigError(
                path,
                None,
                diff[0],
                f"{out} holds generations made with different settings ({', '.join(diff)}); "
                "use another --out directory or delete it to start over",
            )
    return settings


def llm_queries(
    corpus_path: str | Path,
    out: str | Path,
    cfg: LLMQueryConfig | None = None,
    progress: bool = True,
    model_and_tokenizer: tuple[Any, Any] | None = None,
) -> list[PseudoQuery]:
    """LLM query generation over a BEIR corpus (resumable); writes the outputs listed in the
    module docstring plus ``generations.jsonl`` (the raw, resumable log)."""
    import torch

    cfg = cfg or LLMQueryConfig()
    out = Path(out)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    docs = select_documents(corpus_path, cfg.max_docs, cfg.seed)
    settings = _check_resume(out, cfg)
    lm, tok = model_and_tokenizer or load_causal_lm(cfg.model)
    write_json(out / "generation_settings.json", settings)
    recs = generate_queries(docs, lm, tok, cfg, out / "generations.jsonl", progress=progress)
    pairs = [PseudoQuery(Query(f"llm-{d.id}", recs[d.id]["query"]), d.id) for d in docs if recs[d.id]["query"]]
    stats = {
        "method": "llm",
        "model": str(cfg.model),
        "corpus": str(corpus_path),
        "documents": len(docs),
        "queries": len(pairs),
        "empty_generations": len(docs) - len(pairs),
        "mean_query_words": round(sum(len(p.query.text.split()) for p in pairs) / max(1, len(pairs)), 2),
    }
    write_pseudo_outputs(out, pairs, "llm", {"corpus": str(corpus_path), **cfg.__dict__}, stats)
    return pairs
