from __future__ import annotations

import pytest

from scalingnote.errors import ScalingNoteError
from scalingnote.utils.registry import Registry, RegistryError


def test_register_get_and_errors():
    reg = Registry("loss", {"a": 1})
    assert reg.get("a") == 1 and "a" in reg and reg.names() == ["a"]
    reg.register("b", 2)
    with pytest.raises(RegistryError, match="already registered"):
        reg.register("b", 3)
    reg.register("b", 3, replace=True)
    assert reg.get("b") == 3
    with pytest.raises(ScalingNoteError, match=r"loss.name: unknown loss 'c'; known: a, b"):
        reg.get("c", option="loss.name")
    with pytest.raises(RegistryError, match="without ':'"):
        reg.register("x:y", 1)


def test_dotted_paths_import_on_demand():
    reg = Registry("pooling mode")
    assert reg.get("os.path:join") is __import__("os").path.join
    with pytest.raises(RegistryError, match="cannot import pooling mode 'nosuchmodule_xyz:f'.*ModuleNotFoundError"):
        reg.get("nosuchmodule_xyz:f")
    with pytest.raises(RegistryError, match="AttributeError"):
        reg.get("os:no_such_attribute")


def test_scoped_registrations_are_undone():
    reg = Registry("back end", {"faiss": 1})
    with reg.scoped():
        reg.register("mine", 2)
        assert reg.get("mine") == 2
    assert reg.names() == ["faiss"]
