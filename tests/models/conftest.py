"""Tiny random models (built once per session) for the tower tests."""

from __future__ import annotations

import pytest

from scalingnote.models import build_tiny_model


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_models")
    return {
        "llama": build_tiny_model(root / "llama", "llm", arch="llama", num_layers=3),
        "qwen2": build_tiny_model(root / "qwen2", "llm", arch="qwen2", num_layers=3),
        "bert": build_tiny_model(root / "bert", "bert", num_layers=3),
    }
