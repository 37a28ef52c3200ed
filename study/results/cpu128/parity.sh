#!/usr/bin/env bash
# Before the lanes move to new code: does it train the campaign's models to the same bits as the lanes' code?
#
#   bash study/results/cpu128/parity.sh /tmp/suite/wt128        # the lanes' worktree; this checkout is the new code
#
# 12 steps at the micro preset (WikiText-2 bytes, batch 4 x 64, an evaluation at step 6), eager and compiled, of
# Llama, CEM attention (diag+low-rank, T=2) and cem-t2, with each tree; every logged loss, gradient norm and
# validation loss, and the final losses, must be equal to the bit (a run resumes on whatever code the lanes run).
set -uo pipefail
old=$(cd "${1:?usage: parity.sh LANES_WORKTREE [DATA_DIR]}" && pwd); new=$(cd "$(dirname "$0")/../../.." && pwd)
data=${2:-/work/shared/data}; work=$(mktemp -d /tmp/parity.XXXXXX)
export OMP_NUM_THREADS=1 CEM_CACHE_DIR=$work/cache
status=0
for compile in --no-compile --compile; do
  for arch in "llama" "cem-attn attn_precond=diag_lowrank attn_steps=2" "cem-t2"; do
    name=$(echo "$arch$compile" | tr ' =' '__')
    for side in old new; do
      src=$old/src; [ $side = new ] && src=$new/src
      PYTHONPATH=$src python -m cem.cli train --preset micro --arch ${arch%% *} --data wikitext-2 --data-dir "$data" \
        --max-steps 12 --batch-size 4 --seq-len 64 --out "$work/$side-$name" --no-tensorboard $compile --quiet \
        log_every=1 eval_every=6 final_eval_tokens=4096 $(echo "$arch" | cut -s -d' ' -f2-) > "$work/$side-$name.log" 2>&1 \
        || { echo "$side $name: training failed (log: $work/$side-$name.log)"; status=1; }
    done
    python - "$work/old-$name" "$work/new-$name" "$name" <<'PY' || status=1
import json, sys
from pathlib import Path
old, new, name = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
keys = ("step", "loss", "grad_norm", "valid_loss", "lr")
rows = [[{k: r.get(k) for k in keys} for r in map(json.loads, (d / "metrics.jsonl").read_text().splitlines())] for d in (old, new)]
final = [tuple(json.loads((d / "results.json").read_text())[k] for k in ("valid_loss", "test_loss")) for d in (old, new)]
first = next((a["step"] for a, b in zip(*rows) if a != b), None)
same = first is None and len(rows[0]) == len(rows[1]) and final[0] == final[1]
print(f"{name}: {'equal to the bit' if same else f'DIFFERS (first at step {first}; final {final[0]} vs {final[1]})'}")
sys.exit(0 if same else 1)
PY
  done
done
exit $status
