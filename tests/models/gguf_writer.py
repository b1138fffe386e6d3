"""Write a tiny Llama HF checkpoint as an F32 GGUF file (test helper, mirrors llama.cpp's converter)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    # llama.cpp convert_hf_to_gguf.py LlamaModel.permute: HF rotary layout -> GGUF layout
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_llama_gguf(hf_dir: Path, out: Path) -> Path:
    """Convert the tiny Llama directory written by ``build_tiny_model`` into ``out`` (.gguf, F32)."""
    import gguf
    from safetensors.numpy import load_file

    cfg = json.loads((hf_dir / "config.json").read_text())
    tok = json.loads((hf_dir / "tokenizer.json").read_text())
    sd = load_file(str(hf_dir / "model.safetensors"))
    sd = {k.removeprefix("model."): v for k, v in sd.items()}
    n_head, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]

    vocab = tok["model"]["vocab"]
    added = {t["content"]: t["id"] for t in tok.get("added_tokens", [])}
    by_id = {i: t for t, i in {**vocab, **added}.items()}
    tokens = [by_id[i] for i in range(len(by_id))]
    types = [3 if t in added else 1 for t in tokens]  # 3 = CONTROL, 1 = NORMAL
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]

    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name("tiny-llama")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg.get("rope_parameters", {}).get("rope_theta", cfg.get("rope_theta", 10000.0)))
    w.add_rope_dimension_count(cfg["hidden_size"] // n_head)
    w.add_vocab_size(len(tokens))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(cfg["eos_token_id"])
    w.add_pad_token_id(cfg["pad_token_id"])
    w.add_add_bos_token(False)

    f32 = lambda a: np.ascontiguousarray(a, dtype=np.float32)  # noqa: E731
    w.add_tensor("token_embd.weight", f32(sd["embed_tokens.weight"]))
    w.add_tensor("output_norm.weight", f32(sd["norm.weight"]))
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        w.add_tensor(f"blk.{i}.attn_norm.weight", f32(sd[p + "input_layernorm.weight"]))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", f32(sd[p + "post_attention_layernorm.weight"]))
        w.add_tensor(f"blk.{i}.attn_q.weight", f32(_permute(sd[p + "self_attn.q_proj.weight"], n_head)))
        w.add_tensor(f"blk.{i}.attn_k.weight", f32(_permute(sd[p + "self_attn.k_proj.weight"], n_kv)))
        w.add_tensor(f"blk.{i}.attn_v.weight", f32(sd[p + "self_attn.v_proj.weight"]))
        w.add_tensor(f"blk.{i}.attn_output.weight", f32(sd[p + "self_attn.o_proj.weight"]))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", f32(sd[p + "mlp.gate_proj.weight"]))
        w.add_tensor(f"blk.{i}.ffn_up.weight", f32(sd[p + "mlp.up_proj.weight"]))
        w.add_tensor(f"blk.{i}.ffn_down.weight", f32(sd[p + "mlp.down_proj.weight"]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
