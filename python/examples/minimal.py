"""The smallest Stoker trainer: numpy only. Consumes two epochs and prints the rate.

    stoker coordinator --data-dir /tmp/stoker &      # or `stoker demo` for a self-contained run
    stoker dataset add train /data/imagenet-shards
    stoker worker --coordinator 127.0.0.1:7400 --listen 127.0.0.1:7500 --threads 2 &
    python examples/minimal.py --coordinator 127.0.0.1:7400 --dataset train
"""

import argparse
import time

import numpy as np
import stoker


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--coordinator", default="127.0.0.1:7400", help="HOST:PORT of the coordinator, or HOST:PORT,HOST:PORT,... of a replicated one")
    parser.add_argument("--dataset", default="train", help="name given to `stoker dataset add`")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--size", type=int, default=224, help="RandomResizedCrop output size")
    args = parser.parse_args()

    loader = stoker.Loader(
        args.coordinator,
        dataset=args.dataset,
        batch_size=args.batch_size,
        transforms=[stoker.RandomResizedCrop(args.size), stoker.RandomHorizontalFlip()],
    )
    print(f"{loader}: {len(loader)} steps per epoch")
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        started, images = time.perf_counter(), 0
        checksum = 0
        for batch in loader:
            x, y = batch  # uint8 [B, H, W, 3] and int64 [B], views of the received buffers
            images += len(batch)
            checksum ^= int(np.bitwise_xor.reduce(x[:, 0, 0, 0]))
        elapsed = time.perf_counter() - started
        print(f"epoch {epoch}: {images} images in {elapsed:.2f} s = {images / elapsed:,.0f} img/s, data stall {loader.wait_seconds:.2f} s")


if __name__ == "__main__":
    main()
