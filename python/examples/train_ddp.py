"""ResNet training under torchrun with Stoker feeding every rank.

    torchrun --nproc-per-node 8 examples/train_ddp.py --coordinator HOST:7400 --dataset train

Each rank attaches with torchrun's RANK/WORLD_SIZE; Stoker's workers decode and augment, the
rank receives uint8 batches and `stoker.torch.to_device` normalises them on the GPU. Without a
GPU (or with --device cpu) it runs on CPU with the gloo backend; --model tiny swaps ResNet-50
for a two-layer CNN, for a smoke test. Checkpoints hold the model and the loader state, so a
restarted job continues mid-epoch without repeating or skipping samples.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import stoker
from stoker.torch import to_device


def tiny_model(classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, classes),
    )


def build_model(name: str, classes: int) -> nn.Module:
    if name == "tiny":
        return tiny_model(classes)
    import torchvision

    return getattr(torchvision.models, name)(num_classes=classes)


def main() -> None:
    parser = argparse.ArgumentParser(description="ResNet training under torchrun with Stoker")
    parser.add_argument("--coordinator", default=os.environ.get("STOKER_COORDINATOR", "127.0.0.1:7400"))
    parser.add_argument("--dataset", default="train")
    parser.add_argument("--batch-size", type=int, default=256, help="per rank")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--steps", type=int, default=0, help="stop each epoch after this many steps (0: whole epochs)")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--model", default="resnet50", help="a torchvision model name, or 'tiny'")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--checkpoint", default="", help="file to save after each epoch and resume from")
    args = parser.parse_args()

    device = torch.device(args.device)
    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
    model = build_model(args.model, args.classes).to(device).to(memory_format=torch.channels_last)
    if distributed:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    loss_fn = nn.CrossEntropyLoss()

    loader = stoker.Loader(
        args.coordinator,
        dataset=args.dataset,
        batch_size=args.batch_size,
        transforms=[stoker.RandomResizedCrop(args.size), stoker.RandomHorizontalFlip()],
        seed=0,
        shuffle="window",
        tail="drop",
    )
    first_epoch = 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        saved = torch.load(args.checkpoint, map_location="cpu", weights_only=False)
        (model.module if distributed else model).load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        loader.load_state_dict(saved["loader"])
        first_epoch = loader.epoch  # the epoch the loaded state is in
    rank = loader.rank
    for epoch in range(first_epoch, args.epochs):
        loader.set_epoch(epoch)
        model.train()
        started, images, steps = time.perf_counter(), 0, 0
        for batch in loader:
            x, y = to_device(batch, device)
            y = y.clamp(min=0) % args.classes  # unlabelled samples (-1) become class 0
            loss = loss_fn(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            images += len(batch)
            steps += 1
            if rank == 0 and steps % 20 == 0:
                print(f"epoch {epoch} step {steps}/{len(loader)} loss {loss.item():.3f}", flush=True)
            if args.steps and steps >= args.steps:
                break
        if device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - started
        print(
            f"rank {rank}: epoch {epoch}: {steps} steps, {images / elapsed:,.0f} img/s, data stall {loader.wait_seconds:.2f} s, loss {loss.item():.3f}",
            flush=True,
        )
        if args.checkpoint and rank == 0:
            state = {"model": (model.module if distributed else model).state_dict(), "optimizer": optimizer.state_dict(), "loader": loader.state_dict()}
            torch.save(state, args.checkpoint)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
