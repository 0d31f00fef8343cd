"""Errors raise the right exception with a message that says what to do."""

from __future__ import annotations

import signal
import sys
import threading
import time

import pytest
import stoker

from conftest import run_stoker, write_image_folder


def test_the_hierarchy() -> None:
    for error in (stoker.ConfigError, stoker.ConnectionError, stoker.TimeoutError, stoker.ResumeError):
        assert issubclass(error, stoker.StokerError)
    assert issubclass(stoker.ResumeError, stoker.ConfigError)
    # Code written for any library catches Stoker's with the built-in names.
    assert issubclass(stoker.ConnectionError, ConnectionError)
    assert issubclass(stoker.TimeoutError, TimeoutError)
    assert stoker.TimeoutError.__module__ == "stoker"


def test_an_unknown_dataset_is_a_config_error_that_names_the_fix(cluster, job_name) -> None:
    with pytest.raises(stoker.ConfigError, match="stoker dataset add"):
        stoker.Loader(cluster.coordinator, "no-such-dataset", batch_size=8, rank=0, world_size=1, job_name=job_name)


def test_an_unreachable_coordinator_is_a_connection_error() -> None:
    started = time.monotonic()
    with pytest.raises(stoker.ConnectionError, match="127.0.0.1:9"):
        stoker.Loader("127.0.0.1:9", "train", batch_size=8, rank=0, world_size=1)
    with pytest.raises(ConnectionError):
        stoker.Loader("127.0.0.1:9", "train", batch_size=8, rank=0, world_size=1)
    assert time.monotonic() - started < 30


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: stoker.RandomResizedCrop(0), "positive"),
        (lambda: stoker.RandomResizedCrop(224, scale=(0.9, 0.1)), "low <= high"),
        (lambda: stoker.RandomResizedCrop(224, interpolation="lanczos"), "interpolation"),
        (lambda: stoker.RandomHorizontalFlip(p=2), "probability"),
        (lambda: stoker.Normalize(std=(0.2, 0.0, 0.2)), "positive"),
        (lambda: stoker.Normalize(dtype="float64"), "float32"),
        (lambda: stoker.CenterCrop((1, 2, 3)), "height, width"),
        (lambda: stoker.ColorJitter(hue=0.7), "hue"),
        (lambda: stoker.ColorJitter(brightness=(1.5, 0.5)), "low <= high"),
        (lambda: stoker.RandomGrayscale(p=-1), "probability"),
        (lambda: stoker.RandomErasing(value=300), "levels"),
        (lambda: stoker.RandomErasing(scale=(0.5, 2.0)), "scale"),
        (lambda: stoker.GaussianBlur(4), "odd"),
        (lambda: stoker.GaussianBlur(3, sigma=0), "sigma"),
        (lambda: stoker.RandAugment(magnitude=31), "magnitude"),
        (lambda: stoker.TrivialAugmentWide(num_magnitude_bins=1), "num_magnitude_bins"),
    ],
)
def test_bad_transform_arguments_are_config_errors(make, message: str) -> None:
    with pytest.raises(stoker.ConfigError, match=message):
        make()


def test_augmentations_write_the_json_the_workers_read() -> None:
    """torchvision's argument forms become the ranges of the Rust spec (common/plan's
    `Transform`); a spec with them is accepted by a worker in test_augment_parity.py."""
    assert stoker.ColorJitter(0.4, contrast=(0.5, 1.0), hue=0.1).to_dict() == {
        "type": "ColorJitter",
        "brightness": [0.6, 1.4],
        "contrast": [0.5, 1.0],
        "saturation": None,
        "hue": [-0.1, 0.1],
    }
    assert stoker.ColorJitter(brightness=1.5).to_dict()["brightness"] == [0.0, 2.5]
    assert stoker.RandomErasing.imagenet_mean().to_dict() == {
        "type": "RandomErasing",
        "p": 0.5,
        "scale": [0.02, 0.33],
        "ratio": [0.3, 3.3],
        "value": [124, 116, 104],
    }
    assert stoker.GaussianBlur((5, 3), sigma=1.5).to_dict() == {"type": "GaussianBlur", "kernel_size": [5, 3], "sigma": [1.5, 1.5]}
    assert stoker.RandomGrayscale().to_dict() == {"type": "RandomGrayscale", "p": 0.1}
    assert stoker.RandAugment().to_dict() == {"type": "RandAugment", "num_ops": 2, "magnitude": 9, "num_magnitude_bins": 31}
    assert stoker.TrivialAugmentWide().to_dict() == {"type": "TrivialAugmentWide", "num_magnitude_bins": 31}


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(rank=2, world_size=2), "outside world size"),
        (dict(shuffle="sometimes"), "window:K"),
        (dict(tail="wrap"), "partial"),
        (dict(metrics_port=-1), "metrics_port"),
        (dict(metrics_port="9102"), "metrics_port"),
        (dict(batch_size=0), "batch_size"),
        (dict(layout="HWC"), "NCHW"),
        (dict(transforms=[stoker.RandomHorizontalFlip(), stoker.RandomHorizontalFlip()]), "once"),
        (dict(transforms=["RandomResizedCrop"]), "stoker transforms"),
        (dict(prefetch=8, max_buffered_batches=4), "at least prefetch"),
        (dict(max_buffered_batches="many"), "max_buffered_batches"),
    ],
)
def test_bad_loader_settings_are_config_errors(cluster, job_name, settings, message: str) -> None:
    arguments = dict(batch_size=8, rank=0, world_size=1, job_name=job_name)
    arguments.update(settings)
    with pytest.raises(stoker.ConfigError, match=message):
        stoker.Loader(cluster.coordinator, "train", **arguments)


