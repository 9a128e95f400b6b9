#!/usr/bin/env bash
# The GPU checks as one script for a machine with a CUDA device and torch but no OpenTelemetry
# (CONTRIBUTING.md, "GPU checks"): installs the wheels in .whl/ (this package and its
# OpenTelemetry dependencies, built and downloaded beforehand), then runs tests/gpu, the step
# benchmark (a ~10 ms and a ~3 ms step, the bridge at its defaults) and the NCCL timing
# benchmark, writing their logs to $OUT (or /tmp). Each part has a time limit of its own,
# 280 + 2 x 55 + 170 s in all (under 10 minutes with the install, one device run).
set -uo pipefail
out=${OUT:-/tmp}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c 'import torch, opentelemetry.sdk.version as v
print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(),
      "otel sdk", v.__version__)'
timeout 280 python3 -m pytest -p no:cacheprovider -v -rA tests/gpu 2>&1 | tee "$out/gpu-tests.log"
echo "tests exit ${PIPESTATUS[0]}"
for shape in "4096 512" "1024 64"; do
    set -- $shape
    timeout 55 python3 -m benchmarks.gpu_step --runs 2 --steps 200 --width "$1" --batch "$2" \
        2>&1 | tee -a "$out/gpu-step.log"
    echo "benchmark $1 x $2 exit ${PIPESTATUS[0]}"
done
timeout 170 python3 -m benchmarks.nccl_timing --budget 150 2>&1 | tee "$out/nccl-timing.log"
echo "nccl timing exit ${PIPESTATUS[0]}"
