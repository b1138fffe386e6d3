"""Cached frozen-prefix features: train only the top ``k`` layers (``trainable_layers: k``).

On a 2-core CPU a full back-propagation step through an LLM tower costs seconds, so a short
run leaves every tower worse than its start. With ``trainable_layers = k`` the embeddings
and the bottom ``L - k`` transformer layers of a tower are frozen: their output for a text
never changes, so it is computed **once per distinct text** and cached on disk. A training
step then runs only the top ``k`` layers, the pooling and the head:

* ``k = 0``: the cache holds the *pooled* states (before the projection; one row per
  document view for the LLM prompt, §3.2), and a step is ``W (h - c)`` (Eq. 3-4 / Eq. 14).
* ``0 < k <= L``: the cache holds the hidden states entering layer ``L - k`` for every real
  token (float16 by default, memory-mapped; with an LLM document prompt, the positions before
  its 3 placeholders, §3.2, so the views pool the same tokens); a step runs layers
  ``L-k .. L-1`` (+ the final norm of a decoder) on them, for the query and the document tower
  alike; LoRA adapters on those layers are an option (:func:`add_top_lora`).
* ``k = None`` ("all"): no cache; the paper's full fine-tuning (the default on GPU).

A cache directory is keyed by everything that determines its content: tower kind and role,
depth ``L - k``, pooling (``k = 0``), maximum length, document prompt and field caps, a
digest of the tokenizer and of the frozen weights (embeddings + the bottom layers, + the final
norm for ``k = 0``). Rows are keyed by a hash of the text (a document: title, topic,
content). Shards are written under a temporary name and renamed (a reader never sees half a
shard); an interrupted fill keeps its finished shards and resumes; a directory whose key
differs from the tower's is refused. One pass of a deep tower fills the caches of several
``(depth N, k)`` pairs at once (:func:`fill_depths`; :func:`fill_pooled_depths` for ``k = 0``) —
the key of ``(N, k)`` equals the key of the same model truncated to ``N`` layers with ``k``
trainable. A fill logs its disk size before computing anything (:func:`estimate_cache_bytes`).
"""

from scalingnote.models.prefix.cache import (
    FORMAT,
    FORMAT_VERSION,
    FeatureCache,
    cache_key,
    item_key,
    key_digest,
    prefix_weights_digest,
)
from scalingnote.models.prefix.fill import (
    estimate_cache_bytes,
    fill_cache,
    fill_depths,
    fill_pooled_depths,
    fill_targets,
)
from scalingnote.models.prefix.lora import add_top_lora, has_lora, merge_lora
from scalingnote.models.prefix.surgery import check_trainable_layers, freeze_prefix, layer_list, sub_backbone
from scalingnote.models.prefix.tower import PrefixTower

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "key_digest",
    "layer_list",
    "prefix_weights_digest",
    "FeatureCache",
    "add_top_lora",
    "estimate_cache_bytes",
    "fill_depths",
    "fill_targets",
    "has_lora",
    "merge_lora",
    "PrefixTower",
    "cache_key",
    "check_trainable_layers",
    "fill_cache",
    "fill_pooled_depths",
    "freeze_prefix",
    "item_key",
    "sub_backbone",
]
