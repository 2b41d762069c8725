#!/usr/bin/env bash
# GPU check on ONE GPU (ranks share cuda:0 over gloo; NCCL needs a device per rank): every
# strategy with pipelined and sequential parameter-server transfers, AMP, the DALI loader
# with "mixed" (GPU) decoding from shards this script prepares, `ralp-pipe profile` on CUDA, and
# that profile against the device model's for this GPU (measured / modelled per unit and for the
# whole forward+backward), and the same profile as the target of a time-dilated emulation on this machine's CPUs
# next to undilated runs on the device ("dilated vs device"). Prints every figure; one more NCCL pair where the
# machine has >= 2 GPUs.
# Usage: scripts/gpu_check.sh [OUT_DIR]   (under 5 minutes on a current GPU; needs a CUDA build of torch)
# GPU_CHECK_DEVICE=cpu runs the same script on the CPU: a check of its plumbing where no GPU is.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
OUT="${1:-results/gpu_check}"
DEVICE="${GPU_CHECK_DEVICE:-cuda}"
mkdir -p "$OUT"
"$PY" - "$DEVICE" <<'PYEOF'
import sys, torch
if sys.argv[1] == "cpu":
    print(f"torch {torch.__version__}: plumbing check on the CPU (GPU_CHECK_DEVICE=cpu), no GPU path runs")
elif not torch.cuda.is_available():
    sys.exit("gpu_check: no CUDA device visible to torch; nothing to check")
else:
    print(f"torch {torch.__version__} CUDA {torch.version.cuda}: {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}")
PYEOF
BASE=(model=resnet18 train.batch_size=32 train.image_size=64 train.warmup_steps=2 train.measure_steps=5
      cluster.timeout_s=240 cluster.init_timeout_s=60 "paths.results=$OUT/results")
COMMON=("${BASE[@]}" "cluster.device=$DEVICE")
run() {  # name, overrides... (the synthetic loader unless they name one: a key is given once)
  local name=$1 arg loader=(train.loader=synthetic); shift
  for arg in "$@"; do [[ $arg == train.loader=* ]] && loader=(); done
  timeout 300 "$PY" -m ralp_pipe.cli train --out "$OUT/$name" "${COMMON[@]}" "${loader[@]}" "$@"
  "$PY" - "$OUT/$name/metrics.json" "$name" <<'PYEOF'
import json, sys
m = json.load(open(sys.argv[1]))
gb, an = m["gb_per_step"], m["analytic_gb_per_step"]
equal = all(gb[k] == an[k] for k in an if k != "total")  # per category: the total is a float sum
print(f"  {sys.argv[2]:<22} {m['backend']:<5} {m['device']:<7} {m['images_per_sec']:9.1f} img/s  "
      f"step {m['step_time_s'] * 1e3:7.1f} ms  {gb['total']:.4f} GB/step (analytic {an['total']:.4f}, "
      f"every category equal: {equal})")
PYEOF
}
for strategy in ps allreduce ralp_h ralp_n; do
  run "$strategy" strategy=$strategy cluster.gpus=2 cluster.backend=gloo
  [ "$strategy" = allreduce ] || run "${strategy}_sequential" strategy=$strategy cluster.gpus=2 cluster.backend=gloo strategy.overlap=false
done
run ps_colocated strategy=ps cluster.gpus=2 cluster.backend=gloo strategy.num_ps=2 strategy.ps_placement=colocated
run amp_allreduce strategy=allreduce cluster.gpus=2 cluster.backend=gloo train.amp=true
run amp_ralp_n strategy=ralp_n cluster.gpus=2 cluster.backend=gloo train.amp=true
"$PY" -m ralp_pipe.cli prepare-shards --no-progress dataset=synthetic1k "paths.results=$OUT/results"
run dali_mixed_ps strategy=ps cluster.gpus=2 cluster.backend=gloo dataset=synthetic1k train.loader=dali
timeout 300 "$PY" -m ralp_pipe.cli profile --out "$OUT/profile-$DEVICE.json" --repeats 3 model=resnet18 \
  train.batch_size=32 train.image_size=64 "cluster.device=$DEVICE" cluster.gpus=2
