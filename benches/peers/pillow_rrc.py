"""The peer baseline: what a PyTorch DataLoader worker does per image with torchvision on PIL.

For each JPEG of the dataset: decode with Pillow, RandomResizedCrop(size) (torchvision's box
algorithm, bilinear antialiased resize), RandomHorizontalFlip(), and copy the pixels out as
`pil_to_tensor` would. One process, so the rate is per core. torchvision itself is not needed:
its crop algorithm is a dozen lines of Python, repeated here, and its PIL path calls exactly
these Pillow functions.

Usage: pillow_rrc.py --data MANIFEST [--seconds 10] [--size 224] [--json]
"""
import argparse
import io
import json
import math
import random
import sys
import tarfile
import time
from pathlib import Path

from PIL import Image


def get_params(width, height, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * random.uniform(scale[0], scale[1])
        aspect_ratio = math.exp(random.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            return random.randint(0, height - h), random.randint(0, width - w), h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def load_jpegs(manifest_path):
    manifest = json.loads(Path(manifest_path).read_text())
    base = Path(manifest_path).parent
    images = []
    for shard in manifest["shards"]:
        uri = shard["uri"]
        path = Path(uri[len("file://"):]) if uri.startswith("file://") else base / uri
        with tarfile.open(path) as tar:
            for member in tar:
                if member.isfile() and member.name.lower().endswith((".jpg", ".jpeg")):
                    images.append(tar.extractfile(member).read())
    return images


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="manifest.json, or the folder holding it")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    manifest = Path(args.data)
    if manifest.is_dir():
        manifest = manifest / "manifest.json"
    images = load_jpegs(manifest)
    if not images:
        sys.exit(f"{manifest}: no JPEG members")
    random.seed(0)
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        data = images[done % len(images)]
        with Image.open(io.BytesIO(data)) as img:
            img = img.convert("RGB")
            top, left, h, w = get_params(img.width, img.height)
            out = img.crop((left, top, left + w, top + h)).resize((args.size, args.size), Image.BILINEAR)
            if random.random() < 0.5:
                out = out.transpose(Image.FLIP_LEFT_RIGHT)
            out.tobytes()
        done += 1
    elapsed = time.perf_counter() - start
    rate = done / elapsed
    if args.json:
        print(json.dumps({"images_per_sec": rate, "images": done, "seconds": elapsed, "threads": 1}))
    else:
        print(f"pillow rrc {rate:9.1f} images/s  ({done} images in {elapsed:.1f} s, 1 process)")


if __name__ == "__main__":
    main()
