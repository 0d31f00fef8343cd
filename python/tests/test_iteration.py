"""Issue 29, item 7: ``iter(loader)`` means what it means for a PyTorch ``DataLoader``. Each
test here failed before the fix (see the docstrings for what was seen)."""

from __future__ import annotations

import itertools
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import stoker

from conftest import SAMPLES

SMALL = [stoker.RandomResizedCrop(32), stoker.RandomHorizontalFlip()]
STEPS = SAMPLES // 8


def make(cluster, job_name: str, **overrides) -> stoker.Loader:
    settings = dict(batch_size=8, transforms=SMALL, rank=0, world_size=1, job_name=job_name, timeout=60)
    settings.update(overrides)
    return stoker.Loader(cluster.coordinator, cluster.dataset, **settings)


def reference(cluster, job_name: str, epoch: int) -> list:
    loader = make(cluster, job_name)
    loader.set_epoch(epoch)
    return [(batch.epoch, batch.step, batch.checksum) for batch in loader]


def test_a_loop_that_took_exactly_len_batches_finished_the_epoch(cluster, job_name) -> None:
    """Lightning takes exactly ``len(loader)`` batches and never asks past the last: epoch 1
    then trained on zero batches (global_step 30 after max_epochs=2)."""
    loader = make(cluster, job_name)
    first = [(b.epoch, b.step, b.checksum) for b in itertools.islice(loader, len(loader))]
    assert first == reference(cluster, job_name + "-ref0", 0)
    second = [(b.epoch, b.step, b.checksum) for b in itertools.islice(loader, len(loader))]
    assert second == reference(cluster, job_name + "-ref1", 1), "the next iter() goes on with epoch 1"
    assert loader.epoch == 1


def test_a_loop_run_to_its_end_goes_on_with_the_next_epoch(cluster, job_name) -> None:
    """Wrapped in a DataLoader, epochs ran 30/0/30 batches and epoch 2 repeated epoch 0."""
    loader = make(cluster, job_name)
    epochs = [[(b.epoch, b.step, b.checksum) for b in loader] for _ in range(3)]
    assert [len(epoch) for epoch in epochs] == [STEPS] * 3
    assert [epoch[0][0] for epoch in epochs] == [0, 1, 2]
    assert epochs[2] == reference(cluster, job_name + "-ref", 2)
    state = loader.state_dict()
    assert (state["checkpoint"]["epoch"], state["checkpoint"]["position"]) == (3, 0)


def test_a_peeked_batch_is_not_taken_from_the_epoch(cluster, job_name) -> None:
    loader = make(cluster, job_name)
    start = loader.state_dict()
    peeked = next(iter(loader))
    assert (peeked.epoch, peeked.step) == (0, 0)
    assert loader.state_dict() == start and loader.steps_remaining == STEPS
    epoch = [(b.step, b.checksum) for b in loader]
    assert epoch == [(step, checksum) for _, step, checksum in reference(cluster, job_name + "-ref", 0)]
    assert epoch[0] == (0, peeked.checksum)


def test_a_loop_left_early_continues_where_it_stopped(cluster, job_name) -> None:
    loader = make(cluster, job_name)
    taken = []
    for batch in loader:
        taken.append(batch.step)
        if len(taken) == 3:
            break
    rest = [batch.step for batch in loader]
    assert taken + rest == list(range(STEPS)), "nothing lost, nothing repeated"


def test_a_state_taken_inside_the_loop_counts_the_batch_out(cluster, job_name) -> None:
    loader = make(cluster, job_name)
    for batch in loader:
        if batch.step == 4:
            state = json.loads(json.dumps(loader.state_dict()))
            break
    resumed = make(cluster, job_name)
    resumed.load_state_dict(state)
    assert [batch.step for batch in resumed] == list(range(5, STEPS))


def test_an_eval_loader_restarts_at_step_0_on_every_iter(cluster, job_name) -> None:
    """After Lightning's sanity check (num_sanity_val_steps=2) the first validation saw steps 2-7
    only (352 of 480 samples)."""
    evaluation = stoker.Loader.for_eval(cluster.coordinator, cluster.dataset, 8, size=32, resize=36, rank=0, world_size=1, job_name=job_name)
    sanity = [batch.step for batch in itertools.islice(evaluation, 2)]
    assert sanity == [0, 1]
    for _ in range(2):
        keys = [key for batch in evaluation for key in batch.keys]
        assert len(keys) == SAMPLES and len(set(keys)) == SAMPLES


