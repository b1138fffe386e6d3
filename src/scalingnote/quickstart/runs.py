"""The quick start's steps: data, Stage I runs of the large and small towers, the zero-shot start
of a family, pseudo-queries, QKD and the IVFPQ index. Each step writes a ``DONE`` marker holding
the digest of its inputs and settings; a re-run reuses a step only when they match, and redoes it
(saying what changed) when they do not."""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from scalingnote.config import load_config
from scalingnote.data import load_corpus
from scalingnote.data.build import load_build_config, run_build
from scalingnote.data.corpus import find_corpus_file, use_corpus_format
from scalingnote.data.pseudo import ICTConfig, corpus_texts, ict_queries
from scalingnote.data.synth import SynthConfig, synthesize
from scalingnote.distill import DistillConfig, distill
from scalingnote.models import PrefixTower, default_device, fill_pooled_depths, load_tower, pair_towers
from scalingnote.models.layers import is_bottom, start_candidates
from scalingnote.models.loading import resolve_source
from scalingnote.models.towers import matryoshka_dims_for
from scalingnote.quickstart.choose import default_unless_separated
from scalingnote.quickstart.config import Family, QuickstartConfig
from scalingnote.training import TrainConfig, train
from scalingnote.utils import write_json
from scalingnote.utils.steps import changed_keys, file_sha256, mark_step, step_state, with_defaults

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------- step markers
def _root(path: Path) -> Path | None:
    """The quick start's output directory above a step (the one holding ``quickstart.yaml``)."""
    for p in (path, *path.parents):
        if (p / "quickstart.yaml").exists():
            return p
    return None


def _canon(path: Path, inputs: dict[str, Any]) -> dict[str, Any]:
    """``inputs`` as plain JSON with the output directory written as ``$OUT``, so a run directory
    that is moved or copied whole still matches its steps."""
    text = json.dumps(inputs, sort_keys=True, default=str)
    root = _root(path)
    if root is not None:
        text = text.replace(json.dumps(str(root))[1:-1], "$OUT")
    return json.loads(text)


def step_done(path: Path, inputs: dict[str, Any]) -> bool:
    """True when ``path`` finished with these inputs (:mod:`scalingnote.utils.steps`); a step
    finished with other inputs is cleared (its directory removed) and redone, with a message
    naming what changed."""
    canon = _canon(path, inputs)
    state = step_state(path, canon)
    if state == "done":
        return True
    if state == "changed":
        changed = ", ".join(changed_keys(path, canon)) or "format"
        log.warning("%s was made from other inputs (%s changed): redoing it", path, changed)
        print(f"[quickstart] {path.name}: made from other inputs ({changed} changed): redoing it", flush=True)
        shutil.rmtree(path)
    return False


def mark_done(path: Path, inputs: dict[str, Any], info: dict | None = None) -> None:
    """Mark a step finished; a training step's checkpoints go (a finished step is reused, never
    resumed: they would be copies of weights its towers already hold), their record stays."""
    for ck in (path / "checkpoints").glob("step-*"):
        shutil.rmtree(ck, ignore_errors=True)
    mark_step(path, _canon(path, inputs), info)


def on_gpu() -> bool:
    """Whether this process trains on a GPU (what the ``auto`` settings resolve against): the
    device the towers load on (:func:`scalingnote.models.default_device`)."""
    return default_device().type == "cuda"


def banner(title: str) -> None:
    Console(stderr=True).rule(f"[bold]{title}")


