"""Tiny randomly initialised models with real tokenizers, built in code (for tests and dry runs).

``build_tiny_model(path, "llm")`` writes a Hugging Face directory (config, safetensors,
tokenizer) that every loader in :mod:`scalingnote.models` accepts like a real checkpoint:
a byte-level BPE tokenizer (with EOS and PAD) and a Llama- or Qwen2-style decoder, or a
lower-casing WordPiece tokenizer (with [CLS]/[SEP]/[PAD]/[UNK]/[MASK]) and a BERT encoder.
Nothing is downloaded; everything is deterministic given ``seed``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from scalingnote.models._fs import atomic_dir
from scalingnote.models.loading import quiet_transformers

#: Sentences the tiny tokenizers are trained on: the document prompt's words plus some text.
TINY_CORPUS: tuple[str, ...] = (
    "Document: {‘title’: a title}. Predict a query term: “x”.",
    "Document: {‘topic’: a topic, ‘content’: some content}. Predict a query term: “y”, "
    "combine the predicted query terms, and compress the above content into one word: “z”.",
    "The quick brown fox jumps over the lazy dog.",
    "Dense retrieval maps queries and documents into one vector space.",
    "A large language model encodes the documents; a small model encodes the queries.",
    "Scaling laws relate model size, data size and retrieval quality.",
    "Vitamin D deficiency is associated with an increased risk of fractures.",
    "Product quantization compresses embeddings into short codes for fast search.",
    "what is the capital of france? paris is the capital of france.",
    "0 1 2 3 4 5 6 7 8 9 10 100 2024 (a) [b] {c} <d> - _ + = / \\ | ; : ' \" ! ? , .",
)

LLM_EOS = "<|endoftext|>"
LLM_PAD = "<|pad|>"
BERT_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def tiny_tokenizer(kind: str = "llm", vocab_size: int = 512) -> Any:
    """A ``PreTrainedTokenizerFast`` trained on :data:`TINY_CORPUS`.

    ``"llm"``: byte-level BPE (any text encodes; no UNK), EOS ``<|endoftext|>``, PAD ``<|pad|>``,
    no BOS. ``"bert"``: lower-casing WordPiece, ``[CLS] text [SEP]`` post-processing.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if kind == "llm":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=[LLM_EOS, LLM_PAD],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(list(TINY_CORPUS), trainer)
        return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=LLM_EOS, pad_token=LLM_PAD)
    if kind == "bert":
        tok = Tokenizer(models.WordPiece(_tiny_wordpiece_vocab(vocab_size), unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
        )
        return PreTrainedTokenizerFast(
            tokenizer_object=tok,
            unk_token="[UNK]",
            cls_token="[CLS]",
            sep_token="[SEP]",
            pad_token="[PAD]",
            mask_token="[MASK]",
            model_max_length=512,
        )
    raise ValueError(f"kind must be 'llm' or 'bert', got {kind!r}")


def _tiny_wordpiece_vocab(vocab_size: int) -> dict[str, int]:
    """A WordPiece vocabulary built in a fixed order: the specials, every character of
    :data:`TINY_CORPUS` alone and as a ``##`` continuation, then its most frequent words.

    (``tokenizers``' ``WordPieceTrainer`` breaks ties between equally frequent merges in hash
    order, which differs between processes: its vocabulary, and so every tiny BERT, changed
    from run to run.)"""
    from collections import Counter

    from tokenizers import normalizers, pre_tokenizers

    norm, pre = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
    words = Counter(w for line in TINY_CORPUS for w, _ in pre.pre_tokenize_str(norm.normalize_str(line)))
    chars = sorted({c for w in words for c in w})
    tokens = [*BERT_SPECIALS, *chars, *(f"##{c}" for c in chars)]
    tokens += [w for w, _ in sorted(words.items(), key=lambda kv: (-kv[1], kv[0])) if len(w) > 1 and w not in tokens]
    return {t: i for i, t in enumerate(tokens[:vocab_size])}


def tiny_llm_config(
    arch: str = "llama",
    vocab_size: int = 512,
    hidden_size: int = 32,
    num_layers: int = 3,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 64,
    max_position_embeddings: int = 1024,
    eos_token_id: int = 0,
    pad_token_id: int = 1,
) -> Any:
    """A tiny ``LlamaConfig`` (``arch="llama"``) or ``Qwen2Config`` (``arch="qwen2"``)."""
    from transformers import LlamaConfig, Qwen2Config

    common: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    if arch == "llama":
        return LlamaConfig(**common)
    if arch == "qwen2":
        return Qwen2Config(**common)
    raise ValueError(f"arch must be 'llama' or 'qwen2', got {arch!r}")


def tiny_bert_config(
    vocab_size: int = 512,
    hidden_size: int = 32,
    num_layers: int = 3,
    num_heads: int = 4,
    intermediate_size: int = 64,
    max_position_embeddings: int = 512,
    pad_token_id: int = 0,
) -> Any:
    """A tiny ``BertConfig`` (dropout kept at the BERT defaults; towers run in eval mode)."""
    from transformers import BertConfig

    return BertConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        pad_token_id=pad_token_id,
    )


def build_tiny_model(
    path: str | os.PathLike,
    kind: str = "llm",
    *,
    arch: str = "llama",
    num_layers: int = 3,
    hidden_size: int = 32,
    seed: int = 0,
    causal_lm: bool = True,
) -> Path:
    """Write a tiny random model + tokenizer as a Hugging Face directory and return its path.

    LLMs are saved with their LM head class (``*ForCausalLM``, tied embeddings) like real
    checkpoints; ``causal_lm=False`` saves the bare model. BERT is saved as ``BertModel``.
    """
    from transformers import AutoModel, AutoModelForCausalLM

    tok = tiny_tokenizer(kind)
    vocab = len(tok)
    if kind == "llm":
        cfg = tiny_llm_config(
            arch,
            vocab_size=vocab,
            hidden_size=hidden_size,
            num_layers=num_layers,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
        cls = AutoModelForCausalLM if causal_lm else AutoModel
    elif kind == "bert":
        cfg = tiny_bert_config(
            vocab_size=vocab, hidden_size=hidden_size, num_layers=num_layers, pad_token_id=tok.pad_token_id
        )
        cls = AutoModel
    else:
        raise ValueError(f"kind must be 'llm' or 'bert', got {kind!r}")
    with torch.random.fork_rng(devices=[]):  # do not disturb the caller's RNG
        torch.manual_seed(seed)
        model = cls.from_config(cfg)
    model.eval()
    path = Path(path)
    with atomic_dir(path, replace=True) as tmp, quiet_transformers():
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
    return path
