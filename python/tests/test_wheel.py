"""Issue 16, item 10: the wheel `make wheel` builds installs with pip into a fresh venv, on a
PATH without Rust, and runs the minimal example against a real cluster. `make test` builds the
wheel and names it in STOKER_WHEEL; a plain `pytest` run without one skips this test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

WHEEL = os.environ.get("STOKER_WHEEL", "")
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "minimal.py"


@pytest.mark.skipif(not WHEEL, reason="no wheel built: `make wheel` then STOKER_WHEEL=target/wheels/stoker-*.whl (make test does both)")
def test_the_wheel_installs_without_rust_and_runs_the_minimal_example(cluster, tmp_path: Path) -> None:
    wheel = Path(WHEEL)
    assert wheel.is_file(), f"STOKER_WHEEL={WHEEL} is not a file"
    assert "abi3" in wheel.name, f"an abi3 wheel installs on every CPython >= 3.9: {wheel.name}"
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    # No cargo or rustc on the PATH of the install and of the run: the wheel needs neither.
    bare = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": os.environ.get("HOME", str(tmp_path)), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    # The cluster's certificates come from the tests' local CA (conftest); so must the example's.
    bare["STOKER_LOCAL_CA"] = os.environ["STOKER_LOCAL_CA"]
    numpy = subprocess.run([sys.executable, "-c", "import numpy; print(numpy.__version__)"], capture_output=True, text=True, check=True)
    install = [str(venv / "bin" / "pip"), "install", "--quiet", f"numpy=={numpy.stdout.strip()}", str(wheel)]
    subprocess.run(install, env=bare, check=True, timeout=600)
    run = subprocess.run(
        [str(venv / "bin" / "python"), str(EXAMPLE), "--coordinator", cluster.coordinator, "--dataset", cluster.dataset,
         "--batch-size", "8", "--epochs", "1", "--size", "32"],
        env=bare, cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert "steps per epoch" in run.stdout, run.stdout
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import stoker; print(stoker.__file__)"], env=bare, cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert str(venv) in where.stdout, f"stoker came from the wheel's venv, not the source tree: {where.stdout}"
