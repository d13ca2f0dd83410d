#!/usr/bin/env bash
# The GPU checks in one go, sized for one sitting of about 8.5 minutes on an H200 (each step has
# its own time limit, so a slow one cannot starve the next):
#   1. benchmarks/serving_accuracy.py --gpu  continuous batching, predicted against served (jax runner)
#   2. benchmarks/gpu/check.py               LENS static batches (jax runner), first case
#   3. benchmarks/gpu/amali_validate.py      AMALI's kernel model against torch kernels (21 s on an H200)
# Run from the repository root on the GPU host; logs and CSVs go to $OUT (default ./gpu-out).
# serving_accuracy reads the Azure trace from shared/data/traces/ at or above the checkout.
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export OUT PYTHONUNBUFFERED=1 PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false JAX_ENABLE_COMPILATION_CACHE=false
PY=${PYTHON:-python3}
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=driver_version,clocks.sm,clocks.mem --format=csv;
  $PY -c 'import jax, numpy; print("jax", jax.__version__, jax.devices(), "numpy", numpy.__version__)'; } \
  >"$OUT/env.txt" 2>&1
timeout "${SERVING_S:-250}" $PY benchmarks/serving_accuracy.py --gpu --units "${SERVING_UNITS:-1x8}" \
  --requests "${SERVING_REQUESTS:-40}" --repeats 2 --budget-s "${SERVING_BUDGET_S:-110}" \
  --csv "$OUT/serving_gpu.csv" >"$OUT/serving.log" 2>&1
echo "serving_accuracy: exit $?" >>"$OUT/env.txt"
timeout "${CHECK_S:-200}" $PY benchmarks/gpu/check.py --budget-s 0 >"$OUT/check.log" 2>&1
echo "check: exit $?" >>"$OUT/env.txt"
timeout "${AMALI_S:-60}" $PY benchmarks/gpu/amali_validate.py --gpu H200 --budget-s 45 >"$OUT/amali.log" 2>&1
echo "amali_validate: exit $?" >>"$OUT/env.txt"
cat "$OUT/env.txt"
