"""Issue 29, item 4: torchdata's ``StatefulDataLoader`` over ``StokerIterableDataset``, 2 CPU
processes under torchrun (gloo, DDP): its ``state_dict`` carries Stoker's, and a run restored from
it mid-epoch continues exactly (each sample once per epoch, nothing fast-forwarded)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (make test installs it)")
pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata is not installed (make test installs it)")

import stoker  # noqa: E402
import stoker.torch as stoker_torch  # noqa: E402
from torchdata.stateful_dataloader import StatefulDataLoader  # noqa: E402

from conftest import SAMPLES  # noqa: E402
from test_huggingface import STEPS, assert_each_sample_once_per_epoch, torchrun, trained  # noqa: E402


def test_a_stateful_dataloader_resumes_mid_epoch_under_ddp(cluster, job_name, tmp_path: Path) -> None:
    torchrun("torchdata", cluster, job_name, tmp_path, "first", STEPS + 3)
    torchrun("torchdata", cluster, job_name, tmp_path, "resumed", STEPS + 3)
    records = trained(tmp_path, "torchdata")
    assert_each_sample_once_per_epoch(records)
    resumed = [r for r in records if r["phase"] == "resumed" and r["epoch"] == 1]
    assert sorted({r["step"] for r in resumed}) == list(range(3, STEPS)), "the rest of epoch 1, with its epoch step numbers"


def test_a_stateful_dataloader_restores_exactly_in_one_process(cluster, job_name) -> None:
    def make() -> stoker.Loader:
        return stoker.Loader(cluster.coordinator, cluster.dataset, 8, transforms=[stoker.RandomResizedCrop(32)], rank=0, world_size=1, job_name=job_name)

    reference = [(b.step, b.checksum) for b in make()]
    data = StatefulDataLoader(stoker_torch.StokerIterableDataset(make()), batch_size=None)
    iterator = iter(data)
    first = [(b.step, b.checksum) for b in (next(iterator) for _ in range(4))]
    state = json.loads(json.dumps(data.state_dict()))
    restored = StatefulDataLoader(stoker_torch.StokerIterableDataset(make()), batch_size=None)
    restored.load_state_dict(state)
    rest = [(b.step, b.checksum) for b in restored]
    assert first + rest == reference
    assert len(reference) == SAMPLES // 8