def test_a_bad_address_is_a_config_error() -> None:
    with pytest.raises(stoker.ConfigError, match="HOST:PORT"):
        stoker.Loader("no-port-here", "train", batch_size=8)


def test_a_state_of_another_dataset_order_is_a_resume_error(cluster, job_name) -> None:
    loader = stoker.Loader(cluster.coordinator, "train", batch_size=8, rank=0, world_size=1, job_name=job_name, seed=1)
    state = loader.state_dict()
    other = stoker.Loader(cluster.coordinator, "train", batch_size=8, rank=0, world_size=1, job_name=job_name + "-b", seed=2)
    with pytest.raises(stoker.ResumeError, match="seed"):
        other.load_state_dict(state)
    with pytest.raises(stoker.ResumeError, match="not a Stoker loader state"):
        other.load_state_dict({"position": 3})


def test_no_batch_within_the_timeout_is_a_timeout_error(idle_cluster, job_name) -> None:
    loader = stoker.Loader(idle_cluster.coordinator, "train", batch_size=8, rank=0, world_size=1, job_name=job_name, timeout=1)
    with pytest.raises(TimeoutError, match="stoker status") as raised:
        next(iter(loader))
    assert isinstance(raised.value, stoker.TimeoutError)


def test_ctrl_c_interrupts_a_loop_waiting_for_data(idle_cluster, job_name) -> None:
    loader = stoker.Loader(idle_cluster.coordinator, "train", batch_size=8, rank=0, world_size=1, job_name=job_name, timeout=120,
                           transforms=[stoker.CenterCrop(32)])
    main = threading.get_ident()
    timer = threading.Timer(0.5, lambda: signal.pthread_kill(main, signal.SIGINT))
    started = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            for _ in loader:
                pass
    finally:
        timer.cancel()
    assert time.monotonic() - started < 10


def test_ctrl_c_whose_keyboard_interrupt_a_finalizer_swallowed_still_stops_the_wait(idle_cluster, job_name, monkeypatch) -> None:
    """Python runs a SIGINT handler at the next Python code of the main thread; when that is a
    finalizer, its KeyboardInterrupt is printed as "Exception ignored" and dropped, and the loop
    went on to wait out its whole batch timeout (seen once in a clean-clone ``make test``, where
    the garbage collector closes the generators of earlier tests' loops). Here a finalizer runs,
    and swallows the Ctrl-C, just before the loop waits."""
    loader = stoker.Loader(idle_cluster.coordinator, "train", batch_size=8, rank=0, world_size=1, job_name=job_name, timeout=30,
                           transforms=[stoker.CenterCrop(32)])
    ignored = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: ignored.append(unraisable.exc_type))

    class Swallows:
        def __del__(self) -> None:
            signal.raise_signal(signal.SIGINT)  # the handler runs here, in the finalizer

    begin = loader._begin

    def begin_then_finalize() -> None:
        begin()
        Swallows()  # dropped at once

    monkeypatch.setattr(loader, "_begin", begin_then_finalize)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        for _ in loader:
            pass
    assert ignored == [KeyboardInterrupt], "the finalizer swallowed the Ctrl-C's KeyboardInterrupt"
    assert time.monotonic() - started < 10
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, "the loop put Python's handler back"


def test_a_sample_that_fails_under_on_error_fail_raises_naming_its_key(cluster, job_name, tmp_path) -> None:
    images, shards = tmp_path / "images", tmp_path / "shards"
    write_image_folder(images)
    (images / "class1" / "img003.jpg").write_bytes(b"this is not a JPEG")
    run_stoker("pack", "--input", str(images), "--output", str(shards), "--shard-size", "64KiB", "--threads", "1")
    run_stoker("dataset", "add", "bad", str(shards / "manifest.json"), "--coordinator", cluster.coordinator)
    loader = stoker.Loader(cluster.coordinator, "bad", batch_size=8, rank=0, world_size=1, job_name=job_name, on_error="fail",
                           transforms=[stoker.RandomResizedCrop(32)], timeout=60)
    started = time.monotonic()
    with pytest.raises(stoker.StokerError, match="img003.*on_error=fail") as raised:
        for _ in loader:
            pass
    assert not isinstance(raised.value, stoker.TimeoutError), "the job failed at once, not by the batch timeout"
    assert time.monotonic() - started < 30
