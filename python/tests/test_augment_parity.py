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
from torchvision.transforms import InterpolationMode  # noqa: E402
from torchvision.transforms import v2  # noqa: E402
from torchvision.transforms.v2 import functional as F  # noqa: E402

PHOTOS = [Path(sklearn_datasets.__file__).parent / "images" / name for name in ("china.jpg", "flower.jpg")]
# Largest difference in uint8 levels, and the largest fraction of values that may differ at
# all. Measured: brightness, contrast, saturation, hue, grayscale and erase give torchvision's
# bytes exactly on these images; the blur differs by 1 in at most 0.006% of values (Stoker
# makes two 1-D passes, torchvision one 2-D convolution: the same sum, rounded differently).
TOLERANCE = (1, 0.001)


def images() -> List[np.ndarray]:
    """Noise (every level, odd sizes; a square for the quarter turns) and two photographs
    (crops of 260x200)."""
    noise = np.random.default_rng(0).integers(0, 256, (37, 53, 3), dtype=np.uint8)
    square = np.random.default_rng(1).integers(0, 256, (40, 40, 3), dtype=np.uint8)
    photos = [np.ascontiguousarray(np.asarray(Image.open(path).convert("RGB"))[50:250, 100:360]) for path in PHOTOS]
    return [noise, square, *photos]


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
        elif kind == "sharpness":
            tensor = F.adjust_sharpness(tensor, op["factor"])
        elif kind == "posterize":
            tensor = F.posterize(tensor, op["bits"])
        elif kind == "solarize":
            tensor = F.solarize(tensor, op["threshold"])
        elif kind == "auto_contrast":
            tensor = F.autocontrast(tensor)
        elif kind == "equalize":
            tensor = F.equalize(tensor)
        elif kind == "affine":
            nearest = InterpolationMode.NEAREST
            scale = op.get("scale", 1.0)
            tensor = F.affine(tensor, op["angle"], op["translate"], scale, op["shear"], interpolation=nearest, fill=None, center=op["center"])
        elif kind == "rotate":
            tensor = F.rotate(tensor, op["angle"], interpolation=InterpolationMode.NEAREST, fill=None)
        elif kind == "invert":
            tensor = F.invert(tensor)
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
    # The auto-augment ops (TrivialAugmentWide, RandAugment).
    + [{"op": "sharpness", "factor": f} for f in (0.0, 0.5, 1.9)]
    + [{"op": "posterize", "bits": b} for b in (0, 2, 5, 8)]
    + [{"op": "solarize", "threshold": t} for t in (0.0, 127.5, 178.5, 255.0)]
    + [{"op": "auto_contrast"}, {"op": "equalize"}]
    + [{"op": "affine", "angle": 0.0, "translate": [0.0, 0.0], "shear": sh, "center": [0.0, 0.0]} for sh in ([16.7, 0.0], [-44.7, 0.0], [0.0, -30.0])]
    + [{"op": "affine", "angle": 0.0, "translate": t, "shear": [0.0, 0.0], "center": None} for t in ([13.0, 0.0], [0.0, -7.0], [-32.0, 0.0])]
    + [{"op": "rotate", "angle": a} for a in (4.5, -30.0, 90.0, -90.0, 135.0, 180.0)]
    # AutoAugment's Invert; RandomAffine's scale with the rest.
    + [{"op": "invert"}]
    + [
        {"op": "affine", "angle": a, "translate": t, "scale": sc, "shear": sh, "center": None}
        for a, t, sc, sh in ((0.0, [0.0, 0.0], 0.75, [0.0, 0.0]), (17.3, [3.0, -2.0], 1.3, [5.5, -3.0]), (-41.0, [-6.0, 4.0], 0.9, [0.0, 12.0]))
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


def auto_augment_ops(policy: "v2.Transform", height: int, width: int) -> List[Dict]:
    """Every explicit op torchvision's `policy` can apply to a `height` x `width` image: each
    op of its `_AUGMENTATION_SPACE` at each magnitude bin it may use, both signs where signed,
    mapped as `_apply_image_or_video_transform` maps them."""
    # AutoAugment's steps index tables of 10 bins (`magnitudes_fn(10, height, width)`).
    bins = 10 if isinstance(policy, v2.AutoAugment) else policy.num_magnitude_bins

    def translate(m: float) -> int:
        # torch's float32 linspace can land a unit in the last place below a whole number
        # (15.999999 for 16 on AVX-512), which `int()` truncates; Stoker computes the table
        # exactly (docs/transforms.md), so a whole number within 1e-4 counts as itself.
        return round(m) if abs(m - round(m)) < 1e-4 else int(m)

    used_bins = [policy.magnitude] if isinstance(policy, v2.RandAugment) else range(bins)
    ops: List[Dict] = []
    for name, (magnitudes_fn, signed) in policy._AUGMENTATION_SPACE.items():
        magnitudes = magnitudes_fn(bins, height, width)
        values = [0.0] if magnitudes is None else [float(magnitudes[b]) for b in used_bins]
        for value in values:
            for m in {value, -value} if signed else {value}:
                shear = float(np.degrees(np.arctan(m)))
                ops.append(
                    {
                        "Identity": None,
                        "ShearX": {"op": "affine", "angle": 0.0, "translate": [0.0, 0.0], "scale": 1.0, "shear": [shear, 0.0], "center": [0.0, 0.0]},
                        "ShearY": {"op": "affine", "angle": 0.0, "translate": [0.0, 0.0], "scale": 1.0, "shear": [0.0, shear], "center": [0.0, 0.0]},
                        "TranslateX": {
                            "op": "affine", "angle": 0.0, "translate": [float(translate(m)), 0.0], "scale": 1.0, "shear": [0.0, 0.0], "center": None,
                        },  # fmt: skip
                        "TranslateY": {
                            "op": "affine", "angle": 0.0, "translate": [0.0, float(translate(m))], "scale": 1.0, "shear": [0.0, 0.0], "center": None,
                        },  # fmt: skip
                        "Rotate": {"op": "rotate", "angle": m},
                        "Brightness": {"op": "brightness", "factor": 1.0 + m},
                        "Color": {"op": "saturation", "factor": 1.0 + m},
                        "Contrast": {"op": "contrast", "factor": 1.0 + m},
                        "Sharpness": {"op": "sharpness", "factor": 1.0 + m},
                        "Posterize": {"op": "posterize", "bits": int(m)},
                        "Solarize": {"op": "solarize", "threshold": 255.0 * m},
                        "AutoContrast": {"op": "auto_contrast"},
                        "Equalize": {"op": "equalize"},
                        "Invert": {"op": "invert"},
                    }[name]
                )
    return [op for op in ops if op is not None]


def same_op(ours: Dict, theirs: Dict) -> bool:
    if ours.keys() != theirs.keys() or ours["op"] != theirs["op"]:
        return False
    for key, value in ours.items():
        if key == "op" or value is None or theirs[key] is None:
            if value != theirs[key]:
                return False
        elif not np.allclose(np.asarray(value, dtype=float), np.asarray(theirs[key], dtype=float), rtol=1e-6, atol=1e-6):
            return False
    return True


POLICY_KINDS = {"affine", "rotate", "brightness", "saturation", "contrast", "sharpness", "posterize", "solarize", "auto_contrast", "equalize"}
# The ops ImageNet's AutoAugment policy uses (no Brightness, TranslateX/Y or ShearY; Invert).
IMAGENET_KINDS = POLICY_KINDS - {"brightness"} | {"invert"}


@pytest.mark.parametrize(
    "spec, policy, expected",
    [
        ({"type": "TrivialAugmentWide"}, v2.TrivialAugmentWide(), POLICY_KINDS),
        ({"type": "RandAugment"}, v2.RandAugment(), POLICY_KINDS),
        ({"type": "RandAugment", "num_ops": 3, "magnitude": 20}, v2.RandAugment(num_ops=3, magnitude=20), POLICY_KINDS),
        ({"type": "AutoAugment"}, v2.AutoAugment(), IMAGENET_KINDS),
    ],
    ids=["TrivialAugmentWide", "RandAugment", "RandAugment-3-20", "AutoAugment-imagenet"],
)
def test_auto_augment_draws_torchvisions_ops_and_torchvision_reproduces_the_pixels(spec: Dict, policy, expected, tmp_path: Path) -> None:
    """A spec with the policy through the worker's sample code: every op it reports is one
    torchvision's policy can apply (same op set, magnitude table and mapping), the number of ops
    is the policy's, every op of the set appears, and torchvision given the crop and the ops
    gives the worker's pixels."""
    size = 64
    crop = [{"type": "RandomResizedCrop", "size": size}]
    seeds = list(range(300))

    def run(transforms: List[Dict], out: Path) -> List[Dict]:
        args = ["transform", str(PHOTOS[1]), "--spec", json.dumps({"transforms": transforms, "dct_scaling": False}), "--seeds", "0..300", "--out", str(out)]
        done = subprocess.run([stoker_bin(), *args], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return [json.loads(line) for line in done.stdout.splitlines()]

    plain, augmented = run(crop, tmp_path / "plain"), run(crop + [spec], tmp_path / "augmented")
    possible = auto_augment_ops(policy, size, size)
    kinds = set()
    for before, after in zip(plain, augmented):
        ops = after["pixel_ops"]
        assert len(ops) <= getattr(policy, "num_ops", 2 if isinstance(policy, v2.AutoAugment) else 1)
        for op in ops:
            assert any(same_op(op, candidate) for candidate in possible), f"seed {after['seed']}: {op} is not one of torchvision's"
            kinds.add(op["op"])
        if after["seed"] < 40:
            seed = after["seed"]
            cropped = np.fromfile(tmp_path / "plain" / f"{seed}.raw", np.uint8).reshape(after["shape"])
            ours = np.fromfile(tmp_path / "augmented" / f"{seed}.raw", np.uint8).reshape(after["shape"])
            assert_within(ours, torchvision_apply(cropped, ops), f"seed {seed}: {ops}")
    assert kinds == expected, kinds
    assert len(seeds) == len(augmented)


def test_random_rotation_and_affine_draw_in_torchvisions_ranges_and_torchvision_reproduces_the_pixels(tmp_path: Path) -> None:
    """RandomRotation and RandomAffine through the worker's sample code: each draw in the
    ranges torchvision's `make_params` draws from (whole-pixel translations), and torchvision's
    `rotate` and `affine` given the crop and the drawn parameters give the worker's pixels."""
    crop = [{"type": "RandomResizedCrop", "size": 72}]
    spec = [
        {"type": "RandomRotation", "degrees": 25},
        {"type": "RandomAffine", "degrees": [-10, 40], "translate": [0.2, 0.1], "scale": [0.7, 1.3], "shear": [-8, 8, 0, 5]},
    ]

    def run(transforms: List[Dict], out: Path) -> List[Dict]:
        args = ["transform", str(PHOTOS[0]), "--spec", json.dumps({"transforms": transforms, "dct_scaling": False}), "--seeds", "0..40", "--out", str(out)]
        done = subprocess.run([stoker_bin(), *args], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return [json.loads(line) for line in done.stdout.splitlines()]

    plain, augmented = run(crop, tmp_path / "plain"), run(crop + spec, tmp_path / "augmented")
    assert len(augmented) == 40
    for before, after in zip(plain, augmented):
        rotation, affine = after["pixel_ops"]
        assert rotation["op"] == "rotate" and -25 <= rotation["angle"] <= 25, rotation
        assert affine["op"] == "affine" and -10 <= affine["angle"] <= 40 and 0.7 <= affine["scale"] <= 1.3, affine
        tx, ty = affine["translate"]
        assert tx == int(tx) and ty == int(ty) and abs(tx) <= round(0.2 * 72) and abs(ty) <= round(0.1 * 72), affine
        sx, sy = affine["shear"]
        assert -8 <= sx <= 8 and 0 <= sy <= 5 and affine["center"] is None, affine
        seed = after["seed"]
        cropped = np.fromfile(tmp_path / "plain" / f"{seed}.raw", np.uint8).reshape(after["shape"])
        ours = np.fromfile(tmp_path / "augmented" / f"{seed}.raw", np.uint8).reshape(after["shape"])
        assert_within(ours, torchvision_apply(cropped, after["pixel_ops"]), f"seed {seed}: {after['pixel_ops']}")
