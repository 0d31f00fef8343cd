"""Issue 16, items 6 and 7: the PyTorch-facing API without surprises — DataLoader's
``shuffle=True/False``, ``timeout=None``, ``STOKER_COORDINATOR``, ``close()`` and ``with``,
``loader.epoch``, the wait per epoch, an evaluation preset, a logged default transform list,
and run ids that keep two identical runs apart."""

from __future__ import annotations

import warnings

import pytest
import stoker

from conftest import SAMPLES

SMALL = [stoker.RandomResizedCrop(32), stoker.RandomHorizontalFlip()]


def make(cluster, job_name: str, **overrides) -> stoker.Loader:
    settings = dict(batch_size=8, transforms=SMALL, rank=0, world_size=1, job_name=job_name, timeout=60)
    settings.update(overrides)
    return stoker.Loader(cluster.coordinator, cluster.dataset, **settings)


def test_shuffle_takes_dataloader_booleans_and_mode_names(cluster) -> None:
    names = {}
    for shuffle in (True, "window", False, "none", "block", "block:8:4"):
        with make(cluster, None, shuffle=shuffle) as loader:
            names[shuffle] = loader.job_name
    assert names[True] == names["window"] and names[False] == names["none"], names
    assert len({names[True], names[False], names["block"], names["block:8:4"]}) == 4, names
    with pytest.raises(stoker.ConfigError, match="shuffle"):
        make(cluster, None, shuffle=1.5)


def test_the_coordinator_comes_from_stoker_coordinator_when_not_given(cluster, job_name, monkeypatch) -> None:
    monkeypatch.setenv("STOKER_COORDINATOR", cluster.coordinator)
    with stoker.Loader(dataset=cluster.dataset, batch_size=8, transforms=SMALL, rank=0, world_size=1, job_name=job_name) as loader:
        assert len(next(iter(loader))) == 8
    monkeypatch.delenv("STOKER_COORDINATOR")
    with pytest.raises(stoker.ConfigError, match="STOKER_COORDINATOR"):
        stoker.Loader(dataset=cluster.dataset, batch_size=8, transforms=SMALL)


def test_a_list_of_coordinators_is_followed_past_one_that_is_down(cluster, job_name) -> None:
    # Nothing listens on 127.0.0.1:9 (UDP): the loader moves on to the coordinator that answers.
    with stoker.Loader(["127.0.0.1:9", cluster.coordinator], cluster.dataset, 8, transforms=SMALL, rank=0, world_size=1, job_name=job_name) as loader:
        assert len(next(iter(loader))) == 8
    with pytest.raises(stoker.ConfigError, match="HOST:PORT"):
        stoker.Loader(7400, cluster.dataset, 8)


def test_timeout_none_waits_forever_and_a_bad_timeout_says_so(cluster, job_name) -> None:
    with make(cluster, job_name, timeout=None) as loader:
        assert len(next(iter(loader))) == 8
    for bad in (0, -1, "5", True):
        with pytest.raises(stoker.ConfigError, match="timeout"):
            make(cluster, job_name, timeout=bad)


def test_close_and_with_detach_and_a_closed_loader_says_so(cluster, job_name) -> None:
    with make(cluster, job_name) as loader:
        next(iter(loader))
        assert not loader.closed
    assert loader.closed
    with pytest.raises(stoker.StokerError, match="closed"):
        next(iter(loader))
    loader.close()  # twice is harmless
    # The rank is free again: a new loader of the job gets its batches.
    with make(cluster, job_name) as again:
        assert len(next(iter(again))) == 8


def test_epoch_and_the_wait_of_each_epoch(cluster, job_name) -> None:
    with make(cluster, job_name) as loader:
        assert loader.epoch == 0
        steps = sum(1 for _ in loader)
        assert steps == len(loader) == SAMPLES // 8
        first_epoch_wait = loader.epoch_wait_seconds
        assert 0 < first_epoch_wait <= loader.wait_seconds
        loader.set_epoch(1)
        assert loader.epoch == 1 and loader.epoch_wait_seconds == 0.0
        assert loader.wait_seconds == pytest.approx(first_epoch_wait)


