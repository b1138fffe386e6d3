"""Query and document towers (ScalingNote §3.2 Eq. 1-4, §3.3 Eq. 13-14).

Split along its seams (as Tevatron splits ``EncoderModel`` / ``DenseModel``):
:mod:`~scalingnote.models.towers.config` (``TowerConfig``, defaults),
:mod:`~scalingnote.models.towers.identity` (digests),
:mod:`~scalingnote.models.towers.pooling` (the pooling table, ``register_pooling``),
:mod:`~scalingnote.models.towers.base` (``Tower``),
:mod:`~scalingnote.models.towers.classes` (``QueryTower``, ``DocumentTower``, ``pair_towers``,
``check_compatible``) and
:mod:`~scalingnote.models.towers.io` (build / save / load). Everything is importable from
``scalingnote.models.towers`` as before.

Two tower classes share one base (:class:`Tower`):

* :class:`QueryTower` — ``tokenize_queries(texts) -> BatchEncoding`` and
  ``tower(batch) -> Tensor[B, out_dim]``.
  LLM: query text + EOS, pooled at the last non-padding position (§3.2, Eq. 2, 4).
  BERT: ``[CLS]`` first, pooled at ``[CLS]`` (§3.3, Eq. 13-14) or mean pooling.
* :class:`DocumentTower` — ``tokenize_documents(docs) -> BatchEncoding`` and
  ``tower(batch) -> {"title": T, "content": T, "emb": T}`` (each ``[B, out_dim]``).
  LLM: the §3.2 prompt; each view is the hidden state just before its placeholder (Eq. 1, 3).
  BERT (the TwinBERT baseline): ``Document.text`` pooled once; **all three views are the
  same tensor**, so the Stage I loss over views works unchanged.

Both end in an optional projection ``W`` (hidden -> ``dim``, no bias) whose prefixes
are the Matryoshka dims (Eq. 3-4: ``d = W h``, truncated to ``m``). ``dim=None`` means
no projection (identity, output = hidden size): the right choice for zero-shot use,
where a random projection would destroy quality. A trainable ``W`` is initialised as a
random orthogonal projection (rows orthonormal, from a seeded generator) scaled by
``sqrt(hidden/dim)``, which preserves norms in expectation (a Johnson-Lindenstrauss
style projection that is better conditioned than an i.i.d. Gaussian one).

Identity and compatibility
--------------------------
``fingerprint``: SHA-256 (32 hex) over the output-affecting config (everything except the
base model's path and the padding side), a tokenizer digest and all weights (as fp32).
It is computed once (before any cast to a lower precision) and stored in the saved
``tower.json``; :meth:`Tower.refresh_fingerprint` recomputes it after training
(:meth:`Tower.save` always does).

``compat_id``: the embedding space a tower's vectors live in. An index stores its
document tower's ``compat_id`` and refuses a query tower with a different one
(:func:`check_compatible`). The rule:

1. A tower built from a base model (zero-shot, untrained) gets the *space id*: a hash of
   its weights, tokenizer, kind, output dim and pooling family. A query and a document
   tower built from the same base with the same ``num_layers``/``dim``/``projection_seed``
   (and, for BERT, the same pooling) therefore share it: symmetric zero-shot towers are
   compatible, towers from different models are not.
2. Towers trained together are tied by :func:`pair_towers`: both get the document
   tower's (refreshed) fingerprint as their ``compat_id``.
3. A distilled student inherits its teacher's: ``student.compat_id = teacher.compat_id``.

An explicitly set ``compat_id`` is saved and reloaded as is; a derived one (rule 1) is
re-derived after :meth:`Tower.refresh_fingerprint`.
"""

from scalingnote.models.towers.base import Tower
from scalingnote.models.towers.classes import TOWER_CLASSES, DocumentTower, QueryTower, check_compatible, pair_towers
from scalingnote.models.towers.config import (
    DEFAULT_DIM,
    DEFAULT_MATRYOSHKA_DIMS,
    DEFAULT_MAX_DOC_LENGTH,
    DEFAULT_MAX_QUERY_LENGTH,
    FORMAT,
    FORMAT_VERSION,
    TowerConfig,
    matryoshka_dims_for,
)
from scalingnote.models.towers.identity import tokenizer_digest, weights_digest
from scalingnote.models.towers.io import build_tower, load_saved_tower, load_tower, load_tower_pair
from scalingnote.models.towers.pooling import (
    POOLING_MODES,
    ROLES,
    PoolingMode,
    orthogonal_projection,
    pooling_mode,
    register_pooling,
)

__all__ = [
    "DEFAULT_DIM",
    "DEFAULT_MATRYOSHKA_DIMS",
    "DEFAULT_MAX_DOC_LENGTH",
    "DEFAULT_MAX_QUERY_LENGTH",
    "FORMAT",
    "FORMAT_VERSION",
    "POOLING_MODES",
    "ROLES",
    "TOWER_CLASSES",
    "DocumentTower",
    "PoolingMode",
    "QueryTower",
    "Tower",
    "TowerConfig",
    "build_tower",
    "check_compatible",
    "load_saved_tower",
    "load_tower",
    "load_tower_pair",
    "matryoshka_dims_for",
    "orthogonal_projection",
    "pair_towers",
    "pooling_mode",
    "register_pooling",
    "tokenizer_digest",
    "weights_digest",
]
