"""``stoker.Loader``: one trainer rank's view of a Stoker job, shaped like a PyTorch
``DataLoader`` with a ``DistributedSampler``."""

from __future__ import annotations

import collections
import json
import os
import warnings
from typing import Any, Deque, Dict, Iterator, Optional, Sequence, Tuple, Union

from stoker import _stoker, interrupt
from stoker.batch import Batch
from stoker.errors import ConfigError, ResumeError
from stoker.placement import distributed_rank, make_device_feed
from stoker.transforms import Transform, as_stoker_transforms, imagenet_eval, imagenet_train

LAYOUTS = ("NHWC", "NCHW")
OUTPUTS = ("numpy", "torch")
ON_ERROR = ("replace", "fail")
BATCH_TRANSPORTS = ("tcp", "quic")


class Loader:
    """Batches of one rank, every sample of an epoch exactly once across the ranks.

    ``coordinator`` is ``"HOST:PORT"``, or for a replicated coordinator the list of its nodes,
    ``stoker.Loader("h1:7400,h2:7400,h3:7400", ...)``: calls follow the Raft leader among them
    (default: the ``STOKER_COORDINATOR`` environment variable, ``STOKER_COORDINATOR=a,b,c`` for
    a list); ``dataset`` a name registered with ``stoker dataset add``. ``rank`` and
    ``world_size`` default to torchrun's ``RANK`` and ``WORLD_SIZE`` (else 0 and 1). Ranks that
    give the same settings and ``run_id`` share one job; the first to attach creates it.
    ``run_id`` (default: torchrun's ``TORCHELASTIC_RUN_ID``) keeps two runs with identical
    settings apart; ``job_name`` names the job outright.

    ``transforms``: what the workers apply; without it, ImageNet training augmentation
    (``RandomResizedCrop(224)`` + ``RandomHorizontalFlip``) with a warning: validation data
    wants :meth:`Loader.for_eval`.
    ``shuffle``: ``True`` (the default: ``"window"``), ``False`` (``"none"``), or a mode:
    ``"window"`` (8 shards; ``"window:K"`` for K), ``"block"`` (``"block:S:N"``: blocks of S
    consecutive samples, N a window; mixes data written in class order), ``"full"``, ``"none"``.
    ``tail``: ``"drop"`` (whole steps only), ``"pad"`` (repeat a few samples, as
    ``DistributedSampler``) or ``"partial"`` (every sample once; the last step is smaller).
    ``prefetch``: steps the workers may run ahead of the slowest rank.
    ``output``: ``"numpy"`` arrays or ``"torch"`` tensors (both zero-copy).
    ``timeout``: seconds to wait for one batch before raising :class:`stoker.TimeoutError`
    (``None``: wait forever).
    ``missing_label``: the label of a sample without one (no ``.cls`` member); ``-1`` by
    default, ``-100`` is what ``torch.nn.CrossEntropyLoss`` ignores.
    ``metrics_port``: serve this rank's own Prometheus metrics (bytes received, first-batch
    latency, buffered batches; ``/metrics``, ``/healthz``, ``/readyz``) on this TCP port of
    every interface (``0``: a free port, see :attr:`metrics_address`); one port per process, e.g.
    ``9102 + LOCAL_RANK`` under torchrun. Not needed for the stall and throughput figures: the
    coordinator exports those for every rank.

    ``tls_dir``: this trainer's TLS directory (``ca.pem``, ``node.pem``, ``node.key``: a
    trainer certificate of the cluster CA, from ``stoker certs issue --role trainer``); default
    ``STOKER_TLS_DIR``, else the local CA (one machine only). ``insecure=True`` checks no
    certificates, for a cluster whose nodes run ``--insecure``. A certificate refused by the
    cluster (no certificate, another CA, expired, revoked, another role) raises
    :class:`stoker.ConfigError` saying which.

    ``max_buffered_batches``: most batches this rank holds before yielding them (waiting for an
    earlier step, or of the next epoch); default ``4 * prefetch + 16``. Past it the batch
    farthest ahead is dropped and made again later, so a worker sending far ahead cannot fill
    the trainer's memory. At least ``prefetch``.

    ``batch_transport``: ``"tcp"`` (default) receives batches on a bulk connection (TLS 1.3
    over TCP) from every worker that takes one, and over QUIC from the rest; about half QUIC's
    CPU per GB when workers are on other hosts. ``"quic"`` receives over QUIC only.

    ``device``: ``"cuda"`` (``"cuda:N"``, or ``"cpu"``) yields batches on that device, images
    normalised there by ``device_normalize`` (a :class:`stoker.Normalize`; ImageNet's mean and
    std to float32 by default) as ``[B, 3, H, W]`` in channels-last memory
    (``channels_last=False``: contiguous). Each batch goes once through a pool of pinned host
    buffers (allocated once) and is copied on a side stream ``device_prefetch`` batches ahead
    of the loop, ordered by CUDA events (see ``stoker.device``). Needs PyTorch.

    ``close()`` (or ``with stoker.Loader(...) as loader:``) detaches and frees the receive
    buffers at once instead of when the object is collected.

    Iterating yields the batches of the current epoch in step order; ``set_epoch`` picks the
    epoch (as with ``DistributedSampler.set_epoch``). A ``for`` loop left early continues where
    it stopped the next time.
    """

    def __init__(
        self,
        coordinator: Union[str, Sequence[str], None] = None,
        dataset: Optional[str] = None,
        batch_size: Optional[int] = None,
        *,
        transforms: Optional[Sequence[Transform]] = None,
        seed: int = 0,
        shuffle: Union[bool, str] = True,
        tail: str = "drop",
        prefetch: int = 8,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        layout: str = "NHWC",
        output: str = "numpy",
        dct_scaling: bool = True,
        on_error: str = "replace",
        job_name: Optional[str] = None,
        run_id: Optional[str] = None,
        timeout: Optional[float] = 300.0,
        missing_label: int = -1,
        metrics_port: Optional[int] = None,
        tls_dir: Union[str, os.PathLike, None] = None,
        insecure: bool = False,
        max_buffered_batches: Optional[int] = None,
        batch_transport: str = "tcp",
        device: Any = None,
        device_prefetch: int = 2,
        device_normalize: Optional[Transform] = None,
        channels_last: bool = True,
    ) -> None:
        if coordinator is None:
            coordinator = os.environ.get("STOKER_COORDINATOR")
            if not coordinator:
                raise ConfigError(
                    'no coordinator: pass Loader("HOST:PORT", ...) or set STOKER_COORDINATOR=HOST:PORT '
                    '(a replicated coordinator: "HOST:PORT,HOST:PORT,HOST:PORT")'
                )
        if isinstance(coordinator, (list, tuple)):
            coordinator = ",".join(str(address) for address in coordinator)
        if not isinstance(coordinator, str):
            raise ConfigError(f'coordinator must be "HOST:PORT" or "HOST:PORT,HOST:PORT,..." (or a list of them), got {coordinator!r}')
        if not isinstance(dataset, str) or not dataset:
            raise ConfigError(f"dataset must be the name of a registered dataset (stoker dataset ls), got {dataset!r}")
        if isinstance(shuffle, bool):
            shuffle = "window" if shuffle else "none"
        elif not isinstance(shuffle, str):
            raise ConfigError(f"shuffle must be True, False or a mode name (window, block, full, none), got {shuffle!r}")
        if isinstance(missing_label, bool) or not isinstance(missing_label, int) or not -(2**63) <= missing_label < 2**63:
            raise ConfigError(f"missing_label must be an int (-100 is what CrossEntropyLoss ignores), got {missing_label!r}")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0):
            raise ConfigError(f"timeout must be a positive number of seconds or None (wait forever), got {timeout!r}")
        if metrics_port is not None and (isinstance(metrics_port, bool) or not isinstance(metrics_port, int) or not 0 <= metrics_port < 65536):
            raise ConfigError(f"metrics_port must be a TCP port (0: any free one) or None, got {metrics_port!r}")
        if output not in OUTPUTS:
            raise ConfigError(f"output must be one of {', '.join(OUTPUTS)}, got {output!r}")
        if layout not in LAYOUTS:
            raise ConfigError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        if on_error not in ON_ERROR:
            raise ConfigError(f"on_error must be one of {', '.join(ON_ERROR)}, got {on_error!r}")
        for name, value in (("batch_size", batch_size), ("prefetch", prefetch)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive int, got {value!r}")
        if max_buffered_batches is not None and (
            isinstance(max_buffered_batches, bool) or not isinstance(max_buffered_batches, int) or not prefetch <= max_buffered_batches < 2**32
        ):
            raise ConfigError(f"max_buffered_batches must be an int of at least prefetch ({prefetch}) or None, got {max_buffered_batches!r}")
        if batch_transport not in BATCH_TRANSPORTS:
            raise ConfigError(f"batch_transport must be one of {', '.join(BATCH_TRANSPORTS)}, got {batch_transport!r}")
        if output == "torch":
            try:
                import torch  # noqa: F401
            except ImportError:
                raise ConfigError('output="torch" needs PyTorch: pip install torch') from None
        if transforms is None:
            warnings.warn(
                "stoker.Loader without transforms= applies ImageNet training augmentation "
                "(RandomResizedCrop(224) + RandomHorizontalFlip); pass transforms=[...] to say so, "
                "or use stoker.Loader.for_eval(...) for validation data",
                stacklevel=2,
            )
            transforms = imagenet_train()
        transforms = as_stoker_transforms(transforms)
        spec = {
            "transforms": [transform.to_dict() for transform in transforms],
            "layout": layout,
            "dct_scaling": bool(dct_scaling),
            "on_error": on_error,
        }
        self._output = output
        if tls_dir is None:
            tls_dir = os.environ.get("STOKER_TLS_DIR") or None
        if tls_dir is not None and not isinstance(tls_dir, (str, os.PathLike)):
            raise ConfigError(f"tls_dir must be a directory path (stoker certs issue --out), got {tls_dir!r}")
        if not isinstance(insecure, bool):
            raise ConfigError(f"insecure must be True or False, got {insecure!r}")
        self._missing_label = missing_label
        if rank is None and world_size is None:
            rank, world_size = distributed_rank()
        # The SIGINT count when the iterating loop last had control (see stoker.interrupt).
        self._interrupts_seen: Optional[int] = None
        # A batch handed back unused (see __iter__), the batch out in a live loop, whether every
        # iter() starts the epoch again (evaluation), and the GPU feed (device=).
        self._held: Optional[Batch] = None
        self._out: Optional[Batch] = None
        # The positions before the batch handed back and the batch out, where known already.
        self._held_state: Optional[str] = None
        self._out_state: Optional[str] = None
        self._restart_each_iter = False
        # Batches on their way to the device, each with the position before it; whether the
        # epoch's last was received.
        self._in_flight: Deque[Tuple[Any, str]] = collections.deque()
        self._source_ended = False
        self._device_feed: Any = None
        self._device_prefetch = device_prefetch
        if device is not None:
            self._device_feed = make_device_feed(device, device_prefetch, device_normalize, channels_last)
            self._output = "torch"
        self._attach_args = (coordinator, dataset, batch_size, json.dumps(spec))
        self._attach_settings: Dict[str, Any] = dict(
            seed=seed,
            shuffle=shuffle,
            tail=tail,
            prefetch=prefetch,
            rank=rank,
            world_size=world_size,
            job_name=job_name,
            run_id=run_id,
            timeout=None if timeout is None else float(timeout),
            metrics_port=metrics_port,
            tls_dir=None if tls_dir is None else os.fspath(tls_dir),
            insecure=insecure,
            max_buffered_batches=max_buffered_batches,
            batch_transport=batch_transport,
        )
        self._native = _stoker.NativeLoader(*self._attach_args, **self._attach_settings)
        self.batch_size = batch_size

    @classmethod
    def for_eval(
        cls,
        coordinator: Optional[str] = None,
        dataset: Optional[str] = None,
        batch_size: Optional[int] = None,
        *,
        size: int = 224,
        resize: int = 256,
        **settings: Any,
    ) -> "Loader":
        """A loader for evaluation: ``Resize(resize)`` + ``CenterCrop(size)`` (torchvision's
        ImageNet evaluation transform), no shuffle, and ``tail="partial"``: every sample exactly
        once, the last step smaller. Every ``iter()`` starts the epoch at step 0 (a validation
        pass, a sanity check and the next pass each see the whole set). Pixels are exact
        (``dct_scaling=False``): they match torchvision/PIL's Resize + CenterCrop, which matters
        for weights trained with torchvision; ``dct_scaling=True`` decodes large JPEGs faster
        at about 2/255 per pixel of difference. Other settings as for :class:`Loader`."""
        if settings.get("transforms") is None:
            settings["transforms"] = imagenet_eval(size, resize)
        settings.setdefault("shuffle", False)
        settings.setdefault("tail", "partial")
        settings.setdefault("dct_scaling", False)
        loader = cls(coordinator, dataset, batch_size, **settings)
        loader._restart_each_iter = True
        return loader

    def close(self) -> None:
        """Detach from the job and free the receive buffers now. The loader cannot be used
        afterwards; closing twice is harmless."""
        self._drop_pending()
        self._native.close()

    @property
    def closed(self) -> bool:
        return self._native.closed

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    @property
    def epoch(self) -> int:
        """The epoch iterated: the last ``set_epoch`` (or the loaded state's)."""
        return self._native.epoch

    @property
    def epoch_wait_seconds(self) -> float:
        """Seconds this rank has waited for data since the last ``set_epoch``."""
        return self._native.epoch_wait_seconds

    def set_epoch(self, epoch: int) -> None:
        """Iterate ``epoch`` next (from its start, or from a loaded state's position in it)."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ConfigError(f"set_epoch takes an epoch number (an int >= 0), got {epoch!r}")
        self._native.set_epoch(epoch)
        self._drop_pending()

    def __len__(self) -> int:
        """Steps (batches) of an epoch for this rank, counted from the epoch's start also after
        ``load_state_dict`` (as ``len(DataLoader)``): ``epochs * len(loader)`` is the run's
        length, and ``batch.step`` numbers steps within the epoch the same way."""
        return len(self._native)

    @property
    def steps_remaining(self) -> int:
        """Steps of the current epoch not yielded yet (fewer than ``len(loader)`` after a
        resume mid-epoch, 0 once the epoch ended)."""
        return self._native.steps_remaining + (self._held is not None) + len(self._in_flight)

    def __iter__(self) -> Iterator[Batch]:
        """The batches of the current epoch in step order, as a PyTorch ``DataLoader``:

        * a loop that yielded the epoch's last step finished the epoch, and the next ``iter()``
          goes on with the next epoch (``set_epoch`` is needed only to pick another one);
        * a loop left early continues after the last batch it was given the next time;
        * a peek, ``next(iter(loader))`` (an iterator dropped after its first batch, before
          being asked for a second), takes nothing: the next loop yields that batch first;
        * an evaluation loader (:meth:`Loader.for_eval`) starts at step 0 on every ``iter()``.

        Nothing happens until the first batch is asked for, so an ``iter()`` made only to check
        that the loader is iterable moves nothing.
        """
        return self._iterate()

    def _begin(self) -> None:
        """What the first ``next()`` of a new iterator does: restart an evaluation loader, or
        go on to the next epoch after a finished one."""
        native = self._native
        if self._restart_each_iter:
            self._drop_pending()
            steps = len(native)
            native.seek_step(native.epoch * steps if steps else 0)
            if not steps:
                self._warn_empty()
            return
        if self._held is not None or self._in_flight:
            return
        if not len(native):
            self._warn_empty()
        elif native.steps_remaining == 0:
            native.set_epoch(native.epoch + 1)

    def _warn_empty(self) -> None:
        warnings.warn(
            f"stoker.Loader: epoch {self.epoch} has no steps for rank {self.rank} (batch_size={self.batch_size}, "
            f"world_size={self.world_size}): a smaller batch_size, or tail=\"partial\", gives it some",
            stacklevel=4,
        )

    def _iterate(self) -> Iterator[Batch]:
        with interrupt.watching():
            # A Ctrl-C counted after this, while the loop has not had control back, stops the
            # wait for the next batch even if a finalizer swallowed its KeyboardInterrupt.
            self._interrupts_seen = interrupt.count()
            self._begin()
            yielded = 0
            while True:
                batch = self._held
                if batch is not None:
                    self._held = None
                    self._out_state = self._held_state
                else:
                    batch = self._next_batch()
                    if batch is None:
                        return
                self._out = batch
                yielded += 1
                try:
                    yield batch
                except GeneratorExit:
                    # Dropped after handing out its first batch only, never asked for a second:
                    # a peek (next(iter(loader))). The batch goes back; the next loop yields it first.
                    if yielded == 1:
                        self._give_back(batch)
                    raise
                self._out = None
                self._interrupts_seen = interrupt.count()

    def _next_batch(self) -> Optional[Batch]:
        """The next batch of the epoch (``None`` at its end): received, or from the device feed,
        which keeps ``device_prefetch`` more on their way to the device."""
        native, feed = self._native, self._device_feed
        if feed is None:
            raw = native.next_batch(self._interrupts_seen)
            if raw is None:
                return None
            self._out_state = None
            return Batch._from_native(raw, self._output, self._missing_label)
        while not self._source_ended and len(self._in_flight) <= self._device_prefetch:
            raw = native.next_batch(self._interrupts_seen)
            if raw is None:
                self._source_ended = True
                break
            received = Batch._from_native(raw, "torch", self._missing_label)
            del raw
            # Taken now, while the epoch's pass is open: the position if this batch goes back.
            state_before = native.state_before_json(received.step)
            self._in_flight.append((feed.submit(received), state_before))
        if not self._in_flight:
            self._source_ended = False
            return None
        in_flight, self._out_state = self._in_flight.popleft()
        return feed.take(in_flight)

    def _drop_pending(self) -> None:
        """Forget batches handed back or on their way to the device (a new position)."""
        self._held = self._out = None
        self._held_state = self._out_state = None
        self._in_flight.clear()
        self._source_ended = False

    def _give_back(self, batch: Batch) -> None:
        """Hand ``batch``, the last one out, back unused: ``state_dict`` counts it as not
        taken and the next iteration yields it first (adapters whose framework fetched a batch
        ahead and dropped it use this)."""
        if self._out is batch:
            self._held, self._held_state, self._out = batch, self._out_state, None

    def steps(self, start: int = 0, total: Optional[int] = None) -> Iterator[Batch]:
        """Batches by global step, for training loops that count steps, not epochs: from step
        ``start`` (over all epochs: epoch ``start // len(loader)``, from its step
        ``start % len(loader)``), rolling over to the next epoch by itself, up to global step
        ``total`` (excluded; ``None``: for ever). A batch's global step is
        ``batch.epoch * len(loader) + batch.step``. ``state_dict`` works as with epochs::

            for batch in loader.steps(start=global_step, total=max_steps):
                ...
        """
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise ConfigError(f"start must be a step number (an int >= 0), got {start!r}")
        if total is not None and (isinstance(total, bool) or not isinstance(total, int)):
            raise ConfigError(f"total must be an int or None, got {total!r}")
        self._native.seek_step(start)
        self._drop_pending()
        step = start
        while total is None or step < total:
            for batch in self:
                yield batch
                step += 1
                if total is not None and step >= total:
                    return
            self.set_epoch(self.epoch + 1)

    def state_dict(self) -> Dict[str, Any]:
        """Where this rank stands: every batch before it has been taken. Save it with the
        model's checkpoint; ``load_state_dict`` continues after it, with any world size. A batch
        handed back unused (a peek, see ``__iter__``) is not taken; one out in a loop is."""
        if self._held is not None:
            return json.loads(self._held_state or self._native.state_before_json(self._held.step))
        if self._in_flight:
            return json.loads(self._in_flight[0][1])
        return json.loads(self._native.state_json())

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue from ``state`` (from ``state_dict``, possibly of another world size)."""
        if not isinstance(state, dict) or "checkpoint" not in state:
            raise ResumeError(f"not a Stoker loader state (a stoker.Loader state_dict has job_name and checkpoint): {state!r:.200}")
        saved_job = state.get("job_name")
        if isinstance(saved_job, str) and saved_job and saved_job != self.job_name and self._attach_settings["job_name"] is None:
            self._rejoin(saved_job)
        self._native.load_state_json(json.dumps(state))
        self._drop_pending()

    def _rejoin(self, job_name: str) -> None:
        """Attach to the job a loaded state was taken in, instead of the one this loader's
        settings name: a restarted torchrun has a new ``TORCHELASTIC_RUN_ID`` and would
        otherwise start a new job at every restart. Where that job cannot take this loader
        (another world size: the state re-partitions), the loader stays where it is."""
        # The loader attached now goes first: it may hold the metrics port the rejoined one needs.
        self._native.close()
        try:
            self._native = _stoker.NativeLoader(*self._attach_args, **dict(self._attach_settings, job_name=job_name))
        except ConfigError:
            self._native = _stoker.NativeLoader(*self._attach_args, **self._attach_settings)

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
    def metrics_address(self) -> Optional[str]:
        """``HOST:PORT`` of this rank's metrics endpoint (``metrics_port=``), else ``None``."""
        return self._native.metrics_address

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
