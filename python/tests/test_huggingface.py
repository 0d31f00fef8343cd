"""Issue 29, item 4: Stoker under Hugging Face Accelerate and transformers' Trainer, 2 CPU
processes under torchrun: Accelerate does not re-shard or re-batch the per-rank stream, and a run
checkpointed mid-epoch and resumed trains on each sample once per epoch."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (make test installs it)")
pytest.importorskip("accelerate", reason="Accelerate is not installed (make test installs it)")

import stoker  # noqa: E402

from conftest import SAMPLES  # noqa: E402

SCRIPT = Path(__file__).parent / "scripts" / "frameworks_ddp.py"
STEPS = SAMPLES // (2 * 8)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def torchrun(mode: str, cluster, job_name: str, out: Path, phase: str, stop_after: int) -> None:
    env = {key: value for key, value in os.environ.items() if key not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()), str(SCRIPT)]
    command += [mode, cluster.coordinator, job_name, str(out), phase, str(stop_after)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, cwd=out)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]


def trained(out: Path, mode: str) -> list:
    lines = []
    for phase in ("first", "resumed"):
        for rank in range(2):
            path = out / f"{mode}-{phase}-rank{rank}.jsonl"
            lines += [dict(json.loads(line), rank=rank, phase=phase) for line in path.read_text().splitlines()]
    return lines


def assert_each_sample_once_per_epoch(records: list) -> None:
    for epoch in (0, 1):
        keys = Counter(key for r in records if r["epoch"] == epoch for key in r["keys"])
        assert len(keys) == SAMPLES - SAMPLES % 16 and set(keys.values()) == {1}, f"epoch {epoch}: {keys.most_common(2)}"


@pytest.mark.parametrize("mode", ["accelerate", "trainer"])
def test_a_run_checkpointed_mid_epoch_resumes_without_a_repeat_or_a_loss(mode: str, cluster, job_name, tmp_path: Path) -> None:
    if mode == "trainer":
        pytest.importorskip("transformers", reason="transformers is not installed (make test installs it)")
    torchrun(mode, cluster, job_name, tmp_path, "first", STEPS + 3)
    torchrun(mode, cluster, job_name, tmp_path, "resumed", STEPS + 3)
    records = trained(tmp_path, mode)
    assert_each_sample_once_per_epoch(records)
    first = [r for r in records if r["phase"] == "first"]
    assert len(first) == 2 * (STEPS + 3), "both ranks took every batch of their own stream: no re-sharding"


def test_accelerate_prepare_of_the_per_rank_stream_says_what_to_write(cluster, job_name) -> None:
    """``accelerator.prepare(DataLoader(dataset, batch_size=None))`` failed on rank 0 ("Can only
    concatenate tensors but got <class 'stoker.batch.Batch'>") and hung rank 1."""
    from accelerate import Accelerator

    import stoker.torch as stoker_torch

    accelerator = Accelerator(cpu=True)
    loader = stoker.Loader(cluster.coordinator, cluster.dataset, 8, transforms=[stoker.CenterCrop(32)], rank=0, world_size=1, job_name=job_name, output="torch")
    prepared = accelerator.prepare(torch.utils.data.DataLoader(stoker_torch.StokerIterableDataset(loader), batch_size=None))
    with pytest.raises(stoker.ConfigError, match="prepare_loader"):
        next(iter(prepared))
