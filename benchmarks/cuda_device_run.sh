#!/usr/bin/env bash
# The GPU check of issue 25, as one prepared run on a CUDA machine (the `device`
# tool's H200: torch 2.11.0+cu130, Python 3.12, no network): installs this
# checkout, runs test/test_precompile_cuda.py, then benchmarks/cuda_bench.py.
# Logs and results go to $OUT (default ./cuda_out).  Wheels the machine lacks
# (expecttest, for torch's test utilities) travel in .whl/.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-$PWD/cuda_out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index . 2>&1 | tail -3
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv | tee "$OUT/gpu.txt"
# Tests from outside the checkout, so the installed package is what runs.
(cd /tmp && timeout "${TEST_TIMEOUT:-240}" python3 -m pytest "$OLDPWD/test/test_precompile_cuda.py" -q -rs \
    ${PYTEST_WORKERS:+-n "$PYTEST_WORKERS"} 2>&1 | tee "$OUT/tests.log")
(cd /tmp && timeout "${BENCH_TIMEOUT:-330}" python3 "$OLDPWD/benchmarks/cuda_bench.py" --out "$OUT/cuda.md" \
    ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log")
