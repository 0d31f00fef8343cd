"""Stoker's per-pixel augmentations against torchvision v2's functionals, on the same uint8
images with the same explicit parameters.

`stoker augment --ops JSON --size WxH` runs the worker's augmentation code on a raw RGB image
(stdin to stdout); torchvision gets the same image as a CHW uint8 tensor and the same
parameters. `stoker transform` prints the operations a spec drew for each seed ("pixel_ops"),
so the end-to-end test gives torchvision exactly what the worker drew. TOLERANCE is what
docs/transforms.md promises ("Parity with torchvision").
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest

from conftest import need_module, stoker_bin

torch = need_module("torch")
need_module("torchvision")
sklearn_datasets = need_module("sklearn.datasets")

from PIL import Image  # noqa: E402
from torchvision.transforms.v2 import functional as F  # noqa: E402

PHOTOS = [Path(sklearn_datasets.__file__).parent / "images" / name for name in ("china.jpg", "flower.jpg")]
# Largest difference in uint8 levels, and the largest fraction of values that may differ at
# all. Measured: brightness, contrast, saturation, hue, grayscale and erase give torchvision's
# bytes exactly on these images; the blur differs by 1 in at most 0.006% of values (Stoker
# makes two 1-D passes, torchvision one 2-D convolution: the same sum, rounded differently).
TOLERANCE = (1, 0.001)


def images() -> List[np.ndarray]:
    """Noise (every level, odd sizes) and two photographs (crops of 260x200)."""
    noise = np.random.default_rng(0).integers(0, 256, (37, 53, 3), dtype=np.uint8)
    photos = [np.ascontiguousarray(np.asarray(Image.open(path).convert("RGB"))[50:250, 100:360]) for path in PHOTOS]
    return [noise, *photos]


def stoker_augment(image: np.ndarray, ops: List[Dict]) -> np.ndarray:
    height, width, _ = image.shape
    done = subprocess.run(
        [stoker_bin(), "augment", "--ops", json.dumps(ops), "--size", f"{width}x{height}"], input=image.tobytes(), capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stderr.decode()
    return np.frombuffer(done.stdout, np.uint8).reshape(image.shape)


def torchvision_apply(image: np.ndarray, ops: List[Dict]) -> np.ndarray:
    """The same operations through torchvision.transforms.v2.functional on a CHW uint8 tensor."""
    tensor = torch.from_numpy(image.copy()).permute(2, 0, 1)
    for op in ops:
        kind = op["op"]
        if kind == "brightness":
            tensor = F.adjust_brightness(tensor, op["factor"])
        elif kind == "contrast":
            tensor = F.adjust_contrast(tensor, op["factor"])
        elif kind == "saturation":
            tensor = F.adjust_saturation(tensor, op["factor"])
        elif kind == "hue":
            tensor = F.adjust_hue(tensor, op["factor"])
        elif kind == "grayscale":
            tensor = F.rgb_to_grayscale(tensor, num_output_channels=3)
        elif kind == "erase":
            value = torch.tensor(op["value"], dtype=torch.uint8)[:, None, None]
            tensor = F.erase(tensor, op["top"], op["left"], op["height"], op["width"], value)
        elif kind == "gaussian_blur":
            tensor = F.gaussian_blur(tensor, kernel_size=op["kernel_size"], sigma=op["sigma"])
        else:
            raise AssertionError(f"unknown op {op}")
    return tensor.permute(1, 2, 0).numpy()


def assert_within(ours: np.ndarray, theirs: np.ndarray, what: str) -> None:
    assert ours.shape == theirs.shape
    d = np.abs(ours.astype(np.int32) - theirs.astype(np.int32))
    largest, fraction = TOLERANCE
    assert int(d.max()) <= largest and float((d > 0).mean()) <= fraction, (
        f"{what}: max {d.max()}, {float((d > 0).mean()):.5f} of values differ (allowed {TOLERANCE})"
    )


OPS = (
    [{"op": "brightness", "factor": f} for f in (0.0, 0.37, 1.0, 1.25, 1.9)]
    + [{"op": "contrast", "factor": f} for f in (0.0, 0.37, 1.25, 1.9)]
    + [{"op": "saturation", "factor": f} for f in (0.0, 0.37, 1.25, 1.9)]
    + [{"op": "hue", "factor": f} for f in (-0.5, -0.23, 0.0, 0.1, 0.33, 0.5)]
    + [{"op": "grayscale"}]
    + [{"op": "erase", "top": 3, "left": 5, "height": 20, "width": 31, "value": [124, 116, 104]}]
    + [
        {"op": "gaussian_blur", "kernel_size": k, "sigma": s}
        for k, s in (([3, 3], [0.1, 0.1]), ([5, 5], [1.3, 1.3]), ([9, 3], [2.0, 0.7]), ([23, 23], [1.9, 1.9]))
    ]
)


@pytest.mark.parametrize("op", OPS, ids=lambda op: "-".join(str(v) for v in op.values()))
def test_each_op_matches_torchvision_on_explicit_parameters(op: Dict) -> None:
    for index, image in enumerate(images()):
        assert_within(stoker_augment(image, [op]), torchvision_apply(image, [op]), f"image {index}, {op}")


def test_a_sequence_of_ops_matches_torchvisions_in_the_same_order() -> None:
    """ColorJitter's four ops in one of its orders, then grayscale-free blur and erase: order
    matters (the tests would fail if either side reordered)."""
    ops = [
        {"op": "hue", "factor": 0.21},
        {"op": "saturation", "factor": 1.6},
        {"op": "brightness", "factor": 0.7},
        {"op": "contrast", "factor": 1.4},
        {"op": "gaussian_blur", "kernel_size": [5, 7], "sigma": [0.8, 1.7]},
        {"op": "erase", "top": 0, "left": 0, "height": 9, "width": 4, "value": [0, 0, 0]},
    ]
    for index, image in enumerate(images()):
        ours = stoker_augment(image, ops)
        assert_within(ours, torchvision_apply(image, ops), f"image {index}")
        assert np.abs(ours.astype(int) - torchvision_apply(image, ops[::-1]).astype(int)).max() > 1, "the order shows"


def test_explicit_parameters_torchvision_refuses_are_refused() -> None:
    image = np.zeros((4, 4, 3), np.uint8)
    for ops in ([{"op": "hue", "factor": 0.7}], [{"op": "gaussian_blur", "kernel_size": [4, 3], "sigma": [1, 1]}], [{"op": "spin"}]):
        done = subprocess.run([stoker_bin(), "augment", "--ops", json.dumps(ops), "--size", "4x4"], input=image.tobytes(), capture_output=True)
        assert done.returncode != 0, ops
    done = subprocess.run([stoker_bin(), "augment", "--ops", "[]", "--size", "4x5"], input=image.tobytes(), capture_output=True)
    assert done.returncode != 0 and b"60" in done.stderr, done.stderr


def test_a_spec_draws_ops_that_torchvision_reproduces_on_the_same_crop(tmp_path: Path) -> None:
    """End to end: a spec with every augmentation through the worker's sample code. The same
    spec without them gives the same crop (the augmentations draw from their own stream);
    torchvision, given that crop and the ops the worker reports, gives the augmented pixels."""
    crop = [{"type": "RandomResizedCrop", "size": 96}, {"type": "RandomHorizontalFlip"}]
    augmentations = [
        {"type": "ColorJitter", "brightness": [0.6, 1.4], "contrast": [0.6, 1.4], "saturation": [0.6, 1.4], "hue": [-0.1, 0.1]},
        {"type": "RandomGrayscale", "p": 0.3},
        {"type": "GaussianBlur", "kernel_size": 5, "sigma": [0.1, 2.0]},
        {"type": "RandomErasing", "p": 0.7, "value": [124, 116, 104]},
    ]
    seeds = list(range(16))

    def run(transforms: List[Dict], out: Path) -> List[Dict]:
        spec = {"transforms": transforms, "dct_scaling": False}
        args = ["transform", str(PHOTOS[0]), "--spec", json.dumps(spec), "--seeds", ",".join(map(str, seeds)), "--out", str(out)]
        done = subprocess.run([stoker_bin(), *args], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return [json.loads(line) for line in done.stdout.splitlines()]

    plain, augmented = run(crop, tmp_path / "plain"), run(crop + augmentations, tmp_path / "augmented")
    kinds = set()
    for before, after in zip(plain, augmented):
        assert before["geometry"] == after["geometry"] and before["pixel_ops"] == []
        seed = after["seed"]
        cropped = np.fromfile(tmp_path / "plain" / f"{seed}.raw", np.uint8).reshape(after["shape"])
        ours = np.fromfile(tmp_path / "augmented" / f"{seed}.raw", np.uint8).reshape(after["shape"])
        assert_within(ours, torchvision_apply(cropped, after["pixel_ops"]), f"seed {seed}: {after['pixel_ops']}")
        kinds.update(op["op"] for op in after["pixel_ops"])
    assert kinds == {"brightness", "contrast", "saturation", "hue", "grayscale", "gaussian_blur", "erase"}, kinds