# ---------------------------------------------------------------------------- data
def prepare_data(cfg: QuickstartConfig, out: Path) -> dict[str, Any]:
    """Returns {"beir": dir, "corpus": its corpus file, "triplets": path|None, "validation_triplets":
    path|None, "fingerprint": ...}. ``cfg.corpus_format`` is made readable by every stage first."""
    if cfg.data:
        fmt = use_corpus_format(cfg.corpus_format, cfg.data) if cfg.corpus_format else None
        data = {"beir": str(Path(cfg.data).resolve()), "triplets": None, "validation_triplets": None}
        data["corpus"] = str(find_corpus_file(data["beir"], fmt))
        return {**data, "fingerprint": data_fingerprint(data)}
    d = out / "data"
    inputs = {"synth_docs": cfg.synth_docs, "synth_queries": cfg.synth_queries, "seed": cfg.seed}
    if not step_done(d, inputs):
        banner("data: synthetic note-search log -> triplets (click/relevance, one-hop/multi-hop)")
        synthesize(
            d,
            SynthConfig(seed=cfg.seed, num_docs=cfg.synth_docs, num_queries=cfg.synth_queries),
            progress=cfg.show_progress,
        )
        run_build(load_build_config(d / "build.yaml"), progress=cfg.show_progress)
        mark_done(d, inputs)
    data = {
        "beir": str(d),
        "corpus": str(find_corpus_file(d)),
        "triplets": str(d / "triplets" / "train.jsonl"),
        "validation_triplets": str(d / "triplets" / "validation.jsonl"),
    }
    return {**data, "fingerprint": data_fingerprint(data)}


def corpus_file(data: dict[str, Any]) -> Path:
    """The corpus file of the run's data (``data["corpus"]``, else detected in ``data["beir"]``)."""
    return Path(data["corpus"]) if data.get("corpus") else find_corpus_file(data["beir"])


def data_fingerprint(data: dict[str, Any]) -> dict[str, Any]:
    """What identifies the training data of a step: the BEIR files' sizes and SHA-256 digests
    (content, not modification times: a copied or re-provisioned data set with the same bytes
    reuses every step). Computed once per run by :func:`prepare_data` (``data["fingerprint"]``)."""
    if "fingerprint" in data:
        return data["fingerprint"]
    beir = Path(data["beir"])
    files = {}
    for p in sorted(
        [corpus_file(data), beir / "queries.jsonl", *sorted((beir / "qrels").glob("*.tsv"))]
        + [Path(t) for t in (data.get("triplets"), data.get("validation_triplets")) if t]
    ):
        if p.exists():
            files[str(p)] = [p.stat().st_size, file_sha256(p)]
    return files


# ---------------------------------------------------------------------------- Stage I
def data_spec(cfg: QuickstartConfig, data: dict) -> dict[str, Any]:
    """The ``DataSpec`` of every Stage I run over ``data`` (the same split, the same held-out queries);
    ``data["spec"]``: more DataSpec fields (the mining round's mined negatives)."""
    return {
        "data_dir": data["beir"],
        "triplets": data["triplets"],
        "validation_triplets": data["validation_triplets"],
        "eval_split": cfg.eval_split,
        "max_eval_queries": cfg.max_eval_queries,
        "eval_overlap": "drop",  # any BEIR set: never train on a test query (KUAKE-QTR reuses them)
        **data.get("spec", {}),
    }


def stage1_config(
    cfg: QuickstartConfig,
    method: str,
    data: dict,
    out_dir: Path,
    q: dict,
    d: dict,
    *,
    lr: float,
    head_lr: float,
    max_epochs: float,
    init_heads_from: str | None = None,
    dim: int | None = None,
):
    """A Stage I run's TrainConfig; ``dim`` = its embedding size (None = ``cfg.dim``), with the
    Matryoshka sizes {16, 32, ..., dim/2, dim} of §3.2."""
    heads_only = q["trainable_layers"] == 0 and d["trainable_layers"] == 0
    dim = dim or cfg.dim
    return load_config(
        TrainConfig,
        {
            "method": method,
            "output_dir": str(out_dir),
            "dim": dim,
            "loss": {"dims": matryoshka_dims_for(dim), **data.get("loss", {})},  # data["loss"]: the mining round's
            "query_tower": q,
            "doc_tower": d,
            "data": data_spec(cfg, data),
            "optim": {
                "batch_size": cfg.batch_size,
                "micro_batch_size": cfg.micro_batch_size,
                "max_steps": cfg.steps,
                "epochs": max_epochs,
                "lr": lr,
                "head_lr": head_lr,
            },
            "seed": cfg.seed,
            "feature_cache_dir": str(Path(cfg.out).resolve() / "features"),  # shared by every run over this data
            "center_samples": 100_000 if heads_only else 1024,  # cached features make the head fit cheap
            "eval_every": "epoch",  # validation queries: held out from the training split / triplets
            "patience": cfg.patience,
            "save_every": 50,
            "precision": cfg.precision,
            "evaluate_zero_shot": False,
            "init_heads_from": init_heads_from,
            "show_progress": cfg.show_progress,
        },
    )


