"""Head initialisation for the towers' projections (``c`` and ``W`` of ``W (h - c)``).

- :func:`init_centers` — centre ``c`` = the mean pooled state; with ``pca``, ``W`` = the top
  principal directions (Matryoshka prefixes keep the most variance);
- :func:`init_heads` — the ``projection_init`` modes of a Stage I run (``pca``, ``orthogonal``,
  ``pairs``: the query head fitted by ridge least squares onto the document head's coordinates);
- :func:`load_heads` — heads of a finished run (``init_heads_from``: heads first, then layers);
- :func:`init_student_head` — the QKD student's linear-probe start for ScalingNote Eq. 14
  (``W`` = the ridge least-squares map from the student's states to the teacher's embeddings);
- :func:`pooled_states`, :func:`top_directions`, :func:`ridge_fit` — the pieces they share.

None of these starts is in the paper (it trains ``W`` from random); they let a short CPU run
start from the best linear map of the pre-trained states.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from scalingnote.errors import ConfigError, ScalingNoteError

log = logging.getLogger(__name__)


def pooled_states(tower, items, tok, batch_size: int):
    """Pooled hidden states (before the projection) of ``items``, tokenised by ``tok(tower, batch)``,
    in eval mode without grad; rows flattened (an LLM document gives one row per view), on CPU."""
    import torch

    was_training = tower.training
    tower.eval()
    parts = []
    with torch.no_grad():
        for i in range(0, len(items), batch_size):
            batch = tok(tower, items[i : i + batch_size])
            p = tower.pooled({k: v.to(tower.device) for k, v in batch.items()}).float()
            parts.append(p.reshape(-1, p.shape[-1]).cpu())
    tower.train(was_training)
    return torch.cat(parts)


def top_directions(x, k: int):
    """``[k, H]``: the top-``k`` principal directions of the (already centred) rows of ``x``, each
    with its sign fixed so that its largest-magnitude coordinate is positive (deterministic)."""
    import torch

    _, _, vh = torch.linalg.svd(x.double(), full_matrices=False)
    v = vh[:k]
    idx = v.abs().argmax(dim=1, keepdim=True)
    return (v * torch.sign(v.gather(1, idx))).float()


def _pooler(tower, prefix, tok, batch_size: int):
    """``items -> pooled states [n(*views), H]`` through the feature cache when there is one."""
    if prefix is None:
        return lambda items: pooled_states(tower, items, tok, batch_size)

    def pool(items):
        import torch

        with torch.no_grad():
            p = prefix.pooled(items).float()
        return p.reshape(-1, p.shape[-1]).cpu()

    return pool


def ridge_fit(x, y, ridge: float = 1e-3):
    """``W [out, in]`` minimising ``||x W^T - y||^2 + lam ||W||^2`` (lam relative to trace(x^T x)/in)."""
    import torch

    x, y = x.double(), y.double()
    gram = x.T @ x
    lam = ridge * float(torch.trace(gram)) / gram.shape[0]
    return torch.linalg.solve(gram + lam * torch.eye(gram.shape[0], dtype=gram.dtype), x.T @ y).T


def init_heads(
    qt, dt, examples, mode: str, *, n: int = 256, batch_size: int = 32, encoders=(None, None)
) -> dict[str, float]:
    """Centre both towers and initialise their projections (``mode``: see ``TrainConfig.projection_init``).

    "pairs" (not in the paper): the document head = the top principal directions of the centred
    document states; the query head = the ridge least-squares map from the centred query states to
    the coordinates of their positive documents in that head — so a query tower from another base
    model (ScalingDoc: MiniLM queries, SmolLM2 documents) starts aligned with the document tower.
    Returns fit diagnostics (the relative squared error of the query fit).
    """

    same_base = qt.config.base_model == dt.config.base_model and qt.config.hidden_size == dt.config.hidden_size
    if mode == "auto":
        mode = "pca" if same_base else "pairs"
    if mode in ("pca", "orthogonal"):
        pools = {
            "q": _pooler(qt, encoders[0], lambda t, xs: t.tokenize_queries(xs), batch_size),
            "d": _pooler(dt, encoders[1], lambda t, xs: t.tokenize_documents(xs), batch_size),
        }
        init_centers(qt, dt, examples, n=n, batch_size=batch_size, pca=mode == "pca", pools=pools)
        return {}
    if qt.projection is None or dt.projection is None:
        raise ScalingNoteError("projection_init='pairs' needs a projection on both towers")
    sample = examples[:n]
    hq = _pooler(qt, encoders[0], lambda t, xs: t.tokenize_queries(xs), batch_size)([e.query for e in sample])
    hd_all = _pooler(dt, encoders[1], lambda t, xs: t.tokenize_documents(xs), batch_size)([e.pos for e in sample])
    views = hd_all.shape[0] // len(sample)
    cq, cd = hq.mean(0), hd_all.mean(0)
    qt.set_center(cq)
    dt.set_center(cd)
    k = dt.projection.weight.shape[0]
    xd = hd_all - cd
    if xd.shape[0] < k or hq.shape[0] < 2:
        log.warning("projection_init='pairs' needs >= %d samples, got %d: keeping the random W", k, xd.shape[0])
        return {}
    wd = top_directions(xd, k) * (xd.shape[1] / k) ** 0.5
    target = (xd.reshape(len(sample), views, -1)[:, -1] @ wd.T).double()  # the [EMB] view's coordinates
    wq = ridge_fit(hq - cq, target)
    err = float(((target - (hq - cq).double() @ wq.T) ** 2).sum() / (target**2).sum().clamp(min=1e-12))
    for tower, w in ((dt, wd), (qt, wq)):
        tower.set_projection("pairs", w)
    return {"init_query_fit_rel_err": round(err, 4), "init_samples": len(sample)}


#: tower settings a loaded head must share with the tower it starts (the same pooled space)
_HEAD_SPACE = ("kind", "base_model", "hidden_size", "num_layers", "pooling", "dim")


def head_files(run_dir) -> dict[str, Path]:
    """``{"query": ..., "doc": ...}``: the head files of a Stage I run's saved towers."""
    return {side: Path(run_dir) / f"{side}_tower" / "projection.safetensors" for side in ("query", "doc")}


