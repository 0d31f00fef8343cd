"""Transforms the workers apply, named and parameterised as in torchvision.

Each is a small frozen dataclass whose ``to_dict()`` is the JSON form of the Rust
``Transform`` (the same spec a Rust trainer or ``stoker consume`` states). Arguments are checked
here, so a mistake raises :class:`stoker.ConfigError` where it is made.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Sequence, Tuple, Union, get_args

from stoker.errors import ConfigError

Size = Union[int, Tuple[int, int]]

INTERPOLATIONS = ("nearest", "bilinear", "bicubic")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _size(name: str, size: Any) -> Any:
    """``224`` or ``(height, width)`` → the JSON form, checked."""
    if isinstance(size, bool):
        raise ConfigError(f"{name}: size must be an int or (height, width), got {size!r}")
    if isinstance(size, int):
        sides: Sequence[Any] = (size,)
    elif isinstance(size, (tuple, list)) and len(size) == 2:
        sides = size
    else:
        raise ConfigError(f"{name}: size must be an int or (height, width), got {size!r}")
    for side in sides:
        if isinstance(side, bool) or not isinstance(side, int) or side < 1:
            raise ConfigError(f"{name}: sizes must be positive ints, got {size!r}")
    if isinstance(size, int) or size[0] == size[1]:
        return int(sides[0])
    return [int(size[0]), int(size[1])]


def _range(name: str, field: str, value: Any) -> Tuple[float, float]:
    try:
        low, high = (float(value[0]), float(value[1]))
    except (TypeError, ValueError, IndexError, KeyError):
        raise ConfigError(f"{name}: {field} must be a (low, high) pair of numbers, got {value!r}") from None
    if len(value) != 2 or not (0.0 < low <= high) or not math.isfinite(high):
        raise ConfigError(f"{name}: {field} must be a (low, high) pair with 0 < low <= high, got {value!r}")
    return (low, high)


def _interpolation(name: str, interpolation: str) -> str:
    if interpolation not in INTERPOLATIONS:
        raise ConfigError(f"{name}: interpolation must be one of {', '.join(INTERPOLATIONS)}, got {interpolation!r}")
    return interpolation


@dataclass(frozen=True)
class RandomResizedCrop:
    """Crop a random box (area ``scale``, aspect ``ratio``) and resize it to ``size``,
    drawing the box exactly as torchvision does from the sample's seed."""

    size: Size
    scale: Tuple[float, float] = (0.08, 1.0)
    ratio: Tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0)
    interpolation: str = "bilinear"

    def __post_init__(self) -> None:
        _size("RandomResizedCrop", self.size)
        _range("RandomResizedCrop", "scale", self.scale)
        _range("RandomResizedCrop", "ratio", self.ratio)
        _interpolation("RandomResizedCrop", self.interpolation)

    def to_dict(self) -> Dict[str, Any]:
        return {
            "type": "RandomResizedCrop",
            "size": _size("RandomResizedCrop", self.size),
            "scale": list(_range("RandomResizedCrop", "scale", self.scale)),
            "ratio": list(_range("RandomResizedCrop", "ratio", self.ratio)),
            "interpolation": self.interpolation,
        }


@dataclass(frozen=True)
class Resize:
    """Resize so that the shorter side is ``shorter_side``, keeping the aspect ratio."""

    shorter_side: int
    interpolation: str = "bilinear"

    def __post_init__(self) -> None:
        if isinstance(self.shorter_side, bool) or not isinstance(self.shorter_side, int) or self.shorter_side < 1:
            raise ConfigError(f"Resize: shorter_side must be a positive int, got {self.shorter_side!r}")
        _interpolation("Resize", self.interpolation)

    def to_dict(self) -> Dict[str, Any]:
        return {"type": "Resize", "shorter_side": self.shorter_side, "interpolation": self.interpolation}


