"""The service's waiting room: two lanes of work items, admission and micro-batch assembly.

* **single** lane: ``POST /search`` (one query per request); **batch** lane: chunks of the
  ``POST /search/batch`` requests (a batch is split into chunks of at most ``max(1, max_batch // 2)``
  queries, each its own work item; the request is answered when all its chunks are).
* Admission (counted in queries, a batch by its size): the batch lane holds at most
  ``batch_cap = floor(batch_queue_share x max_queue)`` queries, except that a batch is always
  admitted into an empty batch lane (so no legal batch is refused for its size alone). A single
  query is admitted while ``singles + min(batch queries waiting, batch_cap) < max_queue`` (or
  nothing waits at all): batches count against the queue, yet single queries always keep at
  least ``max_queue - batch_cap`` places, whatever the batches do.
* Assembly: a micro-batch starts when the first item arrives and closes at ``max_batch`` queries
  or ``max_wait_ms`` after that first arrival. Micro-batches alternate which lane fills first;
  on the batch lane's turn it contributes one chunk (at most half of ``max_batch``) before the
  single queries. Single queries thus get at least half of every micro-batch while batches
  wait, and a waiting batch gets a chunk at least every second micro-batch.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque

from scalingnote.serve.processing import _Item


class Lanes:
    """Two FIFO lanes (single queries, batch chunks) with query counts; event-loop only."""

    def __init__(self, max_queue: int, batch_queue_share: float):
        self.max_queue = int(max_queue)
        self.batch_cap = math.floor(batch_queue_share * max_queue)
        self.singles: deque[_Item] = deque()
        self.batches: deque[_Item] = deque()
        self.queued_single = 0
        self.queued_batch = 0
        self.stopping = False
        self._wake = asyncio.Event()
        self._batch_turn = True

    @property
    def queued(self) -> int:
        return self.queued_single + self.queued_batch

    def admits(self, n: int, batch: bool) -> bool:
        """Whether a request of ``n`` queries may wait (see the module docstring)."""
        if batch:
            return self.queued_batch == 0 or self.queued_batch + n <= self.batch_cap
        return self.queued == 0 or self.queued_single + min(self.queued_batch, self.batch_cap) + n <= self.max_queue

    def put(self, item: _Item, batch: bool) -> None:
        (self.batches if batch else self.singles).append(item)
        if batch:
            self.queued_batch += len(item.texts)
        else:
            self.queued_single += len(item.texts)
        self._wake.set()

    def stop(self) -> None:
        """The batcher finishes what waits, then :meth:`next_batch` returns None."""
        self.stopping = True
        self._wake.set()

    def drain(self) -> list[_Item]:
        """Remove and return every waiting item."""
        items = [*self.singles, *self.batches]
        self.singles.clear()
        self.batches.clear()
        self.queued_single = self.queued_batch = 0
        return items

    def _head_time(self) -> float:
        return min(lane[0].enqueued for lane in (self.singles, self.batches) if lane)

    async def next_batch(self, max_batch: int, max_wait_s: float) -> list[_Item] | None:
        """Wait for the first item, then for more until ``max_batch`` queries or ``max_wait_s``
        after that item's arrival; None once stopped and empty."""
        loop = asyncio.get_running_loop()
        while not (self.singles or self.batches):
            if self.stopping:
                return None
            self._wake.clear()
            await self._wake.wait()
        deadline = self._head_time() + max_wait_s
        while self.queued < max_batch and not self.stopping:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), remaining)
            except TimeoutError:
                break
        return self._take(max_batch)

    def _take(self, max_batch: int) -> list[_Item]:
        out: list[_Item] = []
        room = [max_batch]

        def take(lane: deque[_Item], one: bool = False) -> None:
            while lane and len(lane[0].texts) <= room[0]:
                it = lane.popleft()
                out.append(it)
                room[0] -= len(it.texts)
                if lane is self.batches:
                    self.queued_batch -= len(it.texts)
                else:
                    self.queued_single -= len(it.texts)
                if one:
                    return

        if self._batch_turn:
            take(self.batches, one=True)
            take(self.singles)
            take(self.batches)
        else:
            take(self.singles)
            take(self.batches)
        self._batch_turn = not self._batch_turn
        if not out:  # an item larger than max_batch (not made by the service itself): alone
            lane = self.singles if self.singles else self.batches
            room[0] = len(lane[0].texts)
            take(lane, one=True)
        return out
