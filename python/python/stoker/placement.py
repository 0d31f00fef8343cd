"""Where a loader runs: its rank and world size (from the process group ``torch.distributed``
has, else torchrun's environment) and the device its batches go to (``stoker.device``)."""

from __future__ import annotations

import os
import sys
from typing import Any, Optional, Tuple

from stoker.errors import ConfigError


def make_device_feed(device: Any, device_prefetch: Any, device_normalize: Any, channels_last: Any) -> Any:
    """The GPU feed for ``Loader(device=...)`` (see ``stoker.device``); needs PyTorch."""
    if isinstance(device_prefetch, bool) or not isinstance(device_prefetch, int) or not 0 <= device_prefetch <= 64:
        raise ConfigError(f"device_prefetch must be an int from 0 to 64 (batches copied ahead of the training loop), got {device_prefetch!r}")
    if not isinstance(channels_last, bool):
        raise ConfigError(f"channels_last must be True or False, got {channels_last!r}")
    try:
        from stoker import device as device_module
    except ImportError:
        raise ConfigError(f"device={device!r} needs PyTorch: pip install torch") from None
    resolved = device_module.resolve_device(device)
    normalize = device_module.resolve_normalize(device_normalize)
    backend = device_module.CudaBackend(resolved) if resolved.type == "cuda" else device_module.CpuBackend()
    return device_module.DeviceFeed(backend, slots=device_prefetch + 2, normalize=normalize, channels_last=channels_last)


def distributed_rank() -> Tuple[Optional[int], Optional[int]]:
    """Rank and world size of the process group when ``torch.distributed`` has one (Lightning,
    Accelerate and torchrun all make one), else ``(None, None)``: the native loader then reads
    torchrun's ``RANK`` and ``WORLD_SIZE``. ``WORLD_SIZE`` without ``RANK`` is refused: that is
    a launcher (Lightning's DDP) that sets the rank elsewhere, and every process would attach
    as rank 0."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if os.environ.get("WORLD_SIZE") and not os.environ.get("RANK"):
        raise ConfigError(
            f"WORLD_SIZE={os.environ['WORLD_SIZE']} is set but RANK is not, so every process would be rank 0: make the "
            "loader after torch.distributed.init_process_group (Lightning: in the DataModule's setup() or "
            "train_dataloader(), or use stoker.lightning.StokerDataModule), or pass rank= and world_size="
        )
    return None, None