def load_heads(qt, dt, run_dir) -> dict[str, str]:
    """Start both towers' heads (centre ``c`` and ``W``) from a finished Stage I run's saved towers
    (``TrainConfig.init_heads_from``): the heads-first half of gradual unfreezing. The saved
    towers must pool the same base model at the same depth (:data:`_HEAD_SPACE`); anything else is
    refused naming the file and the field."""
    import json

    import torch
    from safetensors.torch import load_file

    for side, tower in (("query", qt), ("doc", dt)):
        f = head_files(run_dir)[side]
        meta = f.parent / "tower.json"
        if tower.projection is None:
            raise ConfigError(
                f, None, "init_heads_from", f"the {side} tower has no projection (dim) to load a head into"
            )
        if not f.is_file() or not meta.is_file():
            raise ConfigError(
                f,
                None,
                "init_heads_from",
                f"missing: {run_dir} is not a finished Stage I run with a saved {side} tower",
            )
        saved = json.loads(meta.read_text(encoding="utf-8")).get("config", {})
        for key in _HEAD_SPACE:
            mine = getattr(tower.config, key)
            if saved.get(key) != mine:
                raise ConfigError(
                    meta,
                    None,
                    f"config.{key}",
                    f"{saved.get(key)!r} != {mine!r} of the tower it would start (init_heads_from)",
                )
        t = load_file(str(f))
        with torch.no_grad():
            tower.projection.weight.copy_(t["weight"].to(tower.projection.weight.device, tower.projection.weight.dtype))
            tower.center.copy_(t["center"].to(tower.center.device, tower.center.dtype))
    log.info("heads loaded from %s", run_dir)
    return {"init_heads_from": str(run_dir)}


