"""The loader against a real cluster: exactly-once over two rank processes, zero-copy arrays,
checkpoints, fork, and the iteration protocol."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np
import stoker

from conftest import SAMPLES

SMALL = [stoker.RandomResizedCrop(32), stoker.RandomHorizontalFlip()]


def loader(cluster, job_name: str, **overrides) -> stoker.Loader:
    settings = dict(batch_size=8, transforms=SMALL, rank=0, world_size=1, job_name=job_name, timeout=60)
    settings.update(overrides)
    return stoker.Loader(cluster.coordinator, cluster.dataset, **settings)


def test_two_rank_processes_see_every_key_once_per_epoch(cluster, job_name, tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import json, sys, stoker
        coordinator, job_name, out = sys.argv[1:4]
        loader = stoker.Loader(coordinator, "train", batch_size=8, tail="partial", job_name=job_name,
                               transforms=[stoker.RandomResizedCrop(32)], timeout=60)
        seen = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            steps = [batch.step for batch in loader for _ in [seen.extend((epoch, key) for key in batch.keys)]]
            assert steps == list(range(len(loader))), steps
        json.dump({"rank": loader.rank, "world_size": loader.world_size, "seen": seen}, open(out, "w"))
        """
    )
    processes = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2")
        out = tmp_path / f"rank{rank}.json"
        processes.append((subprocess.Popen([sys.executable, "-c", script, cluster.coordinator, job_name, str(out)], env=env), out))
    results = []
    for process, out in processes:
        assert process.wait(timeout=180) == 0
        results.append(json.loads(out.read_text()))
    assert sorted((result["rank"], result["world_size"]) for result in results) == [(0, 2), (1, 2)]
    for epoch in range(2):
        keys = Counter(key for result in results for seen_epoch, key in result["seen"] if seen_epoch == epoch)
        assert len(keys) == SAMPLES
        assert set(keys.values()) == {1}


def test_batches_are_views_over_the_received_memory(cluster, job_name) -> None:
    first = next(iter(loader(cluster, job_name)))
    images, labels = first
    assert images.shape == (8, 32, 32, 3) and images.dtype == np.uint8
    assert labels.shape == (8,) and labels.dtype == np.int64
    for array in (images, labels):
        assert not array.flags.owndata, "a copy owns its data; a view over the Rust buffer does not"
        assert array.base is not None
    assert images.flags.c_contiguous and images.flags.writeable
    assert len(first) == 8 and len(first.keys) == 8 and first.replaced == []
    assert set(labels.tolist()) <= set(range(4))


def test_layout_and_normalize_on_the_workers(cluster, job_name) -> None:
    transforms = [stoker.Resize(40), stoker.CenterCrop((24, 32)), stoker.Normalize(dtype="float16")]
    batch = next(iter(loader(cluster, job_name, transforms=transforms, layout="NCHW")))
    assert batch.images.shape == (8, 3, 24, 32) and batch.images.dtype == np.float16
    assert batch.layout == "NCHW"
    assert not batch.images.flags.owndata
    assert np.isfinite(batch.images).all() and float(np.abs(batch.images).max()) < 3.0


