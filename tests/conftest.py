"""Shared fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

# OpenMP threads (FAISS, torch) spin-wait by default; on a small machine shared with other
# processes that makes FAISS training (OPQ, PQ) 5-10x slower. Must be set before OpenMP
# starts, i.e. before faiss/torch are imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _shared_data() -> Path:
    env = os.environ.get("SCALINGNOTE_SHARED_DATA")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Path to ../shared/data (SciFact, KUAKE-QTR); skips when absent."""
    p = _shared_data()
    if not (p / "scifact" / "corpus.jsonl").exists():
        pytest.skip(f"shared data not found at {p}")
    return p


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory):
    """A tiny random BERT (seed 0), built once per session (index, learned-PQ and service tests)."""
    from scalingnote.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-bert", "bert", seed=0)


@pytest.fixture(scope="session")
def other_bert_dir(tmp_path_factory):
    """A second tiny BERT with different random weights (a different, incompatible embedding space)."""
    from scalingnote.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-bert-other", "bert", seed=1)


@pytest.fixture(autouse=True, scope="session")
def _limit_threads():
    """Unit tests use tiny models: one thread avoids the synchronisation overhead that makes
    tiny matmuls many times slower on 2 threads (and keeps parallel test runs from thrashing)."""
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        pass
    yield


@pytest.fixture(scope="session")
def tiny_quickstart(tmp_path_factory):
    """A finished tiny quick start (``tests/helpers/tiny_quickstart.py``), shared by the Python API
    tests and the process-word scan: ``(output directory, its options, everything it printed)``."""
    from tests.helpers.tiny_quickstart import run_tiny_quickstart

    return run_tiny_quickstart(tmp_path_factory.mktemp("tiny_quickstart"))
