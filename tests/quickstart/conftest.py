"""Fixtures of the quick-start tests: a tiny random LLM and BERT (once per module)."""

from __future__ import annotations

import pytest

from scalingnote.models import build_tiny_model


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("qs_models")
    return str(build_tiny_model(root / "llm", "llm", num_layers=2)), str(
        build_tiny_model(root / "bert", "bert", num_layers=2)
    )
