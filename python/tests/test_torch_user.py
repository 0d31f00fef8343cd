"""Issue 29, item 7: what broke when Stoker was used as a PyTorch user would. Each test failed
before its fix (the docstrings say what was seen)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (make test installs it)")

import stoker  # noqa: E402
import stoker.torch as stoker_torch  # noqa: E402

SMALL = [stoker.RandomResizedCrop(32), stoker.RandomHorizontalFlip()]


def make(cluster, job_name: str, **overrides) -> stoker.Loader:
    settings = dict(batch_size=8, transforms=SMALL, rank=0, world_size=1, job_name=job_name, timeout=60, output="torch")
    settings.update(overrides)
    return stoker.Loader(cluster.coordinator, cluster.dataset, **settings)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_dataloader_with_its_default_batch_size_passes_batches_through(cluster, job_name) -> None:
    """``DataLoader(dataset)`` (batch_size 1) failed in default_collate on Batch."""
    dataset = stoker_torch.StokerIterableDataset(make(cluster, job_name))
    batches = list(torch.utils.data.DataLoader(dataset))
    assert len(batches) == len(dataset) and all(isinstance(batch, stoker.Batch) for batch in batches)
    assert tuple(batches[0].images.shape) == (8, 32, 32, 3)
    grouped = torch.utils.data.DataLoader(stoker_torch.StokerIterableDataset(make(cluster, job_name + "-2")), batch_size=2)
    with pytest.raises(stoker.ConfigError, match="batch_size=None"):
        next(iter(grouped))


def test_batch_to_moves_the_tensors_and_keeps_the_metadata(cluster, job_name) -> None:
    batch = next(iter(make(cluster, job_name, output="numpy")))
    moved = batch.to("cpu")
    assert isinstance(moved.images, torch.Tensor) and moved.images.dtype == torch.uint8
    assert (moved.step, moved.keys, moved.layout) == (batch.step, batch.keys, batch.layout)
    as_float = moved.to(torch.float16)
    assert as_float.images.dtype == torch.float16 and as_float.labels.dtype == torch.int64
    assert batch.batch_size == 8


def test_lightning_infers_the_batch_size_and_moves_the_batch(cluster, job_name) -> None:
    """Lightning's ``self.log`` could not infer the batch size of a Batch, nor move it."""
    utilities = pytest.importorskip("lightning_fabric.utilities.apply_func")
    from pytorch_lightning.utilities.data import extract_batch_size

    batch = next(iter(make(cluster, job_name)))
    assert extract_batch_size(batch) == 8
    moved = utilities.move_data_to_device(batch, torch.device("meta"))
    assert isinstance(moved, stoker.Batch) and moved.keys == batch.keys
    assert moved.images.device.type == moved.labels.device.type == "meta"


