"""MixUp and CutMix: batch-level augmentations on the trainer (they need the whole batch), as
torchvision v2's ``MixUp`` and ``CutMix`` compute them, with their random draws a pure function
of ``(seed, epoch, rank, step)``: a resumed run, or a rerun on other workers, mixes every batch
as before. Use them through :mod:`stoker.torch` (``stoker.torch.MixUp``)."""

from __future__ import annotations

import math
import random
from typing import Any, Dict, Optional, Tuple

import torch

from stoker.errors import ConfigError


class _BatchMix:
    """What MixUp and CutMix share: arguments, the per-batch generator, the label mixing."""

    _name = ""

    def __init__(self, alpha: float = 1.0, num_classes: Optional[int] = None, seed: int = 0) -> None:
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not (alpha > 0 and math.isfinite(alpha)):
            raise ConfigError(f"{self._name}: alpha must be a positive number, got {alpha!r}")
        if num_classes is not None and (isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1):
            raise ConfigError(f"{self._name}: num_classes must be a positive int, got {num_classes!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError(f"{self._name}: seed must be an int, got {seed!r}")
        self.alpha = float(alpha)
        self.num_classes = num_classes
        self.seed = seed

    def generator(self, epoch: int, step: int, rank: int = 0) -> random.Random:
        """The batch's own generator: Python's ``random.Random`` seeded with a string of
        (kind, seed, epoch, rank, step), which it hashes with SHA-512, so the same on every
        machine and in every process, whatever ``PYTHONHASHSEED`` is."""
        return random.Random(f"stoker.{self._name}:{self.seed}:{epoch}:{rank}:{step}")

    def _key(self, batch: Any, epoch: Optional[int], step: Optional[int], rank: Optional[int]) -> Tuple[int, int, int]:
        if batch is not None:
            return int(batch.epoch), int(batch.step), int(batch.rank)
        if epoch is None or step is None:
            raise ConfigError(f"{self._name}: give the stoker.Batch the images came from (batch=...) or epoch= and step= (and rank=)")
        return int(epoch), int(step), int(rank or 0)

    def _mix_labels(self, labels: torch.Tensor, lam: float) -> torch.Tensor:
        """torchvision's ``_mixup_label``: one-hot (index labels), then the batch rolled by one
        weighted ``1 - lam`` plus itself weighted ``lam``."""
        if labels.ndim not in (1, 2):
            raise ConfigError(f"{self._name}: labels must be [B] class indices or [B, num_classes] probabilities, got shape {tuple(labels.shape)}")
        if labels.ndim == 1:
            if self.num_classes is None:
                raise ConfigError(f"{self._name}: num_classes is needed to one-hot index labels")
            labels = torch.nn.functional.one_hot(labels.long(), num_classes=self.num_classes)
        elif self.num_classes is not None and labels.shape[-1] != self.num_classes:
            raise ConfigError(f"{self._name}: labels have {labels.shape[-1]} classes, num_classes is {self.num_classes}")
        if not labels.dtype.is_floating_point:
            labels = labels.float()
        return labels.roll(1, 0).mul_(1.0 - lam).add_(labels.mul(lam))

    def _check(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        if images.ndim != 4 or images.shape[0] != labels.shape[0]:
            raise ConfigError(
                f"{self._name}: expected images [B, C, H, W] (what stoker.torch.to_device returns) and labels [B, ...], "
                f"got {tuple(images.shape)} and {tuple(labels.shape)}"
            )


class MixUp(_BatchMix):
    """torchvision v2's ``MixUp(alpha, num_classes)``: ``lam ~ Beta(alpha, alpha)``, each image
    becomes ``lam * image + (1 - lam) * previous image`` of the batch (rolled by one), and the
    labels (one-hot) are mixed alike. The images must be float ``[B, C, H, W]`` (after
    ``stoker.torch.to_device`` or ``normalize_images``), as torchvision needs.

    >>> mixup = stoker.torch.MixUp(alpha=0.2, num_classes=1000)
    >>> for batch in loader:
    ...     images, labels = stoker.torch.to_device(batch, "cuda")
    ...     images, labels = mixup(images, labels, batch=batch)
    """

    _name = "MixUp"

    def params(self, epoch: int, step: int, rank: int = 0) -> Dict[str, float]:
        """What this batch draws: ``{"lam": ...}``."""
        return {"lam": self.generator(epoch, step, rank).betavariate(self.alpha, self.alpha)}

    def __call__(
        self, images: torch.Tensor, labels: torch.Tensor, batch: Any = None, *, epoch: Optional[int] = None, step: Optional[int] = None, rank: Optional[int] = None
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Mix ``images`` and ``labels`` of the batch ``batch`` (or at ``epoch``/``step``/``rank``)."""
        self._check(images, labels)
        if not images.dtype.is_floating_point:
            raise ConfigError("MixUp: images must be float (normalise first: stoker.torch.to_device or normalize_images), as torchvision's MixUp needs")
        lam = self.params(*self._key(batch, epoch, step, rank))["lam"]
        mixed = images.roll(1, 0).mul_(1.0 - lam).add_(images.mul(lam))
        return mixed, self._mix_labels(labels, lam)


class CutMix(_BatchMix):
    """torchvision v2's ``CutMix(alpha, num_classes)``: ``lam ~ Beta(alpha, alpha)``, a box of
    about ``1 - lam`` of the area around a uniform centre is pasted from the previous image of the
    batch (rolled by one); the labels are mixed by the area actually pasted. Images ``[B, C, H,
    W]`` of any dtype (the box is on the last two dimensions, as torchvision's).

    >>> cutmix = stoker.torch.CutMix(alpha=1.0, num_classes=1000)
    >>> images, labels = cutmix(images, labels, batch=batch)
    """

    _name = "CutMix"

    def params(self, epoch: int, step: int, rank: int, height: int, width: int) -> Dict[str, Any]:
        """What this batch draws, as torchvision's ``make_params``: ``lam``, the box centre
        ``(x, y)``, the box ``(x1, y1, x2, y2)`` and ``lam_adjusted`` (the label weight)."""
        rng = self.generator(epoch, step, rank)
        lam = rng.betavariate(self.alpha, self.alpha)
        centre_x, centre_y = rng.randrange(width), rng.randrange(height)
        r = 0.5 * math.sqrt(1.0 - lam)
        half_width, half_height = int(r * width), int(r * height)
        x1, y1 = max(centre_x - half_width, 0), max(centre_y - half_height, 0)
        x2, y2 = min(centre_x + half_width, width), min(centre_y + half_height, height)
        lam_adjusted = float(1.0 - (x2 - x1) * (y2 - y1) / (width * height))
        return {"lam": lam, "centre": (centre_x, centre_y), "box": (x1, y1, x2, y2), "lam_adjusted": lam_adjusted}

    def __call__(
        self, images: torch.Tensor, labels: torch.Tensor, batch: Any = None, *, epoch: Optional[int] = None, step: Optional[int] = None, rank: Optional[int] = None
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Cut and mix ``images`` and ``labels`` of the batch ``batch`` (or at ``epoch``/``step``/``rank``)."""
        self._check(images, labels)
        height, width = images.shape[-2:]
        params = self.params(*self._key(batch, epoch, step, rank), height=int(height), width=int(width))
        x1, y1, x2, y2 = params["box"]
        rolled = images.roll(1, 0)
        mixed = images.clone()
        mixed[..., y1:y2, x1:x2] = rolled[..., y1:y2, x1:x2]
        return mixed, self._mix_labels(labels, params["lam_adjusted"])