@dataclass(frozen=True)
class CenterCrop:
    """Crop the centre ``size`` (black padding where the image is smaller)."""

    size: Size

    def __post_init__(self) -> None:
        _size("CenterCrop", self.size)

    def to_dict(self) -> Dict[str, Any]:
        return {"type": "CenterCrop", "size": _size("CenterCrop", self.size)}


@dataclass(frozen=True)
class RandomHorizontalFlip:
    """Mirror left-right with probability ``p``."""

    p: float = 0.5

    def __post_init__(self) -> None:
        if isinstance(self.p, bool) or not isinstance(self.p, (int, float)) or not (0.0 <= self.p <= 1.0):
            raise ConfigError(f"RandomHorizontalFlip: p must be a probability in [0, 1], got {self.p!r}")

    def to_dict(self) -> Dict[str, Any]:
        return {"type": "RandomHorizontalFlip", "p": float(self.p)}


@dataclass(frozen=True)
class Normalize:
    """Scale to [0, 1], subtract ``mean``, divide by ``std`` (torchvision's ``ToTensor`` then
    ``Normalize``) on the worker, and output ``dtype`` floats ("float32" or "float16").

    Often cheaper on the GPU: keep uint8 batches and use ``stoker.torch.to_device``."""

    mean: Tuple[float, float, float] = IMAGENET_MEAN
    std: Tuple[float, float, float] = IMAGENET_STD
    dtype: Any = "float32"

    def __post_init__(self) -> None:
        for field, values in (("mean", self.mean), ("std", self.std)):
            if len(values) != 3 or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
                raise ConfigError(f"Normalize: {field} must be three finite numbers (R, G, B), got {values!r}")
        if any(v <= 0 for v in self.std):
            raise ConfigError(f"Normalize: std must be positive, got {self.std!r}")
        if _dtype_name(self.dtype) is None:
            raise ConfigError(f"Normalize: dtype must be 'float32' or 'float16' (or torch.float32, torch.float16), got {self.dtype!r}")

    def to_dict(self) -> Dict[str, Any]:
        return {
            "type": "Normalize",
            "mean": [float(v) for v in self.mean],
            "std": [float(v) for v in self.std],
            "dtype": {"float32": "f32", "float16": "f16"}[_dtype_name(self.dtype) or "float32"],
        }


