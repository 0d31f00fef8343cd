"""A small CNN that learns scikit-learn's handwritten digits through Stoker, and the same model
through PyTorch's own DataLoader, so the two can be compared (python/tests/test_learning.py
runs both and states the accuracy they must reach).

    # JPEG ImageFolders (train/ and heldout/, one folder per digit) and their Stoker shards
    python examples/train_digits.py prepare --out /tmp/digits
    stoker dataset add digits-train /tmp/digits/shards/train --coordinator HOST:PORT
    stoker dataset add digits-heldout /tmp/digits/shards/heldout --coordinator HOST:PORT
    # 2 CPU ranks (gloo, DDP): through stoker.Loader, evaluated with Loader.for_eval ...
    torchrun --standalone --nproc-per-node 2 examples/train_digits.py train --loader stoker \\
        --coordinator HOST:PORT --workdir /tmp/digits/run-stoker
    # ... and through DataLoader + DistributedSampler + torchvision transforms
    torchrun --standalone --nproc-per-node 2 examples/train_digits.py train --loader torch \\
        --images /tmp/digits/images --workdir /tmp/digits/run-torch

The images are the 1,797 8x8 digits of `sklearn.datasets.load_digits`, upscaled to 32x32 RGB
JPEGs and split 80/20 (stratified) into train and held-out sets. Both loaders apply the same
augmentation (RandomResizedCrop with a mild scale and ratio, no flip: a mirrored digit is
another symbol) and the same normalisation, so their accuracies should agree.

`--workdir DIR` receives `result.json` (accuracy, optimiser steps, samples per epoch),
`samples-rank{R}.jsonl` (every step's sample keys, one line per step: what the test checks
for "each sample once per epoch"), and with `--checkpoint-every N` a checkpoint (model,
optimiser, loader state, step count) every N steps and at the end of every epoch; a run
started again with the same `--workdir` continues from it. `--stall-at-step` is a test hook: the
rank stops there (after logging the step) so that a test can kill it at a known point.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

SIZE = 32
CLASSES = 10
MEAN = (0.5, 0.5, 0.5)
STD = (0.5, 0.5, 0.5)
# RandomResizedCrop's ranges: mild, so that a digit stays a digit.
SCALE = (0.6, 1.0)
RATIO = (0.8, 1.25)
SPLITS = ("train", "heldout")


def prepare(out: Path, stoker_bin: str = "stoker", heldout: float = 0.2) -> Dict[str, int]:
    """Write `out/images/{train,heldout}/digit{0-9}/NNNN.jpg` and pack each split into
    `out/shards/{split}` with `stoker pack`; returns the number of images of each split."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    indices = np.arange(len(digits.target))
    train, held = train_test_split(indices, test_size=heldout, stratify=digits.target, random_state=0)
    counts = {}
    for split, chosen in zip(SPLITS, (train, held)):
        for index in sorted(int(i) for i in chosen):
            folder = out / "images" / split / f"digit{digits.target[index]}"
            folder.mkdir(parents=True, exist_ok=True)
            # Pixel values are 0..16.
            pixels = np.clip(np.round(digits.images[index] * (255.0 / 16.0)), 0, 255).astype(np.uint8)
            image = Image.fromarray(pixels, mode="L").resize((SIZE, SIZE), Image.BICUBIC).convert("RGB")
            image.save(folder / f"{index:04d}.jpg", quality=95)
        counts[split] = len(chosen)
        subprocess.run(
            [stoker_bin, "pack", "--input", str(out / "images" / split), "--output", str(out / "shards" / split), "--shard-size", "16KiB", "--force"],
            check=True,
            capture_output=True,
            timeout=300,
        )
    return counts


def make_model():
    """Two convolutions and a linear layer: ~98% on the held-out digits after 6 epochs."""
    import torch.nn as nn

    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * (SIZE // 4) ** 2, CLASSES),
    )


