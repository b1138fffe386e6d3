"""Typed configuration: dataclasses loaded from YAML with validation.

Every stage defines its config as a (possibly nested) dataclass.
:func:`load_config` reads a YAML file (or a dict), checks every key and value
type against the dataclass and raises :class:`~scalingnote.errors.ConfigError`
naming the file, the line and the dotted key of the first problem. Unknown keys
are errors (a typo must not be silently ignored).
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from scalingnote.errors import ConfigError
from scalingnote.utils.io import atomic_write
from scalingnote.utils.runinfo import _plain

T = TypeVar("T")


def _key_lines(text: str) -> dict[str, int]:
    """Map dotted key paths to their 1-based line in the YAML text."""
    lines: dict[str, int] = {}
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return lines

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                key = f"{prefix}.{k.value}" if prefix else str(k.value)
                lines[key] = k.start_mark.line + 1
                walk(v, key)
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                key = f"{prefix}[{i}]"
                lines[key] = v.start_mark.line + 1
                walk(v, key)

    if root is not None:
        walk(root, "")
    return lines


def _bad_scalar_line(text: str) -> int | None:
    """1-based line of the first scalar that PyYAML's safe constructor refuses (None if not found)."""
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        stack = [root] if root is not None else []
        while stack:
            node = stack.pop(0)
            if isinstance(node, yaml.ScalarNode):
                try:
                    loader.construct_object(node, deep=True)
                except Exception:  # noqa: BLE001 - the one we are looking for
                    return node.start_mark.line + 1
            elif isinstance(node, yaml.MappingNode):
                stack.extend(x for kv in node.value for x in kv)
            elif isinstance(node, yaml.SequenceNode):
                stack.extend(node.value)
    except Exception:  # noqa: BLE001 - best effort: the caller still reports the error
        return None
    finally:
        loader.dispose()
    return None


