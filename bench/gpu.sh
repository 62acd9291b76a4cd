#!/usr/bin/env bash
# GPU checks and measurements, one script, under 8 minutes on one GPU, one report (bench/results/gpu.json):
#   every strategy (DDP, FSDP2, TP, PP) on NCCL vs a single process (fp32, and bf16 where native); the abort
#   path (a blocked NCCL rank with 2+ GPUs; with one GPU, the abort from a background thread and re-form);
#   NVML sampling by the join's GPU UUID and its overhead; the dashboard's communication bar; FSDP's peak
#   memory sharding a CPU model; one rank vs torchrun; and pytest -m gpu. See bench/gpu.py.
# Needs .venv with a CUDA build of torch, e.g.
#   make setup TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
# Usage: bash bench/gpu.sh [--quick]
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
export PYTHONUNBUFFERED=1

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "bench/gpu.sh: torch in $PY sees no CUDA device: install a CUDA build on a GPU machine." >&2
    exit 2
fi
"$PY" -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, '|', torch.cuda.get_device_name(0))"
timeout 460 "$PY" -m bench.gpu "$@"
status=$?
[ $status -eq 124 ] && echo "bench/gpu.sh: ran past 460 s (the report was not written)" >&2
exit $status
