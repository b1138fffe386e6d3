"""``scalingnote scaling``: sweeps, fits, predictions, budget plans and plots (scaling laws)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import typer

from scalingnote.cli._options import parse_key_values, parse_overrides, with_option_group
from scalingnote.config import load_config
from scalingnote.errors import ConfigError, ScalingNoteError
from scalingnote.scaling.budget import CostModel, plan_both
from scalingnote.scaling.fit import fit_table, read_fit_params
from scalingnote.scaling.gpu_plan import GpuPlanSpec, plan_gpu, spec_from_train_config
from scalingnote.scaling.laws import LAWS, predict
from scalingnote.scaling.plots import plot_all
from scalingnote.scaling.table import read_table
from scalingnote.utils import write_json

#: ``scaling plan`` options that set a CostModel field: field -> (type, flag, help)
COST_OPTIONS: dict[str, tuple[type, str, str]] = {
    "annotation_cost_per_pair": (float, "--annotation-cost", "Z_data: $ per annotated pair (paper: 0.6)."),
    "z_train": (float, "--z-train", "Z_train: training $ per parameter (paper Eq. 14: 3.22e-8)."),
    "z_infer": (float, "--z-infer", "Z_infer: inference $ per parameter (paper Eq. 15: 0.43)."),
    "corpus_size": (float, "--corpus-size", "Documents encoded (paper: 30e12 web pages)."),
    "query_volume": (float, "--query-volume", "Queries encoded over the model's life (paper: 0)."),
}
LAW_HELP = (
    "model: L(N)=(A/N)^alpha+delta; data: L(D)=(B/D)^beta+delta; joint: L(N,D)=[(A/N)^(alpha/beta)+B/D]^beta+delta"
)


def _parse_params(text: str) -> dict[str, float]:
    """``"A=8.2e5,alpha=0.57,B=5.2e3,beta=1.39,delta=0.03"`` -> dict."""
    out = {}
    for item in text.split(","):
        if not item.strip():
            continue
        if "=" not in item:
            raise ConfigError("--params", None, item.strip(), "expected NAME=VALUE")
        k, v = (s.strip() for s in item.split("=", 1))
        try:
            out[k] = float(v)
        except ValueError:
            raise ConfigError("--params", None, k, f"expected a number, got {v!r}") from None
    return out


def _cost_model(cost: list[str] | None, **explicit):
    """A CostModel from ``--cost KEY=VALUE`` items plus the explicit options that were given."""
    data = parse_key_values(cost, "--cost", "corpus_size=1e9")
    data.update({k: v for k, v in explicit.items() if v is not None})
    return load_config(CostModel, data)


def _echo_json(obj) -> None:
    typer.echo(json.dumps(obj, indent=2, allow_nan=False, default=str))


def register(app: typer.Typer) -> None:
    sc = typer.Typer(
        help="Scaling laws (Fang et al. 2024; ScalingNote §4.4): sweep, fit, predict, plan, plot.", no_args_is_help=True
    )
    app.add_typer(sc, name="scaling")
    for add in (_sweep, _fit, _predict, _plan, _plan_gpu, _plot):
        add(sc)


def _sweep(sc: typer.Typer) -> None:
    @sc.command("sweep")
    def sweep_cmd(
        config: Path = typer.Option(..., "--config", "-c", help="YAML SweepConfig (see configs/scaling_sweep_*.yaml)."),
        set_: list[str] = typer.Option(None, "--set", help="Override a key, e.g. --set steps=20 (repeatable)."),
    ) -> None:
        """Train the model-size x data-size grid and score each point on one fixed validation set (resumable)."""
        # why: loads torch (training); fit / predict / plan / plot do not need it
        from scalingnote.scaling.sweep import (
            load_sweep_config,
            run_sweep,
        )

        cfg = load_sweep_config(config, **parse_overrides(set_))
        res = run_sweep(cfg)
        typer.echo(f"{len(res.rows)} grid points -> {res.table}")
        typer.echo(f"validation: {json.dumps(res.validation)}")


def _fit(sc: typer.Typer) -> None:
    @sc.command("fit")
    def fit_cmd(
        input: Path = typer.Option(..., "--input", "-i", help="Results CSV with columns N,D,loss (sweep output)."),
        law: str = typer.Option("joint", "--law", help=LAW_HELP),
        as_json: bool = typer.Option(
            False, "--json", help="Print one JSON object (parameters, r2, stderr, holdout_*)."
        ),
        holdout_largest: int | None = typer.Option(
            None, "--holdout-largest", help="Hold out the rows at the K largest values of --holdout-by."
        ),
        holdout_frac: float | None = typer.Option(
            None, "--holdout-frac", help="Hold out a random fraction of the rows."
        ),
        holdout_by: str | None = typer.Option(
            None, "--holdout-by", help="N or D (default: the law's variable; N for joint)."
        ),
        at: float | None = typer.Option(
            None, "--at", help="model/data law: the D (resp. N) whose rows are fitted (default: the largest)."
        ),
        loss_fn: str = typer.Option(
            "soft_l1", "--loss", help="least_squares loss: linear, soft_l1, huber, cauchy, arctan."
        ),
        f_scale: float | None = typer.Option(
            None, "--f-scale", help="Robust loss scale (default: 1.4826 * MAD of the residuals, iterated)."
        ),
        log_residuals: bool = typer.Option(
            False, "--log-residuals", help="Fit log(prediction) - log(loss) (relative errors)."
        ),
        seed: int = typer.Option(0, "--seed", help="Seed of --holdout-frac."),
        output: Path | None = typer.Option(None, "--output", "-o", help="Also write the JSON to this file."),
    ) -> None:
        """Fit a scaling law to a results table (robust non-linear least squares in log-parameter space)."""
        if law not in LAWS:
            raise ScalingNoteError(f"--law must be one of {list(LAWS)}, got {law!r}")
        if holdout_by is not None and holdout_by not in ("N", "D"):
            raise ScalingNoteError(f"--holdout-by must be N or D, got {holdout_by!r}")
        rows = read_table(input, required=("loss",) + {"model": ("N",), "data": ("D",), "joint": ("N", "D")}[law])
        res = fit_table(
            rows,
            law,
            at=at,
            holdout_largest=holdout_largest,
            holdout_frac=holdout_frac,
            holdout_by=holdout_by,
            seed=seed,
            loss_fn=loss_fn,
            f_scale=f_scale,
            residuals="log" if log_residuals else "linear",
        )
        d = res.to_dict()
        if output is not None:
            write_json(output, d)
        if as_json:
            _echo_json(d)
            return
        typer.echo(f"{law} law fitted on {res.n_fit} rows" + (f" at {res.fixed}" if res.fixed else ""))
        for k, v in res.params.items():
            se = res.stderr.get(k)
            typer.echo(f"  {k:6s} = {v:.6g}" + (f"  ± {se:.3g}" if se is not None and math.isfinite(se) else ""))
        typer.echo(f"  R²     = {res.r2:.4f}   RMSE = {res.rmse:.4g}")
        if res.holdout:
            typer.echo(
                f"  held out {res.holdout['n']} rows: MAE = {res.holdout['mae']:.4g}, MAPE = "
                f"{100 * res.holdout['mape']:.2f}%"
            )


def _predict(sc: typer.Typer) -> None:
    @sc.command("predict")
    def predict_cmd(
        fit: Path = typer.Option(None, "--fit", help="JSON written by `scaling fit --json` (or --output)."),
        params: str | None = typer.Option(
            None, "--params", help="Parameters instead of --fit, e.g. 'A=4.5e4,alpha=0.46,delta=0.02'."
        ),
        law: str = typer.Option("joint", "--law", help=LAW_HELP),
        n: list[float] = typer.Option(None, "--n", help="Model size(s) N."),
        d: list[float] = typer.Option(None, "--d", help="Data size(s) D."),
    ) -> None:
        """Predict the loss at given N and/or D from a fitted law (prints JSON)."""
        if law not in LAWS:
            raise ScalingNoteError(f"--law must be one of {list(LAWS)}, got {law!r}")
        p = _parse_params(params) if params else (read_fit_params(fit, law) if fit else None)
        if p is None:
            raise ScalingNoteError("give --fit FILE or --params")
        Ns = np.array(n or [], dtype=float)
        Ds = np.array(d or [], dtype=float)
        if law == "joint" and Ns.size and Ds.size and Ns.size != Ds.size:
            if Ns.size == 1 or Ds.size == 1:
                Ns, Ds = np.broadcast_arrays(Ns, Ds)
            else:
                raise ScalingNoteError("--n and --d must be given the same number of times (or one of them once)")
        try:
            y = predict(p, law, N=Ns if Ns.size else None, D=Ds if Ds.size else None)
        except ValueError as e:
            raise ScalingNoteError(str(e)) from None
        rows = []
        for i, v in enumerate(np.atleast_1d(y)):
            r = {}
            if Ns.size:
                r["N"] = float(Ns[i])
            if Ds.size:
                r["D"] = float(Ds[i])
            r["loss"] = float(v)
            rows.append(r)
        _echo_json({"law": law, "params": p, "predictions": rows})


def _plan(sc: typer.Typer) -> None:
    @sc.command(
        "plan",
        help="The (N, D) minimising the predicted loss under a budget, with and without the inference cost "
        "(Fang et al. §6).",
    )
    @with_option_group("given_costs", COST_OPTIONS)
    def plan_cmd(
        budget: list[float] = typer.Option(..., "--budget", help="Total budget in $ (repeatable)."),
        fit: Path | None = typer.Option(None, "--fit", help="Joint-law JSON from `scaling fit --law joint --json`."),
        params: str | None = typer.Option(
            None, "--params", help="Joint-law parameters instead of --fit: 'A=..,alpha=..,B=..,beta=..,delta=..'."
        ),
        cost: list[str] = typer.Option(
            None, "--cost", help="Any other CostModel field, e.g. --cost gpu_price_per_hour=2.5 (repeatable)."
        ),
        n_min: float = typer.Option(1e4, "--n-min", help="Smallest model size considered."),
        n_max: float = typer.Option(1e13, "--n-max", help="Largest model size considered."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
        given_costs: dict[str, float | None] = None,  # type: ignore[assignment]  # one option per COST_OPTIONS entry
    ) -> None:
        if (fit is None) == (params is None):
            raise ScalingNoteError("give exactly one of --fit FILE and --params")
        if fit is not None:
            p = read_fit_params(fit, "joint", with_bounds=True)
        else:
            assert params is not None  # exactly one of --fit and --params (checked above)
            p = _parse_params(params)
        costs = _cost_model(cost, **given_costs)
        plans: list[dict[str, Any]] = []
        for b in budget:
            both = plan_both(p, b, costs, n_range=(n_min, n_max))
            plans.append({"budget": b, **{k: v.to_dict() for k, v in both.items()}})
        doc = {"params": p, "cost_factors": costs.factors(), "plans": plans}
        if as_json:
            _echo_json(doc)
            return
        f = costs.factors()
        typer.echo(next(iter(both.values())).describe())  # the law used and whether it has a floor
        typer.echo("cost factors: " + ", ".join(f"{k}={v:.4g}" for k, v in f.items()))
        for pl in plans:
            typer.echo(f"budget ${pl['budget']:.4g}")
            for key in ("without_inference", "with_inference"):
                x = pl[key]
                flag = "  (at the N range edge)" if x["at_bound"] else ""
                typer.echo(
                    f"  {key:18s} N={x['N']:.4g}  D={x['D']:.4g}  loss={x['loss']:.4f}  "
                    f"(data ${x['cost_data']:.4g}, train ${x['cost_train']:.4g}, infer ${x['cost_infer']:.4g}){flag}"
                )


def _plan_gpu(sc: typer.Typer) -> None:
    @sc.command(
        "plan-gpu",
        help="Memory per GPU and GPU-hours of a Stage I run (ZeRO accounting + the 6N FLOPs/token cost model, "
        "Eq. 14-15).",
    )
    def plan_gpu_cmd(
        arch: str = typer.Option(
            "qwen2.5-7b", "--arch", help="Decoder architecture (qwen2.5-0.5b/1.5b/7b, smollm2-135m/1.7b)."
        ),
        config: Path | None = typer.Option(
            None,
            "--config",
            "-c",
            help="A Stage I YAML (configs/gpu/*.yaml): batch, micro-batch, lengths, LoRA, sharding.",
        ),
        num_gpus: int | None = typer.Option(None, "--gpus", help="GPUs (default 8)."),
        train_pairs: float | None = typer.Option(
            None, "--train-pairs", help="Training examples (steps = epochs x pairs / global batch)."
        ),
        steps: int | None = typer.Option(None, "--steps", help="Optimizer steps (instead of --train-pairs)."),
        corpus_size: float | None = typer.Option(
            None, "--corpus-size", help="Documents to encode once after training."
        ),
        gpu_memory: float | None = typer.Option(None, "--gpu-memory-gib", help="Memory of one GPU (default 80)."),
        set_: list[str] = typer.Option(
            None, "--set", help="Any other GpuPlanSpec field, e.g. --set peak_flops=312e12 (repeatable)."
        ),
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        extra = parse_key_values(set_, "--set")
        given = dict(
            num_gpus=num_gpus,
            train_pairs=train_pairs,
            steps=steps,
            corpus_size=corpus_size,
            gpu_memory_gib=gpu_memory,
            **extra,
        )
        if config is not None:
            # why: loads torch (training); plan-gpu without --config does not need it
            from scalingnote.training.config import load_train_config

            spec = spec_from_train_config(load_train_config(config), arch, **given)
        else:
            spec = load_config(GpuPlanSpec, {"arch": arch, **{k: v for k, v in given.items() if v is not None}})
        plan = plan_gpu(spec)
        if as_json:
            _echo_json(plan)
            return
        typer.echo(
            f"{plan['arch']}: N={plan['non_embedding_params']:.4g} non-embedding, "
            f"{plan['trainable_params_per_tower']:.4g} trainable "
            f"per tower x {plan['llm_towers']} LLM tower(s), {spec.sharding} on {plan['num_gpus']} GPUs"
        )
        typer.echo(
            f"batch {spec.global_batch} = {plan['num_gpus']} x {plan['local_batch']} (micro-batch "
            f"{plan['micro_batch']}, "
            f"gradient cache {'on' if plan['gradient_cache'] else 'off'}), {plan['steps']} steps, "
            f"{plan['flops_per_token']} FLOPs/token"
        )
        typer.echo(
            f"memory per GPU: {plan['mem_per_gpu_gib']:.1f} GiB (model states {plan['mem_model_states_gib']:.1f}, "
            "FSDP working "
            f"{plan['mem_fsdp_working_gib']:.1f}, activations {plan['mem_activations_gib']:.1f}, overhead "
            f"{plan['mem_overhead_gib']:.1f})"
            f" -> {'fits' if plan['fits'] else 'does NOT fit'} in {spec.gpu_memory_gib:g} GiB"
        )
        typer.echo(
            f"training: {plan['train_gpu_hours']:.1f} GPU-hours ({plan['train_wall_hours']:.2f} h wall, "
            f"${plan['train_dollars']:.0f}); "
            f"encoding the corpus: {plan['encode_gpu_hours']:.1f} GPU-hours"
        )


def _plot(sc: typer.Typer) -> None:
    @sc.command("plot")
    def plot_cmd(
        input: Path = typer.Option(..., "--input", "-i", help="Results CSV with columns N,D,loss."),
        out: Path = typer.Option(..., "--out", "-o", help="Directory for the PNG files."),
        budget: list[float] = typer.Option(
            None, "--budget", help="Budgets for the budget curves (needs N and D; repeatable)."
        ),
        holdout_largest: int | None = typer.Option(
            None, "--holdout-largest", help="Hold out the K largest N (joint, model) / D (data)."
        ),
        loss_fn: str = typer.Option("soft_l1", "--loss"),
        log_residuals: bool = typer.Option(False, "--log-residuals", help="Fit relative (log) residuals."),
        cost: list[str] = typer.Option(
            None, "--cost", help="CostModel field for the budget curves, e.g. --cost corpus_size=1e9."
        ),
        n_min: float = typer.Option(1e4, "--n-min"),
        n_max: float = typer.Option(1e13, "--n-max"),
    ) -> None:
        """Fit the laws the table allows and write loss_vs_N.png, loss_vs_D.png, joint.png, budget.png."""
        rows = read_table(input)
        cols = set(rows[0])
        fits = {}
        for law, need in (("model", {"N"}), ("data", {"D"}), ("joint", {"N", "D"})):
            if need <= cols:
                try:
                    fits[law] = fit_table(
                        rows,
                        law,
                        holdout_largest=holdout_largest,
                        loss_fn=loss_fn,
                        residuals="log" if log_residuals else "linear",
                    )
                except ScalingNoteError as e:
                    typer.echo(f"{law} law not fitted: {e}", err=True)
        paths = plot_all(rows, fits, out, budgets=budget or (), costs=_cost_model(cost), n_range=(n_min, n_max))
        for p in paths:
            typer.echo(str(p))
