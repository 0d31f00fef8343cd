"""PyTorch helpers: the GPU transform stage, the batch-level augmentations (``MixUp``,
``CutMix``, drawn per batch from its epoch, step and rank), and an adapter for
``torch.utils.data``.

Importing this module needs PyTorch; ``import stoker`` alone does not.
"""

from __future__ import annotations

import sys
from typing import Any, Iterator, Optional, Sequence, Tuple, Union

import torch
import torch.utils.data

from stoker.batch import Batch
from stoker.errors import ConfigError
from stoker.loader import Loader
from stoker.mix import CutMix, MixUp
from stoker.stream import BatchStream
from stoker.transforms import IMAGENET_MEAN, IMAGENET_STD

__all__ = ["to_device", "normalize_images", "normalize_batch", "StokerIterableDataset", "MixUp", "CutMix"]


def to_device(
    batch: Union[Batch, Tuple[Any, Any]],
    device: Union[str, torch.device],
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
    channels_last: bool = True,
    dtype: torch.dtype = torch.float32,
    layout: Optional[str] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Move a uint8 batch to ``device`` and normalise it there: ``(x / 255 - mean) / std``.

    Returns ``(images, labels)``: images ``[B, 3, H, W]`` of ``dtype`` (in channels-last memory
    unless ``channels_last=False``), labels int64 ``[B]``. On CUDA the copy is made from pinned
    memory with ``non_blocking=True``, so it overlaps with the work already queued on the GPU;
    the uint8 batch is a quarter of the bytes a float32 one would be. A batch the workers
    already normalised (float) is moved without normalising again.
    """
    if isinstance(batch, Batch):
        images, labels, layout = batch.images, batch.labels, batch.layout
    else:
        images, labels = batch
    layout = layout or "NHWC"
    images = images if isinstance(images, torch.Tensor) else torch.from_numpy(images)
    labels = labels if isinstance(labels, torch.Tensor) else torch.from_numpy(labels)
    device = torch.device(device)
    if images.dim() != 4:
        raise ConfigError(f"to_device expects a [B, H, W, C] or [B, C, H, W] batch, got shape {tuple(images.shape)}")
    if device.type == "cuda":
        images, labels = images.pin_memory(), labels.pin_memory()
    images = images.to(device, non_blocking=True)
    labels = labels.to(device, non_blocking=True)
    if layout == "NHWC":
        images = images.permute(0, 3, 1, 2)  # a view: NCHW indexing over NHWC (channels-last) memory
    if images.dtype == torch.uint8:
        # (x / 255 - mean) / std as one multiply and one subtract per element.
        scale = torch.tensor([1.0 / (255.0 * s) for s in std], device=device, dtype=dtype).view(1, 3, 1, 1)
        shift = torch.tensor([m / s for m, s in zip(mean, std)], device=device, dtype=dtype).view(1, 3, 1, 1)
        images = images.to(dtype).mul_(scale).sub_(shift)
    else:
        images = images.to(dtype)
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    return images.contiguous(memory_format=memory_format), labels


def normalize_images(
    images: torch.Tensor,
    layout: str,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
    dtype: torch.dtype = torch.float32,
    channels_last: bool = True,
) -> torch.Tensor:
    """uint8 ``[B, H, W, 3]`` (``layout="NHWC"``) or ``[B, 3, H, W]`` images, on whatever device
    they are, as ``(x / 255 - mean) / std`` of ``dtype``, ``[B, 3, H, W]`` in channels-last
    memory (or contiguous with ``channels_last=False``). Float images (normalised on the
    workers) are only converted."""
    if images.dim() != 4:
        raise ConfigError(f"expected a [B, H, W, C] or [B, C, H, W] batch, got shape {tuple(images.shape)}")
    if not dtype.is_floating_point:
        raise ConfigError(f"images normalise to a float dtype (torch.float32, torch.float16, torch.bfloat16), not {dtype}")
    if layout == "NHWC":
        images = images.permute(0, 3, 1, 2)  # a view: NCHW indexing over NHWC (channels-last) memory
    if images.dtype == torch.uint8:
        # (x / 255 - mean) / std as one multiply and one subtract per element.
        scale = torch.tensor([1.0 / (255.0 * s) for s in std], device=images.device, dtype=dtype).view(1, 3, 1, 1)
        shift = torch.tensor([m / s for m, s in zip(mean, std)], device=images.device, dtype=dtype).view(1, 3, 1, 1)
        images = images.to(dtype).mul_(scale).sub_(shift)
    else:
        images = images.to(dtype)
    return images.contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)


def normalize_batch(
    batch: Batch,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
    dtype: torch.dtype = torch.float32,
    channels_last: bool = True,
) -> Batch:
    """``batch`` with its images normalised where they are (see :func:`normalize_images`)."""
    images = batch.images if isinstance(batch.images, torch.Tensor) else torch.from_numpy(batch.images)
    labels = batch.labels if isinstance(batch.labels, torch.Tensor) else torch.from_numpy(batch.labels)
    return batch._with(normalize_images(images, batch.layout, mean, std, dtype, channels_last), labels, layout="NCHW")


def _as_tensors(batch: Batch) -> Batch:
    if not isinstance(batch.images, torch.Tensor):
        batch.images, batch.labels = torch.from_numpy(batch.images), torch.from_numpy(batch.labels)
    return batch


class StokerIterableDataset(BatchStream, torch.utils.data.IterableDataset):
    """A :class:`stoker.Loader` as a ``torch.utils.data.IterableDataset`` of whole batches, so
    a training loop written for a ``DataLoader`` keeps working::

        dataset = StokerIterableDataset(loader)
        data = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=0)
        for epoch in range(epochs):
            dataset.set_epoch(epoch)
            for images, labels in data:
                ...

    Use ``batch_size=None`` (the batches are already made) and ``num_workers`` 0 (or 1): the
    Stoker workers do the decoding, and several DataLoader workers would each attach as the
    same rank. Yields :class:`stoker.Batch` objects holding tensors, zero-copy over the received
    memory: they unpack as ``images, labels`` and keep ``keys``, ``step``, ``layout``,
    ``replaced`` and ``corrupt``. ``state_dict``/``load_state_dict`` make torchdata's
    ``StatefulDataLoader`` checkpoint the loader's position with the rest.
    """

    def __init__(self, loader: Loader) -> None:
        BatchStream.__init__(self, loader, convert=_as_tensors)

    def __iter__(self) -> Iterator[Batch]:
        info = torch.utils.data.get_worker_info()
        if info is not None:
            # One worker process would hold the position the parent's state_dict() cannot see,
            # and (persistent_workers) never hear of set_epoch; several would share one rank.
            raise ConfigError(
                f"StokerIterableDataset under a DataLoader with num_workers={info.num_workers}: a DataLoader worker process "
                "cannot follow the loader's epoch and checkpoint. Use DataLoader(dataset, batch_size=None, num_workers=0): "
                "Stoker's own workers decode the batches, so the training process only receives them."
            )
        return self._checked_iter()

    def _checked_iter(self) -> Iterator[Batch]:
        _refuse_accelerate_resharding()
        yield from BatchStream.__iter__(self)


def _refuse_accelerate_resharding() -> None:
    """Accelerate's ``prepare()`` of a DataLoader over this dataset shards it again
    (``IterableDatasetShard``: half the batches) or reads it on rank 0 for every rank
    (``dispatch_batches``: fails there, hangs the other ranks). Refuse with the recipe."""
    frame = sys._getframe(2)
    for _ in range(12):
        if frame is None:
            return
        if str(frame.f_globals.get("__name__", "")).startswith("accelerate."):
            raise ConfigError(
                "accelerator.prepare() was given a DataLoader over Stoker's per-rank stream: Accelerate would shard and re-batch "
                "it again across the processes. Leave it out of prepare(): "
                "batches = stoker.huggingface.prepare_loader(accelerator, loader) (batches on accelerator.device, saved by "
                "save_state), or use stoker.huggingface.StokerTrainer with transformers.Trainer"
            )
        frame = frame.f_back


def _collate_batches(batches: Sequence[Batch], *, collate_fn_map: Optional[dict] = None) -> Batch:
    """``default_collate`` of Stoker batches: ``DataLoader(dataset)`` (batch_size=1) passes each
    whole batch through; grouping several is refused (they are batches already)."""
    if len(batches) == 1:
        return batches[0]
    raise ConfigError(
        f"a DataLoader grouped {len(batches)} Stoker batches into one: they are batches already. "
        "Write DataLoader(dataset, batch_size=None) (the batch size is the stoker.Loader's)"
    )


torch.utils.data._utils.collate.default_collate_fn_map[Batch] = _collate_batches