def run_stage1(
    cfg: QuickstartConfig,
    name: str,
    method: str,
    data: dict,
    out: Path,
    q: dict,
    d: dict,
    *,
    lr: float,
    head_lr: float,
    max_epochs: float,
    init_heads_from: str | None = None,
    dim: int | None = None,
) -> dict[str, Any]:
    """Train (or reuse) one Stage I run under ``out/stage1/<name>``; returns its metrics + ``run_dir``."""
    run_dir = out / "stage1" / name
    tc = stage1_config(
        cfg,
        method,
        data,
        run_dir,
        q,
        d,
        lr=lr,
        head_lr=head_lr,
        max_epochs=max_epochs,
        init_heads_from=init_heads_from,
        dim=dim,
    )
    return stage1_step(tc, name, data)


def stage1_step(tc: TrainConfig, name: str, data: dict, **more: Any) -> dict[str, Any]:
    """Train (or reuse) the Stage I run ``tc`` (its ``output_dir``) as a step; ``more``: further inputs."""
    run_dir = Path(tc.output_dir)
    inputs = _step_inputs(tc, data=data_fingerprint(data), **more)
    if not step_done(run_dir, inputs):
        banner(f"Stage I: {name}")
        res = train(tc, resume=True, on_change="redo")  # the step's own digest decided: redo, never refuse
        mark_done(run_dir, inputs, {"best_val_score": res.get("best_val_score")})
    m = json.loads((run_dir / "run.json").read_text())["metrics"]
    return dict(m, run_dir=str(run_dir))


#: settings that do not change what a step produces (progress bars, logging, checkpoint cadence)
COSMETIC = ("show_progress", "save_every", "log_every", "keep_checkpoints")


def _config_dict(c) -> dict:
    """A run's config as the inputs of its step, without :data:`COSMETIC` fields."""
    return {k: v for k, v in asdict(c).items() if k not in COSMETIC}


def _step_inputs(c, **more: Any) -> dict[str, Any]:
    """A training step's inputs: its config (plain JSON, with its fields' defaults, so a setting a
    later version adds at its default is no change) and ``more``."""
    return with_defaults({"config": json.loads(json.dumps(_config_dict(c), default=str)), **more}, c, "config.")


def family_method(fam: Family) -> str:
    """Stage I's method name for two towers of one family (it checks the towers' kinds): the
    matched-cost rows differ in tower sizes, not kinds, so ScalingDoc's small query tower and
    large document tower of one family train under that family's dual method."""
    return "scaling_dual" if fam.name == "llm" else "twinbert"


def large_tower_runs(
    cfg: QuickstartConfig, fam: Family, data: dict, out: Path, head_lrs: dict[int | None, list[float]] | None = None
) -> dict[int | None, dict[str, Any]]:
    """The family's large dual tower at each candidate depth (``fam.depths``), each with the best
    head learning rate of ``cfg.head_lrs`` (or ``head_lrs[depth]``: the ones still in after the
    proxy) on validation; {depth: metrics (+ ``lr_grid``, ``lr_scores`` {lr: validation nDCG@10})}."""
    prefill_depth_caches(cfg, fam, data)
    res = {}
    for depth in fam.depths:
        tried, ms, scores = [], {}, {}
        for hl in (head_lrs or {}).get(depth, cfg.head_lrs):
            ms[hl] = dict(_large_run(cfg, fam, data, out, depth, hl), head_lr=hl, depth=depth, dim=cfg.dim)
            tried.append(f"{hl:g}:{ms[hl]['best_val_score']:.4f}")
            scores[hl] = ms[hl]["best_val_score"]
        # the declared default (the first configured rate) unless another is better beyond the noise
        lr, why = default_unless_separated(
            scores,
            {k: m.get("best_val_per_query") for k, m in ms.items()},
            cfg.head_lrs[0],
            cfg.choice_margin,
            "head learning rate",
        )
        res[depth] = dict(ms[lr], lr_grid=" ".join(tried), lr_scores=scores, lr_choice=why)
    return res


