"""scalingnote.quickstart.scoring: the QPS measurement takes the towers in turns."""

from __future__ import annotations

import numpy as np

from scalingnote.quickstart.scoring import query_qps, query_qps_many


class _Recorder:
    """A stand-in query tower that records which tower encoded and how many texts."""

    def __init__(self, name: str, log: list[tuple[str, int]]):
        self.name, self.log = name, log

    def encode_queries(self, texts, *, batch_size, show_progress):
        self.log.append((self.name, len(texts)))
        return np.zeros((len(texts), 4), dtype=np.float32)


def test_towers_take_turns_within_each_round():
    log: list[tuple[str, int]] = []
    towers = {"a": _Recorder("a", log), "b": _Recorder("b", log)}
    qps = query_qps_many(towers, ["q1", "q2", "q3"], batch_size=4, repeats=3)
    assert set(qps) == {"a", "b"} and all(v > 0 for v in qps.values())
    assert log[:2] == [("a", 4), ("b", 4)]  # one warm-up batch each
    timed = log[2:]
    assert [n for n, _ in timed] == ["a", "b"] * 3  # interleaved, not a-a-a-b-b-b
    assert all(k == 512 for _, k in timed)  # the texts are repeated to 512 queries


def test_single_tower_wrapper():
    log: list[tuple[str, int]] = []
    assert query_qps(_Recorder("x", log), ["only"], batch_size=8, repeats=2) > 0
    assert [k for _, k in log] == [8, 512, 512]
