"""Issue 16, item 8: the batch stream behind ``StokerIterableDataset`` keeps each batch's
metadata and checkpoints with ``state_dict``/``load_state_dict`` (as torchdata's
``StatefulDataLoader`` calls them); a sample without a label gets ``missing_label``. These need
no PyTorch: ``stoker.torch`` adds only the tensor conversion on top."""

from __future__ import annotations

import io
import json
import tarfile
import uuid
from pathlib import Path

import numpy as np
import stoker
from stoker.stream import BatchStream

from conftest import SAMPLES, run_stoker

SMALL = [stoker.RandomResizedCrop(32), stoker.RandomHorizontalFlip()]


def make(cluster, job_name: str, dataset: str = "", **overrides) -> stoker.Loader:
    settings = dict(batch_size=8, transforms=SMALL, rank=0, world_size=1, job_name=job_name, timeout=60)
    settings.update(overrides)
    return stoker.Loader(cluster.coordinator, dataset or cluster.dataset, **settings)


def test_the_stream_yields_batches_with_their_metadata_and_checkpoints(cluster, job_name) -> None:
    reference = [(batch.step, batch.keys, batch.checksum) for batch in make(cluster, job_name + "-ref")]
    stream = BatchStream(make(cluster, job_name))
    stream.set_epoch(0)
    assert len(stream) == SAMPLES // 8
    iterator = iter(stream)
    first = [next(iterator) for _ in range(3)]
    assert all(isinstance(batch, stoker.Batch) and batch.layout == "NHWC" for batch in first)
    images, labels = first[0]
    assert images.shape == (8, 32, 32, 3) and labels.dtype == np.int64
    assert [(b.step, b.keys, b.checksum) for b in first] == reference[:3]
    state = json.loads(json.dumps(stream.state_dict()))
    stream.loader.close()
    resumed = BatchStream(make(cluster, job_name))
    resumed.load_state_dict(state)
    assert [(b.step, b.keys, b.checksum) for b in resumed] == reference[3:], "the rest, with their epoch steps"


def unlabelled_dataset(root: Path, coordinator: str) -> str:
    """Twelve JPEGs in a WebDataset shard with no `.cls` members, registered under a new name."""
    from PIL import Image

    root.mkdir(parents=True, exist_ok=True)
    shard = root / "unlabelled-000000.tar"
    rng = np.random.default_rng(3)
    with tarfile.open(shard, "w") as tar:
        for index in range(12):
            encoded = io.BytesIO()
            Image.fromarray(rng.integers(0, 255, size=(48, 48, 3), dtype=np.uint8)).save(encoded, format="JPEG")
            member = tarfile.TarInfo(f"sample{index:03d}.jpg")
            member.size = len(encoded.getvalue())
            tar.addfile(member, io.BytesIO(encoded.getvalue()))
    manifest = root / "manifest.json"
    run_stoker("index", str(shard), "--manifest", str(manifest))
    name = f"unlabelled-{uuid.uuid4().hex[:8]}"
    run_stoker("dataset", "add", name, str(manifest), "--coordinator", coordinator)
    return name


def test_a_sample_without_a_label_gets_missing_label(cluster, job_name, tmp_path: Path) -> None:
    dataset = unlabelled_dataset(tmp_path / "unlabelled", cluster.coordinator)
    default = next(iter(make(cluster, job_name, dataset, batch_size=4)))
    assert default.labels.tolist() == [-1] * 4
    ignored = next(iter(make(cluster, job_name + "-ce", dataset, batch_size=4, missing_label=-100)))
    assert ignored.labels.tolist() == [-100] * 4
    labelled = next(iter(make(cluster, job_name + "-l", missing_label=-100)))
    assert (labelled.labels >= 0).all(), "real labels are left alone"
