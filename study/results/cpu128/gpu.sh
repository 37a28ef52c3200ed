#!/usr/bin/env bash
# The cpu128 campaign on a lent GPU machine (issue 35, item 8), in one call of at most ten minutes:
#
#   bash study/results/cpu128/gpu.sh OUTDIR            # on the device machine, from the repository root
#
# SCALE names another scale trained the same way (default cpu128; study/results/gpu8/gpu.sh trains gpu8's quartet).
#
# Local lanes finish about two cpu128 runs an hour (one thread each). A GPU machine is lent for about 15 minutes,
# so a run counts only if it finishes there: this script trains whole experiments (EXPERIMENTS, default the Llama
# rate sweep, fig2a, fig2c and fig2d) in LANES commands of JOBS processes each, all sharing the one GPU and one runs folder
# (a run one lane holds is left to it, as in lanes.sh on the CPU; every run but the Llama sweep waits for Llama's rate,
# so until that is chosen the other lanes wait: 3.5 of the first call's 9 minutes), for at most BUDGET seconds, then adds
# every finished run folder to the tables (cpu/runs.jsonl, cpu/steps.jsonl: `python -m cem_study.records add`) and
# brings them back with the scale's folder as OUTDIR/runs.tgz (no run folder, no checkpoint; env.txt has the plan and its time estimate), with a summary of what finished and how fast (OUTDIR/summary.txt). A cpu run on that machine's 16 cores would take
# 0.7-1.3 h, so none is started there.
#
# Runs trained here form their own campaign: they record the GPU as their processor, are never paired with the
# local lanes' CPU runs, and are unpacked into their own results folder, one per GPU model (study/results/h200/ for an
# "NVIDIA H200": `tar xzf OUTDIR/runs.tgz -C study/results/h200`, its cpu128/ and cpu/runs.jsonl beside each other as
# in study/results/). Every run of a comparison must come from one device kind (an H100 and an H200 are two devices): the
# experiments train with --processor set to the GPU's name, and the call starts from that GPU's committed folder
# (FROM, default study/results/<gpu>/), so its finished runs and chosen rates are not trained again.
#
# The corpus travels with the call: copy /work/shared/data/wikitext-2 into .gpu-data/ (ignored by git) and
# name .gpu-data in the call's carry. DRY=1 rehearses the same call on the CPU (the same scale, corpus, experiments
# and learning-rate sweeps, each run 3 steps: `cem-study experiment --rehearse`), in a few minutes: run it before a GPU call.
set -uo pipefail
out=${1:?usage: gpu.sh OUTDIR}
mkdir -p "$out"
export PYTHONPATH="$PWD/src:$PWD/study/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1
py=${PYTHON:-python3}
scale=${SCALE:-cpu128} exps=${EXPERIMENTS:-lr,fig2a,fig2c,fig2d} data=${DATA:-.gpu-data}
if [ -n "${DRY:-}" ]; then
  device=cpu lanes=${LANES:-2} jobs=${JOBS:-1} budget=${BUDGET:-600} rehearse=--rehearse
else
  device=cuda lanes=${LANES:-3} jobs=${JOBS:-4} budget=${BUDGET:-480} rehearse=