def _dim_tag(cfg: QuickstartConfig, dim: int | None) -> str:
    """A run name's embedding-size suffix: none at ``cfg.dim`` (a run at the configured size keeps the
    plain name), ``_d384`` otherwise."""
    return "" if dim in (None, cfg.dim) else f"_d{dim}"


def _large_run(
    cfg: QuickstartConfig,
    fam: Family,
    data: dict,
    out: Path,
    depth: int | None,
    head_lr: float,
    *,
    k: int | str | None = None,
    dim: int | None = None,
    max_epochs: float | None = None,
    init_heads_from: str | None = None,
    suffix: str = "",
) -> dict[str, Any]:
    """One Stage I run of the family's large dual tower (both towers ``depth`` layers, the top ``k``
    training; default ``cfg.trainable_layers``), named ``<family>_large_L<depth>_hlr<lr>[_d<dim>]<suffix>``."""
    tower = fam.tower(depth, cfg.trainable_layers if k is None else k, cfg.query_max_length)
    return run_stage1(
        cfg,
        f"{fam.name}_large_L{depth or 'all'}_hlr{head_lr:g}{_dim_tag(cfg, dim)}{suffix}",
        family_method(fam),
        data,
        out,
        tower,
        {**tower, "max_length": cfg.doc_max_length},
        lr=fam.lr,
        head_lr=head_lr,
        max_epochs=cfg.max_epochs if max_epochs is None else max_epochs,
        init_heads_from=init_heads_from,
        dim=dim,
    )


def _tower_config(tower_dir: str | Path) -> dict[str, Any]:
    """A saved tower's config (its ``tower.json``), read without loading the tower."""
    return json.loads((Path(tower_dir) / "tower.json").read_text(encoding="utf-8"))["config"]


def hidden_size(run_dir: str | Path) -> int:
    """The backbone hidden size of a finished Stage I run's query tower."""
    return int(_tower_config(Path(run_dir) / "query_tower")["hidden_size"])


def full_dim_run(
    cfg: QuickstartConfig, fam: Family, best: dict[str, Any], data: dict, out: Path
) -> dict[str, Any] | None:
    """The family's chosen large tower (``best``: depth and head learning rate, a
    :func:`large_tower_runs` entry) trained again with the embedding size = its backbone's hidden
    size (``cfg.full_dim``); None when that is ``cfg.dim`` already. The paper's dim = 128 reduces a
    3,584-d Qwen state (§4.1, dim << h); a frozen 384-d MiniLM projected to 128 starts below its own
    zero-shot embeddings, so the size is a choice made on validation, like the head learning rate."""
    h = hidden_size(best["run_dir"])
    if h == cfg.dim:
        return None
    return dict(
        _large_run(cfg, fam, data, out, best["depth"], best["head_lr"], dim=h),
        head_lr=best["head_lr"],
        depth=best["depth"],
        dim=h,
    )


