#!/usr/bin/env bash
# Issue 37's GPU measurements in one run of at most ~9 minutes on one H100/H200, from the repository root:
#   bash benchmarks/gpu_issue37.sh OUTDIR [--dry-run]
# Each section runs under its own `timeout` (one failure loses only its own report) and writes its raw report
# under OUTDIR, beside env.txt (machine, commit, settings) and a log per section:
#   train      benchmarks/train_throughput.py: 134M, context 2048, bf16, eager and compiled: CEM T=1, cem-t2 vs Llama
#   attention  benchmarks/attention.py: the layer's forward and forward+backward at 2k and 8k, CEM (triton, sdpa)
#              vs Llama through SDPA's flash kernel
#   decode     benchmarks/decode.py: 8k and 32k, batch 1 and 16, bf16: kq=shared, cem-t2 vs Llama tokens/s and cache
#              bytes, eager and static-compiled (a StaticCache, the step compiled with mode "reduce-overhead": CUDA graphs)
#   memory     benchmarks/train_memory.py (the allocator) and the memory planner (plan_memory) for cem-t2, T = 1..4
# --dry-run runs every section on the CPU at tiny shapes in seconds (tests/benchmarks/test_gpu_script.py).
# Timeouts (s): train 170, attention 70, decode 2 × 130 (eager and compiled in one run per batch, so their ratio
# is paired), memory 45 + planner 25: at most 570 s, 9.5 minutes. Not yet run on a GPU (written on a CPU-only task).
set -uo pipefail
out=${1:?usage: gpu_issue37.sh OUTDIR [--dry-run]}
dry=${2:-}
mkdir -p "$out"
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
py=${PYTHON:-python3}
if [ "$dry" = "--dry-run" ]; then
  dev=(--device cpu)
  train=(--presets tiny --seq-len 32 --batch 1 --steps 1 --warmup 0 --compile off --no-hf)
  attn=(--dim 64 --heads 4 --seqs 32 --batch 1 --repeats 1 --warmup 0 --cem-steps 1 --backends eager sdpa)
  dec=(--preset tiny --contexts 32 64 --steps 1 --warmup 1 --dtype fp32 --modes eager static)
  batches=(1 2) mem=(--preset tiny --seq 32 --depths 1 2 --modes none --repeats 1 --warmup 0) plan="tiny 32"
else
  dev=(--device cuda)
  train=(--presets 134M --seq-len 2048 --precision bf16 --compile both --models "CEM T=1" cem-t2 --steps 10 --no-hf)
  attn=(--seqs 2048 8192 --dtype bf16 --backends sdpa triton --kq-diag shared --cem-steps 1 2 --repeats 10)
  dec=(--preset 134M --contexts 8192 32768 --steps 20 --warmup 3 --dtype bf16 --modes eager compiled --fill tile --prefill-chunk 2048)
  batches=(1 16) mem=(--preset 134M --arch cem-t2 --seq 2048 --depths 1 2 3 4 --modes none --precision bf16 --repeats 3) plan="134M 2048"
fi
t() { if [ -n "$dry" ]; then echo 120; else echo "$1"; fi; }  # a section's timeout (s); dry: generous, for a loaded CPU
{ echo "date: $(date -u +%FT%TZ)"; echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo +dirty)"
  echo "settings: train ${train[*]} | attention ${attn[*]} | decode ${dec[*]} batches ${batches[*]} | memory ${mem[*]}"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>/dev/null || echo "no nvidia-smi"
  lscpu 2>/dev/null | grep -E "Model name|^CPU\(s\)"
  $py -c "import torch, platform; print('python', platform.python_version(), 'torch', torch.__version__, 'cuda', torch.version.cuda)"
} > "$out/env.txt" 2>&1
cat "$out/env.txt"
section() {  # name, timeout (s), command...
  local name=$1 limit=$2; shift 2
  echo "=== $name $(date -u +%H:%M:%S) (timeout ${limit}s)"
  timeout "$limit" "$@" > "$out/$name.log" 2>&1; local rc=$?
  echo "$name: exit $rc" | tee -a "$out/status.txt"; tail -4 "$out/$name.log"
}
section train "$(t 170)" $py benchmarks/train_throughput.py "${dev[@]}" "${train[@]}" --out "$out/train_throughput.md"
section attention "$(t 70)" $py benchmarks/attention.py "${dev[@]}" "${attn[@]}" --out "$out/attention.md"
for b in "${batches[@]}"; do
  section "decode_b$b" "$(t 130)" $py benchmarks/decode.py "${dev[@]}" "${dec[@]}" --batch "$b" --models "CEM kq=shared" cem-t2 --out "$out/decode_b$b.md"
done
section memory "$(t 45)" $py benchmarks/train_memory.py "${dev[@]}" "${mem[@]}" --out "$out/train_memory.md"
section plan "$(t 25)" $py -c "
import sys
from cem.model import model_config
from cem.model.memory import format_plan, plan_memory
preset, seq = sys.argv[1], int(sys.argv[2])
for T in (1, 2, 3, 4):
    cfg = model_config(preset, 'cem-t2', attn_steps=T, mlp_steps=T)
    print(f'## cem-t2 T={T}, {preset}, batch 1, seq {seq}, bf16, no checkpointing'); print(format_plan(plan_memory(cfg, 1, seq, precision='bf16')))
" $plan
echo "=== done $(date -u +%H:%M:%S)"
