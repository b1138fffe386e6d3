"""Benchmarks: ``python -m benchmarks.<name>`` from the repository root; each writes
``benchmarks/results/<name>.json`` (see :mod:`benchmarks._common`)."""

import os

# OpenMP threads (FAISS, torch) spin-wait by default; on a small machine shared with other
# processes that is many times slower. Must be set before OpenMP starts, i.e. before a
# benchmark module imports faiss / torch — this package is imported first.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