class _Ctx:
    def __init__(self, path: str | None, lines: dict[str, int]):
        self.path = path
        self.lines = lines

    def fail(self, key: str, msg: str) -> typing.NoReturn:
        line = self.lines.get(key)
        if line is None:  # fall back to the closest parent key
            parent = key
            while parent and line is None:
                parent = parent.rsplit(".", 1)[0] if "." in parent else ""
                line = self.lines.get(parent)
        raise ConfigError(self.path or "<config>", line, key or None, msg)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(value: Any, tp: Any, key: str, ctx: _Ctx) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _convert(value, a, key, ctx)
            except ConfigError as e:
                errors.append(e.reason)
        ctx.fail(key, f"expected {_type_name(tp)}, got {type(value).__name__} {value!r}")
    if origin is typing.Literal:
        if value not in args:
            ctx.fail(key, f"must be one of {list(args)}, got {value!r}")
        return value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        shorthand = getattr(tp, "__config_shorthand__", None)  # e.g. `loss: infonce` = `loss: {name: infonce}`
        if shorthand and isinstance(value, str):
            value = {shorthand: value}
        if not isinstance(value, dict):
            ctx.fail(key, f"expected a mapping for {tp.__name__}, got {type(value).__name__}")
        return _build(tp, value, key, ctx)
    if origin in (list, tuple) or tp in (list, tuple):
        if not isinstance(value, (list, tuple)):
            ctx.fail(key, f"expected a list, got {type(value).__name__} {value!r}")
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(args) != len(value):
                ctx.fail(key, f"expected {len(args)} items, got {len(value)}")
            return tuple(_convert(v, a, f"{key}[{i}]", ctx) for i, (v, a) in enumerate(zip(value, args, strict=True)))
        inner = args[0] if args else Any
        items = [_convert(v, inner, f"{key}[{i}]", ctx) for i, v in enumerate(value)]
        return tuple(items) if (origin is tuple or tp is tuple) else items
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            ctx.fail(key, f"expected a mapping, got {type(value).__name__}")
        kt, vt = args if args else (Any, Any)
        return {_convert(k, kt, key, ctx): _convert(v, vt, f"{key}.{k}", ctx) for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            ctx.fail(key, f"expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            ctx.fail(key, f"expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            # YAML reads 1e-4 (no dot) as a string: accept numeric strings
            if isinstance(value, str):
                try:
                    return float(value)
                except ValueError:
                    pass
            ctx.fail(key, f"expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            ctx.fail(key, f"expected a string, got {value!r}")
        return value
    if tp is Path:
        if not isinstance(value, (str, Path)):
            ctx.fail(key, f"expected a path, got {value!r}")
        return Path(value)
    return value


def _build(cls: type[T], data: dict[str, Any], prefix: str, ctx: _Ctx) -> T:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kwargs = {}
    removed = getattr(cls, "__config_removed__", {})  # keys of older versions: null is accepted, a value is refused
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if k in removed and k not in fields:
            if v is None:
                continue
            ctx.fail(key, f"no longer supported: {removed[k]}")
        if k not in fields:
            ctx.fail(key, f"unknown key; valid keys of {cls.__name__}: {sorted(fields)}")
        kwargs[k] = _convert(v, hints[k], key, ctx)
    missing = [
        n
        for n, f in fields.items()
        if n not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        ctx.fail(
            f"{prefix}.{missing[0]}" if prefix else missing[0], f"missing required key(s) {missing} for {cls.__name__}"
        )
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as e:  # __post_init__ validation
        if isinstance(e, ConfigError) and e.field in fields:  # it names its field: keep its reason, add the file's line
            ctx.fail(f"{prefix}.{e.field}" if prefix else e.field, e.reason)
        # name the first field the message mentions (its line when the file sets it)
        named = next((n for n in fields if re.search(rf"(?<![\w.]){re.escape(n)}(?![\w])", str(e))), None)
        ctx.fail(f"{prefix}.{named}" if prefix and named else (named or prefix), str(e))


def load_config(cls: type[T], source: str | Path | dict[str, Any] | None = None, **overrides: Any) -> T:
    """Build ``cls`` from a YAML file path, a dict, or defaults, then apply ``overrides``.

    Overrides use dotted keys with ``__`` as separator (``optim__lr=1e-4``).
    """
    path: str | None = None
    data: dict[str, Any] = {}
    lines: dict[str, int] = {}
    if isinstance(source, (str, Path)):
        path = str(source)
        try:
            raw = Path(source).read_bytes()
        except OSError as e:
            raise ConfigError(path, None, None, f"cannot read config: {e.strerror or e}") from None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(
                path, raw[: e.start].count(b"\n") + 1, None, f"not valid UTF-8 (byte 0x{raw[e.start]:02x})"
            ) from None
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            problem = getattr(e, "problem", None) or str(e)
            col = f" (column {mark.column + 1})" if mark else ""
            line = mark.line + 1 if mark else None
            position = getattr(e, "position", None)
            if line is None and isinstance(position, int):  # reader errors (control characters)
                line = text[:position].count("\n") + 1
                problem = f"{getattr(e, 'reason', None) or problem}"
            raise ConfigError(path, line, None, f"invalid YAML: {problem}{col}") from None
        except (
            ValueError,
            TypeError,
            OverflowError,
            RecursionError,
        ) as e:  # a scalar PyYAML parses but cannot build (2020-99-99)
            raise ConfigError(path, _bad_scalar_line(text), None, f"invalid YAML value: {e}") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(path, 1, None, "the top level must be a mapping of keys to values")
        data = loaded
        lines = _key_lines(text)
    elif isinstance(source, dict):
        data = dict(source)
    for k, v in overrides.items():
        parts = k.split("__")
        node = data
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = v
    return _build(cls, data, "", _Ctx(path, lines))


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """A plain, YAML/JSON-serialisable dict of a config dataclass."""
    return _plain(cfg)


def save_config(cfg: Any, path: str | Path) -> None:
    """Atomically write the resolved config as YAML."""
    with atomic_write(path) as fh:
        yaml.safe_dump(config_to_dict(cfg), fh, sort_keys=False, allow_unicode=True)


def cli_meta(
    help: str | None = None, *, min: float | None = None, max: float | None = None, flag: str | None = None
) -> dict[str, Any]:
    """``dataclasses.field(metadata=cli_meta(...))``: how a config field shows as a generated
    command-line option (:func:`scalingnote.cli._options.with_config_options`)."""
    meta: dict[str, Any] = {"help": help, "min": min, "max": max}
    if flag:
        meta["flag"] = flag
    return {"cli": meta}
