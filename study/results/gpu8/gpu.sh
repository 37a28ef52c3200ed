#!/usr/bin/env bash
# The gpu8 scale (issue 62, item 6) on a lent H200, in one call of at most nine minutes: fig4's position-matched quartet
# (CEM attention T=1 and T=2, Llama-ALiBi x1 and x2) at cpu128-l8 (cpu128 twice as deep), 3 seeds, each on its own
# Chinchilla budget at the fixed rate 2e-3, its twelve runs trained together (one lane of twelve processes), then
# analysed: the regime check of its Llama (Llama-ALiBi x1) against the 5- to 8-grams first, then the quartet's findings.
#
#   cp -r /work/shared/data/wikitext-2 .gpu-data/        # here, once; then carry .gpu-data
#   DRY=1 bash study/results/gpu8/gpu.sh /tmp/gpu8-dry   # here, on the CPU: the same path, every run 3 steps (2-4 min)
#   bash study/results/gpu8/gpu.sh $OUT                  # on the device machine (timeout_s 600)
#
# It is study/results/cpu128/gpu.sh at SCALE=gpu8 (see there: the budget, the campaign folder, bringing the runs back),
# so the runs form their own campaign under the GPU's name: `tar xzf $OUT/runs.tgz -C study/results/h200` unpacks
# gpu8/ (the report, fig4-alibi/, runs.jsonl, steps.jsonl) beside that campaign's cpu128/. The call starts from
# study/results/h200/, whose gpu8/fig4-alibi/ holds the regime check's n-grams already fit (the 5- to 8-gram on the
# whole train split scored in 256-byte windows: study/results/cpu128/regime.json's, the same fits), so the analysis
# does not fit them on the machine (about 7 minutes on one core). env.txt carries the plan with its estimated wall
# time (`cem-study experiment fig4-alibi --scale gpu8 --plan`, from the H200 runs of study/results/h200/cpu/).
set -uo pipefail
export SCALE=gpu8 EXPERIMENTS=fig4-alibi
if [ -n "${DRY:-}" ]; then export LANES=${LANES:-1} JOBS=${JOBS:-2}; else export LANES=${LANES:-1} JOBS=${JOBS:-12} BUDGET=${BUDGET:-510}; fi
exec bash "$(dirname "$0")/../cpu128/gpu.sh" "$@"
