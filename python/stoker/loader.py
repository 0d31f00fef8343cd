"""``stoker.Loader``: one trainer rank's view of a Stoker job, shaped like a PyTorch
``DataLoader`` with a ``DistributedSampler``."""

from __future__ import annotations

import json
from typing import Any, Dict, Iterator, Optional, Sequence

from stoker import _stoker
from stoker.batch import Batch
from stoker.errors import ConfigError
from stoker.transforms import Transform, imagenet_train

LAYOUTS = ("NHWC", "NCHW")
OUTPUTS = ("numpy", "torch")
ON_ERROR = ("replace", "fail")


class Loader:
    """Batches of one rank, every sample of an epoch exactly once across the ranks.

    ``coordinator`` is ``"HOST:PORT"``; ``dataset`` a name registered with
    ``stoker dataset add``. ``rank`` and ``world_size`` default to torchrun's ``RANK`` and
    ``WORLD_SIZE`` (else 0 and 1). Ranks that give the same settings share one job; the first to
    attach creates it.

    ``shuffle``: ``"window"`` (8 shards; ``"window:K"`` for K), ``"full"`` or ``"none"``.
    ``tail``: ``"drop"`` (whole steps only), ``"pad"`` (repeat a few samples, as
    ``DistributedSampler``) or ``"partial"`` (every sample once; the last step is smaller).
    ``prefetch``: steps the workers may run ahead of the slowest rank.
    ``output``: ``"numpy"`` arrays or ``"torch"`` tensors (both zero-copy).
    ``timeout``: seconds to wait for one batch before raising :class:`stoker.TimeoutError`.

    Iterating yields the batches of the current epoch in step order; ``set_epoch`` picks the
    epoch (as with ``DistributedSampler.set_epoch``). A ``for`` loop left early continues where
    it stopped the next time.
    """

    def __init__(
        self,
        coordinator: str,
        dataset: str,
        batch_size: int,
        *,
        transforms: Optional[Sequence[Transform]] = None,
        seed: int = 0,
        shuffle: str = "window",
        tail: str = "drop",
        prefetch: int = 8,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        layout: str = "NHWC",
        output: str = "numpy",
        dct_scaling: bool = True,
        on_error: str = "replace",
        job_name: Optional[str] = None,
        timeout: float = 300.0,
    ) -> None:
        if output not in OUTPUTS:
            raise ConfigError(f"output must be one of {', '.join(OUTPUTS)}, got {output!r}")
        if layout not in LAYOUTS:
            raise ConfigError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        if on_error not in ON_ERROR:
            raise ConfigError(f"on_error must be one of {', '.join(ON_ERROR)}, got {on_error!r}")
        for name, value in (("batch_size", batch_size), ("prefetch", prefetch)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive int, got {value!r}")
        if output == "torch":
            try:
                import torch  # noqa: F401
            except ImportError:
                raise ConfigError('output="torch" needs PyTorch: pip install torch') from None
        transforms = imagenet_train() if transforms is None else list(transforms)
        for transform in transforms:
            if not hasattr(transform, "to_dict"):
                raise ConfigError(f"transforms must be stoker transforms (stoker.RandomResizedCrop, ...), got {transform!r}")
        spec = {
            "transforms": [transform.to_dict() for transform in transforms],
            "layout": layout,
            "dct_scaling": bool(dct_scaling),
            "on_error": on_error,
        }
        self._output = output
        self._native = _stoker.NativeLoader(
            coordinator,
            dataset,
            batch_size,
            json.dumps(spec),
            seed=seed,
            shuffle=shuffle,
            tail=tail,
            prefetch=prefetch,
            rank=rank,
            world_size=world_size,
            job_name=job_name,
            timeout=float(timeout),
        )
        self.batch_size = batch_size

    def set_epoch(self, epoch: int) -> None:
        """Iterate ``epoch`` next (from its start, or from a loaded state's position in it)."""
        self._native.set_epoch(epoch)

    def __len__(self) -> int:
        """Steps (batches) of the current epoch for this rank."""
        return len(self._native)

    def __iter__(self) -> Iterator[Batch]:
        native, output = self._native, self._output
        while True:
            raw = native.next_batch()
            if raw is None:
                return
            batch = Batch._from_native(raw, output)
            del raw  # the caller's batch alone keeps the buffers alive
            yield batch

    def state_dict(self) -> Dict[str, Any]:
        """Where this rank stands: every batch before it has been yielded. Save it with the
        model's checkpoint; ``load_state_dict`` continues after it, with any world size."""
        return json.loads(self._native.state_json())

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue from ``state`` (from ``state_dict``, possibly of another world size)."""
        self._native.load_state_json(json.dumps(state))

    @property
    def rank(self) -> int:
        return self._native.rank

    @property
    def world_size(self) -> int:
        return self._native.world_size

    @property
    def job_name(self) -> str:
        """The job's name on the coordinator (``stoker status`` shows it)."""
        return self._native.job_name

    @property
    def wait_seconds(self) -> float:
        """Seconds this rank has waited for data: the data stall."""
        return self._native.wait_seconds

    @property
    def buffered_batches(self) -> int:
        """Batches received and not yet yielded (bounded by ``prefetch``)."""
        return self._native.buffered_batches

    def __repr__(self) -> str:
        return f"Loader(job={self.job_name!r}, rank={self.rank}, world_size={self.world_size}, batch_size={self.batch_size})"
