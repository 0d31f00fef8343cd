"""Issue 29, item 4: ``stoker.lightning.StokerDataModule`` under Lightning's DDP on 2 CPU
processes: the trainer drives the epochs, validation reads every sample once per pass (also
after the sanity check), and a run stopped mid-epoch and restored with ``fit(ckpt_path=...)``
trains on the rest of that epoch, nothing repeated or lost; and a rank SIGKILLed mid-step, one
step past a checkpoint Lightning saved, loses and repeats no sample once the run is restarted from
that checkpoint (issue 29, "Bad input and faults")."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (make test installs it)")
pytest.importorskip("pytorch_lightning", reason="Lightning is not installed (make test installs it)")

import stoker  # noqa: E402

from conftest import SAMPLES, wait_until  # noqa: E402

SCRIPT = Path(__file__).parent / "scripts" / "lightning_ddp.py"
STEPS = SAMPLES // (2 * 8)


def run(cluster, job_name: str, out: Path, phase: str, max_steps: int, ckpt_path: str = "") -> dict:
    env = {key: value for key, value in os.environ.items() if key not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    args = [sys.executable, str(SCRIPT), cluster.coordinator, job_name, str(out), phase, str(max_steps)] + ([ckpt_path] if ckpt_path else [])
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300, cwd=out)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return json.loads((out / f"{phase}-done.json").read_text())


def records(out: Path, phase: str) -> list:
    lines = []
    for rank in range(2):
        path = out / f"{phase}-rank{rank}.jsonl"
        lines += [dict(json.loads(line), rank=rank) for line in path.read_text().splitlines()]
    return lines


def test_a_datamodule_trains_validates_and_resumes_mid_epoch_under_ddp(cluster, job_name, tmp_path: Path) -> None:
    first = run(cluster, job_name, tmp_path, "first", max_steps=STEPS + 3)
    assert first["global_step"] == STEPS + 3
    resumed = run(cluster, job_name, tmp_path, "resumed", max_steps=-1, ckpt_path=str(tmp_path / "mid.ckpt"))
    assert resumed["global_step"] == 2 * STEPS, "the rest of epoch 1, then stop: max_epochs=2"
    trained = [r for r in records(tmp_path, "first") + records(tmp_path, "resumed") if r["kind"] == "train"]
    for epoch in (0, 1):
        keys = Counter(key for r in trained if r["batch_epoch"] == epoch for key in r["keys"])
        assert len(keys) == SAMPLES - SAMPLES % 16 and set(keys.values()) == {1}, f"epoch {epoch}: every sample once, {keys.most_common(2)}"
        assert all(r["epoch"] == epoch for r in trained if r["batch_epoch"] == epoch), "Lightning's epoch is the loader's"
    assert {r["rank"] for r in trained} == {0, 1}
    validated = [r for r in records(tmp_path, "first") if r["kind"] == "val"]
    keys = Counter(key for r in validated for key in r["keys"])
    assert len(keys) == SAMPLES and set(keys.values()) == {1}, "the first validation after the sanity check sees every sample once"


def test_a_rank_killed_mid_step_loses_and_repeats_no_sample_after_the_restart(cluster, job_name, tmp_path: Path) -> None:
    """Lightning saves a checkpoint every 4 steps; at step 9 (global step 8, 2 steps into epoch 1,
    one past the checkpoint of step 8) rank 1 stops in training_step and the test kills it with
    SIGKILL by PID, then the rest of the run's process group. fit(ckpt_path=last.ckpt) then ends
    the run: the steps up to the checkpoint of the killed run and the steps of the restarted run
    trained on each sample exactly once per epoch (the step past the checkpoint is made again)."""
    every, stall_at = 4, STEPS + 2
    assert stall_at % every == 0 and stall_at < 2 * STEPS
    env = {key: value for key, value in os.environ.items() if key not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env.update(STOKER_TEST_CHECKPOINT_EVERY=str(every), STOKER_TEST_STALL_AT=str(stall_at), PYTHONUNBUFFERED="1")
    args = [sys.executable, str(SCRIPT), cluster.coordinator, job_name, str(tmp_path), "killed", "-1"]
    with open(tmp_path / "killed.log", "wb") as log:  # Lightning's launcher starts rank 1 in this session
        first = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path, start_new_session=True)
    try:
        wait_until(lambda: (tmp_path / "stalled").exists() or first.poll() is not None, 300, "rank 1 to reach the step it stops at")
        assert first.poll() is None, (tmp_path / "killed.log").read_text(errors="replace")[-4000:]
        os.kill(int((tmp_path / "rank1.pid").read_text()), signal.SIGKILL)
        os.killpg(first.pid, signal.SIGKILL)  # rank 0 would wait in gloo's all-reduce for rank 1
        first.wait(60)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(60)
    assert first.returncode != 0
    saved = torch.load(tmp_path / "last.ckpt", map_location="cpu", weights_only=False)
    assert saved["global_step"] == stall_at, "the last checkpoint is the one before the killed step"
    killed = [r for r in records(tmp_path, "killed") if r["kind"] == "train"]
    assert any(r["global_step"] == stall_at for r in killed), "the killed step had its batch, and is made again"

    resumed = run(cluster, job_name, tmp_path, "resumed", max_steps=-1, ckpt_path=str(tmp_path / "last.ckpt"))
    assert resumed["global_step"] == 2 * STEPS
    after = [r for r in records(tmp_path, "resumed") if r["kind"] == "train"]
    assert min(r["global_step"] for r in after) == stall_at
    trained = [r for r in killed if r["global_step"] < stall_at] + after
    for rank in (0, 1):
        assert sorted(r["global_step"] for r in trained if r["rank"] == rank) == list(range(2 * STEPS)), f"rank {rank}: each step once"
    for epoch in (0, 1):
        keys = Counter(key for r in trained if r["batch_epoch"] == epoch for key in r["keys"])
        assert len(keys) == SAMPLES - SAMPLES % 16 and set(keys.values()) == {1}, f"epoch {epoch}: every sample once, {keys.most_common(2)}"
        assert all(r["epoch"] == epoch for r in trained if r["batch_epoch"] == epoch), "Lightning's epoch is the loader's"


def test_a_datamodule_without_a_coordinator_says_what_to_write(monkeypatch) -> None:
    from stoker.lightning import StokerDataModule

    monkeypatch.delenv("STOKER_COORDINATOR", raising=False)
    with pytest.raises(stoker.ConfigError, match="STOKER_COORDINATOR"):
        StokerDataModule(dataset="train", batch_size=8)
    with pytest.raises(stoker.ConfigError, match="rank"):
        StokerDataModule("127.0.0.1:9", "train", 8, rank=0)
    with pytest.raises(stoker.ConfigError, match="torch.float16"):
        StokerDataModule("127.0.0.1:9", "train", 8, dtype=torch.int8)