def test_torchvision_transforms_are_accepted_as_written(cluster, job_name) -> None:
    """``transforms=T.Compose([...])`` or a single transform gave "object is not iterable";
    ``Normalize(dtype=torch.float16)`` was refused."""
    T = pytest.importorskip("torchvision.transforms.v2")
    compose = T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.ToImage(), T.ToDtype(torch.float32, scale=True)])
    assert stoker.transforms.as_stoker_transforms(compose) == SMALL
    loader = make(cluster, job_name, transforms=compose)
    assert tuple(next(iter(loader)).images.shape) == (8, 32, 32, 3)
    single = make(cluster, job_name + "-single", transforms=T.CenterCrop(32))
    assert tuple(next(iter(single)).images.shape) == (8, 32, 32, 3)
    half = make(cluster, job_name + "-half", transforms=[stoker.CenterCrop(32), stoker.Normalize(dtype=torch.float16)])
    assert next(iter(half)).images.dtype == torch.float16
    jitter = make(cluster, job_name + "-jitter", transforms=T.Compose([T.CenterCrop(32), T.ColorJitter(0.4), T.GaussianBlur(3)]))
    assert tuple(next(iter(jitter)).images.shape) == (8, 32, 32, 3)
    converted = stoker.transforms.as_stoker_transforms([T.ColorJitter(0.4, hue=0.1), T.RandomGrayscale(), T.GaussianBlur((5, 3), (0.5, 1.0))])
    expected = [stoker.ColorJitter(0.4, hue=0.1), stoker.RandomGrayscale(0.1), stoker.GaussianBlur((5, 3), (0.5, 1.0))]
    assert [t.to_dict() for t in converted] == [t.to_dict() for t in expected]
    with pytest.raises(stoker.ConfigError, match="before Normalize"):
        stoker.transforms.as_stoker_transforms(T.RandomErasing())
    policies = stoker.transforms.as_stoker_transforms([T.TrivialAugmentWide(), T.RandAugment(num_ops=3, magnitude=5)])
    assert policies == [stoker.TrivialAugmentWide(), stoker.RandAugment(3, 5)]
    with pytest.raises(stoker.ConfigError, match="NEAREST"):
        stoker.transforms.as_stoker_transforms(T.RandAugment(interpolation=pytest.importorskip("torchvision.transforms").InterpolationMode.BILINEAR))
    trivial = make(cluster, job_name + "-trivial", transforms=T.Compose([T.RandomResizedCrop(32), T.TrivialAugmentWide()]))
    assert tuple(next(iter(trivial)).images.shape) == (8, 32, 32, 3)
    geometric = stoker.transforms.as_stoker_transforms([T.AutoAugment(), T.RandomRotation(10), T.RandomAffine(5, translate=(0.1, 0.2), shear=3)])
    assert geometric == [stoker.AutoAugment(), stoker.RandomRotation((-10.0, 10.0)), stoker.RandomAffine((-5.0, 5.0), (0.1, 0.2), None, (-3.0, 3.0))]
    rotated = make(cluster, job_name + "-rotate", transforms=T.Compose([T.CenterCrop(32), T.RandomRotation(10)]))
    assert tuple(next(iter(rotated)).images.shape) == (8, 32, 32, 3)
    with pytest.raises(stoker.ConfigError, match="expand=False"):
        stoker.transforms.as_stoker_transforms(T.RandomRotation(10, expand=True))
    with pytest.raises(stoker.ConfigError, match="RandomPerspective"):
        make(cluster, job_name + "-perspective", transforms=T.Compose([T.CenterCrop(32), T.RandomPerspective()]))
    with pytest.raises(stoker.ConfigError, match="shorter side"):
        make(cluster, job_name + "-fixed", transforms=T.Resize((32, 48)))


def test_dataloader_workers_are_refused_with_the_alternative(cluster, job_name) -> None:
    """``num_workers=1``: re-iterating after a break restarted at step 0 while the parent's
    state_dict stayed at 0; with persistent_workers, set_epoch never reached the worker."""
    dataset = stoker_torch.StokerIterableDataset(make(cluster, job_name))
    data = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=1)
    with pytest.raises(Exception, match=r"num_workers=0"):
        next(iter(data))


RANK_SCRIPT = textwrap.dedent(
    """
    import sys, torch.distributed as dist, stoker
    rank = int(sys.argv[1])
    dist.init_process_group("gloo", init_method=sys.argv[2], rank=rank, world_size=2)
    loader = stoker.Loader(sys.argv[3], "train", 8, transforms=[stoker.CenterCrop(32)], job_name=sys.argv[4])
    print("RANK", loader.rank, loader.world_size, flush=True)
    dist.barrier()
    loader.close()
    dist.destroy_process_group()
    """
)


def test_rank_and_world_size_come_from_the_process_group(cluster, job_name, tmp_path: Path) -> None:
    """Lightning's DDP launcher sets WORLD_SIZE but not RANK: both processes attached as rank 0
    ("another trainer attached as rank 0 of job-33")."""
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    env = {key: value for key, value in os.environ.items() if key not in ("RANK", "LOCAL_RANK")}
    env["WORLD_SIZE"] = "2"
    init = f"tcp://127.0.0.1:{free_port()}"
    processes = [
        subprocess.Popen([sys.executable, str(script), str(rank), init, cluster.coordinator, job_name], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for rank in range(2)
    ]
    outputs = [process.communicate(timeout=120)[0] for process in processes]
    assert all(process.returncode == 0 for process in processes), outputs
    assert sorted(line for output in outputs for line in output.splitlines() if line.startswith("RANK")) == ["RANK 0 2", "RANK 1 2"]
