"""torchvision's RandomResizedCrop.get_params, run on Stoker's random numbers.

Reads JSON from stdin: [{"width", "height", "seed", "scale": [a, b], "ratio": [a, b]}, ...]
Writes JSON to stdout: [[i, j, h, w], ...] (top, left, height, width), one per case.

`get_params` below is torchvision 0.20's code, unchanged except for the decorator and the
first line (a size instead of a tensor). Its `torch` calls go to a shim whose random numbers
come from SplitMix64 seeded with the case's seed — the same stream Stoker draws from — so any
difference in the box is a difference in the algorithm, not in the random numbers.
Source: https://github.com/pytorch/vision/blob/v0.20.0/torchvision/transforms/transforms.py
"""
import json
import math
import sys

MASK = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15


class SplitMix64:
    def __init__(self, seed):
        self.state = seed & MASK

    def next_u64(self):
        self.state = (self.state + GAMMA) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def next_f64(self):
        return (self.next_u64() >> 11) * (1.0 / (1 << 53))

    def below(self, bound):
        # Lemire's multiply-shift with rejection, as stoker_plan::prng::SplitMix64::below.
        threshold = ((-bound) & MASK) % bound
        while True:
            product = self.next_u64() * bound
            if (product & MASK) >= threshold:
                return product >> 64


class _Scalar:
    def __init__(self, value):
        self.value = value

    def item(self):
        return self.value


class _Empty:
    def __init__(self, rng):
        self.rng = rng

    def uniform_(self, low, high):
        low, high = float(low), float(high)
        return _Scalar(low + (high - low) * self.rng.next_f64())


class TorchShim:
    """The five torch calls get_params makes."""

    def __init__(self, rng):
        self.rng = rng

    def empty(self, _size):
        return _Empty(self.rng)

    def tensor(self, values):
        return list(values)

    def log(self, values):
        return [math.log(v) for v in values]

    def exp(self, scalar):
        return _Scalar(math.exp(scalar.value))

    def randint(self, low, high, size):
        return _Scalar(low + self.rng.below(high - low))


torch = None  # set per case


# ---- torchvision 0.20, transforms.RandomResizedCrop.get_params ----
def get_params(img_size, scale, ratio):
    height, width = img_size
    area = height * width

    log_ratio = torch.log(torch.tensor(ratio))
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(scale[0], scale[1]).item()
        aspect_ratio = torch.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1])).item()

        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))

        if 0 < w <= width and 0 < h <= height:
            i = torch.randint(0, height - h + 1, size=(1,)).item()
            j = torch.randint(0, width - w + 1, size=(1,)).item()
            return i, j, h, w

    # Fallback to central crop
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:  # whole image
        w = width
        h = height
    i = (height - h) // 2
    j = (width - w) // 2
    return i, j, h, w
# ---- end of torchvision's code ----


def main():
    global torch
    out = []
    for case in json.load(sys.stdin):
        torch = TorchShim(SplitMix64(case["seed"]))
        out.append(list(get_params((case["height"], case["width"]), case["scale"], case["ratio"])))
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
