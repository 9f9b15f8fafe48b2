"""scripts/gpu_wheels.py (docs/gpu.md): the wheels it pins for the lent GPU are the versions this project's tests
run with, TRL's the one the `bench` extra takes; the download fits the device tool's 64 MiB with the tree."""

import configparser
import os
import subprocess
import sys
from importlib.metadata import version

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import gpu_wheels  # noqa: E402


def test_the_loops_pins_are_the_versions_the_tests_run_with():
    for pin in gpu_wheels.LOOP:
        name, pinned = pin.split("==")
        assert version(name) == pinned, (name, version(name), pinned)


def test_trls_pin_is_one_the_bench_extra_takes():
    from packaging.requirements import Requirement

    extras = configparser.ConfigParser()
    extras.read(os.path.join(ROOT, "setup.cfg"))
    bench = [Requirement(line) for line in extras["options.extras_require"]["bench"].split("\n") if line.strip()]
    (trl,) = [r for r in bench if r.name == "trl"]
    pinned = dict(pin.split("==") for pin in gpu_wheels.TRL)
    assert trl.specifier.contains(pinned["trl"]), (str(trl), pinned["trl"])


def test_the_dry_run_prints_the_download_of_every_pin(tmp_path):
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "gpu_wheels.py"), "--dest", str(tmp_path), "--trl", "--dry-run"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0 and os.listdir(tmp_path) == []
    words = done.stdout.split()
    assert words[1:4] == ["-m", "pip", "download"] and "--no-deps" in words and "3.12" in words
    assert set(gpu_wheels.LOOP + gpu_wheels.TRL) <= set(words)


@pytest.mark.slow  # downloads ~56 MiB from the package registry
def test_the_download_fits_the_carry(tmp_path):
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "gpu_wheels.py"), "--dest", str(tmp_path), "--trl"],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert len([n for n in os.listdir(tmp_path) if n.endswith(".whl")]) == len(gpu_wheels.LOOP + gpu_wheels.TRL)
    assert "of the carry's 64 MiB" in done.stdout
    # another version left in the folder would meet the pinned one in `pip install .whl/*.whl`: named, refused
    (tmp_path / "pyarrow-19.0.1-cp312-cp312-manylinux_2_28_x86_64.whl").write_bytes(b"")
    again = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "gpu_wheels.py"), "--dest", str(tmp_path), "--trl"],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert again.returncode == 2 and "pyarrow-19.0.1" in again.stderr, again.stderr[-2000:]