def test_for_eval_reads_every_sample_once_in_order_with_a_center_crop(cluster, job_name) -> None:
    with stoker.Loader.for_eval(cluster.coordinator, cluster.dataset, 7, size=32, resize=40, rank=0, world_size=1, job_name=job_name) as loader:
        batches = list(loader)
    keys = [key for batch in batches for key in batch.keys]
    assert len(keys) == len(set(keys)) == SAMPLES, "tail=partial: every sample once"
    assert len(batches) == -(-SAMPLES // 7) and len(batches[-1]) == SAMPLES % 7
    assert all(batch.images.shape[1:] == (32, 32, 3) for batch in batches)
    assert batches[0][0] is batches[0].images and batches[0][1] is batches[0].labels, "a batch indexes like a pair"
    # No shuffle, no random augmentation: a second pass is identical.
    with stoker.Loader.for_eval(
        cluster.coordinator, cluster.dataset, 7, size=32, resize=40, transforms=None, rank=0, world_size=1, job_name=job_name + "-b"
    ) as again:
        assert [(b.keys, b.checksum) for b in again] == [(b.keys, b.checksum) for b in batches]


def test_a_loader_without_transforms_says_what_it_applies(cluster, job_name) -> None:
    with pytest.warns(UserWarning, match="for_eval"):
        loader = stoker.Loader(cluster.coordinator, cluster.dataset, batch_size=8, rank=0, world_size=1, job_name=job_name)
    loader.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make(cluster, job_name + "-b").close()


def test_a_run_id_keeps_two_identical_runs_apart(cluster, monkeypatch) -> None:
    settings = dict(batch_size=8, transforms=SMALL, rank=0, world_size=1)
    with stoker.Loader(cluster.coordinator, cluster.dataset, run_id="a", **settings) as a, stoker.Loader(
        cluster.coordinator, cluster.dataset, run_id="b", **settings
    ) as b:
        assert a.job_name != b.job_name
        # Both runs get their rank's batches: neither takes the other's rank.
        assert len(next(iter(a))) == 8 and len(next(iter(b))) == 8
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "elastic-7")
    with stoker.Loader(cluster.coordinator, cluster.dataset, **settings) as elastic:
        assert elastic.job_name.endswith("-elastic-7"), elastic.job_name
    # torchrun without --rdzv-id says "none": no run id.
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    with stoker.Loader(cluster.coordinator, cluster.dataset, **settings) as plain:
        assert not plain.job_name.endswith("-none"), plain.job_name


def test_steps_iterates_by_global_step_across_epochs(cluster, job_name) -> None:
    """Issue 16, item 5 (its API half): a training loop that counts steps starts anywhere and
    rolls over epochs by itself."""
    per_epoch = SAMPLES // 8
    reference = {}
    for epoch in (0, 1, 2):
        with make(cluster, f"{job_name}-ref{epoch}") as ref:
            ref.set_epoch(epoch)
            reference.update({epoch * per_epoch + batch.step: batch.checksum for batch in ref})
    with make(cluster, job_name) as loader:
        start, total = per_epoch - 2, 2 * per_epoch + 3
        got = [(batch.epoch * len(loader) + batch.step, batch.checksum) for batch in loader.steps(start=start, total=total)]
        assert [step for step, _ in got] == list(range(start, total))
        assert got == [(step, reference[step]) for step in range(start, total)], "the same batches as epoch by epoch"
        state = loader.state_dict()
        assert (state["checkpoint"]["epoch"], state["checkpoint"]["position"]) == (2, 3 * 8)
    with pytest.raises(stoker.ConfigError, match="start"):
        next(make(cluster, job_name + "-bad").steps(start=-1))


def test_batches_arrive_over_tcp_or_quic_alike_and_a_bad_transport_says_so(cluster, job_name) -> None:
    seen = {}
    for transport in ("tcp", "quic"):
        with make(cluster, f"{job_name}-{transport}", batch_transport=transport) as loader:
            seen[transport] = [list(batch.keys) for batch in loader]
    assert seen["tcp"] == seen["quic"] and seen["tcp"], "the same batches, whichever way they came"
    with pytest.raises(stoker.ConfigError, match="batch_transport"):
        make(cluster, job_name, batch_transport="udp")
