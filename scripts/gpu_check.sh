#!/usr/bin/env bash
# GPU smoke: every strategy for a few steps on ONE GPU (ranks share cuda:0 over gloo), then one
# allreduce run with NCCL when the machine has >= 2 GPUs. Prints each run's figures.
# Usage: scripts/gpu_check.sh [OUT_DIR]   (about 1-3 minutes; needs a CUDA build of torch)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
OUT="${1:-results/gpu_check}"
"$PY" - <<'PYEOF'
import sys, torch
if not torch.cuda.is_available():
    sys.exit("gpu_check: no CUDA device visible to torch; nothing to check")
print(f"torch {torch.__version__} CUDA {torch.version.cuda}: {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}")
PYEOF
COMMON=(model=resnet18 dataset.num_classes=1000 train.batch_size=32 train.image_size=64
        train.warmup_steps=2 train.measure_steps=5 cluster.device=cuda cluster.timeout_s=240 cluster.init_timeout_s=60)
run() {  # name, overrides...
  local name=$1; shift
  timeout 300 "$PY" -m ralp_pipe.cli train --out "$OUT/$name" "${COMMON[@]}" "$@"
  "$PY" - "$OUT/$name/metrics.json" <<'PYEOF'
import json, sys
m = json.load(open(sys.argv[1]))
gb, an = m["gb_per_step"]["total"], m["analytic_gb_per_step"]["total"]
print(f"  {m['strategy']:<9} {m['backend']:<5} {m['device']:<7} {m['images_per_sec']:9.1f} img/s  "
      f"step {m['step_time_s'] * 1e3:7.1f} ms  {gb:.4f} GB/step (analytic {an:.4f}, equal={gb == an})")
PYEOF
}
for strategy in ps allreduce ralp_h ralp_n; do
  run "$strategy" strategy=$strategy cluster.gpus=2 cluster.backend=gloo
done
run amp_allreduce strategy=allreduce cluster.gpus=2 cluster.backend=gloo train.amp=true
if [ "$("$PY" -c 'import torch; print(torch.cuda.device_count())')" -ge 2 ]; then
  run nccl_allreduce strategy=allreduce cluster.gpus=2 cluster.backend=nccl
  run nccl_ralp_n strategy=ralp_n cluster.gpus=2 cluster.backend=nccl
fi
echo "gpu_check: all runs finished; metrics under $OUT"
