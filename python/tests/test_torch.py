"""The PyTorch helpers; skipped where torch is not installed (failed under CI=true)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import need_module

torch = need_module("torch")

import stoker  # noqa: E402
import stoker.torch as stoker_torch  # noqa: E402

SMALL = [stoker.RandomResizedCrop(32), stoker.RandomHorizontalFlip()]


def test_torch_output_is_zero_copy_tensors(cluster, job_name) -> None:
    loader = stoker.Loader(cluster.coordinator, "train", batch_size=8, transforms=SMALL, rank=0, world_size=1, job_name=job_name, output="torch")
    batch = next(iter(loader))
    assert isinstance(batch.images, torch.Tensor) and batch.images.dtype == torch.uint8
    assert tuple(batch.images.shape) == (8, 32, 32, 3)
    assert batch.labels.dtype == torch.int64
    assert not batch.images.numpy().flags.owndata


def test_to_device_normalises_like_torchvision(cluster, job_name) -> None:
    loader = stoker.Loader(cluster.coordinator, "train", batch_size=8, transforms=SMALL, rank=0, world_size=1, job_name=job_name)
    batch = next(iter(loader))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    images, labels = stoker_torch.to_device(batch, device)
    assert images.device.type == device and tuple(images.shape) == (8, 3, 32, 32)
    assert images.is_contiguous(memory_format=torch.channels_last)
    mean = np.array(stoker.IMAGENET_MEAN, dtype=np.float32).reshape(1, 3, 1, 1)
    std = np.array(stoker.IMAGENET_STD, dtype=np.float32).reshape(1, 3, 1, 1)
    expected = (batch.images.transpose(0, 3, 1, 2).astype(np.float32) / 255.0 - mean) / std
    np.testing.assert_allclose(images.cpu().numpy(), expected, atol=1e-5)
    assert labels.cpu().tolist() == batch.labels.tolist()


def test_the_iterable_dataset_works_under_a_dataloader(cluster, job_name) -> None:
    loader = stoker.Loader(cluster.coordinator, "train", batch_size=8, transforms=SMALL, rank=0, world_size=1, job_name=job_name)
    dataset = stoker_torch.StokerIterableDataset(loader)
    data = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=0)
    shapes = [tuple(images.shape) for images, _ in data]
    assert shapes == [(8, 32, 32, 3)] * len(dataset)


def test_the_iterable_dataset_refuses_several_dataloader_workers(cluster, job_name) -> None:
    loader = stoker.Loader(cluster.coordinator, "train", batch_size=8, transforms=SMALL, rank=0, world_size=1, job_name=job_name)
    data = torch.utils.data.DataLoader(stoker_torch.StokerIterableDataset(loader), batch_size=None, num_workers=2)
    with pytest.raises(Exception, match="num_workers=0"):
        next(iter(data))