def prefill_depth_caches(cfg: QuickstartConfig, fam: Family, data: dict) -> None:
    """One pass of the deepest candidate's frozen prefix fills the pooled document caches of
    every candidate depth (heads-only runs read the state after layer N + the final norm, which
    the deepest tower passes through), so each shallower depth costs no pass of its own over the
    corpus (a no-op when there is one depth, layers train, or the caches are full)."""
    depths = sorted({d for d in fam.depths if d})
    if cfg.trainable_layers != 0 or len(depths) < 2:
        return

    pool = {"pooling": fam.pooling} if fam.pooling else {}
    dt = load_tower(fam.model, "document", dim=None, max_doc_length=cfg.doc_max_length, num_layers=depths[-1], **pool)
    corpus = load_corpus(corpus_file(data))
    fill_pooled_depths(
        Path(cfg.out).resolve() / "features", dt, depths, list(corpus.values()), show_progress=cfg.show_progress
    )


def unfreeze_run(
    cfg: QuickstartConfig, fam: Family, best: dict[str, Any], k: int, data: dict, out: Path
) -> dict[str, Any]:
    """Heads first, then layers: the family's chosen heads-only large tower (``best``, a
    :func:`large_tower_runs` entry) with the top ``k`` layers of both towers trained, starting
    from its trained heads."""
    return _large_run(
        cfg,
        fam,
        data,
        out,
        best["depth"],
        best["head_lr"],
        k=k,
        dim=best.get("dim"),
        max_epochs=cfg.unfreeze_epochs,
        init_heads_from=best["run_dir"],
        suffix=f"_top{k}",
    )


def _keep_tag(keep: list[int] | None) -> str:
    """A small run's name suffix for a start other than the bottom layers: ``_l0-5``."""
    return "" if not keep or is_bottom(keep) else "_l" + "-".join(map(str, keep))


def small_dual_run(
    cfg: QuickstartConfig,
    fam: Family,
    data: dict,
    out: Path,
    head_lr: float,
    dim: int | None = None,
    keep: list[int] | None = None,
) -> dict[str, Any]:
    """``twinbert_small``: the family's small tower on both sides. The query tower (the online
    one) trains every layer (embeddings frozen and cached); the document tower trains like every
    document tower of the run (``trainable_layers``: heads only on a CPU, where a step over the
    layers of 64 + 64 documents costs seconds)."""
    s = fam.small_layers
    q = fam.tower(s, s, cfg.query_max_length, keep)
    d = fam.tower(s, cfg.trainable_layers, cfg.doc_max_length, keep)  # the same small model on both sides
    return run_stage1(
        cfg,
        f"{fam.name}_small_dual_L{s}{_keep_tag(keep)}{_dim_tag(cfg, dim)}{data.get('tag', '')}",
        family_method(fam),
        data,
        out,
        q,
        d,
        lr=fam.lr,
        head_lr=head_lr,
        max_epochs=cfg.small_max_epochs,
        dim=dim,
    )


def scaling_doc_run(
    cfg: QuickstartConfig,
    fam: Family,
    depth: int | None,
    data: dict,
    out: Path,
    head_lr: float,
    dim: int | None = None,
    keep: list[int] | None = None,
) -> dict[str, Any]:
    """``scaling_doc``: the small query tower (every layer trains) + the large document tower
    (``trainable_layers``, like every document tower), trained jointly."""
    s = fam.small_layers
    q = fam.tower(s, s, cfg.query_max_length, keep)
    d = fam.tower(depth, cfg.trainable_layers, cfg.doc_max_length)
    return run_stage1(
        cfg,
        f"{fam.name}_scaling_doc_L{s}{_keep_tag(keep)}_L{depth or 'all'}{_dim_tag(cfg, dim)}{data.get('tag', '')}",
        "scaling_doc" if fam.name == "llm" else "twinbert",
        data,
        out,
        q,
        d,
        lr=fam.lr,
        head_lr=head_lr,
        max_epochs=cfg.small_max_epochs,
        dim=dim,
    )