class StokerData:
    """Training batches from `stoker.Loader`, evaluation batches from `Loader.for_eval`: float32
    NCHW tensors normalised by the workers."""

    def __init__(self, args: argparse.Namespace) -> None:
        import stoker

        train_transforms = [stoker.RandomResizedCrop(SIZE, scale=SCALE, ratio=RATIO), stoker.Normalize(MEAN, STD)]
        common = dict(layout="NCHW", output="torch", seed=args.seed, timeout=120)
        self.loader = stoker.Loader(
            args.coordinator, args.train_dataset, args.batch_size, transforms=train_transforms, job_name=f"{args.job}-train", **common
        )
        self.eval_loader = stoker.Loader.for_eval(
            args.coordinator,
            args.heldout_dataset,
            args.batch_size,
            transforms=[stoker.Resize(SIZE), stoker.CenterCrop(SIZE), stoker.Normalize(MEAN, STD)],
            job_name=f"{args.job}-heldout",
            **common,
        )

    def steps_per_epoch(self) -> int:
        return len(self.loader)

    def epoch(self, epoch: int) -> Iterator[Tuple[object, object, List[str]]]:
        self.loader.set_epoch(epoch)
        for batch in self.loader:
            yield batch.images, batch.labels, batch.keys

    def heldout(self) -> Iterator[Tuple[object, object, List[str]]]:
        """This rank's share of the held-out set: every sample once over the ranks."""
        for batch in self.eval_loader:
            yield batch.images, batch.labels, batch.keys

    def state_dict(self) -> dict:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.loader.load_state_dict(state)

    @property
    def resume_epoch(self) -> int:
        return self.loader.epoch


