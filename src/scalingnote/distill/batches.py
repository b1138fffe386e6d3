"""QKD's batches of an epoch: slices of a seeded permutation of the training queries or, with
``length_buckets``, length-bucketed batches drawn from the same permutation.

A forward pass pads its texts to the longest of them; a batch of texts of similar token length pads little,
so a step costs less. Bucketing (not in the paper) cuts the epoch's permutation into windows of
``length_buckets x batch_size`` texts, sorts each window by the student's token length (ties keep
the permutation's order), cuts it into batches and shuffles the order of all the epoch's batches.
The texts of an epoch are the same as without bucketing (the permutation's first
``steps_per_epoch x batch_size``), each in exactly one batch; only their grouping differs. Every
batch is a pure function of ``(seed, epoch, step)``: resume and the ranks' slices are unchanged.

Within a step, :func:`cheapest_chunks` (or :func:`length_chunks`, a fixed size) cuts the batch
(bucketed or not) into length-sorted chunks that run their forward and backward passes one after
another (``step_chunk``): the same texts and the same gradient, each chunk padded only to its own
longest text.
"""

from __future__ import annotations

import numpy as np

from scalingnote.errors import ScalingNoteError


def epoch_order(train_idx: np.ndarray, seed: int, epoch: int) -> np.ndarray:
    """The epoch's seeded permutation of the training rows (the unbucketed batches are its slices)."""
    return np.random.default_rng([seed, epoch]).permutation(train_idx)


def bucketed_batches(
    train_idx: np.ndarray,
    lengths: np.ndarray,
    batch_size: int,
    steps_per_epoch: int,
    seed: int,
    epoch: int,
    window: int,
) -> np.ndarray:
    """``[steps_per_epoch, batch_size]`` rows of the epoch's batches, length-bucketed within
    windows of ``window`` batches of :func:`epoch_order` (``lengths[row]`` = the row's token count)."""
    if window < 2:
        raise ScalingNoteError(f"length_buckets: a window of at least 2 batches is needed, got {window}")
    order = epoch_order(train_idx, seed, epoch)[: steps_per_epoch * batch_size]
    if len(order) < steps_per_epoch * batch_size:
        raise ScalingNoteError(
            f"distill: {len(train_idx)} training queries cannot fill {steps_per_epoch} batches of {batch_size}"
        )
    span = window * batch_size
    parts = []
    for start in range(0, len(order), span):
        w = order[start : start + span]
        parts.append(w[np.argsort(lengths[w], kind="stable")])
    batches = np.concatenate(parts).reshape(steps_per_epoch, batch_size)
    # the batches' order: a second stream of the same (seed, epoch), so long and short batches interleave
    shuffle = np.random.default_rng([seed, epoch, 1]).permutation(steps_per_epoch)
    return batches[shuffle]


def padded_tokens(batches: np.ndarray, lengths: np.ndarray) -> int:
    """Tokens a forward pass runs over ``batches`` (each padded to its longest text)."""
    return int(sum(len(b) * int(lengths[b].max()) for b in batches))


#: what one forward and backward pass costs beyond its padded tokens, in padded tokens: the price of
#: one more chunk in a step (a 2-layer MiniLM student, batch 128, 2 cores, fp32: ~25 ms a pass against
#: ~0.10 ms a padded token, a least-squares fit over SciFact's and the embedded default's QKD pools cut
#: into 1, 2, 4 and 8 chunks; the default's 13-token texts ran fastest in 2 chunks, SciFact's in 4)
CHUNK_OVERHEAD_TOKENS = 256
MAX_CHUNKS = 8


def cheapest_chunks(
    idx: np.ndarray, lengths: np.ndarray, overhead: float = CHUNK_OVERHEAD_TOKENS, max_chunks: int = MAX_CHUNKS
) -> list[np.ndarray]:
    """``idx`` cut into the number of length-sorted near-equal chunks (:func:`cheapest_count`:
    ``step_chunk`` null, auto) whose padded tokens plus ``overhead`` per chunk beyond the first are
    fewest; one chunk is ``[idx]`` as it came."""
    k = cheapest_count(sorted(lengths[idx].tolist()), overhead, max_chunks)
    if k == 1:
        return [idx]
    return list(np.array_split(idx[np.argsort(lengths[idx], kind="stable")], k))


def cheapest_count(
    ascending: list[float], overhead: float = CHUNK_OVERHEAD_TOKENS, max_chunks: int = MAX_CHUNKS
) -> int:
    """The count of chunks (1, 2, 4, ... ``max_chunks``, at most one text each) of a batch whose
    ascending token lengths are ``ascending`` that costs least by :func:`chunk_cost` (ties: fewer).
    The trainer's auto rule and the quick start's cost model both choose with it."""
    counts, k = [1], 2
    while k <= min(max_chunks, len(ascending)):
        counts.append(k)
        k *= 2
    return min(counts, key=lambda c: (chunk_cost(ascending, c, overhead), c))


def chunk_cost(ascending: list[float], k: int, overhead: float = CHUNK_OVERHEAD_TOKENS) -> float:
    """What ``k`` length-sorted chunks of a batch cost per text, in padded tokens: their padding
    (:func:`chunk_padded`) plus ``overhead`` for each pass beyond the first, shared over the batch."""
    if not ascending:
        return 0.0
    return chunk_padded(ascending, k) + overhead * (k - 1) / len(ascending)


def chunk_padded(sorted_lengths: list[float], k: int) -> float:
    """Padded tokens per text of ``k`` near-equal chunks of ascending ``sorted_lengths``, each padded
    to its longest (the cut of ``np.array_split``)."""
    n = len(sorted_lengths)
    if n == 0:
        return 0.0
    sizes = [n // k + (1 if i < n % k else 0) for i in range(k)]
    total, start = 0.0, 0
    for size in sizes:
        if size:
            total += size * sorted_lengths[start + size - 1]
            start += size
    return total / n


def length_chunks(idx: np.ndarray, lengths: np.ndarray, chunk: int) -> list[np.ndarray]:
    """``idx`` sorted by ``lengths`` (stable) and cut into ``ceil(len / chunk)`` near-equal parts:
    the forward passes of one QKD step (``step_chunk``), each padded to its own longest text.
    ``chunk`` 0 or at least ``len(idx)``: ``[idx]``."""
    if chunk <= 0 or len(idx) <= chunk:
        return [idx]
    order = idx[np.argsort(lengths[idx], kind="stable")]
    return [p for p in np.array_split(order, -(-len(idx) // chunk)) if len(p)]


__all__ = [
    "CHUNK_OVERHEAD_TOKENS",
    "MAX_CHUNKS",
    "bucketed_batches",
    "cheapest_chunks",
    "cheapest_count",
    "chunk_cost",
    "chunk_padded",
    "epoch_order",
    "length_chunks",
    "padded_tokens",
]
