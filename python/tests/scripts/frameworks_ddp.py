"""Run by test_huggingface.py and test_torchdata.py under torchrun with 2 CPU processes: a tiny model
trained on a Stoker loader through Accelerate, transformers' Trainer or torchdata's
StatefulDataLoader, stopped after a checkpoint mid-epoch and resumed from it. argv: mode
(accelerate|trainer|torchdata) coordinator job_name out_dir phase
stop_after_steps. Each rank writes the keys it trained on, with the global step they trained, to
OUT/MODE-PHASE-rankR.jsonl.

With STOKER_TEST_CHECKPOINT_EVERY=N and STOKER_TEST_STALL_AT=M (the kill test, modes accelerate
and trainer, phase "killed"), the run saves its state every N steps, and rank 1, at the batch of
global step M, writes OUT/rank1.pid and OUT/stalled and sleeps, for the test to SIGKILL it there.
"""

import json
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn

import stoker
import stoker.huggingface as stoker_hf

mode, coordinator, job_name, out, phase, stop_after = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4]), sys.argv[5], int(sys.argv[6])
checkpoint_every = int(os.environ.get("STOKER_TEST_CHECKPOINT_EVERY", "0"))
stall_at = int(os.environ.get("STOKER_TEST_STALL_AT", "-1"))


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(48, 4))

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor) -> dict:
        return {"loss": nn.functional.cross_entropy(self.net(pixel_values), labels.clamp(min=0))}


def record(rank: int, batch: stoker.Batch, global_step: int) -> None:
    with open(out / f"{mode}-{phase}-rank{rank}.jsonl", "a") as log:
        log.write(json.dumps({"epoch": batch.epoch, "step": batch.step, "global_step": global_step, "keys": batch.keys}) + "\n")
    if rank == 1 and global_step == stall_at:
        (out / "rank1.pid").write_text(str(os.getpid()))
        (out / "stalled").write_text("")
        for _ in range(600):  # bounded: the test kills this process long before
            time.sleep(1)


def make_loader() -> stoker.Loader:
    return stoker.Loader(coordinator, "train", 8, transforms=[stoker.RandomResizedCrop(32)], job_name=job_name, output="torch", timeout=60)


if mode == "accelerate":
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    loader = make_loader()  # after Accelerator(): the process group gives the rank
    batches = stoker_hf.prepare_loader(accelerator, loader)
    model = Tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    start_epoch, steps = 0, 0
    if phase == "resumed":
        accelerator.load_state(str(out / "accelerate-state"))
        start_epoch = loader.epoch
        steps = start_epoch * len(loader) + len(loader) - loader.steps_remaining
    for epoch in range(start_epoch, 2):
        batches.set_epoch(epoch)
        for batch in batches:
            record(accelerator.process_index, batch, steps)
            images, labels = batch
            loss = model(images, labels)["loss"]
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
            steps += 1
            if checkpoint_every and steps % checkpoint_every == 0:
                accelerator.save_state(str(out / "accelerate-state"))
                accelerator.wait_for_everyone()  # the state is whole before any rank goes on
            if phase == "first" and steps == stop_after:
                accelerator.save_state(str(out / "accelerate-state"))
                accelerator.wait_for_everyone()
                loader.close()
                accelerator.end_training()
                sys.exit(0)
    accelerator.wait_for_everyone()
    loader.close()
    accelerator.end_training()
elif mode == "torchdata":
    import torch.distributed as dist
    from torchdata.stateful_dataloader import StatefulDataLoader

    import stoker.torch as stoker_torch

    dist.init_process_group("gloo")
    loader = make_loader()
    dataset = stoker_torch.StokerIterableDataset(loader)
    data = StatefulDataLoader(dataset, batch_size=None, num_workers=0)
    model = nn.parallel.DistributedDataParallel(Tiny())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = 0
    if phase == "resumed":
        saved = torch.load(out / "torchdata.pt", weights_only=False)
        model.module.load_state_dict(saved["model"])
        data.load_state_dict(saved["data"])  # applied by the next iter(data)
    # No set_epoch: each pass over the loader goes on with the next epoch, as a DataLoader's does.
    while True:
        for batch in data:
            record(dist.get_rank(), batch, steps)
            images, labels = stoker_torch.normalize_batch(batch)
            loss = model(images, labels)["loss"]
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
            if phase == "first" and steps == stop_after:
                state = data.state_dict()
                assert state["dataset_state"] == loader.state_dict(), "StatefulDataLoader's state carries Stoker's"
                if dist.get_rank() == 0:
                    torch.save({"model": model.module.state_dict(), "data": state}, out / "torchdata.pt")
                dist.barrier()
                loader.close()
                dist.destroy_process_group()
                sys.exit(0)
        if loader.epoch == 1:
            break
    # As the first phase and the other modes end: detach, wait for the other rank, then tear the
    # group down. Destroying it while the other rank was still in its last step's allreduce
    # aborted that rank in gloo's thread ("terminate called without an active exception",
    # SIGABRT: a clean-clone make test failed on it once).
    loader.close()
    dist.barrier()
    dist.destroy_process_group()
else:
    from transformers import TrainingArguments

    args = TrainingArguments(
        output_dir=str(out / "trainer"), per_device_train_batch_size=8, num_train_epochs=2, max_steps=stop_after if phase == "first" else -1,
        save_strategy="steps", save_steps=checkpoint_every or stop_after, logging_steps=1, report_to=[], use_cpu=True, dataloader_num_workers=0,
        learning_rate=0.01, disable_tqdm=True, save_only_model=False,
    )
    loader = make_loader()

    def inputs(batch: stoker.Batch) -> dict:
        record(loader.rank, batch, trainer.state.global_step)
        return stoker_hf.as_inputs(batch)

    trainer = stoker_hf.StokerTrainer(model=Tiny(), args=args, train_loader=loader, convert=inputs)
    trainer.train(resume_from_checkpoint=str(out / "trainer" / f"checkpoint-{stop_after}") if phase == "resumed" else None)
    if trainer.is_world_process_zero():
        (out / f"trainer-{phase}-done.json").write_text(json.dumps({"global_step": trainer.state.global_step}))
    # Detach and tear the process group down before exit, as the other modes do: left to the
    # interpreter's exit, gloo's threads were destroyed while joinable once (SIGABRT, "terminate
    # called without an active exception").
    loader.close()
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