# ---------------------------------------------------------------------------- the zero-shot start
def zero_shot_run(cfg: QuickstartConfig, fam: Family, depth: int | None, like: Path, data: dict, out: Path) -> Path:
    """The family's pre-trained tower as a Stage I output directory (native pooling, no
    projection): the start a trained large tower must beat, and a teacher when it does not."""
    d = out / "stage1" / f"{fam.name}_zero_shot_L{depth or 'all'}"
    inputs = {
        "model": fam.model,
        "depth": depth,
        "pooling": fam.pooling,
        "q_max": cfg.query_max_length,
        "d_max": cfg.doc_max_length,
        "data": data_fingerprint(data),
    }
    if step_done(d, inputs):
        return d
    banner(f"zero-shot start: {fam.name} ({fam.model})")
    kw = {"num_layers": depth} if depth else {}
    pool = {"pooling": fam.pooling} if fam.pooling else {}
    qt = load_tower(fam.model, "query", dim=None, max_query_length=cfg.query_max_length, **kw, **pool)
    dt = load_tower(fam.model, "document", dim=None, max_doc_length=cfg.doc_max_length, **kw, **pool)
    corpus = load_corpus(corpus_file(data))
    ids = list(corpus)
    emb = PrefixTower(dt, 0, Path(cfg.out).resolve() / "features", show_progress=cfg.show_progress).encode(
        [corpus[i] for i in ids], normalize=False
    )
    pair_towers(qt, dt)
    d.mkdir(parents=True, exist_ok=True)
    qt.save(d / "query_tower")
    dt.save(d / "doc_tower")
    np.save(d / "doc_embeddings.npy", np.asarray(emb, dtype=np.float32))
    write_json(d / "doc_ids.json", ids, indent=None)
    shutil.copy(like / "config.yaml", d / "config.yaml")  # the same data spec: the same held-out queries
    write_json(d / "run.json", {"metrics": {"method": "zero_shot", "compat_id": qt.compat_id}})
    mark_done(d, inputs)
    return d


# ---------------------------------------------------------------------------- Stage II
def pseudo_queries(cfg: QuickstartConfig, data: dict, out: Path) -> list[str]:
    """QKD's unlabelled query sources from the corpus: ICT pseudo-queries and (``qkd_corpus_texts``)
    a sample of its titles and sentences. Returns the ``queries.jsonl`` paths."""
    corpus = corpus_file(data)
    d = out / "pseudo_ict"
    inputs = {"max_docs": cfg.qkd_max_pseudo_queries, "seed": cfg.seed, "data": data_fingerprint(data)}
    if not step_done(d, inputs):
        banner("pseudo-queries (inverse cloze task) for QKD")
        ict_queries(
            corpus, d, ICTConfig(seed=cfg.seed, max_docs=cfg.qkd_max_pseudo_queries), progress=cfg.show_progress
        )
        mark_done(d, inputs)
    sources = [d / "queries.jsonl"]
    if cfg.qkd_corpus_texts:
        t = out / "corpus_texts"
        inputs = {"max_texts": cfg.qkd_corpus_texts, "seed": cfg.seed, "data": data_fingerprint(data)}
        if not step_done(t, inputs):
            banner(f"corpus text for QKD (titles and sentences, up to {cfg.qkd_corpus_texts})")
            corpus_texts(corpus, t, cfg.qkd_corpus_texts, seed=cfg.seed)
            mark_done(t, inputs)
        sources.append(t / "queries.jsonl")
    return [str(q) for q in sources if q.exists()]


def student_base(fam: Family, teacher_dir: Path, layers: list[int]) -> str:
    """Where a student of the teacher's family starts: the teacher's own backbone when training
    changed any of the ``layers`` it keeps, else the pre-trained model (identical there)."""
    cfg_file = teacher_dir / "config.yaml"
    if not (teacher_dir / "run.json").exists() or "zero_shot" in teacher_dir.name or not cfg_file.exists():
        return fam.model
    tc = _tower_config(teacher_dir / "query_tower")
    if tc.get("base_model") != resolve_source(fam.model).name:  # another family's teacher
        return fam.model
    k, n = load_config(TrainConfig, cfg_file).query_tower.trainable_layers, int(tc["num_layers"])
    trained = set(range(n)) if k == "all" else set(range(n - int(k), n))
    return str(teacher_dir / "query_tower" / "backbone") if trained & set(layers) else fam.model


