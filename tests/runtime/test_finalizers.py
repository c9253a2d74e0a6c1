"""runtime.finalizers: cleanups run at once on an ordinary drop, on the reaper thread when
the drop happens inside a garbage collection or on one of dpgraph's threads."""

from __future__ import annotations

import gc
import logging
import threading

import pytest

from dpgraph.runtime import finalizers


class _Owner:
    pass


def _tracked(log: list[str]) -> _Owner:
    owner = _Owner()
    finalizers.when_dropped(owner, lambda: log.append(threading.current_thread().name))
    return owner


def test_an_ordinary_drop_cleans_up_at_once_in_the_dropping_thread() -> None:
    log: list[str] = []
    owner = _tracked(log)
    del owner
    assert log == [threading.current_thread().name]


def test_a_drop_inside_a_collection_cleans_up_on_the_reaper() -> None:
    log: list[str] = []
    owner = _tracked(log)
    owner.cycle = owner  # type: ignore[attr-defined]
    del owner
    gc.collect()
    assert finalizers.flush(timeout=10)
    assert log == ["dpgraph-reaper"]


def test_a_drop_on_a_dpgraph_thread_cleans_up_on_the_reaper() -> None:
    log: list[str] = []
    owner = [_tracked(log)]
    worker = threading.Thread(target=owner.clear, name="dpgraph-prefetch")
    worker.start()
    worker.join()
    assert finalizers.flush(timeout=10)
    assert log == ["dpgraph-reaper"]


def test_a_failing_cleanup_is_logged_and_the_next_ones_still_run(
        caplog: pytest.LogCaptureFixture) -> None:
    log: list[str] = []

    def fail() -> None:
        raise OSError("disk gone")

    first, second = _Owner(), _tracked(log)
    finalizers.when_dropped(first, fail)
    first.cycle, second.cycle = first, second  # type: ignore[attr-defined]
    del first, second
    with caplog.at_level(logging.ERROR, logger="dpgraph.runtime.finalizers"):
        gc.collect()
        assert finalizers.flush(timeout=10)
    assert log == ["dpgraph-reaper"]
    assert "a deferred cleanup failed" in caplog.text and "disk gone" in caplog.text


def test_must_defer_only_inside_collections_and_on_dpgraph_threads() -> None:
    assert not finalizers.must_defer()
    seen: list[bool] = []
    worker = threading.Thread(target=lambda: seen.append(finalizers.must_defer()),
                              name="dpgraph-decode4_0")
    worker.start()
    worker.join()
    assert seen == [True]


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_a_forked_child_gets_its_own_reaper() -> None:
    import os

    _tracked([])  # the parent's reaper runs
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: defer a cleanup and wait for it on a reaper of its own
        try:
            log: list[str] = []
            owner = _tracked(log)
            owner.cycle = owner  # type: ignore[attr-defined]
            del owner
            gc.collect()
            ok = finalizers.flush(timeout=10) and log == ["dpgraph-reaper"]
            os.write(write, b"ok" if ok else b"no")
        finally:
            os._exit(0)
    os.close(write)
    answer = os.read(read, 2)
    os.waitpid(pid, 0)
    os.close(read)
    assert answer == b"ok"
