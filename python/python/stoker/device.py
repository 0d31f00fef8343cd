"""The GPU feed behind ``stoker.Loader(..., device="cuda")``: batches copied to the device ahead
of the training loop and normalised there.

Each received batch is copied once, by the CPU, into a page-locked (pinned) host buffer of a
small pool allocated (and so registered with the driver) once and reused, and its receive
buffer goes back to the loader's pool at once. A side stream copies it to the device and
normalises it there (uint8 to ``dtype``, NCHW in channels-last memory), ``device_prefetch``
batches ahead of the training loop. Events order the work, so that:

* the training stream never reads a batch before its copy and normalisation ended (it waits
  on the batch's ``ready`` event, on the GPU, without blocking the Python thread);
* a pinned buffer is never written for a new batch before the copy that reads it ended (the
  CPU waits on that copy's event, which has long passed when the pool holds
  ``device_prefetch + 2`` buffers);
* memory the side stream made and the training stream uses is not reused by PyTorch's caching
  allocator before the training stream is done with it (``record_stream``).

The old way, ``batch.pin_memory()`` then ``.to(device, non_blocking=True)`` per batch, pins
fresh memory every batch (``cudaHostAlloc``: slow, serialising) and copies on the training
stream. ``scripts/gpu-feed-bench`` measures one against the other.

All device work goes through a :class:`Backend`, so the ordering is tested on a CPU with a
backend that records what happens (``tests/test_device_feed.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Sequence

import torch

from stoker.batch import Batch
from stoker.errors import ConfigError
from stoker.torch import normalize_images
from stoker.transforms import IMAGENET_MEAN, IMAGENET_STD, Normalize, _dtype_name

__all__ = ["Backend", "CudaBackend", "CpuBackend", "DeviceFeed", "resolve_device"]

FLOAT_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_device(device: Any) -> torch.device:
    """``device=`` as a ``torch.device`` this process can use, or :class:`ConfigError` saying
    what to write."""
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ConfigError(f"device={device!r} is not a torch device: write device=\"cuda\" (or \"cuda:0\", \"cpu\")") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                f"device={device!r}, but this process sees no CUDA GPU (torch.cuda.is_available() is False): "
                "write device=\"cpu\", or leave device out for host batches"
            )
        count = torch.cuda.device_count()
        if resolved.index is not None and resolved.index >= count:
            raise ConfigError(f"device={device!r}, but this process sees {count} GPU(s): write device=\"cuda:{count - 1}\" at most (or \"cuda\" for the current one)")
    elif resolved.type != "cpu":
        raise ConfigError(f"device={device!r}: the feed supports \"cuda\" and \"cpu\" devices")
    return resolved


def resolve_normalize(normalize: Optional[Normalize]) -> Normalize:
    if normalize is None:
        return Normalize(IMAGENET_MEAN, IMAGENET_STD, "float32")
    if not isinstance(normalize, Normalize):
        raise ConfigError(f"device_normalize must be a stoker.Normalize(mean, std, dtype), got {normalize!r}")
    name = _dtype_name(normalize.dtype) if normalize.dtype != torch.bfloat16 else "bfloat16"
    if name not in FLOAT_DTYPES:
        raise ConfigError(f"device_normalize: dtype must be float32, float16 or bfloat16, got {normalize.dtype!r}")
    return normalize


class Backend:
    """What the feed does on a device. :class:`CudaBackend` does it with CUDA streams and
    events; :class:`CpuBackend` synchronously; tests substitute one that records the order."""

    device: torch.device

    def host_buffer(self, nbytes: int) -> torch.Tensor:
        """A pinned uint8 host buffer of ``nbytes`` (allocated once per pool slot)."""
        raise NotImplementedError

    def write_host(self, buffer: torch.Tensor, source: torch.Tensor) -> None:
        """Copy ``source`` (the received bytes) into ``buffer`` on the CPU."""
        buffer.copy_(source)

    def to_device(self, host: torch.Tensor) -> torch.Tensor:
        """Start copying ``host`` to the device on the side stream (inside :meth:`side`)."""
        raise NotImplementedError

    def side(self) -> Any:
        """A context in which work goes to the side stream."""
        raise NotImplementedError

    def record(self) -> Any:
        """An event recorded on the side stream now."""
        raise NotImplementedError

    def synchronize(self, event: Any) -> None:
        """Block the CPU until ``event`` passed."""
        raise NotImplementedError

    def wait(self, event: Any) -> None:
        """Make the training (current) stream wait for ``event``, without blocking the CPU."""
        raise NotImplementedError

    def hand_over(self, tensor: torch.Tensor) -> None:
        """``tensor`` was made on the side stream and is used on the training stream from now."""


class CudaBackend(Backend):
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device=device)

    def host_buffer(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def to_device(self, host: torch.Tensor) -> torch.Tensor:
        return host.to(self.device, non_blocking=True)

    def side(self) -> Any:
        return torch.cuda.stream(self.stream)

    def record(self) -> Any:
        event = torch.cuda.Event()
        event.record(self.stream)
        return event

    def synchronize(self, event: Any) -> None:
        event.synchronize()

    def wait(self, event: Any) -> None:
        torch.cuda.current_stream(self.device).wait_event(event)

    def hand_over(self, tensor: torch.Tensor) -> None:
        tensor.record_stream(torch.cuda.current_stream(self.device))


class _NoStream:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: Any) -> None:
        return None


class CpuBackend(Backend):
    """Everything at once, on the CPU; the "copy" to the device is a copy out of the pool's
    buffer, which the next batch reuses."""

    def __init__(self) -> None:
        self.device = torch.device("cpu")

    def host_buffer(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8)

    def to_device(self, host: torch.Tensor) -> torch.Tensor:
        return host.clone()

    def side(self) -> Any:
        return _NoStream()

    def record(self) -> Any:
        return None

    def synchronize(self, event: Any) -> None:
        return None

    def wait(self, event: Any) -> None:
        return None


@dataclass
class _Slot:
    """One pinned buffer of the pool (images, then labels) and the copy that last read it."""

    buffer: Optional[torch.Tensor] = None
    copy_done: Any = None


@dataclass
class InFlight:
    """A batch on its way: device tensors not to be read before ``ready``."""

    batch: Batch
    images: torch.Tensor
    labels: torch.Tensor
    ready: Any


class DeviceFeed:
    """Copies batches to a device through a pool of ``slots`` pinned buffers; see the module
    documentation for the ordering it keeps."""

    def __init__(self, backend: Backend, slots: int, normalize: Normalize, channels_last: bool = True) -> None:
        if slots < 2:
            raise ConfigError(f"the device feed needs at least 2 pinned buffers, got {slots}")
        self.backend = backend
        self._slots: List[_Slot] = [_Slot() for _ in range(slots)]
        self._next = 0
        self._mean: Sequence[float] = tuple(normalize.mean)
        self._std: Sequence[float] = tuple(normalize.std)
        dtype = normalize.dtype
        self._dtype = dtype if isinstance(dtype, torch.dtype) else FLOAT_DTYPES[_dtype_name(dtype) or "float32"]
        self._channels_last = channels_last
        #: Pinned buffers allocated so far (each slot once, again only for a larger batch).
        self.allocations = 0

    def submit(self, batch: Batch) -> InFlight:
        """Start moving ``batch`` to the device; its received memory is free on return."""
        images = batch.images if isinstance(batch.images, torch.Tensor) else torch.from_numpy(batch.images)
        labels = batch.labels if isinstance(batch.labels, torch.Tensor) else torch.from_numpy(batch.labels)
        image_bytes = images.reshape(-1).view(torch.uint8)
        label_bytes = labels.reshape(-1).view(torch.uint8)
        nbytes = image_bytes.numel() + label_bytes.numel()
        slot = self._slots[self._next % len(self._slots)]
        self._next += 1
        if slot.copy_done is not None:
            # The copy that read this buffer for an earlier batch must have ended.
            self.backend.synchronize(slot.copy_done)
            slot.copy_done = None
        if slot.buffer is None or slot.buffer.numel() < nbytes:
            slot.buffer = self.backend.host_buffer(nbytes)
            self.allocations += 1
        host_images = slot.buffer[: image_bytes.numel()]
        host_labels = slot.buffer[image_bytes.numel() : nbytes]
        self.backend.write_host(host_images, image_bytes)
        self.backend.write_host(host_labels, label_bytes)
        shape, dtype, layout = tuple(images.shape), images.dtype, batch.layout
        meta = batch._with(None, None)
        del batch, images, labels, image_bytes, label_bytes  # the receive buffer goes back now
        with self.backend.side():
            device_images = self.backend.to_device(host_images)
            device_labels = self.backend.to_device(host_labels)
            slot.copy_done = self.backend.record()
            shaped = device_images.view(dtype).view(shape)
            normalized = normalize_images(shaped, layout, self._mean, self._std, self._dtype, self._channels_last)
            ready = self.backend.record()
        return InFlight(meta, normalized, device_labels.view(torch.int64), ready)

    def take(self, in_flight: InFlight) -> Batch:
        """The batch for the training loop: its stream waits for the batch to be ready."""
        self.backend.wait(in_flight.ready)
        self.backend.hand_over(in_flight.images)
        self.backend.hand_over(in_flight.labels)
        return in_flight.batch._with(in_flight.images, in_flight.labels, layout="NCHW")
