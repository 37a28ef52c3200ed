#!/usr/bin/env bash
# The cpu128 campaign (issue 35): the paper's core findings at the cpu suite's largest size, under both rate
# rules, in two single-thread lanes that share one runs folder (docs/results/cpu/runs: a run either lane holds
# is put off by the other). Run from a frozen worktree so that code changes on main do not reach running lanes:
#
#   git worktree add --detach /tmp/suite/wt128 HEAD     # or: git -C /tmp/suite/wt128 checkout --detach main
#   bash /tmp/suite/wt128/docs/results/cpu128/lanes.sh /work/main /work/shared/data
#
# Before moving the worktree to newer code, check that it trains to the same bits: docs/results/cpu128/parity.sh.
# Rerun it to resume (finished runs are skipped, interrupted ones resume bit-exact from their checkpoint).
# Commit only run folders with a results.json. Every run trains on one processor (--processor): a machine
# with another refuses to train, and a run recorded on another is trained again.
set -euo pipefail
WT=$(cd "$(dirname "$0")/../../.." && pwd)      # the frozen worktree this script lives in
MAIN=${1:?the checkout whose docs/results receive the runs}
DATA=${2:?the folder holding wikitext-2/}
PROC=${PROC:-AMD EPYC}
CORE=${CORE:-lr,fig2c,fig2d,fig4,fig3b,positional,fig3a}
LOGS=${LOGS:-/tmp/suite/logs}
mkdir -p "$LOGS"
export PYTHONPATH="$WT/src" OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
run() { python -m cem.cli experiment "$1" --scale cpu128 --jobs 1 --results "$MAIN/docs/results/cpu128" --data-dir "$DATA" --processor "$PROC"; }

# lane A: the Llama sweep, then the core experiments in order, then the rest of the suite
( run "$CORE" && run all ) > "$LOGS/laneA.log" 2>&1 &
# lane B: starts on the recursion runs at Llama's recorded rate (2e-3, chosen by the cpu suite's seed-0 sweep and
# re-checked by lane A's sweep), so that it does not wait for lane A's sweep run; then the same commands as lane A
(
  sleep 20
  python - "$MAIN" "$DATA" "$PROC" <<'PY'
import sys
from dataclasses import replace
from pathlib import Path
from cem.experiments.registry import EXPERIMENTS, variants_under
from cem.experiments.scales import get_scale
from cem.experiments.sweep import run_sweep
main, data, proc = sys.argv[1:]
sc = replace(get_scale("cpu128", processor=proc), chosen_lrs=(("cpu128", 2e-3),))
for exp_id in ("fig2c", "fig2d", "fig4"):
    exp = EXPERIMENTS[exp_id]
    specs = [v.spec.with_seed(s) for v in variants_under(exp, sc, "paper") for s in (v.seeds or sc.seeds_for(exp.seeds))]
    run_sweep(specs, sc, Path(main) / "docs/results/cpu128", data)
PY
  run "$CORE" && run all
) > "$LOGS/laneB.log" 2>&1 &
echo "lanes started: logs in $LOGS (laneA.log, laneB.log); pids $(jobs -p | tr '\n' ' ')"
