"""The quick start's progress display: a line per phase with the phase's planned
minutes and the ETA of the whole run, and — when the output is not a terminal, where progress
bars would flood a log — one line a minute instead of the bars (``show_progress`` is turned off
for the steps)."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO


def is_terminal(stream: TextIO | None = None) -> bool:
    """Whether progress bars would draw in place (tqdm and rich write to stderr)."""
    s = stream if stream is not None else sys.stderr
    try:
        return bool(s.isatty())
    except (AttributeError, ValueError):
        return False


class Progress:
    """Phases against a plan: :meth:`begin` starts a phase (one line), :meth:`end` records its
    seconds; :meth:`eta_s` is the rest of the plan, each remaining phase's planned seconds scaled by
    how the finished ones compared with theirs. ``heartbeat_s``: when set, a background thread
    prints one line per that many seconds (a non-terminal output), started by :meth:`start`."""

    def __init__(
        self,
        planned: dict[str, float],
        *,
        out: TextIO | None = None,
        heartbeat_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.planned = dict(planned)
        self.spent: dict[str, float] = {}
        self.out = out if out is not None else sys.stdout
        self.clock = clock
        self.t0 = clock()
        self.phase: str | None = None
        self._phase_t0 = self.t0
        self.heartbeat_s = heartbeat_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def replan(self, planned: dict[str, float]) -> None:
        """New planned seconds (the plan made again after the proxy); phases already spent keep their time."""
        self.planned = {k: self.spent.get(k, v) for k, v in planned.items()}

    def _say(self, msg: str) -> None:
        print(f"[quickstart] {msg}", file=self.out, flush=True)

    #: how far the pace may stretch the rest of the plan (spent / planned): a phase that ran 4x its plan
    #: (SciFact's students on a busy machine: 12.4 of 3.2 minutes) must stretch the ETA by 4x, not 3x
    MAX_RATIO = 10.0

    def ratio(self) -> float:
        """Spent / planned seconds of the finished phases (clamped to 0.5..:data:`MAX_RATIO`): how the
        plan is running."""
        done = [k for k in self.spent if self.planned.get(k, 0) > 1]
        if not done:
            return 1.0
        r = sum(self.spent[k] for k in done) / sum(self.planned[k] for k in done)
        return min(self.MAX_RATIO, max(0.5, r))

    def eta_s(self) -> float:
        """Seconds left: the remaining phases' planned time (scaled), less what the current one has run."""
        r = self.ratio()
        if (
            self.phase is not None and self.planned.get(self.phase, 0.0) > 1
        ):  # a phase running over its plan slows the rest too
            r = max(r, min(self.MAX_RATIO, (self.clock() - self._phase_t0) / self.planned[self.phase]))
        left = sum(v for k, v in self.planned.items() if k not in self.spent and k != self.phase) * r
        if self.phase is not None:
            left += max(0.0, self.planned.get(self.phase, 0.0) * r - (self.clock() - self._phase_t0))
        return left

    def begin(self, phase: str) -> None:
        self.phase, self._phase_t0 = phase, self.clock()
        self._say(
            f"phase {phase}: planned {self.planned.get(phase, 0.0) / 60:.1f} min; "
            f"{(self._phase_t0 - self.t0) / 60:.1f} min elapsed, ETA {self.eta_s() / 60:.1f} min for the whole run"
        )

    def end(self, phase: str, seconds: float | None = None) -> float:
        """Record ``phase`` done (``seconds``: as measured elsewhere, e.g. the run's laps)."""
        spent = self.clock() - self._phase_t0 if seconds is None else float(seconds)
        self.spent[phase] = spent
        if self.phase == phase:
            self.phase = None
        return spent

    def tick(self) -> None:
        """One status line (what the heartbeat prints)."""
        el = (self.clock() - self.t0) / 60
        if self.phase is None:
            self._say(f"{el:.1f} min elapsed, ETA {self.eta_s() / 60:.1f} min")
            return
        ran = (self.clock() - self._phase_t0) / 60
        self._say(
            f"{el:.1f} min elapsed: {self.phase} {ran:.1f} of "
            f"{self.planned.get(self.phase, 0.0) / 60:.1f} min planned, "
            f"ETA {self.eta_s() / 60:.1f} min"
        )

    def start(self) -> Progress:
        if self.heartbeat_s and self._thread is None:
            self._thread = threading.Thread(target=self._beat, name="quickstart-heartbeat", daemon=True)
            self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            self.tick()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> Progress:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


__all__ = ["Progress", "is_terminal"]