def _factor_range(name: str, field: str, value: Any, center: float, low_bound: float, high_bound: float) -> Any:
    """torchvision's ``ColorJitter._check_input``: ``x`` means ``[center - x, center + x]``
    (the low end clipped at 0 for factors), a pair is taken as given; ``None`` where nothing
    would change."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ConfigError(f"{name}: {field} must be a number or a (low, high) pair, got {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ConfigError(f"{name}: {field} as a single number must be non-negative, got {value!r}")
        low, high = center - float(value), center + float(value)
        if field != "hue":
            low = max(low, 0.0)
    elif isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        low, high = float(value[0]), float(value[1])
    else:
        raise ConfigError(f"{name}: {field} must be a number or a (low, high) pair, got {value!r}")
    if not (low_bound <= low <= high <= high_bound) or not math.isfinite(high):
        raise ConfigError(f"{name}: {field} must lie in [{low_bound}, {high_bound}] with low <= high, got {value!r}")
    return None if low == high == center else [low, high]


def _probability(name: str, p: Any) -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not (0.0 <= p <= 1.0):
        raise ConfigError(f"{name}: p must be a probability in [0, 1], got {p!r}")
    return float(p)


@dataclass(frozen=True)
class ColorJitter:
    """torchvision v2's ``ColorJitter``: change brightness, contrast, saturation and hue by
    factors drawn from the sample's seed, the four in a random order (as torchvision draws it).
    Each argument is a number ``x`` (factors in ``[max(0, 1 - x), 1 + x]``, hue shifts in
    ``[-x, x]`` turns, ``x <= 0.5``) or a ``(low, high)`` pair. Runs on the uint8 image after
    the crop and the flip, before ``Normalize``."""

    brightness: Any = None
    contrast: Any = None
    saturation: Any = None
    hue: Any = None

    def __post_init__(self) -> None:
        self.to_dict()

    def to_dict(self) -> Dict[str, Any]:
        result: Dict[str, Any] = {"type": "ColorJitter"}
        for field in ("brightness", "contrast", "saturation"):
            result[field] = _factor_range("ColorJitter", field, getattr(self, field), 1.0, 0.0, math.inf)
        result["hue"] = _factor_range("ColorJitter", "hue", self.hue, 0.0, -0.5, 0.5)
        return result


@dataclass(frozen=True)
class RandomGrayscale:
    """Make the image gray (torchvision's weights 0.2989, 0.587, 0.114 in all three channels)
    with probability ``p``."""

    p: float = 0.1

    def __post_init__(self) -> None:
        _probability("RandomGrayscale", self.p)

    def to_dict(self) -> Dict[str, Any]:
        return {"type": "RandomGrayscale", "p": float(self.p)}


@dataclass(frozen=True)
class RandomErasing:
    """torchvision's ``RandomErasing``: with probability ``p``, fill a box of random area
    (``scale``, a fraction of the image) and aspect ratio (``ratio``, height / width) with
    ``value``.

    Unlike torchvision's usual place (after ``Normalize``, where ``value=0`` is the mean
    colour), Stoker erases the uint8 image before ``Normalize``: ``value`` is in pixel levels
    0-255, one number or ``(r, g, b)``. ``value=0`` writes black. To get torchvision's
    post-normalisation ``value=0``, write the mean in levels: ``round(mean * 255)``, e.g.
    ``(124, 116, 104)`` for ImageNet (``RandomErasing.imagenet_mean()``). Random-noise fills
    (torchvision's ``value="random"``) are not made."""

    p: float = 0.5
    scale: Tuple[float, float] = (0.02, 0.33)
    ratio: Tuple[float, float] = (0.3, 3.3)
    value: Any = 0

    def __post_init__(self) -> None:
        self.to_dict()

    @staticmethod
    def imagenet_mean(p: float = 0.5, scale: Tuple[float, float] = (0.02, 0.33), ratio: Tuple[float, float] = (0.3, 3.3)) -> "RandomErasing":
        """Erase with ImageNet's mean colour, what ``value=0`` after ``Normalize`` fills."""
        return RandomErasing(p, scale, ratio, tuple(round(m * 255) for m in IMAGENET_MEAN))

    def to_dict(self) -> Dict[str, Any]:
        p = _probability("RandomErasing", self.p)
        try:
            scale = (float(self.scale[0]), float(self.scale[1]))
        except (TypeError, ValueError, IndexError):
            raise ConfigError(f"RandomErasing: scale must be a (low, high) pair, got {self.scale!r}") from None
        if len(self.scale) != 2 or not (0.0 <= scale[0] <= scale[1] <= 1.0):
            raise ConfigError(f"RandomErasing: scale must satisfy 0 <= low <= high <= 1, got {self.scale!r}")
        ratio = _range("RandomErasing", "ratio", self.ratio)
        levels = [self.value] if isinstance(self.value, (int, float)) and not isinstance(self.value, bool) else self.value
        if (
            not isinstance(levels, (list, tuple))
            or len(levels) not in (1, 3)
            or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 255 for v in levels)
        ):
            raise ConfigError(f"RandomErasing: value must be a level 0-255 or (r, g, b) levels (uint8, before Normalize), got {self.value!r}")
        return {"type": "RandomErasing", "p": p, "scale": list(scale), "ratio": list(ratio), "value": int(levels[0]) if len(levels) == 1 else [int(v) for v in levels]}


