"""Stoker: a distributed data loader for deep-learning training.

>>> import stoker
>>> loader = stoker.Loader("127.0.0.1:7400", dataset="train", batch_size=256,
...                        transforms=[stoker.RandomResizedCrop(224), stoker.RandomHorizontalFlip()])
>>> for epoch in range(90):
...     loader.set_epoch(epoch)
...     for images, labels in loader:
...         ...

``stoker.torch`` (needs PyTorch) moves batches to the GPU and adapts the loader to
``torch.utils.data``; ``Loader(..., device="cuda")`` feeds the GPU through a pinned pool and a
side stream (``stoker.device``); ``stoker.lightning`` and ``stoker.huggingface`` adapt it to
Lightning, Accelerate and ``transformers.Trainer``.
"""

from stoker._stoker import __version__
from stoker.batch import Batch
from stoker.errors import ConfigError, ConnectionError, ResumeError, StokerError, TimeoutError
from stoker.loader import Loader
from stoker.transforms import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    AutoAugment,
    CenterCrop,
    ColorJitter,
    GaussianBlur,
    Normalize,
    RandomErasing,
    RandomGrayscale,
    RandomAffine,
    RandomHorizontalFlip,
    RandAugment,
    RandomResizedCrop,
    RandomRotation,
    Resize,
    TrivialAugmentWide,
    imagenet_eval,
    imagenet_train,
)

__all__ = [
    "__version__",
    "Loader",
    "Batch",
    "RandomResizedCrop",
    "Resize",
    "CenterCrop",
    "RandomHorizontalFlip",
    "ColorJitter",
    "RandomGrayscale",
    "RandomErasing",
    "GaussianBlur",
    "TrivialAugmentWide",
    "RandAugment",
    "AutoAugment",
    "RandomRotation",
    "RandomAffine",
    "Normalize",
    "imagenet_train",
    "imagenet_eval",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "StokerError",
    "ConfigError",
    "ResumeError",
    "ConnectionError",
    "TimeoutError",
]
