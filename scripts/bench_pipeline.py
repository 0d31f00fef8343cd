"""`make bench` part 2: the worker pipeline against its floor and the Pillow peer, one run.

Runs `stoker bench pipeline` with 1 and 2 threads, and benches/peers/pillow_rrc.py, over the
same ImageNet-like shards, then rewrites the section of BENCHMARKS.md between the
`pipeline-bench` markers with the figures and the commands that produced them.

Data: $STOKER_BENCH_DATA (a manifest or its folder); default
~/.cache/stoker-data/imagenet-like-10000/wds, made by ../shared/tools/imagenet-like/make.sh.
"""
import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STOKER = ROOT / "target" / "release" / "stoker"
SECONDS = os.environ.get("STOKER_BENCH_SECONDS", "10")


def run_json(cmd):
    print("+", " ".join(map(str, cmd)), file=sys.stderr, flush=True)
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    data = Path(os.environ.get("STOKER_BENCH_DATA", Path.home() / ".cache/stoker-data/imagenet-like-10000/wds"))
    manifest = data / "manifest.json" if data.is_dir() else data
    if not manifest.exists():
        folder = manifest.parent
        shards = sorted(p.name for p in folder.glob("*.tar")) if folder.is_dir() else []
        if not shards:
            sys.exit(f"no dataset at {data}: run ../shared/tools/imagenet-like/make.sh, or set STOKER_BENCH_DATA")
        subprocess.run([STOKER, "index", *shards, "--manifest", "manifest.json"], check=True, cwd=folder)
    common = ["--data", str(manifest), "--seconds", SECONDS, "--json"]
    one = run_json([STOKER, "bench", "pipeline", "--threads", "1", *common])
    two = run_json([STOKER, "bench", "pipeline", "--threads", "2", *common])
    pillow = run_json([sys.executable, ROOT / "benches/peers/pillow_rrc.py", *common])
    rows = [
        "| what (1 core unless said) | images/s | vs full decode, same run | command |",
        "|---|---:|---:|---|",
        f"| libjpeg-turbo full decode (floor), 1 thread | {one['floor_images_per_sec']:.0f} | 1.00 | `stoker bench pipeline --threads 1` |",
        f"| **Stoker pipeline**, RandomResizedCrop(224) + flip, 1 thread | {one['images_per_sec']:.0f} | **{one['ratio_to_floor']:.2f}** | `stoker bench pipeline --threads 1` |",
        f"| Pillow, torchvision's RandomResizedCrop(224) + flip, 1 process | {pillow['images_per_sec']:.0f} | {pillow['images_per_sec'] / one['floor_images_per_sec']:.2f} | `benches/peers/pillow_rrc.py` |",
        f"| libjpeg-turbo full decode (floor), 2 threads | {two['floor_images_per_sec']:.0f} | 1.00 | `stoker bench pipeline --threads 2` |",
        f"| **Stoker pipeline**, 2 threads | {two['images_per_sec']:.0f} | **{two['ratio_to_floor']:.2f}** | `stoker bench pipeline --threads 2` |",
        "",
        f"- Stoker vs Pillow per core: **{one['images_per_sec'] / pillow['images_per_sec']:.2f}×**.",
        f"- 2 threads vs 1 thread: **{two['images_per_sec'] / one['images_per_sec']:.2f}×** (floor: {two['floor_images_per_sec'] / one['floor_images_per_sec']:.2f}×).",
        f"- The pipeline decoded {100 * one['decoded_pixel_fraction']:.0f}% of the source pixels (crop region + DCT scaling).",
        f"- {datetime.date.today()}, {platform.node()}, {os.cpu_count()} CPUs, {SECONDS} s per measurement, data `{manifest}`.",
    ]
    path = ROOT / "BENCHMARKS.md"
    text = path.read_text()
    start, end = "<!-- pipeline-bench:start -->", "<!-- pipeline-bench:end -->"
    if start not in text:
        sys.exit(f"{path} has no {start} marker")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    path.write_text(head + start + "\n" + "\n".join(rows) + "\n" + end + tail)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
