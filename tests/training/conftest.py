"""Fixtures of the Stage I training tests: tiny random towers and a tiny BEIR corpus (once per module;
a module that needs other towers defines its own ``tiny``)."""

from __future__ import annotations

import pytest

from scalingnote.models import build_tiny_model
from tests.helpers.tiny_data import write_tiny_beir


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return {
        "llm": str(build_tiny_model(root / "llm", "llm", num_layers=2)),
        "bert": str(build_tiny_model(root / "bert", "bert", num_layers=2)),
        "data": str(write_tiny_beir(root / "beir")),
    }
