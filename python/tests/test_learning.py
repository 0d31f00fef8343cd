"""A model learns through Stoker, as well as through PyTorch's own DataLoader, and a run killed
mid-epoch resumes from its checkpoint without losing or repeating a step.

examples/train_digits.py trains a small CNN on scikit-learn's handwritten digits (1,437
training and 360 held-out 32x32 JPEGs packed with `stoker pack`) under `torchrun
--nproc-per-node 2` (gloo, DDP, CPU), once through `stoker.Loader` (evaluated with
`Loader.for_eval`) and once through `DataLoader` + `DistributedSampler` + torchvision v2
transforms. Both must reach ACCURACY on the held-out set and lie within MARGIN of each other:
images, labels, shuffling, normalisation and layout are right end to end, not only the bytes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from conftest import REPO, Node, need_module, run_stoker, stoker_bin, wait_until

torch = need_module("torch")
need_module("torchvision")
need_module("sklearn")

EXAMPLE = REPO / "python" / "examples" / "train_digits.py"
# Measured (python/README.md, "A model that learns"): Stoker 0.978, DataLoader 0.983 after
# EPOCHS (Adam, 132 steps of 2 x 32).
ACCURACY = 0.90
MARGIN = 0.04
EPOCHS = 6
TRAIN, HELDOUT = 1437, 360
STEPS_PER_EPOCH = TRAIN // (2 * 32)  # tail="drop", 2 ranks of 32: 22
TIMEOUT = 300


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory):
    """The digits as ImageFolders and shards, and a coordinator with two workers serving them."""
    root = tmp_path_factory.mktemp("digits")
    prepared = subprocess.run(
        [sys.executable, str(EXAMPLE), "prepare", "--out", str(root), "--stoker", stoker_bin()], capture_output=True, text=True, timeout=TIMEOUT
    )
    assert prepared.returncode == 0, prepared.stderr
    assert json.loads(prepared.stdout) == {"train": TRAIN, "heldout": HELDOUT}
    logs = root / "logs"
    logs.mkdir()
    nodes = [Node(["coordinator", "--listen", "127.0.0.1:0", "--data-dir", str(root / "coordinator")], logs / "coordinator.log")]
    try:
        coordinator = nodes[0].addr or ""
        for split in ("train", "heldout"):
            run_stoker("dataset", "add", f"digits-{split}", str(root / "shards" / split / "manifest.json"), "--coordinator", coordinator)
        for index in range(2):
            nodes.append(Node(["worker", "--coordinator", coordinator, "--listen", f"127.0.0.{2 + index}:0", "--threads", "1"], logs / f"worker-{index}.log"))
        yield root, coordinator
    finally:
        for node in reversed(nodes):
            node.stop()


def torchrun(run: Path, *args: str) -> subprocess.Popen:
    """`torchrun --standalone --nproc-per-node 2 train_digits.py train --workdir RUN ARGS`."""
    run.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(EXAMPLE), "train", "--workdir", str(run), *args]
    with open(run / "torchrun.log", "ab") as log:  # the child keeps its own descriptor
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)


def finish(process: subprocess.Popen, run: Path) -> Dict:
    try:
        code = process.wait(TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    log = (run / "torchrun.log").read_text(errors="replace")
    assert code == 0, f"torchrun exited with {code}:\n{log[-4000:]}"
    return json.loads((run / "result.json").read_text())


def stoker_args(coordinator: str, job: str) -> List[str]:
    return ["--loader", "stoker", "--coordinator", coordinator, "--job", job, "--epochs", str(EPOCHS)]


def step_log(run: Path) -> Dict[Tuple[int, int], List[str]]:
    """(rank, global step) → the sample keys of that step, from the ranks' logs; a step logged
    twice (replayed after a restart) must have the same keys both times."""
    steps: Dict[Tuple[int, int], List[str]] = {}
    for rank in (0, 1):
        for line in (run / f"samples-rank{rank}.jsonl").read_text().splitlines():
            record = json.loads(line)
            # The labels are the class folders': a key `digitN/...` is labelled N.
            assert [int(key.split("/")[0].removeprefix("digit")) for key in record["keys"]] == record["labels"]
            key = (rank, record["global_step"])
            if key in steps:
                assert steps[key] == record["keys"], f"rank {rank} step {record['global_step']} replayed with other samples"
            steps[key] = record["keys"]
    return steps


def check_epochs(steps: Dict[Tuple[int, int], List[str]]) -> None:
    """Every epoch: STEPS_PER_EPOCH steps per rank, each training sample at most once, and all
    but the dropped tail (TRAIN mod 64) seen."""
    by_epoch: Dict[int, Counter] = defaultdict(Counter)
    for (rank, global_step), keys in steps.items():
        by_epoch[(global_step - 1) // STEPS_PER_EPOCH].update(keys)
    assert sorted(by_epoch) == list(range(EPOCHS))
    for epoch, seen in by_epoch.items():
        repeated = [key for key, count in seen.items() if count > 1]
        assert not repeated, f"epoch {epoch}: {len(repeated)} samples seen twice, e.g. {repeated[:3]}"
        assert len(seen) == STEPS_PER_EPOCH * 64 == TRAIN - TRAIN % 64, f"epoch {epoch}: {len(seen)} samples"


@pytest.fixture(scope="module")
def stoker_run(digits, tmp_path_factory: pytest.TempPathFactory):
    """The uninterrupted Stoker run: its result and its steps."""
    root, coordinator = digits
    run = tmp_path_factory.mktemp("run-stoker")
    result = finish(torchrun(run, *stoker_args(coordinator, "digits-whole")), run)
    return result, step_log(run)


def test_a_cnn_learns_the_digits_through_stoker_as_through_a_dataloader(digits, stoker_run, tmp_path: Path) -> None:
    root, _ = digits
    through_stoker, steps = stoker_run
    through_torch = finish(torchrun(tmp_path, "--loader", "torch", "--images", str(root / "images"), "--epochs", str(EPOCHS)), tmp_path)
    print(f"\nheld-out accuracy after {EPOCHS} epochs: stoker {through_stoker['accuracy']:.4f}, DataLoader {through_torch['accuracy']:.4f}")
    assert through_stoker["evaluated"] == through_stoker["evaluated_distinct"] == HELDOUT, "for_eval: every held-out sample exactly once"
    for result in (through_stoker, through_torch):
        assert result["optimizer_steps"] == EPOCHS * STEPS_PER_EPOCH, result
        assert result["accuracy"] >= ACCURACY, result
    assert abs(through_stoker["accuracy"] - through_torch["accuracy"]) <= MARGIN
    check_epochs(steps)


def test_a_run_killed_mid_epoch_resumes_from_its_checkpoint(digits, stoker_run, tmp_path: Path) -> None:
    """kill -9 of rank 1 by PID in the middle of epoch 1 (step 31, one step past the checkpoint
    of step 30), then the same torchrun again: it resumes at the checkpoint (step 31 is made
    again, with the same samples) and ends with the optimiser steps of the uninterrupted run;
    each epoch saw each sample once, in the same steps as the uninterrupted run."""
    _, coordinator = digits
    whole, uninterrupted = stoker_run
    checkpoint_every, stall_at = 5, STEPS_PER_EPOCH + 9  # step 31: 9 steps into epoch 1, 1 past a checkpoint
    args = [*stoker_args(coordinator, "digits-killed"), "--checkpoint-every", str(checkpoint_every)]
    first = torchrun(tmp_path, *args, "--stall-at-step", str(stall_at))
    try:
        wait_until(lambda: (tmp_path / "stalled").exists() or first.poll() is not None, TIMEOUT, "rank 1 to reach the step it stops at")
        assert first.poll() is None, (tmp_path / "torchrun.log").read_text()[-4000:]
        os.kill(int((tmp_path / "rank1.pid").read_text()), signal.SIGKILL)
        first.wait(120)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode != 0, "torchrun reports the killed rank"
    saved = torch.load(tmp_path / "checkpoint.pt", map_location="cpu", weights_only=False)
    assert saved["global_step"] == stall_at - stall_at % checkpoint_every == 30
    killed_steps = step_log(tmp_path)
    assert max(step for _, step in killed_steps) >= stall_at, "steps past the checkpoint were made, and are made again"

    result = finish(torchrun(tmp_path, *args), tmp_path)
    assert result["optimizer_steps"] == EPOCHS * STEPS_PER_EPOCH
    assert result["accuracy"] >= ACCURACY, result
    steps = step_log(tmp_path)  # asserts that the replayed step 31 had the same samples
    check_epochs(steps)
    assert steps == uninterrupted, "the resumed run trained on the same samples in the same steps"
    # Model, optimiser and data all resumed exactly: gloo's sum of two ranks' gradients is
    # deterministic on CPU, so the resumed run is the uninterrupted one, bit for bit.
    assert result["accuracy"] == whole["accuracy"]
