"""Issue 29, item 7: Ctrl-C and a coordinator that is down, as a trainer meets them."""

from __future__ import annotations

import signal
import socket
import threading
import time

import pytest
import stoker

SMALL = [stoker.CenterCrop(32)]


def interrupt_main_after(seconds: float) -> threading.Timer:
    main = threading.get_ident()
    timer = threading.Timer(seconds, lambda: signal.pthread_kill(main, signal.SIGINT))
    timer.start()
    return timer


def test_ctrl_c_stops_a_loader_still_connecting() -> None:
    """Ctrl-C during ``Loader()`` was ignored until the 10 s connect timed out."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:  # takes packets, never answers
        silent.bind(("127.0.0.1", 0))
        address = "127.0.0.1:%d" % silent.getsockname()[1]
        started = time.monotonic()
        timer = interrupt_main_after(0.5)
        try:
            with pytest.raises(KeyboardInterrupt):
                stoker.Loader(address, "train", batch_size=8, transforms=SMALL, rank=0, world_size=1)
        finally:
            timer.cancel()
    assert time.monotonic() - started < 5


def test_a_timeout_while_the_coordinator_is_down_names_the_coordinator(idle_cluster, job_name) -> None:
    """It blamed the workers ("are workers running?")."""
    loader = stoker.Loader(idle_cluster.coordinator, "train", batch_size=8, transforms=SMALL, rank=0, world_size=1, job_name=job_name, timeout=9)
    iterator = iter(loader)
    threading.Timer(1.0, idle_cluster.nodes[0].stop).start()
    with pytest.raises(stoker.TimeoutError, match="the coordinator has not answered") as raised:
        next(iterator)
    assert "are workers running" not in str(raised.value)


def test_a_timeout_with_the_coordinator_up_still_points_at_the_workers(idle_cluster, job_name) -> None:
    loader = stoker.Loader(idle_cluster.coordinator, "train", batch_size=8, transforms=SMALL, rank=0, world_size=1, job_name=job_name, timeout=3)
    with pytest.raises(stoker.TimeoutError, match="are workers running"):
        next(iter(loader))


def test_a_replaced_loader_yields_no_buffered_batch_once_its_successor_yields(cluster, job_name) -> None:
    """A loader replaced by a second one for the same rank still yielded one buffered batch
    before raising, so two loaders briefly handed out the same step."""
    settings = dict(batch_size=8, transforms=SMALL, rank=0, world_size=1, job_name=job_name, timeout=60)
    first = stoker.Loader(cluster.coordinator, cluster.dataset, **settings)
    iterator = iter(first)
    steps = [next(iterator).step for _ in range(2)]
    deadline = time.monotonic() + 10
    while first.buffered_batches < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert first.buffered_batches >= 2, "the test wants batches buffered ahead"
    second = stoker.Loader(cluster.coordinator, cluster.dataset, **settings)
    next(iter(second))
    with pytest.raises(stoker.StokerError, match="another trainer attached"):
        extra = next(iterator)
        pytest.fail(f"the replaced loader yielded step {extra.step} after {steps}")
