"""Run by test_lightning.py: a tiny model trained through StokerDataModule under Lightning's DDP
(2 CPU processes). argv: coordinator job_name out_dir phase max_steps [ckpt_path]. Each rank writes
the keys it trained and validated on to OUT/PHASE-rankR.jsonl.

With STOKER_TEST_CHECKPOINT_EVERY=N and STOKER_TEST_STALL_AT=M (the kill test), Lightning saves a
checkpoint every N steps (and last.ckpt), and rank 1, at the training step that follows global
step M, writes OUT/rank1.pid and OUT/stalled and sleeps, for the test to SIGKILL it there."""

import json
import os
import sys
import time
from pathlib import Path

import pytorch_lightning as pl
import torch
from torch import nn

import stoker
from stoker.lightning import StokerDataModule

coordinator, job_name, out, phase, max_steps = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4], int(sys.argv[5])
ckpt_path = sys.argv[6] if len(sys.argv) > 6 else None
checkpoint_every = int(os.environ.get("STOKER_TEST_CHECKPOINT_EVERY", "0"))
stall_at = int(os.environ.get("STOKER_TEST_STALL_AT", "-1"))


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(48, 4))

    def record(self, kind: str, batch: stoker.Batch) -> None:
        with open(out / f"{phase}-rank{self.global_rank}.jsonl", "a") as log:
            log.write(json.dumps({"kind": kind, "epoch": self.current_epoch, "batch_epoch": batch.epoch, "step": batch.step, "global_step": self.global_step, "keys": batch.keys}) + "\n")

    def training_step(self, batch: stoker.Batch, batch_idx: int) -> torch.Tensor:
        images, labels = batch
        assert images.dtype == torch.float32 and images.shape[1] == 3, (images.dtype, images.shape)
        self.record("train", batch)
        if self.global_rank == 1 and self.global_step == stall_at:
            (out / "rank1.pid").write_text(str(os.getpid()))
            (out / "stalled").write_text("")
            for _ in range(600):  # bounded: the test kills this process long before
                time.sleep(1)
        loss = nn.functional.cross_entropy(self.net(images), labels.clamp(min=0))
        self.log("loss", loss)  # infers the batch size from the Batch
        return loss

    def validation_step(self, batch: stoker.Batch, batch_idx: int) -> None:
        if not self.trainer.sanity_checking:
            self.record("val", batch)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


datamodule = StokerDataModule(
    coordinator, "train", 8, val_dataset="train", val_settings=dict(size=32, resize=32, job_name=job_name + "-val"),
    transforms=[stoker.RandomResizedCrop(32)], job_name=job_name, timeout=60,
)
# The first run saves a checkpoint mid-epoch, at its last step, as a run killed after it would.
# The kill test's first run saves one every N steps and last.ckpt, as a user's run would.
if ckpt_path is not None:
    saving = []
elif checkpoint_every:
    saving = [pl.callbacks.ModelCheckpoint(dirpath=out, filename="step{step}", every_n_train_steps=checkpoint_every, save_top_k=-1, save_last=True)]
else:
    saving = [pl.callbacks.ModelCheckpoint(dirpath=out, filename="mid", every_n_train_steps=max_steps, save_top_k=-1)]
trainer = pl.Trainer(
    accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, max_steps=max_steps, num_sanity_val_steps=2,
    callbacks=saving, enable_checkpointing=ckpt_path is None, logger=False, enable_progress_bar=False, enable_model_summary=False,
)
trainer.fit(Tiny(), datamodule=datamodule, ckpt_path=ckpt_path)
if trainer.global_rank == 0:
    (out / f"{phase}-done.json").write_text(json.dumps({"global_step": trainer.global_step}))