def layer_pool(large_dir: str | Path) -> int:
    """How many layers a family's large tower (a Stage I run directory) has: what its students' layers are chosen from."""
    return int(_tower_config(Path(large_dir) / "query_tower")["num_layers"])


def qkd_name(student_family: str, layers: int, teacher: str, rank_weight: float) -> str:
    """``bert2_from_bert_rw1``: the QKD step of a student (family, size) of a teacher family at one
    listwise weight."""
    return f"{student_family}{layers}_from_{teacher}_rw{rank_weight:g}"


def run_qkd(
    cfg: QuickstartConfig,
    name: str,
    teacher_dir: Path,
    fam: Family,
    layers: int,
    data: dict,
    out: Path,
    pseudo: list[str],
    *,
    rank_weight: float,
    pool: int | None = None,
    deadline: float | None = None,
    min_steps: int = 0,
) -> dict[str, Any]:
    """QKD of ``teacher_dir`` into a ``layers``-layer student of ``fam``, starting from the layers of
    its ``pool``-layer large tower that validate best (``cfg.student_layers``). ``deadline``: its
    time box (a ``time.monotonic()`` instant; the steps re-planned to it, never below ``min_steps``)."""
    d = out / "qkd" / name
    sources = [{"path": data["beir"]}]  # every logged/known query text (labels unused); eval queries are removed
    sources += [{"path": p} for p in pseudo]
    cands = start_candidates(layers, pool) if cfg.student_layers == "choose" and pool else [list(range(layers))]
    student = {
        "model": student_base(fam, teacher_dir, sorted({i for c in cands for i in c})),
        "num_layers": layers,
        "max_length": cfg.query_max_length,
        "trainable_layers": layers,
    }  # embeddings frozen and cached, every layer trains
    if fam.pooling:
        student["pooling"] = fam.pooling
    dc = load_config(
        DistillConfig,
        {
            "teacher": str(teacher_dir),
            "output_dir": str(d),
            "student": student,
            "queries": sources,
            "optim": {
                "batch_size": cfg.qkd_batch_size,
                "epochs": cfg.qkd_epochs,
                "max_steps": cfg.qkd_step_cap(on_gpu()),
                "lr": 3e-4 if fam.name == "bert" else 1e-4,
            },
            "target": cfg.qkd_target,
            "patience": cfg.qkd_patience,
            "rank_weight": rank_weight,
            "feature_cache_dir": str(
                Path(cfg.out).resolve() / "features"
            ),  # the head-only teacher's cached query features
            "eval_data": data["beir"],
            "eval_split": cfg.eval_split,
            "seed": cfg.seed,
            "show_progress": cfg.show_progress,
            "precision": cfg.precision,
            "student_dropout": cfg.qkd_dropout,
            "student_layer_candidates": cands if len(cands) > 1 else None,
        },
    )
    inputs = _step_inputs(dc, data=data_fingerprint(data), teacher=step_digest(teacher_dir))
    if not step_done(d, inputs):
        banner(f"Stage II: QKD {name}")
        distill(dc, resume=True, on_change="redo", deadline=deadline, min_steps=min_steps)
        mark_done(d, inputs)
    return dict(json.loads((d / "run.json").read_text())["metrics"], run_dir=str(d))


def step_digest(step_dir: Path) -> str | None:
    marker = step_dir / "DONE"
    return json.loads(marker.read_text()).get("digest") if marker.exists() else None


__all__ = [
    "corpus_file",
    "step_digest",
    "data_spec",
    "full_dim_run",
    "hidden_size",
    "large_tower_runs",
    "unfreeze_run",
    "mark_done",
    "prepare_data",
    "pseudo_queries",
    "qkd_name",
    "run_qkd",
    "run_stage1",
    "stage1_step",
    "layer_pool",
    "scaling_doc_run",
    "small_dual_run",
    "stage1_config",
    "step_done",
    "student_base",
    "zero_shot_run",
]
