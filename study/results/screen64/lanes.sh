#!/usr/bin/env bash
# The test-time recipes' screening (issue 64) at cpu64, in two single-thread lanes that share one runs folder
# (study/results/screen64/runs: a run either lane holds is put off by the other). Run from a frozen worktree so that
# code changes on main do not reach running lanes:
#
#   git worktree add --detach /tmp/suite/wts HEAD
#   bash /tmp/suite/wts/study/results/screen64/lanes.sh /work/main /work/shared/data
#
# The seeds go one at a time (every recipe's seed 0, then seed 1, then seed 2; each pass analyses the seeds so far), so that a session cut short has every
# recipe on the same seeds. Every run trains on one processor (PROC, default the processor this script starts on):
# the screening is a campaign of its own, never paired with another processor's runs. Rerun it to resume (finished
# runs are skipped, interrupted ones resume bit-exact from their checkpoint). UNTIL=HH:MM: no run starts that would
# not finish by then. Commit finished runs as the tables beside them:
# `python -m cem_study.records add study/results/screen64/runs`, then study/results/screen64/{runs,steps}.jsonl.
set -euo pipefail
WT=$(cd "$(dirname "$0")/../../.." && pwd)      # the frozen worktree this script lives in
MAIN=${1:?the checkout whose study/results receive the runs}
DATA=${2:?the folder holding wikitext-2/}
LOGS=${LOGS:-/tmp/suite/logs}
mkdir -p "$LOGS"
export PYTHONPATH="$WT/src:$WT/study/src" OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
PROC=${PROC:-$(python -c "from cem.provenance import processor; print(processor())")}
lane() {
  for seeds in ${SEEDS:-0 0,1 0,1,2}; do    # seed 0 of every recipe first; each pass analyses the seeds so far
    python -m cem_study experiment recipes --scale screen64 --jobs 1 --results "$MAIN/study/results/screen64" --data-dir "$DATA" \
      --seeds "$seeds" --processor "$PROC" ${UNTIL:+--until "$UNTIL"} || return
  done
}
( lane ) > "$LOGS/screenA.log" 2>&1 &
( sleep 20; lane ) > "$LOGS/screenB.log" 2>&1 &
echo "lanes started on $PROC: logs in $LOGS (screenA.log, screenB.log); pids $(jobs -p | tr '\n' ' ')"
