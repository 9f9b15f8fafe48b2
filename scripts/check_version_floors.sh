#!/usr/bin/env bash
# Checks that the lower bounds in setup.cfg's install_requires are true floors: installs exactly those
# versions (jaxlib pinned to the jax floor) into a fresh virtual environment and runs a test subset there.
#
#   bash scripts/check_version_floors.sh [DIR]    # DIR defaults to /tmp/floors; the venv is DIR/.venv
#
# Environment: PYTHON (the interpreter for the venv, default python3.11 or python3), PYTEST_ARGS (extra
# pytest arguments). Only install_requires is pinned, each to its floor, raised to the dev extra's floor for
# the same package where that is higher (the tests' own needs: transformers). The dev extra's other packages
# (torch among them) and the transitive dependencies are left to the resolver. The venv is made anew each run.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-/tmp/floors}"
PY="${PYTHON:-$(command -v python3.11 || command -v python3)}"
VENV="$DIR/.venv"
CONSTRAINTS="$DIR/constraints.txt"

mkdir -p "$DIR"
rm -rf "$VENV"
"$PY" -m venv "$VENV"

# `name[extras]>=X` -> `name==X`
"$VENV/bin/python" - "$ROOT/setup.cfg" >"$CONSTRAINTS" <<'PYTHON'
import configparser
import re
import sys

REQUIREMENT = re.compile(r"([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*>=\s*([0-9][0-9A-Za-z.]*)\s*(,.*)?")


def floors(text, strict):
    out = {}
    for line in text.splitlines():
        line = line.split("#")[0].strip()
        match = REQUIREMENT.fullmatch(line)
        if match:
            out[match.group(1).lower().replace("_", "-")] = (match.group(1), match.group(3))
        elif line and strict:
            sys.exit(f"no >= floor in install_requires line {line!r}")
    return out


def key(version):
    return tuple(int(x) for x in re.findall(r"\d+", version))


cfg = configparser.ConfigParser()
cfg.read(sys.argv[1])
dev = floors(cfg["options.extras_require"].get("dev", ""), strict=False)
for norm, (name, floor) in floors(cfg["options"]["install_requires"], strict=True).items():
    if norm in dev and key(dev[norm][1]) > key(floor):
        floor = dev[norm][1]
    print(f"{name}=={floor}")
    if norm == "jax":
        print(f"jaxlib=={floor}")
PYTHON
echo "== floors ($CONSTRAINTS)"
cat "$CONSTRAINTS"

"$VENV/bin/python" -m pip install -q --upgrade pip
# `[dev]` brings pytest, hypothesis and torch (the tests' numerics reference).
"$VENV/bin/python" -m pip install -q -c "$CONSTRAINTS" -e "$ROOT[dev]"
echo "== installed"
"$VENV/bin/python" -m pip list 2>/dev/null |
    grep -iE "^(jax|jaxlib|flax|optax|orbax-checkpoint|chex|ml.collections|numpy|ml.dtypes|transformers|tensorboardX|datasets|math-verify|tqdm) "

# The subset: the model (against transformers/torch), losses, the update step (optax), checkpoints (orbax,
# with export_hf's partial restore), sharding (jax.set_mesh, AxisType), JAX's compilation cache, data sources (datasets), metrics (tensorboardX, tqdm) and the grader (math-verify).
cd "$ROOT"
# shellcheck disable=SC2086
"$VENV/bin/python" -m pytest -q -p no:cacheprovider \
    tests/models tests/losses tests/sharding \
    tests/train/update/test_update.py tests/train/checkpoint/test_checkpoint.py tests/train/reporting/test_metrics.py \
    tests/scripts/test_export_hf.py tests/test_compile_cache.py \
    tests/data/test_sources.py tests/rewards/test_math_grader.py \
    ${PYTEST_ARGS:-}
