#!/usr/bin/env bash
# The cpu128 campaign (issue 35): the paper's core findings at the cpu suite's largest size, under both rate
# rules, in two single-thread lanes that share one runs folder (study/results/cpu/runs: a run either lane holds
# is put off by the other). Run from a frozen worktree so that code changes on main do not reach running lanes:
#
#   git worktree add --detach /tmp/suite/wt128 HEAD     # or: git -C /tmp/suite/wt128 checkout --detach main
#   bash /tmp/suite/wt128/study/results/cpu128/lanes.sh /work/main /work/shared/data
#
# Before moving the worktree to newer code, check that it trains to the same bits: study/results/cpu128/parity.sh.
# On a new machine, samebits.py says whether it computes what the committed runs' machines did (one model name,
# "AMD EPYC", covers CPUs that round differently: docs/LOG.md, 2026-11-28).
# Rerun it to resume (finished runs are skipped, interrupted ones resume bit-exact from their checkpoint, saved every
# 200 steps and on SIGTERM). Where the work tree outlives the session (the checkpoints live in the run folders, ignored
# by git), let the lanes run to the session's end and rerun them in the next: no lane time is lost. On a machine that
# may not outlive the session, give the session's end less the time to commit: UNTIL=06:05 bash .../lanes.sh ...;
# then no lane starts a run that would not finish by then (--until).
# Run folders are ignored by git: commit finished runs as the tables beside them, after adding those finished since
# (`python -m cem_study.records add study/results/cpu/runs`, then commit study/results/cpu/runs.jsonl and
# steps.jsonl; only finished runs are added, and a run being trained again has left the tables). Every run trains on one processor (--processor, the CPU named with its
# family: "AMD EPYC" covers a Zen 2 and this Zen 4, which round differently): a machine with another refuses to
# train, and a run recorded on another is trained again. On another CPU the lanes stop at once; that session's
# work is elsewhere.
set -euo pipefail
WT=$(cd "$(dirname "$0")/../../.." && pwd)      # the frozen worktree this script lives in
MAIN=${1:?the checkout whose study/results receive the runs}
DATA=${2:?the folder holding wikitext-2/}
SCALE=${SCALE:-cpu128}                          # another scale's campaign: SCALE=screen64 (study/results/screen64/README.md),
                                                # where each (size, seed) trains on one processor: PASSES names the seeds (another's blocks are left to it)
if [ "$SCALE" = cpu128 ]; then PROC=${PROC:-AMD EPYC (AuthenticAMD family 25 model 17 stepping 1)}; fi
LOGS=${LOGS:-/tmp/suite/logs}
mkdir -p "$LOGS"
export PYTHONPATH="$WT/src:$WT/study/src" OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
PROC=${PROC:-$(python -c "from cem.provenance import processor; print(processor())")}   # else the one it starts on
# PASSES="0 0,1 0,1,2": one pass a seed list, each analysing the seeds so far (every variant's seed 0 first);
# SIZES="cpu96": only the runs of those sizes train, and the pass stops before the analysis, which reads every size
# (at confirm, one size's runs of a seed are a block a session can finish)
run() {
  for seeds in ${PASSES:-all}; do
    local only=(); [ "$seeds" = all ] || only=(--seeds "$seeds")
    python -m cem_study experiment "${IDS:-all}" --scale "$SCALE" --jobs 1 --results "$MAIN/study/results/$SCALE" --data-dir "$DATA" \
      --processor "$PROC" ${UNTIL:+--until "$UNTIL"} ${SIZES:+--sizes "$SIZES"} "${only[@]}" || return
  done
}

# two lanes on the same list (`all`: the scale's suite, at cpu128 the core experiments first, lr,fig2c,fig2d,fig4,fig3b,
# positional,fig3a, then the rest): a run one lane holds is left to it, and an experiment waiting on such a run is put
# off until the lane's other experiments are done, so neither lane waits while work is left
( run ) > "$LOGS/${SCALE}A.log" 2>&1 &
( sleep 20; run ) > "$LOGS/${SCALE}B.log" 2>&1 &
echo "lanes of $SCALE started on $PROC: logs in $LOGS (${SCALE}A.log, ${SCALE}B.log); pids $(jobs -p | tr '\n' ' ')"