@dataclass(frozen=True)
class GaussianBlur:
    """torchvision's ``GaussianBlur``: a Gaussian kernel of ``kernel_size`` (odd; a number or
    ``(width, height)``, torchvision's order) with a standard deviation drawn uniformly from
    ``sigma`` (a number or ``(low, high)``), edges reflected."""

    kernel_size: Any
    sigma: Any = (0.1, 2.0)

    def __post_init__(self) -> None:
        self.to_dict()

    def to_dict(self) -> Dict[str, Any]:
        sides = [self.kernel_size] if isinstance(self.kernel_size, int) else self.kernel_size
        if (
            not isinstance(sides, (list, tuple))
            or len(sides) not in (1, 2)
            or not all(isinstance(k, int) and not isinstance(k, bool) and k > 0 and k % 2 == 1 and k <= 255 for k in sides)
        ):
            raise ConfigError(f"GaussianBlur: kernel_size must be odd positive ints (at most 255), one or (width, height), got {self.kernel_size!r}")
        sigma = (self.sigma, self.sigma) if isinstance(self.sigma, (int, float)) and not isinstance(self.sigma, bool) else self.sigma
        low, high = _range("GaussianBlur", "sigma", sigma)
        kernel = int(sides[0]) if len(sides) == 1 or sides[0] == sides[1] else [int(sides[0]), int(sides[1])]
        return {"type": "GaussianBlur", "kernel_size": kernel, "sigma": [low, high]}


