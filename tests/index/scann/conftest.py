"""Fixtures of the ScaNN index tests: the live-index scenario's built index and routed methods
(tests/live), for the scenario run over a method of this package."""

from __future__ import annotations

from tests.live.conftest import _built_index  # noqa: F401 - the fixture the scenario builds on
from tests.live.test_live_methods import routed  # noqa: F401 - chosen on held-out queries, built, defaults saved
