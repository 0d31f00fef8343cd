"""One rank's batch: images and labels as numpy arrays (or torch tensors) over the memory the
Rust client received them into, plus the keys and position for bookkeeping."""

from __future__ import annotations

from typing import Any, Iterator, List, Tuple

import numpy as np

#: The label the workers give a sample without one (``Loader(missing_label=...)`` changes it).
NO_LABEL = -1


class Batch:
    """A batch of one rank at one step.

    ``images`` is ``[B, H, W, 3]`` (NHWC, the default) or ``[B, 3, H, W]`` (NCHW), uint8 unless
    the job normalises on the workers; ``labels`` is int64 ``[B]`` (the loader's
    ``missing_label``, -1 by default, where a sample has no label). Both are views of the received buffers, not copies. ``replaced`` lists the indices of
    samples that could not be decoded and were replaced by black images; ``corrupt`` those whose
    JPEG data was damaged but still decoded (libjpeg warned; parts may be gray), kept as decoded.

    A batch unpacks like a pair: ``images, labels = batch``.
    """

    __slots__ = ("images", "labels", "keys", "epoch", "step", "rank", "replaced", "checksum", "layout", "corrupt")

    def __init__(
        self,
        images: Any,
        labels: Any,
        keys: List[str],
        epoch: int,
        step: int,
        rank: int,
        replaced: List[int],
        checksum: int,
        layout: str,
        corrupt: List[int],
    ) -> None:
        self.images = images
        self.labels = labels
        self.keys = keys
        self.epoch = epoch
        self.step = step
        self.rank = rank
        self.replaced = replaced
        self.checksum = checksum
        self.layout = layout
        self.corrupt = corrupt

    @classmethod
    def _from_native(cls, raw: Tuple[Any, ...], output: str, missing_label: int = -1) -> "Batch":
        flat, shape, dtype, layout, labels, keys, epoch, step, rank, replaced, checksum, corrupt = raw
        images = flat.view(np.dtype(dtype)).reshape(shape)
        if missing_label != NO_LABEL:
            labels[labels == NO_LABEL] = missing_label
        if output == "torch":
            import torch

            images = torch.from_numpy(images)
            labels = torch.from_numpy(labels)
        return cls(images, labels, keys, epoch, step, rank, replaced, checksum, layout, corrupt)

    def __len__(self) -> int:
        return len(self.keys)

    def __iter__(self) -> Iterator[Any]:
        return iter((self.images, self.labels))

    def __getitem__(self, index: int) -> Any:
        """``batch[0]`` is the images, ``batch[1]`` the labels, as for an ``(images, labels)``
        pair."""
        return (self.images, self.labels)[index]

    @property
    def batch_size(self) -> int:
        """Samples in the batch (what Lightning's ``self.log`` looks for)."""
        return len(self.keys)

    def _with(self, images: Any, labels: Any, layout: str = "") -> "Batch":
        """This batch's metadata over other images and labels (``layout`` if they changed it)."""
        return Batch(images, labels, self.keys, self.epoch, self.step, self.rank, self.replaced, self.checksum, layout or self.layout, self.corrupt)

    def to(self, *args: Any, **kwargs: Any) -> "Batch":
        """The batch with its tensors moved (``batch.to("cuda")``, ``batch.to(device,
        non_blocking=True)``), as ``torch.Tensor.to``; Lightning's and Accelerate's
        batch transfer call it. Numpy arrays become tensors first. The labels keep their
        dtype (int64) when a dtype is given: it applies to the images."""
        import torch

        images = self.images if isinstance(self.images, torch.Tensor) else torch.from_numpy(self.images)
        labels = self.labels if isinstance(self.labels, torch.Tensor) else torch.from_numpy(self.labels)
        device_args = [arg for arg in args if not isinstance(arg, torch.dtype)]
        label_kwargs = {key: value for key, value in kwargs.items() if key != "dtype"}
        return self._with(images.to(*args, **kwargs), labels.to(*device_args, **label_kwargs))

    def pin_memory(self) -> "Batch":
        """Pin torch tensors in page-locked memory (``DataLoader(pin_memory=True)`` calls this);
        numpy arrays are left as they are."""
        if hasattr(self.images, "pin_memory"):
            self.images, self.labels = self.images.pin_memory(), self.labels.pin_memory()
        return self

    def __repr__(self) -> str:
        shape = tuple(self.images.shape)
        return f"Batch(epoch={self.epoch}, step={self.step}, rank={self.rank}, images={shape} {self.images.dtype}, replaced={len(self.replaced)})"
