#!/usr/bin/env bash
# The GPU path in one go, on a machine with a CUDA GPU (docs/testing.md, "The GPU path"):
#   1. the tests marked `gpu` in tests/unit (only the modules that have some): NCCL (1 rank; 2 where there
#      are 2 GPUs), fp16 with its grad scaler, bf16 autocast, torch's SyncBatchNorm, the GPU's RNG state in
#      an exact resume;
#   2. one 1-GPU fp16 job through the service on a local Ray cluster given the GPUs
#      (tests/integration/test_gpu_on_ray.py);
#   3. bench/train_throughput.py with --gpus 1, one short round: the service against plain torchrun.
# Each step has a time limit (200 + 120 + 130 s), so the whole run ends within 8 minutes; a summary comes last.
#
# What it needs, and assumes (it installs nothing: a GPU machine may reach no package registry):
#   - a Python with a CUDA build of torch that sees a GPU, and this project's other packages (Ray, FastAPI,
#     SQLAlchemy, pytest, ...) and Ray's `ray` command beside that Python. It is $PYTHON, else .venv/bin/python,
#     else python3. `make install` pins the CPU build of torch, so on a GPU machine make a venv on top of
#     the machine's CUDA torch instead, for example:
#       python3 -m venv --system-site-packages .venv-gpu
#       .venv-gpu/bin/python -m pip install --ignore-requires-python -e ./client -e '.[dev]' -e examples/ \
#           -c <(grep -v '^torch==' constraints.txt)      # offline: add --no-index --find-links <wheels>
#       PYTHON=.venv-gpu/bin/python bash scripts/gpu-check.sh
#   - it fails at once, saying what is missing, when torch has no CUDA or a package is not importable.
# The repository root and examples/ go on PYTHONPATH, so an install without `-e` works too.
# GPU_CHECK_LOGS: where the step logs go (default: a new folder under /tmp).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 2

if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
LOGS="${GPU_CHECK_LOGS:-$(mktemp -d /tmp/gpu-check.XXXXXX)}"
mkdir -p "$LOGS"
export PYTHONPATH="$ROOT:$ROOT/examples${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
START=$SECONDS

die() {
    echo "gpu-check: $*" >&2
    exit 2
}

# --- preflight: fail fast, saying what is missing ------------------------------------------------------
command -v "$PYTHON" >/dev/null 2>&1 || die "no Python at '$PYTHON' (set PYTHON=/path/to/python)"
if ! "$PYTHON" - <<'EOF'
import sys
try:
    import torch
except ImportError as exc:
    sys.exit(f"torch is not importable ({exc}): this check needs a CUDA build of torch")
if not torch.cuda.is_available():
    sys.exit(
        f"torch {torch.__version__} sees no CUDA GPU (built for CUDA {torch.version.cuda}): "
        "this check needs a CUDA build of torch on a machine with a GPU"
    )
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s): "
      + ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())))
EOF
then
    die "torch with CUDA is not importable by $PYTHON (see above)"
fi
if ! "$PYTHON" - <<'EOF'
import importlib, sys
needed = ["ray.train", "ray.serve", "fastapi", "sqlalchemy", "alembic", "pydantic_settings", "psycopg",
          "httpx", "pytest", "pytest_timeout", "xdist", "sklearn", "api.app", "workers.runtime.train_loop"]
missing = []
for name in needed:
    try:
        importlib.import_module(name)
    except Exception as exc:  # an ImportError, or a package broken by a wrong version
        missing.append(f"{name} ({type(exc).__name__}: {exc})")
if missing:
    sys.exit("not importable: " + "; ".join(missing))
EOF
then
    die "the project's packages are not all importable by $PYTHON: install them beside its CUDA torch (header of $0)"
fi
[[ -x "$(dirname "$(command -v "$PYTHON")")/ray" ]] || die "no 'ray' command beside $PYTHON (the service starts Ray with it)"
GPUS=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())')

# --- the steps -------------------------------------------------------------------------------------
declare -a SUMMARY=()
FAILED=0

# step NAME LIMIT_S COMMAND...: run it under its limit, log it, and keep a one-line result.
step() {
    local name=$1 limit=$2
    shift 2
    local log="$LOGS/$name.log" began=$SECONDS rc
    echo "== $name (at most ${limit} s): $*"
    timeout --kill-after=5 "$limit" "$@" >"$log" 2>&1
    rc=$?
    local outcome="passed"
    if ((rc == 124 || rc == 137)); then
        outcome="TIMED OUT after ${limit} s"
    elif ((rc != 0)); then
        outcome="FAILED (exit $rc)"
    fi
    ((rc == 0)) || FAILED=1
    # pytest's closing line, or the benchmark's last line
    local last
    last=$(grep -E '(passed|failed|skipped|error)' "$log" | tail -n 1)
    [[ -n "$last" ]] || last=$(tail -n 1 "$log")
    SUMMARY+=("$(printf '%-12s %-24s %4d s  %s' "$name" "$outcome" $((SECONDS - began)) "$last")")
    if ((rc != 0)); then
        tail -n 40 "$log"
    fi
}

# The unit modules with gpu tests: those that mark them, or take the harness's GPU params. Only they are
# collected (the rest need tools a GPU machine may lack), each on one of two workers (the 1-GPU resume
# module is the longest).
mapfile -t GPU_MODULES < <(grep -lE 'mark\.gpu|GROUP_MARKS|backends\(|devices\(' tests/unit/test_*.py)
PYTEST=("$PYTHON" -m pytest -p no:cacheprovider -m gpu -rs -v --timeout 300)
step unit-gpu 200 "${PYTEST[@]}" -n 2 --dist loadfile "${GPU_MODULES[@]}"
step service-job 120 "${PYTEST[@]}" tests/integration/test_gpu_on_ray.py
step bench 130 "$PYTHON" bench/train_throughput.py --gpus 1 --rounds 1 --epochs 2

echo
echo "== GPU check: $GPUS GPU(s), $((SECONDS - START)) s, logs in $LOGS"
printf '%s\n' "${SUMMARY[@]}"
grep -h "SKIPPED" "$LOGS"/*.log | sed 's/^/   /' | sort | uniq -c | sort -rn | head -n 20
exit "$FAILED"
