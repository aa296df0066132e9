# shellcheck shell=bash
# Source this (bash/zsh) before running tinker-cookbook recipes against `rlvr serve`:
#   source examples/tinker_cookbook/env.sh
# It activates the client venv made by scripts/tinker_client_env.sh and sets, for this shell:
# - HF_HOME to the venv's Hugging Face cache (the SmolLM2 tokenizer and the datasets entries the script wrote),
#   and HF_HUB_OFFLINE / HF_DATASETS_OFFLINE / TRANSFORMERS_OFFLINE=1 so nothing tries the Hub;
# - TINKER_API_KEY: the SDK refuses to start without a key that starts with "tml-" (a local server ignores it);
# - TINKER_BASE_URL: the SDK's fallback when a client is made without base_url (the recipes pass base_url=...).
# TINKER_API_KEY and TINKER_BASE_URL keep a value exported before sourcing; HF_HOME is always set, to
# TINKER_CLIENT_HF_HOME when that is exported (else the venv's cache); the offline flags and
# HF_HUB_DISABLE_TELEMETRY are always set to 1. TINKER_VENV names another venv folder.
_rlvr_root="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")/../.." && pwd)"
_rlvr_venv="${TINKER_VENV:-$_rlvr_root/.venv-tinker}"
case "$_rlvr_venv" in /*) ;; *) _rlvr_venv="$_rlvr_root/$_rlvr_venv" ;; esac
if [ ! -x "$_rlvr_venv/bin/python" ]; then
  echo "env.sh: no client venv at $_rlvr_venv; run scripts/tinker_client_env.sh first" >&2
else
  # shellcheck disable=SC1091
  . "$_rlvr_venv/bin/activate"
  export HF_HOME="${TINKER_CLIENT_HF_HOME:-$_rlvr_venv/hf}"
  export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
  export TINKER_API_KEY="${TINKER_API_KEY:-tml-local-rlvr-serve}"
  export TINKER_BASE_URL="${TINKER_BASE_URL:-http://127.0.0.1:8000}"
fi
unset _rlvr_root _rlvr_venv
