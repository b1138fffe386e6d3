"""Issue 47, item 4: a legal ``/search/batch`` must not starve single queries. A batch counts
against the queue by its size but holds at most ``batch_queue_share`` of ``max_queue``; single
queries keep the rest and at least half of every micro-batch. The lanes alone, then a real
uvicorn server whose model worker is slowed down (so requests stay queued)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from scalingnote.errors import ConfigError
from scalingnote.serve import BackgroundServer, ServeSettings, create_app
from scalingnote.serve.lanes import Lanes
from scalingnote.serve.processing import SearchParams, _Item


def _item(n: int) -> _Item:
    return _Item([f"q{i}" for i in range(n)], SearchParams(), None, 0.0)


def test_lanes_admission_counts_batches_by_size_and_keeps_a_share_for_singles():
    lanes = Lanes(max_queue=16, batch_queue_share=0.5)
    assert lanes.batch_cap == 8
    assert lanes.admits(16, batch=True)  # a legal batch (max_batch_queries = max_queue) into an empty queue
    lanes.put(_item(16), batch=True)
    assert not lanes.admits(1, batch=True)  # one batch at a time once it is over the batch share
    singles = 0
    while lanes.admits(1, batch=False):
        lanes.put(_item(1), batch=False)
        singles += 1
    assert singles == 8 and lanes.queued == 24  # the batch counts only up to its share against single queries
    lanes2 = Lanes(max_queue=16, batch_queue_share=0.5)
    lanes2.put(_item(1), batch=False)
    assert lanes2.admits(16, batch=True)  # one query already waiting does not refuse a legal batch
    lanes2.put(_item(4), batch=True)
    assert lanes2.admits(4, batch=True) and not lanes2.admits(5, batch=True)  # small batches share the batch share
    with pytest.raises(ConfigError, match="batch_queue_share"):
        ServeSettings(batch_queue_share=1.0)


def test_micro_batches_give_single_queries_at_least_half():
    lanes = Lanes(max_queue=64, batch_queue_share=0.5)
    for _ in range(4):
        lanes.put(_item(4), batch=True)  # one 16-query batch in chunks of max_batch // 2 = 4
    for _ in range(10):
        lanes.put(_item(1), batch=False)
    taken = [lanes._take(8) for _ in range(4)]
    singles = [sum(1 for it in mb if len(it.texts) == 1) for mb in taken]
    chunks = [sum(1 for it in mb if len(it.texts) == 4) for mb in taken]
    assert singles[:2] == [4, 6] and chunks[:2] == [
        1,
        0,
    ]  # batch turn: one chunk then singles; single turn: singles first
    assert sum(chunks) == 4 and sum(singles) == 10 and lanes.queued == 0


class _Slow:
    """The real query tower, slowed down so that requests stay queued behind the worker."""

    def __init__(self, tower, seconds: float):
        self._tower, self.seconds = tower, seconds

    def __getattr__(self, name):
        return getattr(self._tower, name)

    def encode_queries(self, texts, **kw):
        time.sleep(self.seconds)
        return self._tower.encode_queries(texts, **kw)


async def _scenario(url: str, batch_first: bool) -> tuple[list[httpx.Response], httpx.Response, list[float], float]:
    """One query occupies the worker, then a 16-query batch and 8 single queries arrive."""
    async with httpx.AsyncClient(base_url=url, trust_env=False, timeout=60) as c:
        done: dict[str, float] = {}

        async def single(i: int) -> httpx.Response:
            r = await c.post("/search", json={"query": f"scaling laws {i}", "k": 3})
            done[f"s{i}"] = time.perf_counter()
            return r

        async def batch() -> httpx.Response:
            r = await c.post("/search/batch", json={"queries": [f"dense retrieval {i}" for i in range(16)], "k": 3})
            done["batch"] = time.perf_counter()
            return r

        busy = asyncio.create_task(single(-1))
        await asyncio.sleep(0.15)  # the worker is now encoding it
        if batch_first:
            b = asyncio.create_task(batch())
            await asyncio.sleep(0.05)
            singles = await asyncio.gather(*(single(i) for i in range(8)))
        else:
            first = asyncio.create_task(single(0))
            await asyncio.sleep(0.05)
            b = asyncio.create_task(batch())
            singles = [await first, *await asyncio.gather(*(single(i) for i in range(1, 8)))]
        await busy
        rb = await b
        return singles, rb, [done[f"s{i}"] for i in range(8)], done["batch"]


@pytest.mark.parametrize("batch_first", [True, False], ids=["batch_into_empty_queue", "batch_behind_a_waiting_query"])
def test_a_legal_batch_does_not_starve_single_queries(serve_index, tiny_bert_dir, batch_first):
    # max_batch_queries = max_queue, as in the defaults (256 / 256); max_batch 8: the batch is 4 chunks of 4
    settings = ServeSettings(port=0, max_queue=16, max_batch_queries=16, max_batch=8, max_wait_ms=2)
    app = create_app(serve_index, tiny_bert_dir, settings)
    with BackgroundServer(app) as srv:
        srv.wait_ready()
        svc = app.state.service
        svc.tower = _Slow(svc.tower, 0.4)
        singles, rb, single_done, batch_done = asyncio.run(_scenario(srv.url, batch_first))
        assert rb.status_code == 200 and len(rb.json()["results"]) == 16, rb.text
        assert [r.status_code for r in singles] == [200] * 8, [r.text[:120] for r in singles]
        assert all(len(r.json()["results"]) == 3 for r in singles)
        assert max(single_done) < batch_done  # the single queries were not queued behind the whole batch
