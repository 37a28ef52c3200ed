#!/usr/bin/env bash
# The checks and benchmarks that need a CUDA GPU, in one script, so that a short lease of a GPU machine runs
# them without typing: `bash benchmarks/gpu_check.sh OUTDIR PHASE...`, from the repository root.
#
# Phases (each writes its log or report under OUTDIR):
#   env      the GPU, driver, torch and triton versions (env.txt)
#   kernel   benchmarks/kernel_check.py: the kernel's output and every gradient against a float64 reference
#            in fp32, bf16 and fp16 at the 134M shape (kernel_check.log)
#   tiles    benchmarks/kernel_tiles.py: a grid of the kernel's tile sizes at the 134M training shape (bf16, L 2048),
#            each checked against float64, then timed forward and backward against the heuristic default
#            (kernel_tiles_cuda.md; TILES_BUDGET seconds, default 150; TILES_DIAG, default "shared none")
#   tests    the CUDA cases of the kernel, attention-core and cache tests: the compiled Triton kernel and
#            FlexAttention's backward against eager (tests_cuda.log)
#   attention  benchmarks/attention.py at 2k and 8k, backends eager, sdpa, triton (flex does not compile at
#            D = 768) (attention_cuda.md)
#   memory   benchmarks/train_memory.py at 134M, context 2048, batch 1, T = 1..4 (train_memory_cuda.md)
#   throughput benchmarks/train_throughput.py at 134M, eager and compiled (train_throughput_cuda.md; THROUGHPUT_MODELS,
#            comma-separated, picks the CEM rows, default all; THROUGHPUT_STEPS, default 15; THROUGHPUT_TIMEOUT, default 480)
#   decode   benchmarks/decode.py at 134M, bf16, contexts 2k, 8k, 32k (decode_cuda.md)
#   suite    the whole test suite with CUDA present (tests_all_cuda.log)
# The source runs from src/ (PYTHONPATH): the machine's own torch, triton and transformers are used.
# Issue 37's side-by-side run (training, attention, eager and static-compiled decoding, memory planner; ~9.5 min,
# each section under its own timeout, --dry-run on the CPU): benchmarks/gpu_issue37.sh OUTDIR.
set -uo pipefail
out=${1:?usage: gpu_check.sh OUTDIR PHASE...}
shift
mkdir -p "$out"
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
py=${PYTHON:-python3}
for phase in "$@"; do
  echo "=== $phase $(date -u +%H:%M:%S)"
  case $phase in
    env)
      { nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
        $py -c "import torch, triton, platform; print('python', platform.python_version(), 'torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__); p = torch.cuda.get_device_properties(0); print(p.name, p.multi_processor_count, 'SMs', round(p.total_memory / 2**30, 1), 'GiB')"
      } 2>&1 | tee "$out/env.txt" ;;
    tiles)
      timeout $(( ${TILES_BUDGET:-150} + 120 )) $py benchmarks/kernel_tiles.py --device cuda --budget-s ${TILES_BUDGET:-150} --diag ${TILES_DIAG:-shared none} \
        --out "$out/kernel_tiles_cuda.md" 2>&1 | tee "$out/kernel_tiles.log" | tail -40 ;;
    tests)
      timeout 240 $py -m pytest -q -p no:cacheprovider --tb=short -k cuda tests/kernels tests/layers/test_attention_core.py \
        tests/model/test_cache.py 2>&1 | tee "$out/tests_cuda.log" | tail -25 ;;
    kernel)
      $py benchmarks/kernel_check.py --device cuda 2>&1 | tee "$out/kernel_check.log" ;;
    attention)
      timeout ${ATTN_TIMEOUT:-420} $py benchmarks/attention.py --device cuda --seqs 2048 8192 --backends eager sdpa triton --out "$out/attention_cuda.md" 2>&1 | tail -45 ;;
    memory)
      timeout 150 $py benchmarks/train_memory.py --device cuda --out "$out/train_memory_cuda.md" 2>&1 | tail -25 ;;
    throughput)
      models=(); [ -n "${THROUGHPUT_MODELS:-}" ] && IFS=',' read -ra models <<< "$THROUGHPUT_MODELS"
      timeout ${THROUGHPUT_TIMEOUT:-480} $py benchmarks/train_throughput.py --device cuda --presets 134M --steps ${THROUGHPUT_STEPS:-15} \
        ${models[@]:+--models "${models[@]}"} --out "$out/train_throughput_cuda.md" 2>&1 | tail -25 ;;
    decode)
      timeout 420 $py benchmarks/decode.py --device cuda --steps 100 --out "$out/decode_cuda.md" 2>&1 | tail -25 ;;
    suite)
      timeout 480 $py -m pytest -q -x -p no:cacheprovider -n 8 --timeout 300 2>&1 | tee "$out/tests_all_cuda.log" | tail -30 ;;
    *) echo "unknown phase $phase" >&2; exit 2 ;;
  esac
done
echo "=== done $(date -u +%H:%M:%S)"
