"""Named tables of extension points (losses, pooling modes, back ends, corpus formats).

Each extension point keeps one :class:`Registry` in the module that defines its built-in
entries. Users add entries from their own code with ``register`` (no edit of scalingnote's
files), or name them in a config / CLI option by a dotted path ``"package.module:attribute"``,
which :meth:`Registry.get` imports on demand.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Generic, TypeVar

from scalingnote.errors import ScalingNoteError

T = TypeVar("T")


class RegistryError(ScalingNoteError, KeyError):
    """An unknown name, a name registered twice, or a dotted path that does not import."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


def import_dotted(spec: str, option: str | None = None, what: str = "object") -> object:
    """The object a dotted path ``"package.module:attribute"`` names (``attribute`` may be
    ``A.b``), imported now; a :class:`RegistryError` naming ``option`` and ``what`` when it
    cannot be."""
    where = f"{option}: " if option else ""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise RegistryError(f"{where}{what} {spec!r}: a dotted path must look like 'package.module:attribute'")
    try:
        obj: object = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise RegistryError(f"{where}cannot import {what} {spec!r}: {type(e).__name__}: {e}") from None
    return obj


class Registry(Generic[T]):
    """A table ``name -> entry`` with a clear error for unknown names.

    ``what`` names the kind of entry in messages (``"loss"``, ``"pooling mode"``, ...)."""

    def __init__(self, what: str, entries: Mapping[str, T] | None = None) -> None:
        self.what = what
        self._entries: dict[str, T] = dict(entries or {})

    def register(self, name: str, entry: T, *, replace: bool = False) -> T:
        """Add ``entry`` under ``name``; a name already taken raises unless ``replace``."""
        if not isinstance(name, str) or not name or ":" in name:
            raise RegistryError(f"a {self.what} name must be a non-empty string without ':' (got {name!r})")
        if name in self._entries and not replace:
            raise RegistryError(f"{self.what} {name!r} is already registered (pass replace=True to replace it)")
        self._entries[name] = entry
        return entry

    @contextmanager
    def scoped(self) -> Iterator[Registry[T]]:
        """Entries registered inside the ``with`` block are gone after it (tests, experiments)."""
        saved = dict(self._entries)
        try:
            yield self
        finally:
            self._entries = saved

    def get(self, name: str, option: str | None = None) -> T:
        """The entry named ``name``, or the object a dotted path ``"module:attribute"`` names.

        ``option`` (e.g. ``"loss.name"``) is named in the error message."""
        where = f"{option}: " if option else ""
        if name in self._entries:
            return self._entries[name]
        if isinstance(name, str) and ":" in name:
            return import_dotted(name, option, self.what)  # type: ignore[return-value]
        raise RegistryError(
            f"{where}unknown {self.what} {name!r}; known: {', '.join(self.names())} "
            "(or a dotted path 'package.module:attribute')"
        )

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)


__all__ = ["Registry", "RegistryError", "import_dotted"]
