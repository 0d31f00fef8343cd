"""Type stubs of the native module (python/src). Use the public API in `stoker` instead."""

import builtins
from typing import List, Optional, Tuple

import numpy as np
import numpy.typing as npt

__version__: str

class StokerError(Exception): ...
class ConfigError(StokerError): ...
class ResumeError(ConfigError): ...
class ConnectionError(StokerError, builtins.ConnectionError): ...
class TimeoutError(StokerError, builtins.TimeoutError): ...

RawBatch = Tuple[
    npt.NDArray[np.uint8],  # images, flat bytes
    Tuple[int, int, int, int],  # shape in layout order
    str,  # dtype: "uint8", "float32" or "float16"
    str,  # layout: "NHWC" or "NCHW"
    npt.NDArray[np.int64],  # labels
    List[str],  # keys
    int,  # epoch
    int,  # step
    int,  # rank
    List[int],  # replaced sample indices
    int,  # xxh3-64 of the images
    List[int],  # corrupt (decoded with warnings) sample indices
]

class NativeLoader:
    def __init__(
        self,
        coordinator: str,
        dataset: str,
        batch_size: int,
        transforms_json: str,
        *,
        seed: int,
        shuffle: str,
        tail: str,
        prefetch: int,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        job_name: Optional[str] = None,
        run_id: Optional[str] = None,
        timeout: Optional[float] = 300.0,
        metrics_port: Optional[int] = None,
        tls_dir: Optional[str] = None,
        insecure: bool = False,
        max_buffered_batches: Optional[int] = None,
        batch_transport: str = "tcp",
    ) -> None: ...
    @property
    def metrics_address(self) -> Optional[str]: ...
    def close(self) -> None: ...
    def seek_step(self, global_step: int) -> None: ...
    @property
    def closed(self) -> bool: ...
    @property
    def epoch(self) -> int: ...
    @property
    def epoch_wait_seconds(self) -> float: ...
    def set_epoch(self, epoch: int) -> None: ...
    def __len__(self) -> int: ...
    @property
    def steps_remaining(self) -> int: ...
    def next_batch(self) -> Optional[RawBatch]: ...
    def state_json(self) -> str: ...
    def load_state_json(self, json: str) -> None: ...
    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def job_name(self) -> str: ...
    @property
    def wait_seconds(self) -> float: ...
    @property
    def buffered_batches(self) -> int: ...
    @property
    def free_receive_buffers(self) -> int: ...
