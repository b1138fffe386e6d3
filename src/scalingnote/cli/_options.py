"""CLI options generated from a typed config dataclass.

A field becomes ``--field-name`` with the field's default, type and the ``help`` / ``min`` /
``max`` / ``flag`` given in its metadata (``field(..., metadata=scalingnote.config.cli_meta(help=...))``), so the
Python API and the command line cannot drift apart::

    @app.command("build")
    @with_config_options(IndexConfig)
    def build(out: Path = typer.Option(...), cfg: IndexConfig = None): ...
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable
from typing import Any

import typer


def parse_key_values(items: list[str] | None, option: str = "--set", example: str = "") -> dict[str, Any]:
    """``["a.b=1e-4", "c=x"]`` (a repeatable ``KEY=VALUE`` option) -> ``{"a.b": 1e-4, "c": "x"}``,
    values parsed as YAML scalars; ``example`` is shown when an item has no ``=``."""
    import yaml

    from scalingnote.errors import ConfigError

    out: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError(option, None, item, f"expected KEY=VALUE (e.g. {example})" if example else "expected KEY=VALUE")
        k, v = item.split("=", 1)
        out[k.strip()] = yaml.safe_load(v)
    return out


def config_parameters(cls: type) -> list[inspect.Parameter]:
    """One keyword-only :class:`inspect.Parameter` with a ``typer.Option`` default per field."""
    hints = typing.get_type_hints(cls)
    params = []
    for f in dataclasses.fields(cls):
        meta = dict(f.metadata.get("cli", {}))
        if meta.get("skip"):
            continue
        default = f.default if f.default is not dataclasses.MISSING else ...
        flag = meta.pop("flag", "--" + f.name.replace("_", "-"))
        opt = typer.Option(default, flag, help=meta.get("help"), min=meta.get("min"), max=meta.get("max"))
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=hints[f.name]))
    return params


def with_config_options(cls: type, arg: str = "cfg") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a command whose parameter ``arg`` is a ``cls`` instance: the command gets one
    option per field of ``cls`` instead, and receives the built config."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(fn, eval_str=True)
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in sig.parameters.values() if p.name != arg]
        fields = config_parameters(cls)
        names = {p.name for p in fields}
        clash = names & {p.name for p in own}
        if clash:
            raise TypeError(f"{fn.__name__}: parameters {sorted(clash)} are also fields of {cls.__name__}")

        def command(**kw: Any) -> Any:
            cfg = cls(**{k: kw.pop(k) for k in names if k in kw})
            return fn(**kw, **{arg: cfg})

        command.__signature__ = sig.replace(parameters=own + fields, return_annotation=sig.return_annotation)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in own + fields}
        command.__name__ = fn.__name__
        command.__qualname__ = fn.__qualname__
        command.__doc__ = fn.__doc__
        return command

    return deco