fi
# on an H200 twelve runs started together take 190-200 s (compilation included): a shorter budget finishes none
# (2026-11-28: 170 s, 0 of 12 runs, 4 minutes of device time lost)
[ -n "${DRY:-}" ] || [ "$budget" -ge 240 ] || { echo "BUDGET=$budget: under 240 s no run finishes; give at least 240" >&2; exit 2; }
[ -f "$data/wikitext-2/train.txt" ] || { echo "no corpus at $data/wikitext-2: copy /work/shared/data/wikitext-2 into $data (and carry it)" >&2; exit 2; }
root=$(mktemp -d /tmp/gpu128.XXXXXX)
# the folder of the scale's run folders and their tables, under the results root: cpu128's are the cpu suite's (cpu/)
runs=$($py -c "from cem_study.scales import get_scale; s = get_scale('$scale'); print(s.runs_from or s.name)") || exit 2
# the processor every run of this campaign records: the GPU's name ("NVIDIA H200"), or the CPU's in a rehearsal
proc=$($py -c "import torch; from cem.provenance import processor; print(processor(torch.device('$device')))") || exit 2
gpu=$(echo "$proc" | awk '{print tolower($2)}')   # "NVIDIA H200" -> h200
if [ -n "${DRY:-}" ]; then from=${FROM:-}; else from=${FROM:-study/results/$gpu}; fi
if [ -n "$from" ] && [ -d "$from" ]; then cp -r "$from/." "$root/"; fi
{ date -u +%FT%TZ; git rev-parse HEAD 2>/dev/null || echo "no git"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"
  $py -c "import torch, platform; print('python', platform.python_version(), 'torch', torch.__version__, 'cuda', torch.version.cuda)"
  echo "scale=$scale${rehearse:+ (rehearsal)} device=$device processor=$proc experiments=$exps lanes=$lanes jobs=$jobs (each lane) budget=${budget}s"
  echo "started from ${from:-nothing}: $(cat "$root/$runs/runs.jsonl" 2>/dev/null | wc -l) runs"
  # what the call trains and its estimated wall time (the scale's own plan, not the rehearsal's 3-step runs)
  $py -m cem_study experiment "$exps" --scale "$scale" --results "$root/$scale" --processor "$proc" --plan
} > "$out/env.txt" 2>&1
cat "$out/env.txt"
start=$(date +%s)
# the experiments, stopped at the budget: runs that finished by then are kept, the others are lost with the machine
# (each lane starts 8 s after the one before, so that the first takes the runs the list begins with)
for i in $(seq 1 "$lanes"); do
  ( sleep $(( 8 * (i - 1) ))
    timeout --signal=INT --kill-after=30 $(( budget - 8 * (i - 1) )) "$py" -m cem_study experiment "$exps" --scale "$scale" \
      --device "$device" --jobs "$jobs" --results "$root/$scale" --data-dir "$data" --processor "$proc" $rehearse > "$out/lane$i.log" 2>&1
    echo "lane $i: experiment exit $? after $(( $(date +%s) - start )) s" ) &
done
wait
for i in $(seq 1 "$lanes"); do echo "== lane $i"; cat "$out/lane$i.log"; rm -f "$out/lane$i.log"; done > "$out/experiment.log"
# what finished, and how fast (tokens/s per run, runs an hour over the whole window)
$py - "$root" "$start" "$(( lanes * jobs ))" > "$out/summary.txt" 2>&1 <<'PY'
import json, sys, time
from pathlib import Path
root, start, jobs = Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
wall = time.time() - start
done = sorted(p for p in root.glob("*/runs/*/results.json") if p.stat().st_mtime >= start)  # not the runs it started from
print(f"{len(done)} runs finished in {wall:.0f} s with {jobs} processes: {3600 * len(done) / wall:.1f} runs an hour "
      f"(the two local lanes: about 2)")
for p in done:
    r = json.loads(p.read_text())
    s = (r.get("sessions") or [{}])[-1]
    print(f"  {p.parent.name}: test ppl {r.get('test_perplexity', float('nan')):.3f}, {r.get('tokens_per_s', float('nan')):,.0f} tokens/s, "
          f"{r.get('wall_time_s', float('nan')):.0f} s, {s.get('processor')}, torch {s.get('torch')}")
PY
cat "$out/summary.txt"
# the finished runs' tables (an unfinished run cannot resume without its checkpoint) and the scale's folder (chosen rates, report)
[ -d "$root/$runs/runs" ] && $py -m cem_study.records add "$root/$runs/runs"
(cd "$root" && { ls -d "$scale"; [ "$runs" = "$scale" ] || ls -d "$runs/runs.jsonl" "$runs/steps.jsonl"; } 2>/dev/null |
  tar czf "$out/runs.tgz" --exclude='*.lock' --exclude=.lock --exclude="$runs/runs" -T -)
cp "$out/experiment.log" "$out/experiment.log.txt" 2>/dev/null; rm -f "$out/experiment.log"
tail -n 5 "$out/experiment.log.txt"
ls -la "$out"