def test_an_epoch_has_len_steps_in_order_and_iterating_again_goes_on_with_the_next(cluster, job_name) -> None:
    """Issue 29, item 7: iterating again after a finished epoch goes on with the next one (as a
    DataLoader over a shuffling sampler gives a new order); it used to repeat the epoch."""
    rank0 = loader(cluster, job_name)
    assert len(rank0) == SAMPLES // 8
    first = [(batch.step, batch.checksum) for batch in rank0]
    assert [step for step, _ in first] == list(range(SAMPLES // 8))
    again = [(batch.step, batch.checksum) for batch in rank0]
    assert rank0.epoch == 1 and len(again) == len(first) and again != first
    rank0.set_epoch(1)
    second = [(batch.step, batch.checksum) for batch in rank0]
    assert second == again, "set_epoch(1) picks the epoch the loop went on with"
    rank0.set_epoch(0)
    assert [(batch.step, batch.checksum) for batch in rank0] == first, "set_epoch repeats an epoch"


def test_state_dict_round_trip_resumes_exactly(cluster, job_name) -> None:
    reference = [(batch.step, batch.checksum, batch.keys) for batch in loader(cluster, job_name + "-ref")]
    first = loader(cluster, job_name)
    iterator = iter(first)
    for _ in range(5):
        next(iterator)
    state = json.loads(json.dumps(first.state_dict()))
    assert state["job_name"] == job_name
    resumed = loader(cluster, job_name)
    resumed.load_state_dict(state)
    # Issue 16, item 3: len() is the epoch's steps and steps keep their epoch numbers.
    assert (len(resumed), resumed.steps_remaining) == (len(reference), len(reference) - 5)
    rest = [(batch.step, batch.checksum, batch.keys) for batch in resumed]
    assert rest == reference[5:]
    assert resumed.steps_remaining == 0


def test_a_state_saved_after_the_epoch_loop_resumes_at_the_next_epoch(cluster, job_name) -> None:
    """Issue 16, item 2: the README's pattern saves `state_dict()` after `for batch in loader`.
    That state said "this epoch, position 0", so a restarted run trained the finished epoch again;
    it now says "the next epoch, position 0", as torchdata's StatefulDataLoader does."""
    first = loader(cluster, job_name)
    first.set_epoch(3)
    steps = [batch.step for batch in first]
    assert steps == list(range(SAMPLES // 8))
    state = json.loads(json.dumps(first.state_dict()))
    assert (state["checkpoint"]["epoch"], state["checkpoint"]["position"]) == (4, 0), state
    del first
    reference = [(batch.step, batch.checksum) for batch in _epoch(loader(cluster, job_name + "-ref"), 4)]
    resumed = loader(cluster, job_name)
    resumed.load_state_dict(state)
    assert len(resumed) == SAMPLES // 8, "a whole epoch"
    assert [(batch.step, batch.checksum) for batch in resumed] == reference, "epoch 4 from its start"


def _epoch(rank_loader: stoker.Loader, epoch: int) -> stoker.Loader:
    rank_loader.set_epoch(epoch)
    return rank_loader


def test_a_forked_child_rebuilds_the_loader_and_continues_where_the_parent_stood(cluster, job_name) -> None:
    reference = [batch.keys for batch in loader(cluster, job_name + "-ref")]
    parent = loader(cluster, job_name)
    iterator = iter(parent)
    assert [next(iterator).keys for _ in range(2)] == reference[:2]
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report the keys it gets, never return into pytest
        code = 1
        try:
            os.close(read)
            got = [batch.keys for batch in parent]
            os.write(write, json.dumps(got).encode())
            code = 0
        except BaseException as error:  # noqa: BLE001 - reported to the parent
            os.write(write, json.dumps(f"{type(error).__name__}: {error}").encode())
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as pipe:
        reported = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, reported
    assert json.loads(reported) == reference[2:], "the child continues after the parent's last batch"


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_consuming_10_gb_of_batches_does_not_grow_memory(cluster, job_name) -> None:
    """Each batch's memory is freed when its arrays go: nothing is copied or kept."""
    target = int(float(os.environ.get("STOKER_RSS_TEST_GB", "10")) * 1e9)
    big = [stoker.Resize(256), stoker.CenterCrop(256), stoker.Normalize()]  # 786 KB a sample
    rank0 = loader(cluster, job_name, batch_size=16, transforms=big, shuffle="none")
    consumed, epoch, settled = 0, 0, None
    while consumed < target:
        rank0.set_epoch(epoch)
        for batch in rank0:
            consumed += batch.images.nbytes
            # By 3 GB every buffer the loader ever holds at once exists: the flow window of this
            # epoch plus the next epoch's first window, made early (up to twice `prefetch`).
            if settled is None and consumed >= 3e9:
                settled = resident_bytes()
        epoch += 1
    assert settled is not None
    growth = resident_bytes() - settled
    assert growth < 64 << 20, f"resident memory grew by {growth >> 20} MiB over {(consumed - 3e9) / 1e9:.1f} GB"
