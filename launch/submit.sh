#!/usr/bin/env bash
# Submit `rlvr train RECIPE [overrides...]` to a running Ray cluster as a Ray job (`ray job submit`).
#
# The repository is uploaded as the job's working directory (without .git, .venv, runs/ and caches), so
# relative recipe and data paths (recipes/..., data/gsm8k/train.jsonl) resolve on the cluster as they do here.
# The job's driver runs on the cluster's head node; `run.ray_address=auto` is appended so that the controller
# joins that cluster instead of starting a Ray of its own. See launch/README.md.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# Variables copied into the job's environment when they are set here. Secrets (HF_TOKEN, WANDB_API_KEY) are
# not on this list: a job's environment is readable by anyone who can read the job's info on the dashboard;
# pass them on purpose with --env NAME.
PASS_ENV=(
  HF_HOME HF_HUB_CACHE HF_DATASETS_CACHE HF_ENDPOINT HF_HUB_OFFLINE HF_DATASETS_OFFLINE TRANSFORMERS_OFFLINE
  RLVR_CACHE VLLM_CACHE_ROOT TORCH_EXTENSIONS_DIR
  WANDB_PROJECT WANDB_ENTITY WANDB_MODE
  # NCCL and gloo settings every rank of a group must share (rlvr.environ.COMM_ENV, which forwards them
  # from the driver to every role)
  NCCL_SOCKET_IFNAME NCCL_IB_DISABLE NCCL_IB_HCA NCCL_P2P_DISABLE NCCL_SHM_DISABLE NCCL_NET_GDR_LEVEL
  NCCL_CUMEM_ENABLE NCCL_DEBUG GLOO_SOCKET_IFNAME
)
# Not uploaded with the working directory (gitignore syntax; Ray also honours the repository's .gitignore).
EXCLUDES=(.git .venv runs __pycache__ "*.egg-info" .pytest_cache .hypothesis .cache "*.log")

usage() {
  cat <<'EOF'
Usage: launch/submit.sh [options] RECIPE.yaml [section.key=value ...] [--dry-run]
       launch/submit.sh [options] -- COMMAND [ARG ...]

Runs `rlvr train RECIPE.yaml run.ray_address=auto [overrides...]` as a Ray job on a running cluster and
streams its logs until it ends. The second form runs any command (e.g. `rlvr eval ...`) the same way,
without adding run.ray_address=auto.

Options (before the recipe):
  --address ADDR       the cluster's job server, e.g. http://HEAD:8265 (required unless
                       $RAY_API_SERVER_ADDRESS or $RAY_ADDRESS holds it, as `ray job submit` reads them)
  --working-dir DIR    folder uploaded as the job's working directory (default: this repository)
  --env NAME[=VALUE]   set NAME in the job's environment; without =VALUE, this shell's $NAME (repeatable)
  --num-gpus N         GPUs reserved for the driver process itself (default 0; the roles reserve their own)
  --submission-id ID   the job's id (default: rlvr-<recipe>-<date>-<time>-<random>)
  --no-wait            return once submitted; follow with `ray job logs -f ID`, stop with `ray job stop ID`
  -h, --help           this text

Copied into the job's environment when set here: HF_HOME HF_HUB_CACHE HF_DATASETS_CACHE HF_ENDPOINT
HF_HUB_OFFLINE HF_DATASETS_OFFLINE TRANSFORMERS_OFFLINE RLVR_CACHE VLLM_CACHE_ROOT TORCH_EXTENSIONS_DIR
WANDB_PROJECT WANDB_ENTITY WANDB_MODE NCCL_SOCKET_IFNAME NCCL_IB_DISABLE NCCL_IB_HCA NCCL_P2P_DISABLE
NCCL_SHM_DISABLE NCCL_NET_GDR_LEVEL NCCL_CUMEM_ENABLE NCCL_DEBUG GLOO_SOCKET_IFNAME (rlvr passes the NCCL and
gloo ones on to every role, so that trainer and engines agree).
The job also gets RAY_OVERRIDE_JOB_RUNTIME_ENV=1, and RAY_JOB_STOP_WAIT_TIME_S=300 (`ray job stop ID` gives the
driver 300 s after its SIGTERM to write a checkpoint; change with --env RAY_JOB_STOP_WAIT_TIME_S=N).
RAY_AUTH_MODE defaults to `disabled` for this client (set RAY_AUTH_MODE=token for a cluster with token auth).

Exit status: 0 when the job succeeded; 1 when it failed, was stopped, or (without --no-wait) had not
ended when log streaming stopped; 2 for a usage error.
EOF
}

die_usage() {
  echo "submit.sh: $*" >&2
  echo "Try 'launch/submit.sh --help'." >&2
  exit 2
}

address="" working_dir="$REPO" num_gpus="0" submission_id="" wait=1 raw=0
env_pairs=()
while (($#)); do
  case "$1" in
    -h | --help) usage; exit 0 ;;
    --address) (($# >= 2)) || die_usage "--address needs a value"; address="$2"; shift 2 ;;
    --address=*) address="${1#*=}"; shift ;;
    --working-dir) (($# >= 2)) || die_usage "--working-dir needs a value"; working_dir="$2"; shift 2 ;;
    --working-dir=*) working_dir="${1#*=}"; shift ;;
    --num-gpus) (($# >= 2)) || die_usage "--num-gpus needs a value"; num_gpus="$2"; shift 2 ;;
    --num-gpus=*) num_gpus="${1#*=}"; shift ;;
    --submission-id) (($# >= 2)) || die_usage "--submission-id needs a value"; submission_id="$2"; shift 2 ;;
    --submission-id=*) submission_id="${1#*=}"; shift ;;
    --env) (($# >= 2)) || die_usage "--env needs NAME or NAME=VALUE"; env_pairs+=("$2"); shift 2 ;;
    --env=*) env_pairs+=("${1#*=}"); shift ;;
    --no-wait) wait=0; shift ;;
    --) raw=1; shift; break ;;
    -*) die_usage "unknown option '$1'" ;;
    *) break ;;
  esac