def init_centers(qt, dt, examples, n: int = 256, batch_size: int = 32, pca: bool = False, pools=None) -> None:
    """Set each tower's centre ``c`` to the mean pooled hidden state over (up to) ``n`` training
    queries / positive documents (all three document views pooled together).

    With ``pca``, also set ``W`` to the top principal directions of the centred states (largest
    first, so Matryoshka prefixes keep the most variance). When both towers have the same
    base model and hidden size, one PCA over both towers' states keeps their spaces aligned;
    otherwise each tower gets its own (there is nothing to align to).
    """
    import torch

    sample = examples[:n]
    towers = []
    pools = pools or {}
    for key, tower, items, tok in (
        ("q", qt, [e.query for e in sample], lambda t, xs: t.tokenize_queries(xs)),
        ("d", dt, [e.pos for e in sample], lambda t, xs: t.tokenize_documents(xs)),
    ):
        if tower.projection is None or not items:
            continue
        p = pools[key](items) if key in pools else pooled_states(tower, items, tok, batch_size)
        c = p.mean(0)
        tower.set_center(c)
        towers.append((tower, p - c))
    if not pca or not towers:
        return
    same_space = (
        len(towers) == 2
        and qt.config.base_model == dt.config.base_model
        and qt.config.hidden_size == dt.config.hidden_size
    )
    groups = [towers] if same_space else [[t] for t in towers]
    for group in groups:
        k = group[0][0].projection.weight.shape[0]
        x = torch.cat([p for _, p in group])
        if x.shape[0] < k:
            log.warning("projection_init='pca' needs >= %d pooled samples, got %d: keeping the random W", k, x.shape[0])
            continue
        # same scale as the random init (orthogonal_projection): norm-preserving in expectation
        w = top_directions(x, k) * (x.shape[1] / k) ** 0.5
        for tower, _ in group:
            tower.set_projection("pca", w)


def init_student_head(
    student, texts: list[str], targets: np.ndarray, batch_size: int = 128, ridge: float = 1e-3, prefix=None
) -> float:
    """Linear-probe start for Eq. 14: ``c`` = mean pooled student state, ``W`` = the ridge
    least-squares map from the centred states to the teacher embeddings ``targets [n, dim]``.

    Returns the relative squared error ``sum||t - W(h - c)||^2 / sum||t||^2`` of the fit. Not in the
    paper: a random W_stu leaves a short CPU run far from the teacher (Eq. 15 must also learn the
    teacher's magnitude), while this start is the best linear map of the pre-trained states.
    """
    import torch

    if student.projection is None:
        raise ScalingNoteError("the student has no projection to initialise")
    if prefix is not None:
        order = np.argsort([len(t) for t in texts], kind="stable")  # length-sorted batches: little padding
        with torch.no_grad():
            h = torch.cat(
                [
                    prefix.pooled([texts[j] for j in order[i : i + batch_size]]).float().cpu()
                    for i in range(0, len(texts), batch_size)
                ]
            ).double()
        h = h[torch.from_numpy(np.argsort(order))]  # back to the order of ``targets``
    else:
        h = pooled_states(student, texts, lambda t, xs: t.tokenize_queries(xs), batch_size).double()
    t = torch.as_tensor(np.asarray(targets), dtype=torch.float64)
    c = h.mean(0)
    x = h - c
    w = ridge_fit(x, t, ridge)  # [dim, hidden]
    student.set_projection("lstsq", w)
    student.set_center(c.float())
    return float(((t - x @ w.T) ** 2).sum() / (t**2).sum().clamp(min=1e-12))


__all__ = [
    "head_files",
    "init_centers",
    "init_heads",
    "init_student_head",
    "load_heads",
    "pooled_states",
    "ridge_fit",
    "top_directions",
]
