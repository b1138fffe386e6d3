"""TMJ training: dense warm-up, stage 1 (multi-task loss), stage 2 (PQ-oriented negatives), export.

Pipeline (TMJ §3.2, §5.1.3), each phase optional and resumable:

1. **warm-up** — the "well-trained" dual encoder TMJ starts from: the towers fine-tuned with
   ``L_r`` (Eq. 5) on the train split, hard negatives from the starting model's dense top-k.
2. **PQ init** — FAISS PQ or OPQ+PQ trained on the warm-up model's document embeddings.
3. **stage 1** — towers and centroids trained jointly with ``L1 = L_m + L_r̂ + L_r`` (Eq. 9),
   or the conventional ``L0 = L_m + L_r̂`` (Eq. 8) for comparison; separate AdamW learning
   rates for encoders and centroids; negatives from the PQ top-k of the warm-up model with the
   initial codebooks (§3.2).
4. **stage 2** — the document tower frozen (embeddings computed once); query tower and
   centroids trained with ``L_r̂`` (Eq. 6); negatives ``S_u ∩ S_c`` (top-200 of the flat and of
   the PQ index) minus positives (§3.4), re-mined every ``mine_every`` steps.
5. **export** — towers (paired), codebooks (``learned_pq.npz``) and FAISS indexes (IndexPQ,
   IVFPQ, HNSW-PQ) with codes recomputed from the learned codebooks.

Every step's batch (queries, positive, sampled negatives) is a pure function of
``(seed, phase, step)``, so a resumed run continues exactly. Checkpoints hold the trainable
weights, optimizer, scheduler, step and the current mined negatives; a finished phase leaves
``<phase>/final.pt`` and is skipped on resume.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from scalingnote.config import load_config, save_config
from scalingnote.data import Qrels
from scalingnote.errors import ScalingNoteError
from scalingnote.evaluation import evaluate
from scalingnote.evaluation.dense import exact_search
from scalingnote.pq.config import PhaseOptim, PQTrainConfig, Stage1Spec, Stage2Spec, WarmupSpec
from scalingnote.pq.data import PQData, build_towers, load_pq_data
from scalingnote.pq.encoders import Side, load_doc_features, load_query_features
from scalingnote.pq.export import EVAL_METRICS, export_trained
from scalingnote.pq.losses import dense_retrieval_loss, pq_retrieval_loss, stage1_loss
from scalingnote.pq.mining import negative_stats, pq_oriented_negatives, sample_negatives, search, top_negatives
from scalingnote.pq.module import LearnedPQ, pq_from_state, pq_state
from scalingnote.pq.phase import PhaseLoop
from scalingnote.training.checkpoint import safe_torch_load
from scalingnote.training.loop import param_groups
from scalingnote.utils import run_metadata, seed_everything, write_json
from scalingnote.utils.io import atomic_path

log = logging.getLogger(__name__)

PHASE_IDS = {"warmup": 0, "stage1": 1, "stage2": 2}


# ----------------------------------------------------------------------------- trainer
class TMJTrainer:
    """Holds the two towers (as :class:`~scalingnote.pq.encoders.Side`), the learned PQ and
    the data; each phase method trains in place and returns evaluation metrics."""

    def __init__(
        self,
        cfg: PQTrainConfig,
        *,
        data: PQData | None = None,
        towers: tuple[Any, Any] | None = None,
        doc_features: np.ndarray | None = None,
        query_features: np.ndarray | None = None,
    ):
        self.cfg = cfg
        self.out = Path(cfg.output_dir)
        self.progress = cfg.show_progress
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
            try:
                import faiss

                faiss.omp_set_num_threads(cfg.threads)
            except ImportError:  # pragma: no cover - faiss is a dependency
                pass
        self.data = data if data is not None else load_pq_data(cfg.data, cfg.seed)
        q, d = towers if towers is not None else build_towers(cfg.towers, cfg.seed)
        self.q_tower, self.d_tower = q, d
        self.train_q_backbone = cfg.towers.train_query_backbone
        self.train_d_backbone = cfg.towers.train_doc_backbone
        D = self.data
        self.q_texts = D.train_texts + D.val_texts + D.eval_texts
        self.n_train, self.n_val = len(D.train_texts), len(D.val_texts)
        cache = self.out / "cache"
        bs = cfg.towers.encode_batch_size
        if not self.train_q_backbone and query_features is None:
            query_features = load_query_features(
                q, self.q_texts, cache / "query_features.npy", batch_size=bs, show_progress=self.progress
            )
        if not self.train_d_backbone and doc_features is None:
            doc_features = load_doc_features(
                d,
                D.docs,
                cache / "doc_features",
                source_dir=cfg.towers.doc_features_dir,
                batch_size=bs,
                show_progress=self.progress,
            )
        self.q_side = Side(q, self.q_texts, None if self.train_q_backbone else query_features, bs)
        self.d_side = Side(d, D.docs, None if self.train_d_backbone else doc_features, bs)
        self.pq: LearnedPQ | None = None
        self._doc_emb: np.ndarray | None = None
        #: called as ``on_step(phase, step)`` after every optimizer step (and its checkpoint);
        #: raising KeyboardInterrupt there simulates an interruption (tests)
        self.on_step: Callable[[str, int], None] | None = None

    # ------------------------------------------------------------------ rows and embeddings
    def train_rows(self) -> np.ndarray:
        return np.arange(self.n_train)

    def _split(self, split: str) -> tuple[np.ndarray, list[str], Qrels]:
        D = self.data
        if split == "eval":
            return np.arange(self.n_train + self.n_val, len(self.q_texts)), D.eval_qids, D.eval_qrels
        if split == "val":
            return np.arange(self.n_train, self.n_train + self.n_val), D.val_qids, D.val_qrels
        raise ValueError(f"split must be 'eval' or 'val', got {split!r}")

    def doc_embeddings(self) -> np.ndarray:
        """Normalised document embeddings of the current document tower (cached until it trains)."""
        if self._doc_emb is None:
            self._doc_emb = self.d_side.encode()
        return self._doc_emb

    def query_embeddings(self, rows: np.ndarray) -> np.ndarray:
        return self.q_side.encode(rows)

    # ------------------------------------------------------------------ evaluation
    def runs(self, split: str = "eval", *, pq: bool = True) -> dict[str, Any]:
        """Top-``eval_k`` runs of the ``split`` queries: ``"dense"`` (exact inner product with the
        document embeddings) and, with a quantizer, ``"pq"`` (inner product with the
        reconstructions ``x̂`` — what an IndexPQ search returns)."""

        rows, qids, _ = self._split(split)
        if not len(rows):
            return {}
        q = self.query_embeddings(rows)
        X = self.doc_embeddings()
        ids = self.data.doc_ids
        out: dict[str, Any] = {"dense": exact_search(q, qids, X, ids, k=self.cfg.eval_k)}
        if pq and self.pq is not None:
            out["pq"] = exact_search(q, qids, self.pq.quantized(X), ids, k=self.cfg.eval_k)
        return out

    def evaluate(self, split: str = "eval", *, pq: bool = True) -> dict[str, float]:
        """Dense retrieval and PQ retrieval metrics (``dense_*``, ``pq_*``, see :meth:`runs`) and
        the mean squared reconstruction error ``pq_mse`` of the documents."""

        _, _, qrels = self._split(split)
        out: dict[str, float] = {}
        for name, run in self.runs(split, pq=pq).items():
            out.update({f"{name}_{m}": v for m, v in evaluate(run, qrels, list(EVAL_METRICS)).items()})
        if pq and self.pq is not None and out:
            X = self.doc_embeddings()
            out["pq_mse"] = float(((X - self.pq.quantized(X)) ** 2).sum(1).mean())
        return {k2: round(float(v), 6) for k2, v in out.items()}

    def evaluate_all(self) -> dict[str, float]:
        out = self.evaluate("eval")
        if self.n_val:
            out.update({f"val_{k}": v for k, v in self.evaluate("val").items()})
        return out

    # ------------------------------------------------------------------ state
    def _saved_keys(self, tower, train_backbone: bool) -> list[str]:
        return [k for k in tower.state_dict() if train_backbone or k.startswith("projection.")]

    def snapshot(self) -> dict[str, Any]:
        """Trainable weights of both towers and the codebooks (detached copies)."""
        qsd, dsd = self.q_tower.state_dict(), self.d_tower.state_dict()
        return {
            "query": {k: qsd[k].detach().clone() for k in self._saved_keys(self.q_tower, self.train_q_backbone)},
            "doc": {k: dsd[k].detach().clone() for k in self._saved_keys(self.d_tower, self.train_d_backbone)},
            "pq": None if self.pq is None else pq_state(self.pq),
        }

    def restore(self, snap: dict[str, Any]) -> None:
        for tower, key in ((self.q_tower, "query"), (self.d_tower, "doc")):
            missing, unexpected = tower.load_state_dict(snap[key], strict=False)
            if unexpected:
                raise ScalingNoteError(f"snapshot: unexpected {key} tower weights {unexpected[:3]}")
        st = snap.get("pq")
        if st is None:
            self.pq = None
        elif (
            self.pq is not None
            and tuple(st["shape"]) == (self.pq.dim, self.pq.m, self.pq.nbits)
            and (st["rotation"] is None) == (self.pq.rotation is None)
        ):
            with torch.no_grad():  # in place: optimizers and closures hold these parameters
                self.pq.codebooks.copy_(st["codebooks"])
                if st["rotation"] is not None:
                    assert self.pq.rotation is not None  # present in both (checked above)
                    self.pq.rotation.copy_(st["rotation"])
        else:
            self.pq = pq_from_state(st).to(self.q_tower.device)
        self._doc_emb = None

    # ------------------------------------------------------------------ batches
    def _batch(self, phase: str, spec: PhaseOptim, step: int, negatives: list[np.ndarray]):
        n = self.n_train
        bs = min(spec.batch_size, n)
        per_epoch = max(1, n // bs)
        epoch, i = divmod(step, per_epoch)
        pid = PHASE_IDS[phase]
        perm = np.random.default_rng([self.cfg.seed, pid, epoch]).permutation(n)
        qrows = perm[i * bs : (i + 1) * bs]
        rng = np.random.default_rng([self.cfg.seed, pid, 7919, step])
        pos_sets = self.data.train_pos
        pos = np.array([rng.choice(sorted(pos_sets[r])) for r in qrows], dtype=np.int64)
        n_docs = len(self.data.docs)
        negs = [sample_negatives(rng, negatives[r], spec.num_negatives, n_docs, pos_sets[r]) for r in qrows]
        cand = np.unique(np.concatenate([pos, *negs])) if negs else np.unique(pos)
        targets = np.searchsorted(cand, pos)
        mask = np.array([[int(c) in pos_sets[r] for c in cand] for r in qrows], dtype=bool)
        return qrows, cand, torch.from_numpy(targets), torch.from_numpy(mask)

    # ------------------------------------------------------------------ generic phase loop
    def _run_phase(
        self,
        phase: str,
        spec: PhaseOptim,
        groups: list[dict],
        loss_fn: Callable[[np.ndarray, np.ndarray, Tensor, Tensor], tuple[Tensor, dict[str, float]]],
        negatives: list[np.ndarray],
        remine: Callable[[], list[np.ndarray]] | None = None,
        remine_every: int = 0,
        sides: tuple[Side, ...] = (),
    ) -> dict[str, Any]:
        pdir = self.out / phase
        final = pdir / "final.pt"
        if final.exists():
            st = safe_torch_load(final)  # weights_only=True + allow-list: never runs pickled code
            self.restore(st["snapshot"])
            log.info("%s: already finished (%s), loaded", phase, final)
            return dict(st.get("info", {}), resumed_finished=True)
        groups = [g for g in groups if g["params"]]
        if not groups:
            raise ScalingNoteError(f"{phase}: nothing to train (frozen towers without a projection and no codebooks)")
        loop = PhaseLoop(self, phase, spec, groups, loss_fn, negatives, remine, remine_every, sides)
        last = loop.run(resume=True)
        self._doc_emb = None
        info = {f"final_{k}": round(v, 6) for k, v in last.items() if k not in ("train_seconds", "steps_run")}
        info.update(
            {
                "steps": loop.total_steps,
                "train_seconds": round(last["train_seconds"], 2),
                **negative_stats(loop.negatives),
            }
        )

        pdir.mkdir(parents=True, exist_ok=True)
        with atomic_path(final, suffix=".pt") as tmp:
            torch.save({"snapshot": self.snapshot(), "info": info}, tmp)
        return info

    def _log(self, rec: dict) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        with open(self.out / "metrics.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(rec) + "\n")

    def _tower_groups(self, towers: list[Any], spec: PhaseOptim) -> list[dict]:
        return param_groups(towers, spec.encoder_lr, spec.head_lr, spec.weight_decay) if towers else []

    def _pq_group(self, spec: PhaseOptim) -> list[dict]:
        return (
            [{"params": [self.pq.codebooks], "lr": spec.centroid_lr, "weight_decay": 0.0}]
            if self.pq is not None
            else []
        )

    def _train_queries(self) -> np.ndarray:
        return self.query_embeddings(self.train_rows())

    def _pq_phase_spec(self, phase: str, spec: Any) -> Any:
        """``spec`` (default: the config's) of a phase that trains the centroids; None when it has
        no steps; an error when the product quantizer was not initialised."""
        spec = spec or getattr(self.cfg, phase)
        if spec.steps <= 0:
            return None
        if self.pq is None:
            raise ScalingNoteError(f"{phase}: initialise the product quantizer first (init_pq)")
        return spec

    def _first_negatives(
        self, phase: str, docs: Callable[[], np.ndarray], depth: int, skip: int = 0
    ) -> list[np.ndarray]:
        """Hard negatives mined once, before ``phase``, from the current model's ranking of the
        training queries against ``docs()`` (ranks ``skip`` to ``skip + depth``, positives removed);
        none when the phase already finished (resume loads its weights instead)."""
        if (self.out / phase / "final.pt").exists():
            return []
        with torch.no_grad():
            ranking = search(self._train_queries(), docs(), skip + depth)
        return top_negatives(ranking[:, skip:], self.data.train_pos)

    # ------------------------------------------------------------------ phases
    def warmup(self, spec: WarmupSpec | None = None) -> dict[str, Any]:
        """Dense warm-up with ``L_r`` (Eq. 5); negatives from the starting model's dense ranking."""
        spec = spec or self.cfg.warmup
        if spec.steps <= 0:
            return {}
        tau = self.cfg.tau
        negatives = self._first_negatives("warmup", self.doc_embeddings, spec.neg_depth, skip=spec.neg_skip)

        def loss_fn(qrows, cand, targets, mask):
            q = F.normalize(self.q_side.embed(qrows), dim=-1)
            d = F.normalize(self.d_side.embed(cand), dim=-1)
            loss = dense_retrieval_loss(q, d, targets, tau, mask)
            return loss, {"loss": float(loss.detach()), "loss_r": float(loss.detach())}

        self._set_trainable(self.q_tower, self.train_q_backbone)
        self._set_trainable(self.d_tower, self.train_d_backbone)
        groups = self._tower_groups([self.q_tower, self.d_tower], spec)
        return self._run_phase("warmup", spec, groups, loss_fn, negatives, sides=(self.q_side, self.d_side))

    def init_pq(self, init: str | None = None, m: int | None = None, path: Path | None = None) -> LearnedPQ:
        """FAISS PQ (``init="pq"``) or OPQ+PQ (``"opq"``) fitted on the current document
        embeddings; saved to / reloaded from ``path`` (default ``<output_dir>/pq_init.npz``)."""
        spec = self.cfg.pq
        init = init or spec.init
        m = m or spec.m
        path = path or self.out / "pq_init.npz"
        if path.exists():
            pq = LearnedPQ.load(path)
            if (pq.m, pq.nbits, pq.rotation is not None) != (m, spec.nbits, init == "opq"):
                raise ScalingNoteError(
                    f"{path}: saved quantizer {pq.describe()} does not match pq config (m={m}, "
                    f"nbits={spec.nbits}, init={init}); use a new output_dir"
                )
        else:
            pq = LearnedPQ.fit(
                self.doc_embeddings(),
                m,
                spec.nbits,
                opq=init == "opq",
                seed=self.cfg.seed,
                niter=spec.niter,
                opq_niter=spec.opq_niter,
                train_size=spec.train_size,
            )
            pq.save(path)
        self.pq = pq.to(self.q_tower.device)
        return self.pq

    def stage1(self, spec: Stage1Spec | None = None) -> dict[str, Any]:
        """Stage 1: ``L1`` (Eq. 9) or ``L0`` (Eq. 8) on towers + centroids."""
        spec = self._pq_phase_spec("stage1", spec)
        if spec is None:
            return {}
        tau = self.cfg.tau
        pq = self.pq
        assert pq is not None  # _pq_phase_spec refuses a phase without a quantizer
        negatives = self._first_negatives("stage1", lambda: pq.quantized(self.doc_embeddings()), spec.neg_depth)
        weights = {"m": spec.w_m, "rhat": spec.w_rhat, "r": spec.w_r}

        def loss_fn(qrows, cand, targets, mask):
            q = F.normalize(self.q_side.embed(qrows), dim=-1)
            d = F.normalize(self.d_side.embed(cand), dim=-1)
            d_hat = pq.reconstruct(pq.assign(d))
            return stage1_loss(
                q,
                d,
                d_hat,
                targets,
                tau=tau,
                kind=spec.loss,
                mask=mask,
                weights=weights,
                centroid_grad=spec.centroid_grad,
            )

        self._set_trainable(self.q_tower, self.train_q_backbone)
        self._set_trainable(self.d_tower, self.train_d_backbone)
        groups = self._tower_groups([self.q_tower, self.d_tower], spec) + self._pq_group(spec)
        info = self._run_phase("stage1", spec, groups, loss_fn, negatives, sides=(self.q_side, self.d_side))
        info["loss"] = spec.loss
        return info

    def stage2(self, spec: Stage2Spec | None = None) -> dict[str, Any]:
        """Stage 2: document tower frozen; query tower + centroids with ``L_r̂`` (Eq. 6) and
        PQ-oriented negatives (§3.4), re-mined every ``mine_every`` steps."""
        spec = self._pq_phase_spec("stage2", spec)
        if spec is None:
            return {}
        tau = self.cfg.tau
        X = self.doc_embeddings()  # frozen document embeddings, computed once
        Xt = torch.from_numpy(X).to(self.q_tower.device)
        pq = self.pq
        assert pq is not None  # _pq_phase_spec refuses a phase without a quantizer

        def remine() -> list[np.ndarray]:
            with torch.no_grad():
                qtr = self._train_queries()
                flat = search(qtr, X, spec.mine_depth)
                pqr = search(qtr, pq.quantized(X), spec.mine_depth)
            negs = pq_oriented_negatives(pqr, flat, self.data.train_pos, spec.mine_depth, spec.negatives)
            self._log(
                {"phase": "stage2", "event": "mined", **{k: round(v, 3) for k, v in negative_stats(negs).items()}}
            )
            return negs

        def loss_fn(qrows, cand, targets, mask):
            q = F.normalize(self.q_side.embed(qrows), dim=-1)
            d = Xt[torch.from_numpy(cand)]
            d_hat = pq.reconstruct(pq.assign(d))
            loss = pq_retrieval_loss(q, d_hat, targets, tau, mask)
            return loss, {"loss": float(loss.detach()), "loss_rhat": float(loss.detach())}

        self._set_trainable(self.q_tower, self.train_q_backbone)
        self.d_tower.requires_grad_(False)
        try:
            groups = self._tower_groups([self.q_tower], spec) + self._pq_group(spec)
            info = self._run_phase(
                "stage2",
                spec,
                groups,
                loss_fn,
                [np.zeros(0, np.int64)] * self.n_train,
                remine=remine,
                remine_every=spec.mine_every,
                sides=(self.q_side,),
            )
        finally:
            self._set_trainable(self.d_tower, self.train_d_backbone)
        self._doc_emb = X  # the document tower did not change
        info["negatives_rule"] = spec.negatives
        return info

    @staticmethod
    def _set_trainable(tower, train_backbone: bool) -> None:
        tower.requires_grad_(False)
        if train_backbone:
            tower.requires_grad_(True)
        elif tower.projection is not None:
            tower.projection.requires_grad_(True)

    # ------------------------------------------------------------------ export
    def export(self, out_dir: Path | None = None) -> dict[str, Any]:
        """Save the paired towers, the codebooks and one FAISS index per ``export.indexes`` kind;
        with ``export.verify`` search each index (via :class:`~scalingnote.index.DenseIndex`)
        with the evaluation queries and record ``served_<kind>_*`` metrics
        (:func:`scalingnote.pq.export.export_trained`)."""
        return export_trained(self, out_dir)

    # ------------------------------------------------------------------ everything
    def run(self) -> dict[str, Any]:
        """All phases in order (each skipped when its steps are 0, resumed when interrupted),
        evaluation after each, export; writes ``config.yaml``, ``metrics.jsonl``, ``run.json``."""

        cfg = self.cfg
        self.out.mkdir(parents=True, exist_ok=True)
        save_config(cfg, self.out / "config.yaml")
        seed_everything(cfg.seed)
        t0 = time.perf_counter()
        res: dict[str, Any] = {
            "n_docs": len(self.data.docs),
            "n_train_queries": self.n_train,
            "n_val_queries": self.n_val,
            "n_eval_queries": len(self.data.eval_qids),
        }
        res["start"] = self.evaluate_all()
        if cfg.warmup.steps > 0:
            res["warmup"] = {**self.warmup(), **self.evaluate_all()}
        pq = self.init_pq()
        res["pq_init"] = {"init": cfg.pq.init, **pq.describe(), **self.evaluate_all()}
        if cfg.stage1.steps > 0:
            res["stage1"] = {**self.stage1(), **self.evaluate_all()}
        if cfg.stage2.steps > 0:
            res["stage2"] = {**self.stage2(), **self.evaluate_all()}
        res["export"] = self.export()
        res["total_seconds"] = round(time.perf_counter() - t0, 2)
        write_json(self.out / "run.json", {"metrics": res, **run_metadata(cfg)})
        return res


def load_pq_config(path: str | Path | None, **overrides: Any) -> PQTrainConfig:
    return load_config(PQTrainConfig, path, **overrides)


def train(cfg: PQTrainConfig) -> dict[str, Any]:
    """``scalingnote pq train``: build a :class:`TMJTrainer` from ``cfg`` and run every phase."""
    return TMJTrainer(cfg).run()


__all__ = ["PQData", "TMJTrainer", "build_towers", "load_pq_config", "load_pq_data", "train"]
