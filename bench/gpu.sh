#!/usr/bin/env bash
# GPU checks, under 5 minutes on one GPU (about 2-3 of benchmarks, the rest for the gpu tests):
#   1. training throughput with one rank on CUDA (NCCL, world of 1): %%distributed vs torchrun
#   2. NVML sampling overhead: samples/s with the metrics publisher off, sampling every 1 s, every 0.05 s
#   3. pytest -m gpu
# Needs .venv with a CUDA build of torch, e.g.
#   make setup TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
# Writes bench/results/gpu.json. Usage: bash bench/gpu.sh [--quick]
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
export PYTHONUNBUFFERED=1

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "bench/gpu.sh: torch in $PY sees no CUDA device: install a CUDA build on a GPU machine." >&2
    exit 2
fi
"$PY" -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, '|', torch.cuda.get_device_name(0))"

status=0
echo "== 1-2. throughput (world of 1, NCCL) vs torchrun; NVML sampling overhead"
timeout 200 "$PY" -m bench.gpu "$@" || { echo "bench.gpu failed (exit $?)"; status=1; }

echo "== 3. pytest -m gpu"
timeout 120 "$PY" -m pytest -q -m gpu -p no:cacheprovider || { echo "pytest -m gpu failed (exit $?)"; status=1; }
exit $status
