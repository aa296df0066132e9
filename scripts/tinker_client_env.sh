#!/usr/bin/env bash
# Client side of `rlvr serve`: a separate venv (.venv-tinker/) with Thinking Machines' Tinker SDK and
# tinker-cookbook, so the cookbook's recipes run unmodified against a local `rlvr serve`, offline.
# Two venvs because tinker-cookbook 0.5.8 pins transformers<=5.5.4 and rlvr needs a newer one.
#
#   scripts/tinker_client_env.sh [--no-robots-substitute]
#   source examples/tinker_cookbook/env.sh     # then run the commands in examples/tinker_cookbook/README.md
#
# What it does (idempotent: a second run checks and skips what is in place):
# 1. creates the venv and installs tinker-cookbook==0.5.8, tinker==0.38.0 (with the cookbook's math-rl extra,
#    which math_rl/train.py and rl_loop.py import) and torch's CPU build (2.13.0+cpu, the one rlvr's .venv uses:
#    the plain PyPI torch wheel pulls several GB of CUDA libraries). tinker-cookbook 0.6.x is not used: it needs
#    a package the index here does not serve.
# 2. installs rlvr_smollm2_hook (a .pth import hook) that registers SmolLM2-135M-Instruct and its renderer in
#    the cookbook (README.md, "Renderer").
# 3. writes a Hugging Face hub cache in .venv-tinker/hf/ with SmolLM2-135M-Instruct's tokenizer files, copied from
#    rlvr's embedded model folder (so the cookbook's AutoTokenizer.from_pretrained(name) works with
#    HF_HUB_OFFLINE=1), and the datasets cache entry for openai/gsm8k built from data/gsm8k/.
#    --no-robots-substitute also writes a labelled SUBSTITUTE for HuggingFaceH4/no_robots (sl_loop.py): GSM8K
#    chats in no_robots' schema, because No Robots itself is not available offline (README.md, "Data").
# 4. checks the result: tokenizer, renderer and datasets load offline.
# Environment: PYTHON (interpreter for the venv, >= 3.11; default python3), TINKER_VENV (default .venv-tinker),
# RLVR_SMOLLM2_DIR (a SmolLM2-135M-Instruct folder with tokenizer.json; default: ask rlvr's .venv for its
# embedded model), TINKER_TORCH (torch requirement; default torch==2.13.0+cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
die() { echo "tinker_client_env.sh: $*" >&2; exit 1; }

no_robots=0
for arg in "$@"; do
  case "$arg" in
    --no-robots-substitute) no_robots=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$arg' (see --help)" ;;
  esac
done