"$PY" - "$OUT/profile-$DEVICE.json" <<'PYEOF'
import json, sys
p = json.load(open(sys.argv[1]))
units, update = p["units"], p["update"]
print(f"  profile on {p['device']}: {len(units)} units, training backend {p.get('training_backend')}, "
      f"link {((p['link'] or {}).get('measured') or {}).get('bytes_per_s', 0) / 1e9:.2f} GB/s, "
      f"SGD update {update['update_s'] * 1e3:.2f} ms, aggregation {update['aggregate_s'] * 1e3:.2f} ms")
print(f"    {'unit':<16} " + "  ".join(f"batch {b:>3}: fwd/bwd ms" for b in units[0]["by_batch"]))
for u in units:
    cells = (f"{t['fwd_s'] * 1e3:9.3f} /{t['bwd_s'] * 1e3:8.3f}" for t in u["by_batch"].values())
    print(f"    {u['name']:<16} " + "  ".join(cells))
PYEOF
# Time-dilated emulation of this device from its measured profile, side by side with the device itself: each
# configuration run (a) here undilated and (b) on this machine's CPUs, modelled, every unit padded to D x its profiled
# time. Their target-equivalent images/sec (measured, and measured x D) should agree; on loopback, which nothing
# slows by D, (b) counts the communication D times too fast. Every rank gets the torch threads the profile was
# timed with (train.cpu_share: what the CPU check compares; on a GPU only the host threads).
FACTOR="${GPU_CHECK_FACTOR:-4}"
SHARE="$("$PY" -c 'from ralp_pipe.contract.topology import largest_world; print(largest_world(2))')"
side_by_side() {  # name, overrides...
  local name=$1; shift
  run "device_$name" train.cpu_share="$SHARE" "$@"
  timeout 300 "$PY" -m ralp_pipe.cli train --out "$OUT/dilated_$name" "${BASE[@]}" train.loader=synthetic \
    cluster.device=cpu train.cpu_share="$SHARE" dilation.mode=modelled "dilation.factor=$FACTOR" \
    "dilation.target=$OUT/profile-$DEVICE.json" "$@"
  "$PY" - "$OUT/device_$name/metrics.json" "$OUT/dilated_$name/metrics.json" "$name" <<'PYEOF'
import json, sys
device, dilated = (json.load(open(path)) for path in sys.argv[1:3])
d = dilated["dilation"]
ratio = dilated["target_images_per_sec"] / device["images_per_sec"]
print(f"  dilated vs device: {sys.argv[3]} {device['images_per_sec']:.1f} img/s on {device['device']}, "
      f"{dilated['target_images_per_sec']:.1f} img/s target-equivalent dilated ({ratio:.2f}); D = {d['factor']:g}, "
      f"target {d['target_device']}, {d['overruns']} overruns, late {d['late_s'] * 1e3:.1f} ms, "
      f"needed D {d['needed_factor']:.2f}")
PYEOF
}
side_by_side allreduce_n1 strategy=allreduce cluster.gpus=1 cluster.backend=gloo
side_by_side ps_n2 strategy=ps cluster.gpus=2 cluster.backend=gloo cluster=local
# The device model against this GPU: its modelled profile (the shipped entry its name names, or the nearest
# by compute capability, with its memory) next to the measured one, per unit and for the whole step. On the
# CPU the modelled side is a V100's, so the ratios only show the plumbing works.
TARGET=auto; [ "$DEVICE" = cuda ] || TARGET=v100
"$PY" -m ralp_pipe.cli profile --target "$TARGET" --out "$OUT/profile-modelled.json" model=resnet18 \
  train.batch_size=32 train.image_size=64 cluster.gpus=2
"$PY" benchmarks/device_model.py --measured "$OUT/profile-$DEVICE.json" --modelled "$OUT/profile-modelled.json"
if [ "$("$PY" -c 'import torch; print(torch.cuda.device_count())')" -ge 2 ]; then
  run nccl_allreduce strategy=allreduce cluster.gpus=2 cluster.backend=nccl
  run nccl_ps strategy=ps cluster.gpus=2 cluster.backend=nccl
  run nccl_ralp_n strategy=ralp_n cluster.gpus=2 cluster.backend=nccl
fi
echo "gpu_check: all runs finished; metrics under $OUT"