class TorchData:
    """`torchvision.datasets.ImageFolder` + `DistributedSampler` + `DataLoader`, with the same
    transforms written in torchvision v2 (on PIL images, as an ImageFolder yields them)."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch
        import torch.distributed as dist
        from torch.utils.data import DataLoader, DistributedSampler
        from torchvision import datasets
        from torchvision.transforms import v2

        tensor = [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]
        train_transform = v2.Compose([v2.RandomResizedCrop(SIZE, scale=SCALE, ratio=RATIO, antialias=True), *tensor])
        eval_transform = v2.Compose([v2.Resize(SIZE, antialias=True), v2.CenterCrop(SIZE), *tensor])
        root = Path(args.images)
        self.train_set = datasets.ImageFolder(str(root / "train"), transform=train_transform)
        self.heldout_set = datasets.ImageFolder(str(root / "heldout"), transform=eval_transform)
        self.sampler = DistributedSampler(self.train_set, num_replicas=dist.get_world_size(), rank=dist.get_rank(), shuffle=True, seed=args.seed, drop_last=True)
        self.loader = DataLoader(self.train_set, batch_size=args.batch_size, sampler=self.sampler, drop_last=True, num_workers=0)
        self.eval_sampler = DistributedSampler(self.heldout_set, num_replicas=dist.get_world_size(), rank=dist.get_rank(), shuffle=False, drop_last=False)
        self.eval_loader = DataLoader(self.heldout_set, batch_size=args.batch_size, sampler=self.eval_sampler, num_workers=0)
        self.root = root

    def _keys(self, samples: List[Tuple[str, int]], indices: List[int]) -> List[str]:
        return [str(Path(samples[i][0]).relative_to(self.root).with_suffix("")) for i in indices]

    def steps_per_epoch(self) -> int:
        return len(self.loader)

    def epoch(self, epoch: int) -> Iterator[Tuple[object, object, List[str]]]:
        self.sampler.set_epoch(epoch)
        order = list(self.sampler)
        for step, (images, labels) in enumerate(self.loader):
            yield images, labels, self._keys(self.train_set.samples, order[step * len(labels) : (step + 1) * len(labels)])

    def heldout(self) -> Iterator[Tuple[object, object, List[str]]]:
        """This rank's share of the held-out set; DistributedSampler pads it to a multiple of
        the world size, so a few samples count twice (as they do in most DDP evaluations)."""
        order = list(self.eval_sampler)
        seen = 0
        for images, labels in self.eval_loader:
            yield images, labels, self._keys(self.heldout_set.samples, order[seen : seen + len(labels)])
            seen += len(labels)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        raise SystemExit("resuming mid-epoch is shown with --loader stoker; a plain DataLoader restarts its epoch")

    @property
    def resume_epoch(self) -> int:
        return 0


def save_atomically(state: dict, path: Path) -> None:
    import torch

    partial = path.with_suffix(".partial")
    torch.save(state, partial)
    os.replace(partial, path)


def train(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    run = Path(args.workdir)
    run.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    model = make_model()
    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()
    data = StokerData(args) if args.loader == "stoker" else TorchData(args)
    checkpoint = run / "checkpoint.pt"
    global_step, first_epoch = 0, 0
    if checkpoint.exists():
        saved = torch.load(checkpoint, map_location="cpu", weights_only=False)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        data.load_state_dict(saved["loader"])
        global_step, first_epoch = saved["global_step"], data.resume_epoch
    (run / f"rank{rank}.pid").write_text(str(os.getpid()))
    log = open(run / f"samples-rank{rank}.jsonl", "a")
    started = time.monotonic()
    for epoch in range(first_epoch, args.epochs):
        ddp.train()
        for images, labels, keys in data.epoch(epoch):
            loss = loss_fn(ddp(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            global_step += 1
            line = {"pid": os.getpid(), "epoch": epoch, "global_step": global_step, "keys": keys, "labels": labels.tolist()}
            log.write(json.dumps(line) + "\n")
            log.flush()
            if rank == 0 and args.checkpoint_every and global_step % args.checkpoint_every == 0:
                save_atomically({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "loader": data.state_dict(), "global_step": global_step}, checkpoint)
            if global_step == args.stall_at_step and rank == args.stall_rank:
                (run / "stalled").write_text(str(os.getpid()))
                deadline = time.monotonic() + 600
                while time.monotonic() < deadline:  # until the test kills this rank
                    time.sleep(0.1)
                raise SystemExit("stalled for 600 s and nobody killed this rank")
        if rank == 0 and args.checkpoint_every:
            save_atomically({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "loader": data.state_dict(), "global_step": global_step}, checkpoint)
        if rank == 0:
            print(f"epoch {epoch}: step {global_step}, loss {loss.item():.3f}", flush=True)
    train_seconds = time.monotonic() - started
    log.close()
    ddp.eval()
    correct = torch.zeros(2, dtype=torch.int64)
    heldout_keys: List[str] = []
    with torch.no_grad():
        for images, labels, keys in data.heldout():
            correct[0] += int((ddp.module(images).argmax(dim=1) == labels).sum())
            correct[1] += len(labels)
            heldout_keys.extend(keys)
    dist.all_reduce(correct)
    gathered: List[List[str]] = [[] for _ in range(world)]
    dist.all_gather_object(gathered, heldout_keys)
    if rank == 0:
        result = {
            "loader": args.loader,
            "accuracy": int(correct[0]) / int(correct[1]),
            "evaluated": int(correct[1]),
            "evaluated_distinct": len({key for keys in gathered for key in keys}),
            "optimizer_steps": global_step,
            "steps_per_epoch": data.steps_per_epoch(),
            "epochs": args.epochs,
            "train_seconds": train_seconds,
        }
        (run / "result.json").write_text(json.dumps(result, indent=1))
        print(json.dumps(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    prep = commands.add_parser("prepare", help="write the digits as JPEG ImageFolders and pack them")
    prep.add_argument("--out", required=True)
    prep.add_argument("--stoker", default=os.environ.get("STOKER_BIN", "stoker"), help="the stoker binary")
    fit = commands.add_parser("train", help="train and evaluate (under torchrun)")
    fit.add_argument("--loader", choices=("stoker", "torch"), default="stoker")
    fit.add_argument("--coordinator", default=os.environ.get("STOKER_COORDINATOR", "127.0.0.1:7400"))
    fit.add_argument("--train-dataset", default="digits-train")
    fit.add_argument("--heldout-dataset", default="digits-heldout")
    fit.add_argument("--job", default="digits", help="Stoker job name prefix (-train, -heldout)")
    fit.add_argument("--images", help="the ImageFolders (prepare's OUT/images), for --loader torch")
    fit.add_argument("--workdir", required=True, help="folder for the result, sample log and checkpoint")
    fit.add_argument("--epochs", type=int, default=6)
    fit.add_argument("--batch-size", type=int, default=32, help="per rank")
    fit.add_argument("--lr", type=float, default=2e-3, help="Adam's learning rate")
    fit.add_argument("--seed", type=int, default=0)
    fit.add_argument("--checkpoint-every", type=int, default=0, help="steps between checkpoints (0: none)")
    fit.add_argument("--stall-at-step", type=int, default=0, help="test hook: stop at this global step")
    fit.add_argument("--stall-rank", type=int, default=1)
    args = parser.parse_args()
    if args.command == "prepare":
        print(json.dumps(prepare(Path(args.out), args.stoker)))
    else:
        train(args)


if __name__ == "__main__":
    main()
