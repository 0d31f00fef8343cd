"""`make bench` part 2: the worker pipeline against its floor and the Pillow peer, one run.

Runs `stoker bench pipeline` over the same ImageNet-like images stored two ways: the WebDataset
shards the `webdataset` package wrote (the original JPEGs), and shards `stoker pack` wrote from
the same ImageFolder (JPEGs re-encoded losslessly with restart markers; packed once into
`stoker-pack/` beside the shards). Then benches/peers/pillow_rrc.py on the original shards.
Rewrites the section of BENCHMARKS.md between the `pipeline-bench` markers with the figures
and the commands that produced them.

Data: $STOKER_BENCH_DATA (a manifest or its folder); default
~/.cache/stoker-data/imagenet-like-10000/wds, made by ../shared/tools/imagenet-like/make.sh,
with the ImageFolder at ../imagefolder/train beside it ($STOKER_BENCH_IMAGES overrides).
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
    images = Path(os.environ.get("STOKER_BENCH_IMAGES", manifest.parent.parent / "imagefolder" / "train"))
    packed = manifest.parent.parent / "stoker-pack" / "manifest.json"
    if not packed.exists():
        if not images.is_dir():
            sys.exit(f"no ImageFolder at {images} to pack: set STOKER_BENCH_IMAGES")
        print("+ stoker pack", images, "->", packed.parent, file=sys.stderr, flush=True)
        subprocess.run([STOKER, "pack", "--input", images, "--output", packed.parent, "--force"], check=True)
    bench = [STOKER, "bench", "pipeline", "--seconds", SECONDS, "--json"]
    original = run_json([*bench, "--data", manifest, "--threads", "1"])
    one = run_json([*bench, "--data", packed, "--threads", "1"])
    against_original = run_json([*bench, "--data", packed, "--threads", "1", "--floor-data", manifest])
    two = run_json([*bench, "--data", packed, "--threads", "2", "--baseline-threads", "1"])
    pillow = run_json([sys.executable, ROOT / "benches/peers/pillow_rrc.py", "--data", str(manifest), "--seconds", SECONDS, "--json"])
    cmd = "`stoker bench pipeline --data {} --threads {}{}`"
    wds, pk = "wds", "stoker-pack"
    rows = [
        "| what (1 core unless said) | images/s | vs full decode, same run | command |",
        "|---|---:|---:|---|",
        f"| libjpeg-turbo full decode of the original JPEGs (floor) | {original['floor_images_per_sec']:.0f} | 1.00 | {cmd.format(wds, 1, '')} |",
        f"| Stoker pipeline, RandomResizedCrop(224) + flip, on the original JPEGs | {original['images_per_sec']:.0f} | {original['ratio_to_floor']:.2f} | {cmd.format(wds, 1, '')} |",
        f"| libjpeg-turbo full decode of the `stoker pack` JPEGs (floor) | {one['floor_images_per_sec']:.0f} | 1.00 | {cmd.format(pk, 1, '')} |",
        f"| **Stoker pipeline on `stoker pack` shards** | {one['images_per_sec']:.0f} | **{one['ratio_to_floor']:.2f}** | {cmd.format(pk, 1, '')} |",
        f"| Stoker pipeline on `stoker pack` shards, floor = full decode of the original JPEGs | {against_original['images_per_sec']:.0f} | {against_original['ratio_to_floor']:.2f} (floor {against_original['floor_images_per_sec']:.0f}) | {cmd.format(pk, 1, ' --floor-data ' + wds)} |",
        f"| Pillow, torchvision's RandomResizedCrop(224) + flip, 1 process, original JPEGs | {pillow['images_per_sec']:.0f} | {pillow['images_per_sec'] / original['floor_images_per_sec']:.2f} | `benches/peers/pillow_rrc.py --data {wds}` |",
        f"| libjpeg-turbo full decode of the `stoker pack` JPEGs (floor), 2 threads | {two['floor_images_per_sec']:.0f} | 1.00 | {cmd.format(pk, 2, ' --baseline-threads 1')} |",
        f"| **Stoker pipeline on `stoker pack` shards, 2 threads** | {two['images_per_sec']:.0f} | **{two['ratio_to_floor']:.2f}** | {cmd.format(pk, 2, ' --baseline-threads 1')} |",
        "",
        f"- Stoker (`stoker pack` shards) vs Pillow per core: **{one['images_per_sec'] / pillow['images_per_sec']:.2f}×**.",
        f"- Restart markers: the pipeline makes **{one['images_per_sec'] / original['images_per_sec']:.2f}×** the images per core of the same pipeline on the original JPEGs (separate runs); decoding whole, the re-encoded JPEGs run at {one['floor_images_per_sec'] / original['floor_images_per_sec']:.2f}× the originals (libjpeg-turbo takes a slower Huffman path for files with restart markers; the optimized Huffman tables of the re-encoding make up for some or all of it).",
        f"- 2 threads vs 1 thread, measured in turns in one run (`--baseline-threads 1`): **{two['scaling']:.2f}×** (floor: {two['floor_scaling']:.2f}×).",
        f"- The pipeline decoded {100 * one['decoded_pixel_fraction']:.0f}% of the source pixels (crop region + DCT scaling).",
        f"- {datetime.date.today()}, {platform.node()}, {os.cpu_count()} CPUs, {SECONDS} s per measurement; `{wds}` = `{manifest.parent}`, `{pk}` = `{packed.parent}`.",
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