def test_an_iter_with_nothing_left_warns(cluster, job_name) -> None:
    loader = make(cluster, job_name, batch_size=SAMPLES + 8)
    assert len(loader) == 0
    with pytest.warns(UserWarning, match="no steps"):
        assert list(loader) == []


def test_world_size_without_rank_is_refused(cluster, job_name, monkeypatch) -> None:
    """Lightning's DDP launcher sets WORLD_SIZE but not RANK: both processes attached as rank 0."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(stoker.ConfigError, match="RANK is not"):
        stoker.Loader(cluster.coordinator, cluster.dataset, 8, transforms=SMALL, job_name=job_name)


def test_the_eval_loader_is_exact_by_default(cluster, job_name, data_root: Path) -> None:
    """for_eval's DCT scaling made Resize + CenterCrop differ from torchvision/PIL by 1.9/255 per
    pixel on average; evaluation now decodes at full size by default."""
    from PIL import Image

    def mean_difference(loader: stoker.Loader) -> float:
        differences = []
        for batch in loader:
            for key, image in zip(batch.keys, batch.images):
                with Image.open(data_root / "images" / f"{key}.jpg") as source:
                    source = source.convert("RGB")
                    scale = 32 / min(source.size)
                    size = (max(32, round(source.size[0] * scale)), max(32, round(source.size[1] * scale)))
                    resized = np.asarray(source.resize(size, Image.BILINEAR), dtype=np.float32)
                top, left = (resized.shape[0] - 32) // 2, (resized.shape[1] - 32) // 2
                # Rounding of the centre differs by at most a pixel; compare the best of them.
                best = min(
                    float(np.abs(resized[top + dy : top + dy + 32, left + dx : left + dx + 32] - image.astype(np.float32)).mean())
                    for dy in (0, 1)
                    for dx in (0, 1)
                    if resized[top + dy : top + dy + 32, left + dx : left + dx + 32].shape == (32, 32, 3)
                )
                differences.append(best)
        return float(np.mean(differences))

    exact = stoker.Loader.for_eval(cluster.coordinator, cluster.dataset, 8, size=32, resize=32, rank=0, world_size=1, job_name=job_name)
    scaled = stoker.Loader.for_eval(
        cluster.coordinator, cluster.dataset, 8, size=32, resize=32, rank=0, world_size=1, job_name=job_name + "-dct", dct_scaling=True
    )
    exact_difference, scaled_difference = mean_difference(exact), mean_difference(scaled)
    assert exact_difference < scaled_difference, (exact_difference, scaled_difference)
    assert exact_difference < 1.5, exact_difference


def test_transforms_take_one_transform_alone(cluster, job_name) -> None:
    """A single transform gave "object is not iterable"."""
    loader = make(cluster, job_name, transforms=stoker.RandomResizedCrop(32))
    assert next(iter(loader)).images.shape == (8, 32, 32, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(stoker.ConfigError, match="stoker transforms"):
            make(cluster, job_name, transforms=[lambda image: image])


def test_a_restarted_run_rejoins_the_job_of_its_state_and_status_shows_live_jobs_first(cluster, monkeypatch) -> None:
    """Every torchrun launch has a new TORCHELASTIC_RUN_ID, so every restart made a new job (69
    after an hour of restarts, all in `stoker status`)."""
    from conftest import run_stoker

    run = uuid_hex()
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", f"first-{run}")
    first = stoker.Loader(cluster.coordinator, cluster.dataset, 8, transforms=SMALL, rank=0, world_size=1, timeout=60)
    steps = [batch.step for batch in itertools.islice(first, 3)]
    state = json.loads(json.dumps(first.state_dict()))
    first.close()
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", f"second-{run}")
    restarted = stoker.Loader(cluster.coordinator, cluster.dataset, 8, transforms=SMALL, rank=0, world_size=1, timeout=60)
    assert restarted.job_name != state["job_name"]
    restarted.load_state_dict(state)
    assert restarted.job_name == state["job_name"], "the restart rejoins its job"
    assert steps + [batch.step for batch in restarted] == list(range(STEPS))
    jobs = json.loads(run_stoker("status", "--coordinator", cluster.coordinator, "--json").stdout)["jobs"]
    live = [bool(job["live_ranks"]) for job in jobs]
    assert live == sorted(live, reverse=True), "live jobs first"
    assert jobs[0]["live_ranks"] == [0] and state["job_name"] in [job["name"] for job in jobs if job["live_ranks"]]


def uuid_hex() -> str:
    import uuid

    return uuid.uuid4().hex[:8]