def _count(name: str, field: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not (low <= value <= high):
        raise ConfigError(f"{name}: {field} must be an int in [{low}, {high}], got {value!r}")
    return value


@dataclass(frozen=True)
class TrivialAugmentWide:
    """torchvision v2's ``TrivialAugmentWide``: one op per image, uniformly of Identity,
    ShearX/Y, TranslateX/Y, Rotate, Brightness, Color, Contrast, Sharpness, Posterize, Solarize,
    AutoContrast and Equalize, at a uniformly drawn magnitude bin (of ``num_magnitude_bins``),
    negated half the time where signed. Geometric ops sample the nearest pixel and fill with 0
    (torchvision's defaults, the only ones made). Runs after the crop, before ``Normalize``."""

    num_magnitude_bins: int = 31

    def __post_init__(self) -> None:
        _count("TrivialAugmentWide", "num_magnitude_bins", self.num_magnitude_bins, 2, 1000)

    def to_dict(self) -> Dict[str, Any]:
        return {"type": "TrivialAugmentWide", "num_magnitude_bins": self.num_magnitude_bins}


@dataclass(frozen=True)
class RandAugment:
    """torchvision v2's ``RandAugment``: ``num_ops`` ops per image, each uniformly of the same
    set as :class:`TrivialAugmentWide`, at magnitude bin ``magnitude`` of
    ``num_magnitude_bins`` (translations scale with the image, as torchvision's), negated half
    the time where signed. Nearest pixel, fill 0."""

    num_ops: int = 2
    magnitude: int = 9
    num_magnitude_bins: int = 31

    def __post_init__(self) -> None:
        _count("RandAugment", "num_ops", self.num_ops, 0, 16)
        bins = _count("RandAugment", "num_magnitude_bins", self.num_magnitude_bins, 2, 1000)
        _count("RandAugment", "magnitude", self.magnitude, 0, bins - 1)

    def to_dict(self) -> Dict[str, Any]:
        return {"type": "RandAugment", "num_ops": self.num_ops, "magnitude": self.magnitude, "num_magnitude_bins": self.num_magnitude_bins}


AUTO_AUGMENT_POLICIES = ("imagenet", "cifar10", "svhn")


@dataclass(frozen=True)
class AutoAugment:
    """torchvision v2's ``AutoAugment``: per image one of the policy's 25 learned sub-policies,
    each of two ops applied with its own probability at its own magnitude (the same op tables
    as :class:`RandAugment`, plus Invert). ``policy`` is ``"imagenet"`` (torchvision's default),
    ``"cifar10"`` or ``"svhn"``, or torchvision's ``AutoAugmentPolicy``. Nearest pixel, fill 0."""

    policy: Any = "imagenet"

    def __post_init__(self) -> None:
        name = str(getattr(self.policy, "value", self.policy)).lower()
        if name not in AUTO_AUGMENT_POLICIES:
            raise ConfigError(f"AutoAugment: policy must be one of {', '.join(AUTO_AUGMENT_POLICIES)}, got {self.policy!r}")
        object.__setattr__(self, "policy", name)

    def to_dict(self) -> Dict[str, Any]:
        return {"type": "AutoAugment", "policy": self.policy}


def _degrees(name: str, field: str, value: Any, bound: float = math.inf) -> Tuple[float, float]:
    """torchvision's ``_setup_angle``: a non-negative number ``d`` is ``(-d, d)``; otherwise a
    ``(low, high)`` pair with ``low <= high``, both within ``bound`` in size."""
    if isinstance(value, bool):
        raise ConfigError(f"{name}: {field} must be a number or a (low, high) pair, got {value!r}")
    if isinstance(value, (int, float)):
        if not (0 <= value < bound):
            raise ConfigError(f"{name}: {field} as a single number must be non-negative (and below {bound}), got {value!r}")
        return (-float(value), float(value))
    try:
        low, high = (float(value[0]), float(value[1]))
    except (TypeError, ValueError, IndexError, KeyError):
        raise ConfigError(f"{name}: {field} must be a number or a (low, high) pair, got {value!r}") from None
    if len(value) != 2 or not (-bound < low <= high < bound):
        raise ConfigError(f"{name}: {field} must be a (low, high) pair with low <= high (each within {bound}), got {value!r}")
    return (low, high)


@dataclass(frozen=True)
class RandomRotation:
    """torchvision v2's ``RandomRotation(degrees)``: counter-clockwise by an angle drawn from
    ``degrees`` (a number ``d`` for ``[-d, d]``, or ``(low, high)``), about the centre, same
    size, nearest pixel, fill 0."""

    degrees: Any

    def __post_init__(self) -> None:
        self.to_dict()

    def to_dict(self) -> Dict[str, Any]:
        return {"type": "RandomRotation", "degrees": list(_degrees("RandomRotation", "degrees", self.degrees))}


@dataclass(frozen=True)
class RandomAffine:
    """torchvision v2's ``RandomAffine(degrees, translate, scale, shear)``: per image a rotation
    from ``degrees``, a whole-pixel shift up to ``translate = (fx, fy)`` of the width and height,
    a scale from ``scale = (low, high)`` and a shear from ``shear`` (``s`` for x in ``[-s, s]``,
    ``(low, high)`` for x, or four numbers for x then y), about the centre, nearest pixel,
    fill 0."""

    degrees: Any
    translate: Any = None
    scale: Any = None
    shear: Any = None

    def __post_init__(self) -> None:
        self.to_dict()

    def to_dict(self) -> Dict[str, Any]:
        name = "RandomAffine"
        result: Dict[str, Any] = {"type": name, "degrees": list(_degrees(name, "degrees", self.degrees))}
        if self.translate is not None:
            try:
                fx, fy = (float(self.translate[0]), float(self.translate[1]))
            except (TypeError, ValueError, IndexError, KeyError):
                raise ConfigError(f"{name}: translate must be a (fx, fy) pair of fractions, got {self.translate!r}") from None
            if len(self.translate) != 2 or not (0.0 <= fx <= 1.0 and 0.0 <= fy <= 1.0):
                raise ConfigError(f"{name}: translate fractions must be in [0, 1], got {self.translate!r}")
            result["translate"] = [fx, fy]
        if self.scale is not None:
            result["scale"] = list(_range(name, "scale", self.scale))
        if self.shear is not None:
            shear = self.shear
            if isinstance(shear, (list, tuple)) and len(shear) == 4:
                x, y = _degrees(name, "shear", shear[:2], 90.0), _degrees(name, "shear", shear[2:], 90.0)
                result["shear"] = [*x, *y]
            else:
                result["shear"] = list(_degrees(name, "shear", shear, 90.0))
        return result


Transform = Union[
    RandomResizedCrop,
    Resize,
    CenterCrop,
    RandomHorizontalFlip,
    Normalize,
    ColorJitter,
    RandomGrayscale,
    RandomErasing,
    GaussianBlur,
    TrivialAugmentWide,
    RandAugment,
    AutoAugment,
    RandomRotation,
    RandomAffine,
]

# The same classes, for isinstance checks.
STOKER_TRANSFORMS = get_args(Transform)


def _dtype_name(dtype: Any) -> Any:
    """``"float32"``/``"float16"`` for those names, ``torch.float32``/``torch.float16``,
    ``numpy.float32``/``numpy.float16``; ``None`` for anything else."""
    if isinstance(dtype, str):
        name = dtype
    else:
        name = str(getattr(dtype, "__name__", dtype)).replace("torch.", "")
    name = {"half": "float16", "float": "float32"}.get(name, name)
    return name if name in ("float32", "float16") else None


def _interpolation_name(name: str, mode: Any) -> str:
    value = str(getattr(mode, "value", mode)).lower()
    if value not in INTERPOLATIONS:
        raise ConfigError(f"{name}: interpolation {mode!r} is not one Stoker makes; use one of {', '.join(INTERPOLATIONS)}")
    return value


def _from_torchvision(transform: Any) -> list:
    """The Stoker transforms a torchvision (v1 or v2) transform stands for; conversions to a
    tensor (``ToTensor``, ``ToImage``, ``PILToTensor``, ``ToDtype``) are what every Stoker batch
    is already. Raises :class:`ConfigError` naming the Stoker way for anything else."""
    kind = type(transform).__name__
    if kind == "Compose":
        return [t for inner in transform.transforms for t in _from_torchvision(inner)]
    if kind == "RandomResizedCrop":
        return [
            RandomResizedCrop(
                _tv_size(kind, transform.size),
                scale=tuple(transform.scale),
                ratio=tuple(transform.ratio),
                interpolation=_interpolation_name(kind, transform.interpolation),
            )
        ]
    if kind == "Resize":
        size = transform.size
        if isinstance(size, (list, tuple)) and len(size) == 1:
            size = size[0]
        if not isinstance(size, int) or getattr(transform, "max_size", None) is not None:
            raise ConfigError(
                f"torchvision Resize(size={transform.size!r}) resizes to a fixed shape; Stoker's Resize takes the shorter side: "
                "write Resize(256) (then CenterCrop(224)), or stoker.Resize(256) + stoker.CenterCrop(224)"
            )
        return [Resize(size, interpolation=_interpolation_name(kind, transform.interpolation))]
    if kind == "CenterCrop":
        return [CenterCrop(_tv_size(kind, transform.size))]
    if kind == "RandomHorizontalFlip":
        return [RandomHorizontalFlip(float(transform.p))]
    if kind == "Normalize":
        return [Normalize(tuple(float(v) for v in transform.mean), tuple(float(v) for v in transform.std))]
    if kind == "ColorJitter":
        # torchvision stores the checked (low, high) ranges, None where nothing changes.
        return [ColorJitter(*(None if r is None else tuple(r) for r in (transform.brightness, transform.contrast, transform.saturation, transform.hue)))]
    if kind == "RandomGrayscale":
        return [RandomGrayscale(float(transform.p))]
    if kind == "GaussianBlur":
        return [GaussianBlur(tuple(int(k) for k in transform.kernel_size), tuple(float(s) for s in transform.sigma))]
    if kind in ("TrivialAugmentWide", "RandAugment", "AutoAugment", "RandomRotation", "RandomAffine"):
        fill = getattr(transform, "fill", None)
        fills = list(fill.values()) if isinstance(fill, dict) else [fill]
        if fills and isinstance(fills[0], (list, tuple)):
            fills = [value for channels in fills for value in channels]
        plain = getattr(transform, "center", None) is None and not getattr(transform, "expand", False)
        if _interpolation_name(kind, transform.interpolation) != "nearest" or any(f not in (None, 0, 0.0) for f in fills) or not plain:
            raise ConfigError(
                f"{kind}: the workers make it with torchvision's defaults only (interpolation=NEAREST, fill=None or 0, center=None, expand=False)"
            )
        if kind == "TrivialAugmentWide":
            return [TrivialAugmentWide(int(transform.num_magnitude_bins))]
        if kind == "RandAugment":
            return [RandAugment(int(transform.num_ops), int(transform.magnitude), int(transform.num_magnitude_bins))]
        if kind == "AutoAugment":
            return [AutoAugment(transform.policy)]
        degrees = tuple(float(d) for d in transform.degrees)
        if kind == "RandomRotation":
            return [RandomRotation(degrees)]
        pairs = {field: getattr(transform, field) for field in ("translate", "scale", "shear")}
        return [RandomAffine(degrees, **{field: None if value is None else tuple(float(v) for v in value) for field, value in pairs.items()})]
    if kind == "RandomErasing":
        raise ConfigError(
            "torchvision's RandomErasing fills a normalised tensor, Stoker's the uint8 image before Normalize: write "
            "stoker.RandomErasing(p, scale, ratio, value=LEVELS) with value in pixel levels (stoker.RandomErasing.imagenet_mean() "
            "for what value=0 after Normalize fills)"
        )
    if kind in ("ToTensor", "ToImage", "PILToTensor", "ToImageTensor", "ToPureTensor", "ConvertImageDtype", "ToDtype"):
        return []
    raise ConfigError(
        f"transforms: torchvision's {kind} is not one the Stoker workers apply; they apply RandomResizedCrop, Resize, "
        "CenterCrop, RandomHorizontalFlip, ColorJitter, RandomGrayscale, RandomErasing, GaussianBlur, TrivialAugmentWide, "
        "RandAugment, AutoAugment, RandomRotation, RandomAffine and Normalize "
        "(torchvision's or stoker's). Apply others to the batch on the GPU"
    )


def _tv_size(name: str, size: Any) -> Size:
    if isinstance(size, (list, tuple)) and len(size) == 1:
        return int(size[0])
    if isinstance(size, (list, tuple)) and len(size) == 2:
        return int(size[0]) if size[0] == size[1] else (int(size[0]), int(size[1]))
    if isinstance(size, int):
        return size
    raise ConfigError(f"{name}: size must be an int or (height, width), got {size!r}")


def as_stoker_transforms(transforms: Any) -> list:
    """``transforms=`` as a list of Stoker transforms: a list of them, one alone, a torchvision
    ``Compose`` or a single torchvision transform (mapped; see ``_from_torchvision``)."""
    if isinstance(transforms, STOKER_TRANSFORMS):
        return [transforms]
    if type(transforms).__module__.startswith("torchvision"):
        return _from_torchvision(transforms)
    try:
        items = list(transforms)
    except TypeError:
        raise ConfigError(
            f"transforms must be a list of stoker transforms (stoker.RandomResizedCrop, ...) or a torchvision Compose, got {transforms!r}"
        ) from None
    result = []
    for transform in items:
        if isinstance(transform, STOKER_TRANSFORMS):
            result.append(transform)
        elif type(transform).__module__.startswith("torchvision"):
            result.extend(_from_torchvision(transform))
        else:
            raise ConfigError(f"transforms must be stoker transforms (stoker.RandomResizedCrop, ...) or torchvision ones, got {transform!r}")
    return result


def imagenet_train(size: int = 224) -> list:
    """torchvision's ImageNet training augmentation: RandomResizedCrop + RandomHorizontalFlip."""
    return [RandomResizedCrop(size), RandomHorizontalFlip()]


def imagenet_eval(size: int = 224, resize: int = 256) -> list:
    """torchvision's ImageNet evaluation transform: Resize(256) + CenterCrop(224)."""
    return [Resize(resize), CenterCrop(size)]
