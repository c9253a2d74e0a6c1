"""The input ops' Prefetcher: one batch read ahead, on the op's thread when the caller has
work to overlap it with, in the caller's thread when it comes straight back."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from dpgraph.data.prefetch import Prefetcher


class _Source:
    """Batches numbered by their tokens; remembers which thread read each one."""

    def __init__(self, seconds: float = 0.0, fail_at: int = -1) -> None:
        self.seconds, self.fail_at = seconds, fail_at
        self.readers: list[int] = []
        self.tokens = iter(range(10**6))

    def produce(self, token: int) -> int:
        self.readers.append(threading.get_ident())
        if self.seconds:
            time.sleep(self.seconds)
        if token == self.fail_at:
            raise ValueError(f"batch {token} is corrupt")
        return token

    def draw(self) -> int:
        return next(self.tokens)


def _deliver(prefetcher: Prefetcher, source: _Source, calls: int, gap: float) -> list[Any]:
    delivered = []
    for _ in range(calls):
        delivered.append(prefetcher.next(source.produce, source.draw))
        if gap:
            time.sleep(gap)
    return delivered


def test_a_caller_that_comes_straight_back_reads_ahead_itself() -> None:
    source, prefetcher = _Source(seconds=0.01), Prefetcher()
    assert _deliver(prefetcher, source, 12, 0.0) == list(range(12))
    assert source.readers[-3:] == [threading.get_ident()] * 3
    assert len(source.readers) == 13  # always one batch ahead
    prefetcher.close()


def test_a_caller_with_work_between_calls_overlaps_the_read_on_a_thread() -> None:
    source, prefetcher = _Source(seconds=0.001), Prefetcher()
    assert _deliver(prefetcher, source, 6, 0.02) == list(range(6))
    assert threading.get_ident() not in source.readers[1:]
    prefetcher.close()
    assert not any(t.name == "dpgraph-prefetch" and t.is_alive()
                   for t in threading.enumerate() if t is not threading.current_thread())


def test_a_reader_that_may_block_always_reads_on_the_thread() -> None:
    source, prefetcher = _Source(seconds=0.002), Prefetcher(may_block=True)
    _deliver(prefetcher, source, 8, 0.0)
    assert threading.get_ident() not in source.readers[1:]
    prefetcher.close()


@pytest.mark.parametrize("gap", [0.0, 0.01])
def test_a_failed_read_ahead_raises_when_its_batch_is_due(gap: float) -> None:
    source, prefetcher = _Source(seconds=0.001, fail_at=5), Prefetcher()
    assert _deliver(prefetcher, source, 5, gap) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="batch 5 is corrupt"):
        prefetcher.next(source.produce, source.draw)
    assert prefetcher.next(source.produce, source.draw) == 6  # reads synchronously again
    prefetcher.close()


@pytest.mark.parametrize("gap", [0.0, 0.01])
def test_close_drops_the_batch_read_ahead(gap: float) -> None:
    source, prefetcher = _Source(seconds=0.001), Prefetcher()
    _deliver(prefetcher, source, 6, gap)
    prefetcher.close()
    assert len(source.readers) == 7  # batch 6 was read (its records consumed), then dropped
    assert prefetcher.next(source.produce, source.draw) == 7
    prefetcher.close()


class _InterruptOnce:
    """A results queue whose first wait is cut short, as a Ctrl-C in the caller would."""

    def __init__(self, queue: Any) -> None:
        self.queue, self.interrupted = queue, False

    def put(self, item: Any) -> None:
        self.queue.put(item)

    def get(self, *args: Any, **kwargs: Any) -> Any:
        if not self.interrupted:
            self.interrupted = True
            raise KeyboardInterrupt
        return self.queue.get(*args, **kwargs)


def test_an_interrupted_wait_keeps_the_batches_in_order() -> None:
    source, prefetcher = _Source(seconds=0.002), Prefetcher(may_block=True)
    assert prefetcher.next(source.produce, source.draw) == 0
    prefetcher._results = _InterruptOnce(prefetcher._results)  # type: ignore[assignment]
    with pytest.raises(KeyboardInterrupt):
        prefetcher.next(source.produce, source.draw)
    assert _deliver(prefetcher, source, 4, 0.0) == [1, 2, 3, 4]
    prefetcher.close()


def test_ctrl_c_during_a_read_ahead_in_the_callers_thread_raises_at_once() -> None:
    source, prefetcher = _Source(seconds=0.002), Prefetcher()
    assert _deliver(prefetcher, source, 4, 0.0) == [0, 1, 2, 3]  # now reading ahead inline
    produce = source.produce

    def interrupted(token: int) -> int:
        if token == 5:
            raise KeyboardInterrupt
        return produce(token)

    with pytest.raises(KeyboardInterrupt):
        prefetcher.next(interrupted, source.draw)
    assert prefetcher.next(interrupted, source.draw) == 6  # the cut call's 4 and 5 are gone
    prefetcher.close()
