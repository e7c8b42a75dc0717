"""How many torch threads a lone stream's decode step runs on (DECODE_THREADS).

Such a step is ~150 small kernel calls. On a quiet machine a second thread splits each one
and the step is faster (one stream over HTTP on a 2-core Intel Xeon: 33 tokens/s on one
thread, 42 on two, bench/README.md); on a busy machine each call meets a descheduled thread
at its barrier and the step was up to 10x slower on two. No fixed count is right for both,
so by default (`auto`) the steps themselves decide: the count whose recent steps were faster
is used, and the other is timed again now and then, less often each time it loses.
"""

from __future__ import annotations

FIRST_TRIES = 3  # steps timed on each count before either is preferred
RETRY_EVERY = 16  # steps between tries of the other count, at first and after a switch
RETRY_AT_MOST = 1024  # the longest wait between tries, reached by doubling
WEIGHT = 0.25  # of a new step's time in the running estimate of its count


class LoneThreads:
    """`fixed`: the setting as a count (0: all `threads`), or None to choose by timing."""

    def __init__(self, fixed: int | None, threads: int) -> None:
        if fixed is None and threads <= 1:
            fixed = 1  # nothing to choose between
        self.fixed = (fixed or threads) if fixed is not None else None
        self.counts = (1, threads)
        self.seconds: dict[int, float] = {}
        self.tries = {count: 0 for count in self.counts}
        self.current = self.counts[-1]
        self.since, self.every = 0, RETRY_EVERY

    def pick(self) -> int:
        """The thread count for the next lone step."""
        if self.fixed is not None:
            return self.fixed
        if not self._timed():
            return min(self.counts, key=self.tries.get)
        return self._other() if self.since >= self.every else self.current

    def record(self, count: int, seconds: float) -> None:
        """A lone step on `count` threads took `seconds` (wall clock)."""
        if self.fixed is not None or count not in self.tries:
            return
        retried = self._timed() and count != self.current
        self.tries[count] += 1
        if retried:
            self._retried(count, seconds)
            return
        if self.tries[count] > FIRST_TRIES:
            self.since += 1
        known = self.seconds.get(count)
        self.seconds[count] = seconds if known is None else known + WEIGHT * (seconds - known)
        if self._timed():
            self.current = min(self.counts, key=self.seconds.__getitem__)

    def _timed(self) -> bool:
        return all(tries >= FIRST_TRIES for tries in self.tries.values())

    def _retried(self, count: int, seconds: float) -> None:
        # the other count's estimate is this fresh step alone: the one before may be stale
        self.seconds[count] = seconds
        self.since = 0
        if seconds < self.seconds[self.current]:
            self.current, self.every = count, RETRY_EVERY
        else:
            self.every = min(self.every * 2, RETRY_AT_MOST)

    def _other(self) -> int:
        low, high = self.counts
        return high if self.current == low else low