done
(($#)) || die_usage "name a recipe (e.g. recipes/tiny_test.yaml) or a command after --"
# Without an address `ray job submit` may start a throw-away local Ray that ends with this command.
if [[ -z "$address" && -z "${RAY_API_SERVER_ADDRESS:-}" && -z "${RAY_ADDRESS:-}" ]]; then
  die_usage "no cluster given: pass --address http://HEAD:8265 (or set RAY_API_SERVER_ADDRESS)"
fi
[[ -d "$working_dir" ]] || die_usage "--working-dir '$working_dir' is not a folder"

if ((!raw)); then
  recipe="$1"
  shift
  # The job runs in (a copy of) the working directory: a relative recipe path is relative to it.
  if [[ "$recipe" == /* ]]; then
    [[ -f "$recipe" ]] || die_usage "recipe '$recipe' not found (an absolute path must exist on the cluster too)"
  else
    [[ -f "$working_dir/$recipe" ]] || die_usage "recipe '$recipe' not found under the working directory $working_dir"
  fi
  # run.ray_address=auto goes first: a later override on the command line still wins, and argparse takes
  # `--dry-run` only after the last override.
  entrypoint=(rlvr train "$recipe" run.ray_address=auto "$@")
  label="$(basename "${recipe%.*}")"
else
  entrypoint=("$@")
  label="$(basename "$1")"
fi
if [[ -z "$submission_id" ]]; then
  submission_id="rlvr-${label//[^A-Za-z0-9_.-]/_}-$(date +%Y%m%d-%H%M%S)-$(printf '%04x' $((RANDOM)))"
fi

# The job's environment: the pass-through list, then --env (later wins). RAY_OVERRIDE_JOB_RUNTIME_ENV=1 lets
# the driver's own ray.init(runtime_env=...) (rlvr's RayExecutor) set variables the job already sets
# (e.g. HF_HUB_OFFLINE); without it Ray refuses to merge the two runtime envs. RAY_JOB_STOP_WAIT_TIME_S: `ray job
# stop` sends the driver SIGTERM, then SIGKILL this many seconds later (Ray's default: 3); rlvr needs the time to
# finish its step and write its checkpoint. --env RAY_JOB_STOP_WAIT_TIME_S=N changes it.
job_env=("RAY_OVERRIDE_JOB_RUNTIME_ENV=1" "RAY_JOB_STOP_WAIT_TIME_S=300")
for name in "${PASS_ENV[@]}"; do
  if [[ -n "${!name+set}" ]]; then job_env+=("$name=${!name}"); fi
done
for pair in "${env_pairs[@]+"${env_pairs[@]}"}"; do
  name="${pair%%=*}"
  [[ "$name" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || die_usage "--env '$pair': not NAME or NAME=VALUE"
  if [[ "$pair" == *=* ]]; then
    job_env+=("$pair")
  else
    [[ -n "${!name+set}" ]] || die_usage "--env $name: \$$name is not set here"
    job_env+=("$name=${!name}")
  fi
done

PY="${PYTHON:-python3}"
# Build the runtime_env JSON in Python (values may hold any character). argv: excludes, "--", NAME=VALUE...
runtime_env_json="$("$PY" - "${EXCLUDES[@]}" -- "${job_env[@]}" <<'EOF'
import json, sys
args = sys.argv[1:]
cut = args.index("--")
env = dict(pair.split("=", 1) for pair in args[cut + 1:])
print(json.dumps({"excludes": args[:cut], "env_vars": env}))
EOF
)"

export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
submit=(ray job submit --submission-id "$submission_id" --working-dir "$working_dir"
  --runtime-env-json "$runtime_env_json" --entrypoint-num-gpus "$num_gpus")
status_args=()
if [[ -n "$address" ]]; then
  submit+=(--address "$address")
  status_args=(--address "$address")
fi
((wait)) || submit+=(--no-wait)

echo "submit.sh: job $submission_id: ${entrypoint[*]}" >&2
rc=0
"${submit[@]}" -- "${entrypoint[@]}" || rc=$?
if ((rc != 0)); then
  echo "submit.sh: job $submission_id: 'ray job submit' exited with status $rc" >&2
  exit 1
fi
((wait)) || exit 0

# `ray job submit` exits 0 for a STOPPED job and when log streaming ends early: ask for the final status.
status="$("$PY" - "$submission_id" "${status_args[@]+"${status_args[@]}"}" <<'EOF'
import sys
from ray.job_submission import JobSubmissionClient
job_id, address = sys.argv[1], (sys.argv[3] if len(sys.argv) > 3 else None)
print(JobSubmissionClient(address).get_job_status(job_id).value)
EOF
)" || { echo "submit.sh: job $submission_id: could not read its status" >&2; exit 1; }
echo "submit.sh: job $submission_id: $status" >&2
[[ "$status" == "SUCCEEDED" ]] || exit 1
