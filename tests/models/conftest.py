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


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models run far faster on one thread: on a shared 2-core machine, 2-thread
    OpenMP barriers dominate matmuls this small. Restored afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