COOKBOOK=tinker-cookbook==0.5.8
TINKER=tinker==0.38.0
TORCH=${TINKER_TORCH:-torch==2.13.0+cpu}
MODEL=HuggingFaceTB/SmolLM2-135M-Instruct
venv=${TINKER_VENV:-.venv-tinker}
[[ $venv = /* ]] || venv=$root/$venv
py=${PYTHON:-python3}
vpy=$venv/bin/python
# this machine's pip configuration names two local index folders that do not exist; pip warns about them
# on every package it looks up. Those lines only are dropped.
quiet_pip() { "$vpy" -m pip "$@" 2> >(grep -v "^WARNING: Location 'file:///opt/pypi" >&2); }

# --- 1. the venv and the packages ---------------------------------------------------------------------------
if [[ ! -x $vpy ]]; then
  command -v "$py" >/dev/null || die "no '$py' on PATH: set PYTHON to a Python >= 3.11"
  "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
    die "$py is Python $("$py" -c 'import platform; print(platform.python_version())'); tinker-cookbook needs >= 3.11 (set PYTHON)"
  avail_kb=$(df -Pk "$(dirname "$venv")" | awk 'NR==2 {print $4}')
  [[ -z $avail_kb || $avail_kb -ge $((3 * 1024 * 1024)) ]] ||
    die "only $((avail_kb / 1024)) MB free for $venv; the client venv needs about 2 GB (3 GB with pip's temporary files)"
  echo "creating $venv"
  "$py" -m venv "$venv" || die "'$py -m venv $venv' failed (Debian/Ubuntu: apt-get install python3-venv)"
fi
want_versions="tinker_cookbook ${COOKBOOK#*==} tinker ${TINKER#*==}"  # what the check below prints
have_versions=$("$vpy" - <<'EOF' 2>/dev/null || true
from importlib.metadata import version
import torch, math_verify  # noqa: F401  (importable, not just listed)
print("tinker_cookbook", version("tinker_cookbook"), "tinker", version("tinker"))
EOF
)
if [[ $have_versions != "$want_versions" ]]; then
  echo "installing $COOKBOOK, $TINKER, $TORCH into $venv (pip, about a minute with warm caches)"
  quiet_pip install -q 'pip>=25.1,<26' || die "could not install pip>=25.1,<26 into $venv (see pip's error above)"
  # torch first, on its own, so that a missing CPU build is reported as such
  if ! quiet_pip install -q "$TORCH"; then
    echo "tinker_client_env.sh: $TORCH is not on the configured index; trying PyTorch's CPU index (5 s timeout)" >&2
    quiet_pip install -q --timeout 5 --retries 1 --extra-index-url https://download.pytorch.org/whl/cpu "$TORCH" ||
      die "could not install $TORCH. Put its wheel where pip finds it, or set TINKER_TORCH=torch to take PyPI's default build (several GB with CUDA libraries), and run this again"
  fi
  quiet_pip install -q "${COOKBOOK/==/[math-rl]==}" "$TINKER" "$TORCH" ||
    die "'pip install ${COOKBOOK/==/[math-rl]==} $TINKER' failed (pip's error above); check the package index and run this again"
fi

# --- 2. the SmolLM2 hook ------------------------------------------------------------------------------------
site=$("$vpy" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
install -m 0644 examples/tinker_cookbook/rlvr_smollm2_hook.py "$site/rlvr_smollm2_hook.py"
echo "import rlvr_smollm2_hook" > "$site/rlvr_smollm2_hook.pth"

# --- 3. Hugging Face caches ---------------------------------------------------------------------------------
hf=$venv/hf
if [[ -n ${RLVR_SMOLLM2_DIR:-} ]]; then
  model_dir=$RLVR_SMOLLM2_DIR
elif [[ -x .venv/bin/python ]]; then
  echo "asking rlvr (.venv) for its embedded SmolLM2-135M-Instruct folder (built on first use)"
  model_dir=$(.venv/bin/python -c "import rlvr; print(rlvr.resolve_model('smollm2-135m-instruct'))" | tail -n 1) ||
    die "rlvr could not resolve its embedded model smollm2-135m-instruct (error above); set RLVR_SMOLLM2_DIR to a SmolLM2-135M-Instruct folder"
else
  die "no rlvr .venv here (run scripts/setup.sh) and RLVR_SMOLLM2_DIR is not set: the tokenizer files come from one of them"
fi
required_tok_files=(tokenizer.json tokenizer_config.json chat_template.jinja)
tok_files=("${required_tok_files[@]}" config.json generation_config.json)
for f in "${required_tok_files[@]}"; do
  [[ -f $model_dir/$f ]] || die "$model_dir has no $f: not a SmolLM2-135M-Instruct folder"
done
# The snapshot folder of a hub cache is named after a commit; this one is named after the files' content instead
# (it is not a Hub commit), so a changed tokenizer gets a new snapshot and refs/main moves to it.
rev=$(cd "$model_dir" && cat "${tok_files[@]}" 2>/dev/null | sha1sum | cut -c1-40)
repo_dir=$hf/hub/models--${MODEL//\//--}
if [[ ! -f $repo_dir/snapshots/$rev/tokenizer.json || $(cat "$repo_dir/refs/main" 2>/dev/null) != "$rev" ]]; then
  rm -rf "$repo_dir"
  mkdir -p "$repo_dir/snapshots/$rev" "$repo_dir/refs"
  for f in "${tok_files[@]}"; do [[ -f $model_dir/$f ]] && cp "$model_dir/$f" "$repo_dir/snapshots/$rev/"; done
  printf %s "$rev" > "$repo_dir/refs/main"
  echo "tokenizer of $MODEL: copied from $model_dir into $repo_dir"
else
  echo "tokenizer of $MODEL: up to date in $repo_dir"
fi
export HF_HOME=$hf HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
ds_args=(--gsm8k-dir data/gsm8k)
[[ $no_robots == 1 ]] && ds_args+=(--no-robots-substitute)
"$vpy" examples/tinker_cookbook/build_offline_datasets.py "${ds_args[@]}" 2>&1 | grep -v "^Generating\|it/s\]" ||
  die "writing the datasets cache entries failed (error above)"

# --- 4. check -----------------------------------------------------------------------------------------------
"$vpy" - "$MODEL" "$no_robots" <<'EOF' || die "the offline check failed (error above)"
import sys, logging
logging.disable(logging.WARNING)
model, no_robots = sys.argv[1], sys.argv[2] == "1"
import datasets
from tinker_cookbook import model_info, renderers
from tinker_cookbook.tokenizer_utils import get_tokenizer
tok = get_tokenizer(model)
name = model_info.get_recommended_renderer_name(model)
r = renderers.get_renderer(name, tok)
convo = [{"role": "user", "content": "What is 2+3?"}, {"role": "assistant", "content": "5"}]
ref = tok.apply_chat_template(convo[:1], tokenize=True, add_generation_prompt=True)
ref = ref["input_ids"] if not isinstance(ref, list) else ref
assert r.build_generation_prompt(convo[:1]).to_ints() == ref, "renderer prompt differs from the chat template"
gsm = datasets.load_dataset("openai/gsm8k", "main")
msg = f"ok: tokenizer {type(tok).__name__} ({len(tok)} tokens), renderer {name!r} (prompt == chat template), openai/gsm8k {dict(gsm.num_rows)}"
if no_robots:
    nr = datasets.load_dataset("HuggingFaceH4/no_robots")
    msg += f", HuggingFaceH4/no_robots SUBSTITUTE {dict(nr.num_rows)}"
print(msg)
EOF
echo "client venv ready: source examples/tinker_cookbook/env.sh, then see examples/tinker_cookbook/README.md"
