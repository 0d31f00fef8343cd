"""Zero copy from the socket to the training loop, checked.

A batch's images arrive in one receive buffer (a `Payload` from the loader's pool, written by
the socket reads); Python gets a numpy array over that memory whose `base` is the
`PayloadOwner` holding the buffer, and torch tensors made from it (`output="torch"`,
`torch.from_numpy`) view the same memory. The buffer goes back to the pool when the owner
goes, which is when the last array or tensor viewing it is dropped, not before
(`Loader._native.free_receive_buffers` counts the buffers in the pool). Labels are not
in the payload: they travel in the batch header, and become a numpy array over the label vector
decoded from it (moved, not copied).
"""

from __future__ import annotations

import gc
import weakref
from typing import List, Tuple

import numpy as np

import stoker
from stoker.batch import Batch
from conftest import need_module, wait_until

torch = need_module("torch")

SMALL = [stoker.RandomResizedCrop(32), stoker.RandomHorizontalFlip()]
BATCH = 8


def owner_of(array: np.ndarray) -> object:
    """The object at the end of an array's `base` chain: what keeps its memory alive."""
    base = array
    while isinstance(base, np.ndarray):
        if base.base is None:
            return base
        base = base.base
    return base


def address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def test_arrays_and_tensors_of_a_batch_are_views_of_its_receive_buffer(cluster, job_name) -> None:
    with stoker.Loader(cluster.coordinator, "train", batch_size=BATCH, transforms=SMALL, rank=0, world_size=1, job_name=job_name) as loader:
        raw = loader._native.next_batch()  # what `for batch in loader` gets, before it wraps it
        flat = raw[0]
        assert flat.dtype == np.uint8 and flat.ndim == 1 and not flat.flags.owndata
        owner = flat.base
        assert type(owner).__name__ == "PayloadOwner", "the receive buffer's owner is the array's base"
        assert flat.nbytes == BATCH * 32 * 32 * 3

        as_numpy = Batch._from_native(raw, "numpy")
        as_torch = Batch._from_native(raw, "torch")
        del raw
        images = as_numpy.images
        assert owner_of(images) is owner and not images.flags.owndata
        assert address(images) == address(flat), "the images array starts at the receive buffer"
        assert isinstance(as_torch.images, torch.Tensor) and as_torch.images.data_ptr() == address(flat)
        assert as_torch.images.untyped_storage().nbytes() == flat.nbytes, "the tensor's storage is the buffer, not a copy"
        from_numpy = torch.from_numpy(images)
        channels_first = from_numpy.permute(0, 3, 1, 2)
        assert from_numpy.data_ptr() == channels_first.data_ptr() == address(flat)
        assert np.shares_memory(images, flat) and np.shares_memory(as_torch.images.numpy(), flat)

        # One memory: a write through the tensor is seen by the arrays.
        before = int(images[0, 0, 0, 0])
        as_torch.images[0, 0, 0, 0] = (before + 1) % 256
        assert int(flat[0]) == int(images[0, 0, 0, 0]) == (before + 1) % 256

        # Labels come from the header: a numpy array of their own, and torch shares it.
        labels = as_numpy.labels
        assert labels.dtype == np.int64 and not np.shares_memory(labels, flat)
        assert as_torch.labels.data_ptr() == address(labels)


def test_a_receive_buffer_returns_to_the_pool_only_after_every_view_is_dropped(cluster, job_name) -> None:
    """Hold every batch of an epoch, so nothing returns early; then drop a batch's views one by
    one: its buffer stays out of the pool (and its pixels unchanged) while any array or tensor
    views it, and is back in the pool the moment the last one goes."""
    with stoker.Loader(cluster.coordinator, "train", batch_size=BATCH, transforms=SMALL, rank=0, world_size=1, job_name=job_name, prefetch=2) as loader:
        held = list(loader)
        assert len(held) == len(loader) >= 3
        # The epoch is over. The loader still receives the first `prefetch` steps of the next
        # epoch (taking buffers from the pool), then nothing: the flow window holds the workers
        # at `prefetch` steps past what this rank consumed. From then on only drops change the
        # pool.
        settled: List[Tuple[int, int]] = []

        def quiet() -> bool:
            settled.append((loader.buffered_batches, loader._native.free_receive_buffers))
            return len(settled) > 20 and len(set(settled[-20:])) == 1 and settled[-1][0] == 2

        wait_until(quiet, 30, "the next epoch's first 2 steps to arrive, and nothing more")
        free = loader._native.free_receive_buffers
        keep = 2 * 2  # the pool keeps 2 * max(prefetch, 2) buffers
        assert free < keep, f"{free} buffers free while every batch is held"

        batch = held.pop(0)
        owner = weakref.ref(owner_of(batch.images))
        copy = batch.images.copy()
        tensor = torch.from_numpy(batch.images)
        nchw = tensor.permute(0, 3, 1, 2)
        crop = batch.images[1:3, 4:20]
        del batch
        for name in ("tensor", "nchw", "crop"):
            gc.collect()
            assert owner() is not None, f"a view ({name} and later ones) is alive: the buffer is not released"
            assert loader._native.free_receive_buffers == free, "no buffer returned while a view lives"
            if name == "tensor":
                del tensor
                assert np.array_equal(nchw.permute(0, 2, 3, 1).numpy(), copy), "the pixels did not change under the view"
            elif name == "nchw":
                del nchw
            else:
                del crop
        gc.collect()
        assert owner() is None, "the last view is gone, so is the buffer's owner"
        assert loader._native.free_receive_buffers == free + 1, "the buffer is back in the pool"

        # Every further batch dropped returns its buffer too, up to what the pool keeps.
        while held and loader._native.free_receive_buffers < keep:
            before = loader._native.free_receive_buffers
            del held[0]
            gc.collect()
            assert loader._native.free_receive_buffers == before + 1
        del held
        gc.collect()
        assert loader._native.free_receive_buffers == keep, "the pool keeps no more than 2 * prefetch buffers"
