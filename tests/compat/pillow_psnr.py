"""What torchvision does to a PIL image for RandomResizedCrop, compared with Stoker's output.

Reads JSON from stdin: [{"path", "box": [left, top, width, height], "size": [h, w],
"output": PATH of Stoker's raw RGB bytes}, ...]. For each, Pillow decodes the file, converts to
RGB, crops the box and resizes it bilinearly (antialiased) — torchvision's
F.resized_crop(img, top, left, height, width, size) on a PIL image — and the PSNR of Stoker's
bytes against that is computed. Writes JSON to stdout: [psnr_db, ...] (inf when identical).
"""
import json
import math
import sys

from PIL import Image


def psnr(a: bytes, b: bytes) -> float:
    if len(a) != len(b):
        raise SystemExit(f"size mismatch: {len(a)} vs {len(b)} bytes")
    se = sum((x - y) * (x - y) for x, y in zip(a, b))
    if se == 0:
        return float("inf")
    return 10.0 * math.log10(255.0 * 255.0 * len(a) / se)


def main():
    out = []
    for case in json.load(sys.stdin):
        left, top, width, height = case["box"]
        h, w = case["size"]
        with Image.open(case["path"]) as img:
            ref = img.convert("RGB").crop((left, top, left + width, top + height)).resize((w, h), Image.BILINEAR)
        with open(case["output"], "rb") as fh:
            ours = fh.read()
        value = psnr(ours, ref.tobytes())
        out.append(value if math.isfinite(value) else 1000.0)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
