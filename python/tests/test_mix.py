"""stoker.torch.MixUp and CutMix against torchvision v2's own MixUp and CutMix, given the same
random draws (torchvision's Beta sample and `torch.randint` answered with what Stoker drew), and
their determinism: a batch's mix is a function of (seed, epoch, rank, step) only."""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import pytest

from conftest import need_module

torch = need_module("torch")
need_module("torchvision")

import stoker  # noqa: E402
import stoker.torch as stoker_torch  # noqa: E402
from torchvision.transforms import v2  # noqa: E402

CLASSES = 10


def batch_of(size: int = 6, height: int = 12, width: int = 17):
    generator = torch.Generator().manual_seed(size * 1000 + height * width)
    images = torch.rand(size, 3, height, width, generator=generator)
    labels = torch.randint(CLASSES, (size,), generator=generator)
    return images, labels


@pytest.mark.parametrize("alpha", [0.2, 1.0])
def test_mixup_is_torchvisions_mixup_with_the_same_lambda(alpha: float) -> None:
    images, labels = batch_of()
    ours = stoker_torch.MixUp(alpha=alpha, num_classes=CLASSES, seed=7)
    for step in range(5):
        lam = ours.params(epoch=2, step=step, rank=1)["lam"]
        mixed, mixed_labels = ours(images, labels, epoch=2, step=step, rank=1)
        theirs = v2.MixUp(alpha=alpha, num_classes=CLASSES)
        theirs._dist = SimpleNamespace(sample=lambda shape, lam=lam: torch.tensor(lam, dtype=torch.float64))
        expected, expected_labels = theirs(images.clone(), labels.clone())
        assert torch.equal(mixed, expected) and torch.equal(mixed_labels, expected_labels), f"step {step}, lam {lam}"
        assert torch.allclose(mixed_labels.sum(dim=1), torch.ones(len(labels)))


@pytest.mark.parametrize("alpha", [0.5, 1.0])
def test_cutmix_is_torchvisions_cutmix_with_the_same_lambda_and_centre(alpha: float) -> None:
    images, labels = batch_of()
    ours = stoker_torch.CutMix(alpha=alpha, num_classes=CLASSES)
    pasted = 0
    for step in range(8):
        params = ours.params(epoch=0, step=step, rank=0, height=12, width=17)
        mixed, mixed_labels = ours(images, labels, epoch=0, step=step)
        theirs = v2.CutMix(alpha=alpha, num_classes=CLASSES)
        theirs._dist = SimpleNamespace(sample=lambda shape, lam=params["lam"]: torch.tensor(lam, dtype=torch.float64))
        centre_x, centre_y = params["centre"]
        with mock.patch("torch.randint", side_effect=[torch.tensor([centre_x]), torch.tensor([centre_y])]):
            expected, expected_labels = theirs(images.clone(), labels.clone())
        assert torch.equal(mixed, expected) and torch.equal(mixed_labels, expected_labels), f"step {step}: {params}"
        x1, y1, x2, y2 = params["box"]
        pasted += (x2 - x1) * (y2 - y1)
    assert pasted > 0, "some batch had a box to paste"


def test_a_batch_mixes_the_same_in_any_process_and_differently_at_another_step() -> None:
    """What makes a resumed run mix as before: the draw depends on (seed, epoch, rank, step)
    only, through a string-seeded generator (SHA-512, not Python's salted hash)."""
    images, labels = batch_of()
    first, again = stoker_torch.MixUp(1.0, CLASSES, seed=3), stoker_torch.MixUp(1.0, CLASSES, seed=3)
    batch = SimpleNamespace(epoch=4, step=9, rank=2)
    assert torch.equal(first(images, labels, batch)[0], again(images, labels, epoch=4, step=9, rank=2)[0])
    draws = {round(first.params(4, step, 2)["lam"], 12) for step in range(50)}
    assert len(draws) == 50
    assert first.params(4, 9, 2) != first.params(4, 9, 3) != stoker_torch.MixUp(1.0, CLASSES, seed=4).params(4, 9, 2)
    # Pinned: the same numbers in every process and on every machine.
    assert round(stoker_torch.MixUp(1.0, CLASSES, seed=0).params(0, 0, 0)["lam"], 12) == 0.611997926098
    # The Beta(alpha, alpha) mean is 1/2.
    lams = [stoker_torch.CutMix(0.4, CLASSES).params(0, step, 0, 10, 10)["lam"] for step in range(2000)]
    assert abs(sum(lams) / len(lams) - 0.5) < 0.03


def test_bad_arguments_are_config_errors() -> None:
    images, labels = batch_of()
    with pytest.raises(stoker.ConfigError, match="alpha"):
        stoker_torch.MixUp(alpha=0)
    with pytest.raises(stoker.ConfigError, match="num_classes"):
        stoker_torch.MixUp()(images, labels, epoch=0, step=0)
    with pytest.raises(stoker.ConfigError, match="float"):
        stoker_torch.MixUp(num_classes=CLASSES)((images * 255).to(torch.uint8), labels, epoch=0, step=0)
    with pytest.raises(stoker.ConfigError, match="batch="):
        stoker_torch.CutMix(num_classes=CLASSES)(images, labels)
    with pytest.raises(stoker.ConfigError, match="B, C, H, W"):
        stoker_torch.CutMix(num_classes=CLASSES)(images[0], labels, epoch=0, step=0)
