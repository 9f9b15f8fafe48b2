"""Downloads the pure-Python wheels the lent GPU's image lacks, for `scripts/bench_gpu.py` (docs/gpu.md).

The image has JAX with CUDA, flax, optax, orbax, chex, torch and transformers, and no package registry; the device
tool carries at most 64 MiB with the working tree. This fetches, for the image's Python 3.12 on x86-64 Linux:

- always, what the training loop (the `grpo` and `compile` steps) imports: ml-collections, tensorboardX,
  math-verify and its LaTeX parser with antlr4's runtime;
- with `--trl`, TRL's `GRPOTrainer` for the `trl` step: trl, accelerate, datasets, and what they import that a
  torch + transformers image may lack (pyarrow, pandas and its dateutil, dill, multiprocess, xxhash, fsspec,
  psutil). pyarrow is
  pinned to 21.0.0, the oldest TRL 1.16 takes (43 MB against 26.0's 55 MB), with datasets 4.7.0, the oldest TRL
  takes, which accepts it.

Then it adds up the wheels and the tracked files of the working tree and says whether they fit the 64 MiB carry
(exit 2 when not). `--dry-run` prints the pip command without running it.

    python scripts/gpu_wheels.py --dest .whl --trl       # then run bench_gpu.py with carry [".whl"]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CARRY_LIMIT = 64 * 2**20  # the device tool's: the working tree and the carried paths together
PLATFORM = ["--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux_2_28_x86_64"]

LOOP = (
    "ml-collections==1.1.0",
    "tensorboardX==2.6.5",
    "math-verify==0.9.0",
    "latex2sympy2_extended==1.11.0",
    "antlr4-python3-runtime==4.13.2",
)
TRL = (
    "trl==1.16.0",
    "accelerate==1.15.0",
    "datasets==4.7.0",
    "pyarrow==21.0.0",
    "pandas==3.1.1",
    "dill==0.4.0",
    "multiprocess==0.70.18",
    "xxhash==4.1.0",
    "fsspec==2026.2.0",
    "psutil==7.2.2",
    "python-dateutil==4.0.0",  # pandas imports it
    "tzdata==2026.6",  # dateutil 4's
)


def wheel_key(distribution: str, version: str) -> tuple:
    """(distribution, version) normalised as wheel file names spell them: `ml-collections` is `ml_collections`."""
    return distribution.lower().replace("-", "_").replace(".", "_"), version


def tree_bytes() -> int:
    """Bytes of the files git tracks in the working tree (what the device tool copies besides the carry)."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    paths = [os.path.join(ROOT, n) for n in names.decode().split("\0") if n]
    return sum(os.path.getsize(p) for p in paths if os.path.isfile(p))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dest", default=os.path.join(ROOT, ".whl"), help="where the wheels go (git ignores .whl)")
    parser.add_argument("--trl", action="store_true", help="also TRL's GRPOTrainer and what it imports")
    parser.add_argument("--dry-run", action="store_true", help="print the pip command, download nothing")
    args = parser.parse_args(argv)
    pins = LOOP + (TRL if args.trl else ())
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", *PLATFORM]
    command += ["-d", args.dest, *pins]
    print(" ".join(command), flush=True)
    if args.dry_run:
        return 0
    done = subprocess.run(command)
    if done.returncode != 0:
        print(f"gpu_wheels.py: pip download failed (status {done.returncode})", file=sys.stderr)
        return 2
    # the pinned versions' wheels only: another version left in the folder is named, since `pip install
    # .whl/*.whl` would meet both
    wanted = {wheel_key(*pin.split("==")) for pin in pins}
    found = [n for n in os.listdir(args.dest) if n.endswith(".whl")]
    wheels = [os.path.join(args.dest, n) for n in found if wheel_key(*n.split("-")[:2]) in wanted]
    stale = [n for n in found if wheel_key(*n.split("-")[:2]) not in wanted]
    if stale:
        print(f"gpu_wheels.py: {args.dest} holds wheels not pinned here: {', '.join(sorted(stale))}", file=sys.stderr)
        return 2
    if len(wheels) != len(pins):
        print(f"gpu_wheels.py: {len(wheels)} wheels in {args.dest} for {len(pins)} pins", file=sys.stderr)
        return 2
    wheel_bytes, tree = sum(os.path.getsize(w) for w in wheels), tree_bytes()
    total = wheel_bytes + tree
    print(
        f"{len(wheels)} wheels, {wheel_bytes / 2**20:.1f} MiB; the tracked tree {tree / 2**20:.1f} MiB; "
        f"together {total / 2**20:.1f} MiB of the carry's {CARRY_LIMIT / 2**20:.0f} MiB"
    )
    if total > CARRY_LIMIT:
        print(f"gpu_wheels.py: {total / 2**20:.1f} MiB is over the device tool's 64 MiB", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
