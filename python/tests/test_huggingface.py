"""Issue 29, item 4: Stoker under Hugging Face Accelerate and transformers' Trainer, 2 CPU
processes under torchrun: Accelerate does not re-shard or re-batch the per-rank stream, a run
checkpointed mid-epoch and resumed trains on each sample once per epoch, and a rank SIGKILLed
mid-step loses and repeats no sample once the run restarts from its last checkpoint (issue 29,
"Bad input and faults")."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (make test installs it)")
pytest.importorskip("accelerate", reason="Accelerate is not installed (make test installs it)")

import stoker  # noqa: E402

from conftest import SAMPLES, wait_until  # noqa: E402

SCRIPT = Path(__file__).parent / "scripts" / "frameworks_ddp.py"
STEPS = SAMPLES // (2 * 8)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def torchrun_command(mode: str, cluster, job_name: str, out: Path, phase: str, stop_after: int) -> list:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()), str(SCRIPT)]
    return command + [mode, cluster.coordinator, job_name, str(out), phase, str(stop_after)]


def clean_env() -> dict:
    return {key: value for key, value in os.environ.items() if key not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}


def torchrun(mode: str, cluster, job_name: str, out: Path, phase: str, stop_after: int) -> None:
    command = torchrun_command(mode, cluster, job_name, out, phase, stop_after)
    done = subprocess.run(command, env=clean_env(), capture_output=True, text=True, timeout=300, cwd=out)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]


def trained(out: Path, mode: str, phases: tuple = ("first", "resumed")) -> list:
    lines = []
    for phase in phases:
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


@pytest.mark.parametrize("mode", ["accelerate", "trainer"])
def test_a_rank_killed_mid_step_loses_and_repeats_no_sample_after_the_restart(mode: str, cluster, job_name, tmp_path: Path) -> None:
    """The run saves its state every 4 steps; at global step 8 (2 steps into epoch 1, the step
    after a checkpoint) rank 1 stops with its batch and the test kills it with SIGKILL by PID,
    then the rest of torchrun's process group (rank 0 waits in gloo's all-reduce). The run
    restarted from that checkpoint ends the 2 epochs: the steps before the checkpoint and those of
    the restarted run trained on each sample exactly once per epoch, each rank making each step
    once (the killed step is made again)."""
    if mode == "trainer":
        pytest.importorskip("transformers", reason="transformers is not installed (make test installs it)")
    every, stall_at = 4, STEPS + 2
    assert stall_at % every == 0 and stall_at < 2 * STEPS
    env = dict(clean_env(), STOKER_TEST_CHECKPOINT_EVERY=str(every), STOKER_TEST_STALL_AT=str(stall_at), PYTHONUNBUFFERED="1")
    # The Trainer writes the loader's position into the checkpoint folder after the rest of it.
    saved = tmp_path / "trainer" / f"checkpoint-{stall_at}" / "stoker_loader.json" if mode == "trainer" else None

    def checkpoint_written() -> bool:
        try:
            return saved is None or bool(json.loads(saved.read_text()))
        except (OSError, ValueError):
            return False

    with open(tmp_path / "killed.log", "wb") as log:
        first = subprocess.Popen(torchrun_command(mode, cluster, job_name, tmp_path, "killed", -1), env=env, stdout=log,
                                 stderr=subprocess.STDOUT, cwd=tmp_path, start_new_session=True)
    try:
        wait_until(lambda: ((tmp_path / "stalled").exists() and checkpoint_written()) or first.poll() is not None, 300,
                   "rank 1 to reach the step it stops at")
        assert first.poll() is None, (tmp_path / "killed.log").read_text(errors="replace")[-4000:]
        os.kill(int((tmp_path / "rank1.pid").read_text()), signal.SIGKILL)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(60)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(60)
    assert first.returncode != 0
    killed = trained(tmp_path, mode, ("killed",))
    assert any(r["global_step"] == stall_at and r["rank"] == 1 for r in killed), "the killed step had its batch, and is made again"

    torchrun(mode, cluster, job_name, tmp_path, "resumed", stall_at)
    after = trained(tmp_path, mode, ("resumed",))
    assert min(r["global_step"] for r in after) == stall_at, "the restarted run goes on from the checkpoint"
    records = [r for r in killed if r["global_step"] < stall_at] + after
    for rank in (0, 1):
        assert sorted(r["global_step"] for r in records if r["rank"] == rank) == list(range(2 * STEPS)), f"rank {rank}: each step once"
    assert_each_sample_once_per_epoch(records)


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
