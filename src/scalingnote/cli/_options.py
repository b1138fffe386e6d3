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
import yaml
from typer.models import OptionInfo

from scalingnote.data import corpus as corpus_formats
from scalingnote.errors import ConfigError
from scalingnote.index.backends import BACKENDS


def parse_key_values(items: list[str] | None, option: str = "--set", example: str = "") -> dict[str, Any]:
    """``["a.b=1e-4", "c=x"]`` (a repeatable ``KEY=VALUE`` option) -> ``{"a.b": 1e-4, "c": "x"}``,
    values parsed as YAML scalars; ``example`` is shown when an item has no ``=``."""
    out: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError(
                option, None, item, f"expected KEY=VALUE (e.g. {example})" if example else "expected KEY=VALUE"
            )
        k, v = item.split("=", 1)
        out[k.strip()] = yaml.safe_load(v)
    return out


def parse_overrides(items: list[str] | None) -> dict:
    """``--set optim.lr=1e-4`` -> {"optim__lr": 1e-4} (values parsed as YAML scalars)."""
    return {k.replace(".", "__"): v for k, v in parse_key_values(items, "--set", "optim.lr=1e-4").items()}


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


def with_parameters(
    params: list[inspect.Parameter], arg: str, build: Callable[[dict[str, Any]], Any], owner: str
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a command whose parameter ``arg`` is built from ``params`` (keyword-only, each
    with a ``typer.Option`` default): the command gets those options instead of ``arg`` and
    receives ``build({name: value})``; ``owner`` names where the parameters come from in errors."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(fn, eval_str=True)
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in sig.parameters.values() if p.name != arg]
        names = {p.name for p in params}
        clash = names & {p.name for p in own}
        if clash:
            raise TypeError(f"{fn.__name__}: parameters {sorted(clash)} are also fields of {owner}")

        def command(**kw: Any) -> Any:
            built = build({k: kw.pop(k) for k in names if k in kw})
            return fn(**kw, **{arg: built})

        command.__signature__ = sig.replace(parameters=own + params, return_annotation=sig.return_annotation)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in own + params}
        command.__name__ = fn.__name__
        command.__qualname__ = fn.__qualname__
        command.__doc__ = fn.__doc__
        return command

    return deco


def with_config_options(cls: type, arg: str = "cfg") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a command whose parameter ``arg`` is a ``cls`` instance: the command gets one
    option per field of ``cls`` instead, and receives the built config."""
    return with_parameters(config_parameters(cls), arg, lambda kw: cls(**kw), cls.__name__)


def with_option_group(
    arg: str, options: dict[str, tuple[Any, str, str]]
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a command whose parameter ``arg`` is a dict: one option per entry ``name:
    (type, flag, help)`` of ``options`` (default None: not given), shared by the commands that
    take the same group; the command receives ``{name: value}``."""
    params = [
        inspect.Parameter(
            name, inspect.Parameter.KEYWORD_ONLY, default=typer.Option(None, flag, help=text), annotation=kind | None
        )
        for name, (kind, flag, text) in options.items()
    ]
    return with_parameters(params, arg, dict, "the option group")


def backend_option_help(what: str = "A back end") -> str:
    """``--backend`` help read from :data:`scalingnote.index.backends.BACKENDS`: each registered
    back end with the option that locates it, and the dotted-path form."""
    where = {"index": "--index DIR", "uri": "--uri URI"}
    names = ", ".join(f"{name} ({where[BACKENDS.get(name).location]})" for name in BACKENDS.names())
    return f"{what} of scalingnote.index.backends: {names}; or a dotted path 'package.module:attribute'."


def backends_located_by(location: str) -> str:
    """The registered back ends located by ``location`` ("index" or "uri"), for option help."""
    return ", ".join(name for name in BACKENDS.names() if BACKENDS.get(name).location == location) or "none"


def corpus_format_help() -> str:
    """``--corpus-format`` help read from :data:`scalingnote.data.corpus.FORMATS`."""
    return (
        f"Corpus format of the data: a registered name ({', '.join(corpus_formats.FORMATS.names())}) or a dotted path "
        "'package.module:reader' naming a reader of your own (default: detected from the files)."
    )


class _LiveHelpOption(OptionInfo):
    """An option whose help is made when its command is built, not when its module is imported
    (the help lists a registry, which user code may extend after the import)."""

    help_of: Callable[[], str]

    @property
    def help(self) -> str:
        return self.help_of()

    @help.setter
    def help(self, value: str | None) -> None:  # OptionInfo.__init__ sets it: the factory wins
        pass


def live_help_option(default: Any, *flags: str, help_of: Callable[[], str], **kwargs: Any) -> Any:
    """``typer.Option(default, *flags, **kwargs)`` whose help is ``help_of()`` at each build."""
    info = typer.Option(default, *flags, **kwargs)
    live = _LiveHelpOption.__new__(_LiveHelpOption)
    live.__dict__.update(info.__dict__)
    live.help_of = help_of
    return live


def corpus_format_option() -> Any:
    """The ``--corpus-format SPEC`` option of the commands that read a data directory (default
    None: the format detected from the files)."""
    return live_help_option(None, "--corpus-format", help_of=corpus_format_help)


def use_corpus_format(spec: str | None, data_dir: Any = None) -> str | None:
    """``--corpus-format SPEC``: the format name SPEC resolves to (a dotted path's reader
    registered for ``data_dir``) through :func:`scalingnote.data.corpus.use_corpus_format`;
    None when SPEC is None."""
    return None if spec is None else corpus_formats.use_corpus_format(spec, data_dir)
