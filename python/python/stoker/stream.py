"""The part of ``stoker.torch.StokerIterableDataset`` that needs no PyTorch: iterating whole
batches with their metadata, and a ``state_dict``/``load_state_dict`` pair that torchdata's
``StatefulDataLoader`` (and any checkpointing code that looks for the two methods) saves and
restores with the model."""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, Optional

from stoker.batch import Batch
from stoker.loader import Loader


class BatchStream:
    """The batches of ``loader``'s current epoch, each a :class:`stoker.Batch` (it unpacks as
    ``images, labels`` and keeps ``keys``, ``step``, ``layout``, ``replaced`` and ``corrupt``),
    passed through ``convert`` when given."""

    def __init__(self, loader: Loader, convert: Optional[Callable[[Batch], Batch]] = None) -> None:
        self.loader = loader
        self._convert = convert

    def set_epoch(self, epoch: int) -> None:
        """As ``DistributedSampler.set_epoch``."""
        self.loader.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Batch]:
        convert = self._convert
        for batch in self.loader:
            yield convert(batch) if convert is not None else batch

    def state_dict(self) -> Dict[str, Any]:
        """The loader's position: every batch yielded so far is consumed."""
        return self.loader.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue from ``state`` (from ``state_dict``, possibly of another world size)."""
        self.loader.load_state_dict(state)
