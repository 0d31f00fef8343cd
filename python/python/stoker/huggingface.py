"""Stoker under Hugging Face Accelerate and ``transformers.Trainer``.

Accelerate's ``prepare()`` shards and re-batches a ``DataLoader`` for each process: over Stoker's
per-rank stream that drops half the batches (``IterableDatasetShard``) or sends rank 0's to every
rank (``dispatch_batches``, the default for an ``IterableDataset``, which fails on rank 0 and hangs
the others). Stoker's stream is per rank already, so it must not go through ``prepare()``:

Accelerate::

    accelerator = Accelerator()
    loader = stoker.Loader("coord:7400", "imagenet-train", 256, transforms=..., output="torch")
    batches = stoker.huggingface.prepare_loader(accelerator, loader)  # not accelerator.prepare
    model, optimizer = accelerator.prepare(model, optimizer)
    for epoch in range(epochs):
        batches.set_epoch(epoch)
        for images, labels in batches:                                 # on accelerator.device
            ...
    accelerator.save_state("ckpt")   # the loader's position goes with it (and load_state)

``transformers.Trainer``: :class:`StokerTrainer` takes the loader as ``train_loader=`` and
keeps the position in every checkpoint folder; ``train(resume_from_checkpoint=...)`` goes on
from it (the Trainer's own batch skipping is turned off: it would skip again)::

    trainer = StokerTrainer(model=model, args=TrainingArguments(...), train_loader=loader)
    trainer.train(resume_from_checkpoint=True)
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, Iterator, Optional, Union

import torch

from stoker.batch import Batch
from stoker.errors import ConfigError
from stoker.loader import Loader
from stoker.torch import normalize_batch

__all__ = ["DeviceBatches", "prepare_loader", "StokerTrainer", "LOADER_STATE_FILE"]

#: The file in a Trainer checkpoint folder that holds the loader's position.
LOADER_STATE_FILE = "stoker_loader.json"


def as_inputs(batch: Batch) -> Dict[str, torch.Tensor]:
    """A batch as the keyword arguments of a vision model: ``pixel_values`` and ``labels``."""
    return {"pixel_values": batch.images, "labels": batch.labels}


class DeviceBatches:
    """A loader's batches on ``device``, normalised there (``normalize=True``: float32 NCHW in
    channels-last memory), passed through ``convert`` (for example :func:`as_inputs` for a
    ``transformers`` model). Has ``set_epoch``, ``len`` and ``state_dict``/``load_state_dict``
    (Accelerate's ``register_for_checkpointing`` saves it with ``save_state``)."""

    def __init__(
        self,
        loader: Loader,
        device: Union[str, torch.device, None] = None,
        normalize: bool = True,
        convert: Optional[Callable[[Batch], Any]] = None,
    ) -> None:
        if not isinstance(loader, Loader):
            raise ConfigError(f"DeviceBatches wraps a stoker.Loader, got {loader!r}")
        self.loader = loader
        self.device = None if device is None else torch.device(device)
        self.normalize = normalize
        self._convert = convert

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        for batch in self.loader:
            if self.device is not None:
                batch = batch.to(self.device, non_blocking=True)
            if self.normalize:
                batch = normalize_batch(batch)
            yield self._convert(batch) if self._convert is not None else batch

    def state_dict(self) -> Dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.loader.load_state_dict(state)


def prepare_loader(accelerator: Any, loader: Loader, normalize: bool = True, convert: Optional[Callable[[Batch], Any]] = None) -> DeviceBatches:
    """What ``accelerator.prepare`` would do for a per-rank stream: batches on the
    accelerator's device, registered for checkpointing, and no re-sharding or re-batching.
    The loader must have been made after the ``Accelerator`` (its process group gives the rank)."""
    if loader.world_size != accelerator.num_processes or loader.rank != accelerator.process_index:
        raise ConfigError(
            f"the loader is rank {loader.rank} of {loader.world_size}, the accelerator process {accelerator.process_index} of "
            f"{accelerator.num_processes}: make the stoker.Loader after Accelerator() (it then takes the process group's rank)"
        )
    batches = DeviceBatches(loader, accelerator.device, normalize=normalize, convert=convert)
    accelerator.register_for_checkpointing(batches)
    return batches


def _trainer_class() -> Any:
    import transformers

    return transformers.Trainer


class _StokerTrainerMixin:
    """The parts of :class:`StokerTrainer` that are not the Trainer itself."""

    def _stoker_init(self, train_loader: Loader, convert: Callable[[Batch], Any]) -> None:
        if not isinstance(train_loader, Loader):
            raise ConfigError(f"StokerTrainer(train_loader=...) takes a stoker.Loader, got {train_loader!r}")
        args = self.args  # type: ignore[attr-defined]
        if not args.ignore_data_skip:
            # The Trainer would skip the batches of a resumed epoch a second time.
            args.ignore_data_skip = True
        self._stoker_batches = DeviceBatches(train_loader, device=None, normalize=True, convert=convert)

    def get_train_dataloader(self) -> DeviceBatches:
        return self._stoker_batches

    def _save_checkpoint(self, model: Any, trial: Any, *args: Any, **kwargs: Any) -> None:
        super()._save_checkpoint(model, trial, *args, **kwargs)  # type: ignore[misc]
        if self.args.should_save:  # type: ignore[attr-defined]
            folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")  # type: ignore[attr-defined]
            with open(os.path.join(folder, LOADER_STATE_FILE), "w") as out:
                json.dump(self._stoker_batches.state_dict(), out)

    def train(self, resume_from_checkpoint: Union[str, bool, None] = None, *args: Any, **kwargs: Any) -> Any:
        folder = resume_from_checkpoint
        if folder is True:
            from transformers.trainer_utils import get_last_checkpoint

            folder = get_last_checkpoint(self.args.output_dir)  # type: ignore[attr-defined]
        if isinstance(folder, str):
            path = os.path.join(folder, LOADER_STATE_FILE)
            if not os.path.isfile(path):
                raise ConfigError(f"{folder} has no {LOADER_STATE_FILE}: it was not written by a StokerTrainer, so the loader's position is unknown")
            with open(path) as saved:
                self._stoker_batches.load_state_dict(json.load(saved))
        return super().train(resume_from_checkpoint, *args, **kwargs)  # type: ignore[misc]


def __getattr__(name: str) -> Any:
    # StokerTrainer subclasses transformers.Trainer, made on first use: importing transformers
    # takes seconds, and Accelerate users need none of it.
    if name == "StokerTrainer":
        trainer_base = _trainer_class()

        class StokerTrainer(_StokerTrainerMixin, trainer_base):  # type: ignore[misc, valid-type]
            """A ``transformers.Trainer`` that trains on a :class:`stoker.Loader` (given as
            ``train_loader=``): batches as ``pixel_values``/``labels`` (or ``convert``), the
            loader's position saved in each checkpoint folder and restored by
            ``train(resume_from_checkpoint=...)``."""

            def __init__(self, *args: Any, train_loader: Loader, convert: Callable[[Batch], Any] = as_inputs, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                self._stoker_init(train_loader, convert)

        globals()["StokerTrainer"] = StokerTrainer
        return StokerTrainer
    raise AttributeError(name)
