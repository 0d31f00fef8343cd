"""``stoker.lightning.StokerDataModule``: a Stoker job as a Lightning ``LightningDataModule``.

::

    datamodule = StokerDataModule("coord:7400", "imagenet-train", batch_size=256,
                                  val_dataset="imagenet-val", transforms=stoker.imagenet_train())
    trainer = pl.Trainer(accelerator="gpu", devices=8, strategy="ddp", max_epochs=90)
    trainer.fit(model, datamodule=datamodule)              # or fit(..., ckpt_path="last.ckpt")

* The loaders are made in ``setup()``, after Lightning made the process group, so each
  process attaches as its own rank (``torch.distributed``'s rank and world size).
* The trainer drives the epoch: Lightning's ``set_epoch`` call at each epoch's start reaches the
  loader, as it reaches a ``DistributedSampler``.
* The loader's position is saved in Lightning checkpoints (the DataModule's ``state_dict``)
  and restored by ``fit(ckpt_path=...)``: a run restored mid-epoch trains on the rest of that
  epoch, nothing repeated and nothing lost. The position saved is that of the last batch that
  reached the model, not of the batch Lightning fetched ahead of it.
* Validation reads ``val_dataset`` with :meth:`stoker.Loader.for_eval` (every sample once,
  the pass starting at step 0 every time, also after the sanity check).
* Batches reach ``training_step`` as :class:`stoker.Batch` on the module's device (they
  unpack as ``images, labels``), images normalised there to ``dtype`` in channels-last
  NCHW unless ``normalize=False`` (uint8 as received).

Needs ``pytorch_lightning`` (or ``lightning``) and PyTorch.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Iterator, Optional, Sequence

import torch

try:  # the package Lightning's own docs use; pytorch_lightning where only that is installed
    import pytorch_lightning as pl
except ImportError:  # pragma: no cover - depends on the environment
    import lightning.pytorch as pl  # type: ignore[no-redef]

from stoker.batch import Batch
from stoker.errors import ConfigError
from stoker.loader import Loader
from stoker.torch import normalize_batch
from stoker.transforms import IMAGENET_MEAN, IMAGENET_STD

__all__ = ["StokerDataModule"]

#: States kept for batches fetched but not yet trained on (Lightning fetches one ahead).
_STATES_KEPT = 8


class _EpochSampler:
    """What Lightning calls ``set_epoch`` on (``dataloader.sampler``)."""

    def __init__(self, loader: Loader, follows_epochs: bool) -> None:
        self._loader = loader
        self._follows_epochs = follows_epochs

    def set_epoch(self, epoch: int) -> None:
        if self._follows_epochs and epoch != self._loader.epoch:
            self._loader.set_epoch(epoch)


class _LoaderIterable:
    """The iterable Lightning reads: the loader's batches, with the state after each kept until
    the batch reached the model (see ``StokerDataModule.state_dict``)."""

    def __init__(self, module: "StokerDataModule", loader: Loader, training: bool) -> None:
        self.loader = loader
        self.sampler = _EpochSampler(loader, follows_epochs=training)
        self.batch_sampler = None  # Lightning looks for one beside the sampler
        self._module = module
        self._training = training

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Batch]:
        for batch in self.loader:
            if self._training:
                self._module._fetched(batch, self.loader.state_dict())
            yield batch


class StokerDataModule(pl.LightningDataModule):
    """Training (and optionally validation) batches of a Stoker job for a Lightning
    ``Trainer``. ``coordinator`` (default ``STOKER_COORDINATOR``), ``dataset`` and
    ``batch_size`` as for :class:`stoker.Loader`; ``val_dataset`` and ``val_batch_size``
    (default ``batch_size``) for validation, read with ``val_settings`` passed to
    :meth:`stoker.Loader.for_eval`. ``normalize``: scale uint8 images on the device to
    ``(x / 255 - mean) / std`` of ``dtype``; ``loader_settings`` go to :class:`stoker.Loader`
    (``transforms``, ``seed``, ``shuffle``, ``prefetch``, ...)."""

    def __init__(
        self,
        coordinator: Optional[str] = None,
        dataset: Optional[str] = None,
        batch_size: Optional[int] = None,
        *,
        val_dataset: Optional[str] = None,
        val_batch_size: Optional[int] = None,
        val_settings: Optional[Dict[str, Any]] = None,
        normalize: bool = True,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        dtype: torch.dtype = torch.float32,
        **loader_settings: Any,
    ) -> None:
        super().__init__()
        coordinator = coordinator or os.environ.get("STOKER_COORDINATOR")
        if not coordinator:
            raise ConfigError(
                'StokerDataModule has no coordinator: write StokerDataModule("HOST:PORT", "DATASET", batch_size=...) '
                "or set STOKER_COORDINATOR=HOST:PORT (start one with `stoker coordinator`, or try `stoker demo`)"
            )
        if not isinstance(dataset, str) or not dataset:
            raise ConfigError(f'StokerDataModule needs dataset="NAME" (a dataset registered with `stoker dataset add`), got {dataset!r}')
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"StokerDataModule needs batch_size= (a positive int: per rank), got {batch_size!r}")
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ConfigError(f"StokerDataModule: dtype must be torch.float32, torch.float16 or torch.bfloat16, got {dtype!r}")
        for name in ("rank", "world_size", "output"):
            if name in loader_settings:
                raise ConfigError(f"StokerDataModule sets {name} itself (from the trainer's process group); leave {name}= out")
        self.coordinator, self.dataset, self.batch_size = coordinator, dataset, batch_size
        self.val_dataset, self.val_batch_size = val_dataset, val_batch_size or batch_size
        self.val_settings = dict(val_settings or {})
        self.loader_settings = loader_settings
        self.normalize, self.mean, self.std, self.dtype = normalize, tuple(mean), tuple(std), dtype
        self.train_loader: Optional[Loader] = None
        self.val_loader: Optional[Loader] = None
        self._pending_state: Optional[Dict[str, Any]] = None
        # The loader's state after each batch fetched, until the model took it; the position of
        # the last batch the model took.
        self._states: Dict[Any, Dict[str, Any]] = {}
        self._trained_state: Optional[Dict[str, Any]] = None

    def setup(self, stage: str) -> None:
        if stage in ("fit", "validate") and self.val_dataset and self.val_loader is None:
            self.val_loader = Loader.for_eval(self.coordinator, self.val_dataset, self.val_batch_size, output="torch", **self.val_settings)
        if stage == "fit" and self.train_loader is None:
            self.train_loader = Loader(self.coordinator, self.dataset, self.batch_size, output="torch", **self.loader_settings)
            if self._pending_state is not None:
                self.train_loader.load_state_dict(self._pending_state)
                self._pending_state = None

    def train_dataloader(self) -> _LoaderIterable:
        if self.train_loader is None:
            self.setup("fit")
        assert self.train_loader is not None
        return _LoaderIterable(self, self.train_loader, training=True)

    def val_dataloader(self) -> Any:
        if self.val_loader is None:
            if not self.val_dataset:
                return []
            self.setup("validate")
        assert self.val_loader is not None
        return _LoaderIterable(self, self.val_loader, training=False)

    def _fetched(self, batch: Batch, state_after: Dict[str, Any]) -> None:
        self._states[(batch.epoch, batch.step)] = state_after
        while len(self._states) > _STATES_KEPT:
            self._states.pop(next(iter(self._states)))

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        # Called as a batch goes to the model, after Lightning fetched the next one.
        if isinstance(batch, Batch) and self.trainer is not None and self.trainer.training:
            state = self._states.pop((batch.epoch, batch.step), None)
            if state is not None:
                self._trained_state = state
        return batch

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if self.normalize and isinstance(batch, Batch):
            return normalize_batch(batch, self.mean, self.std, self.dtype)
        return batch

    def state_dict(self) -> Dict[str, Any]:
        """The training loader's position after the last batch the model took."""
        if self._trained_state is not None:
            return {"loader": self._trained_state}
        if self.train_loader is not None:
            return {"loader": self.train_loader.state_dict()}
        return {}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        state = state_dict.get("loader")
        if state is None:
            return
        self._trained_state = state
        self._states.clear()
        if self.train_loader is None:
            self._pending_state = state
        else:
            self.train_loader.load_state_dict(state)

    def teardown(self, stage: str) -> None:
        if stage == "fit" and self.train_loader is not None:
            self.train_loader.close()
            self.train_loader = None
        if self.val_loader is not None and stage in ("fit", "validate"):
            self.val_loader.close()
            self.val_loader = None
