"""Issue 29, item 5: the GPU feed's ordering, checked on the CPU with a backend that records what
it is asked to do: the pinned pool is allocated once and reused, a pinned buffer is written again
only after the copy that read it ended, the training stream waits for each batch's copy before
reading it, and copies run ``device_prefetch`` batches ahead. ``device="cpu"`` runs the same feed
for real; a model-side mistake in ``device=`` fails at once with a ConfigError saying what to
write."""

from __future__ import annotations

import itertools
import json
from typing import Any, List, Tuple

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (make test installs it)")

import stoker  # noqa: E402
import stoker.device as stoker_device  # noqa: E402
import stoker.torch as stoker_torch  # noqa: E402

from conftest import SAMPLES  # noqa: E402

SMALL = [stoker.RandomResizedCrop(32), stoker.RandomHorizontalFlip()]
STEPS = SAMPLES // 8


class RecordingBackend(stoker_device.CpuBackend):
    """A CPU backend that logs every step; events are numbers, buffers named by their memory."""

    def __init__(self) -> None:
        super().__init__()
        self.log: List[Tuple[Any, ...]] = []
        self.events = itertools.count()

    @staticmethod
    def storage(tensor: torch.Tensor) -> int:
        return tensor.untyped_storage().data_ptr()

    def host_buffer(self, nbytes: int) -> torch.Tensor:
        buffer = super().host_buffer(nbytes)
        self.log.append(("alloc", self.storage(buffer)))
        return buffer

    def write_host(self, buffer: torch.Tensor, source: torch.Tensor) -> None:
        self.log.append(("write", self.storage(buffer)))
        super().write_host(buffer, source)

    def to_device(self, host: torch.Tensor) -> torch.Tensor:
        self.log.append(("copy", self.storage(host)))
        return super().to_device(host)

    def record(self) -> Any:
        event = next(self.events)
        self.log.append(("record", event))
        return event

    def synchronize(self, event: Any) -> None:
        self.log.append(("sync", event))

    def wait(self, event: Any) -> None:
        self.log.append(("wait", event))


def loader_on(cluster, job_name: str, backend: stoker_device.Backend, prefetch: int) -> stoker.Loader:
    loader = stoker.Loader(cluster.coordinator, cluster.dataset, 8, transforms=SMALL, rank=0, world_size=1, job_name=job_name, device="cpu", device_prefetch=prefetch)
    loader._device_feed = stoker_device.DeviceFeed(backend, slots=prefetch + 2, normalize=stoker.Normalize())
    return loader


@pytest.mark.parametrize("prefetch", [1, 3])
def test_the_feed_orders_copies_and_reuses_the_pinned_pool(cluster, job_name, prefetch: int) -> None:
    backend = RecordingBackend()
    loader = loader_on(cluster, job_name, backend, prefetch)
    for batch in itertools.chain(loader, loader):  # two epochs
        backend.log.append(("yield", batch.epoch, batch.step))
    log = backend.log
    assert sum(1 for entry in log if entry[0] == "alloc") == prefetch + 2, "the pool is allocated once"
    assert loader._device_feed.allocations == prefetch + 2
    # Every write of a buffer after its first use waits (sync) on the event recorded after the
    # copy that read it for the previous batch.
    last_copy_event = {}
    synced = set()
    for index, entry in enumerate(log):
        if entry[0] == "copy":
            following = next(e for e in log[index:] if e[0] == "record")
            last_copy_event[entry[1]] = following[1]
        elif entry[0] == "sync":
            synced.add(entry[1])
        elif entry[0] == "write" and entry[1] in last_copy_event:
            assert last_copy_event[entry[1]] in synced, f"buffer written at {index} before the copy that read it ended"
    # Each batch: copy, copy-done event, ready event; the training stream waits on ready before
    # the batch is yielded, and `prefetch` more are on their way by then.
    yields = [index for index, entry in enumerate(log) if entry[0] == "yield"]
    assert len(yields) == 2 * STEPS
    ready_events = [entry[1] for entry in log if entry[0] == "record"][1::2]
    waits = [index for index, entry in enumerate(log) if entry[0] == "wait"]
    assert [log[index][1] for index in waits] == ready_events
    for number, (wait_at, yield_at) in enumerate(zip(waits, yields)):
        assert wait_at < yield_at and not any(entry[0] == "yield" for entry in log[wait_at:yield_at])
        epoch_index = number % STEPS
        copies_before = sum(1 for entry in log[:yield_at] if entry[0] == "copy") // 2 - (number // STEPS) * STEPS
        assert copies_before == min(epoch_index + 1 + prefetch, STEPS), f"batch {number}: copies ahead"


def test_the_cpu_feed_yields_normalised_batches_and_checkpoints_exactly(cluster, job_name) -> None:
    plain = stoker.Loader(cluster.coordinator, cluster.dataset, 8, transforms=SMALL, rank=0, world_size=1, job_name=job_name + "-ref", output="torch")
    reference = [stoker_torch.normalize_batch(batch) for batch in plain]
    fed = stoker.Loader(cluster.coordinator, cluster.dataset, 8, transforms=SMALL, rank=0, world_size=1, job_name=job_name, device="cpu", device_prefetch=2)
    taken = []
    for batch in fed:
        taken.append(batch)
        if len(taken) == 3:
            state = json.loads(json.dumps(fed.state_dict()))
            break
    assert (state["checkpoint"]["epoch"], state["checkpoint"]["position"]) == (0, 3 * 8), "batches still on their way are not taken"
    for got, want in zip(taken, reference):
        assert got.images.dtype == torch.float32 and tuple(got.images.shape) == (8, 3, 32, 32) and got.layout == "NCHW"
        assert got.images.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(got.images, want.images)
        assert got.labels.tolist() == want.labels.tolist() and got.keys == want.keys
    resumed = stoker.Loader(cluster.coordinator, cluster.dataset, 8, transforms=SMALL, rank=0, world_size=1, job_name=job_name, device="cpu")
    resumed.load_state_dict(state)
    assert [batch.keys for batch in resumed] == [batch.keys for batch in reference[3:]]


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(device="gpu"), 'write device="cuda"'),
        (dict(device="cpu", device_normalize="half"), "stoker.Normalize"),
        (dict(device="cpu", device_prefetch=-1), "device_prefetch"),
        (dict(device="tpu"), "cuda"),
    ],
)
def test_a_model_side_mistake_is_a_config_error_saying_what_to_write(cluster, job_name, settings, message: str) -> None:
    with pytest.raises(stoker.ConfigError, match=message):
        stoker.Loader(cluster.coordinator, cluster.dataset, 8, transforms=SMALL, rank=0, world_size=1, job_name=job_name, **settings)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has a GPU")
def test_cuda_without_a_gpu_says_what_to_write(cluster, job_name) -> None:
    with pytest.raises(stoker.ConfigError, match='device="cpu"'):
        stoker.Loader(cluster.coordinator, cluster.dataset, 8, transforms=SMALL, rank=0, world_size=1, job_name=job_name, device="cuda")


def test_a_dtype_the_feed_cannot_make_says_which_it_can() -> None:
    with pytest.raises(stoker.ConfigError, match="float32"):
        stoker.Normalize(dtype=torch.int8)
    with pytest.raises(stoker.ConfigError, match="float"):
        stoker_torch.normalize_images(torch.zeros(1, 2, 2, 3, dtype=torch.uint8), "NHWC", dtype=torch.int32)
