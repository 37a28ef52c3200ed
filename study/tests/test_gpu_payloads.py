"""The payloads for a lent GPU machine (study/results/*/gpu.sh): their DRY=1 rehearsal on the CPU takes the call's
path (the same scale, experiments and analysis, every run 3 steps) and brings back what a GPU call would."""

import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_gpu8_payload_rehearses_its_call_and_brings_back_its_campaign(corpus, tmp_path):
    """gpu8/gpu.sh DRY=1: its twelve runs finish, the plan with the call's estimated time is in env.txt, and runs.tgz
    holds the scale's folder (report, fig4-alibi analysed with its regime check, the run tables), no run folder."""
    data = tmp_path / "data" / "wikitext-2"
    data.mkdir(parents=True)
    for split in ("train", "valid", "test"):
        (data / f"{split}.txt").write_text((corpus / f"{split}.txt").read_text())
    out = tmp_path / "out"
    env = {**os.environ, "DRY": "1", "DATA": str(tmp_path / "data"), "CEM_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run(["bash", str(ROOT / "study" / "results" / "gpu8" / "gpu.sh"), str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out / "summary.txt").read_text().startswith("12 runs finished"), done.stdout[-3000:]
    assert "scale=gpu8 (rehearsal)" in (env_txt := (out / "env.txt").read_text())
    assert "fig4-alibi           0        12" in env_txt and "one call on the GPU of h200/cpu/runs, its 12 runs together: about" in env_txt
    with tarfile.open(out / "runs.tgz") as tar:
        names = tar.getnames()
        summary = json.load(tar.extractfile("gpu8/fig4-alibi/summary.json"))
        rows = tar.extractfile("gpu8/runs.jsonl").read().decode().splitlines()
    assert {"gpu8/report.md", "gpu8/steps.jsonl"} <= set(names) and not [n for n in names if n.startswith("gpu8/runs/")]
    assert len(rows) == 12 and summary["regime"]["cpu128-l8"]["window"] == 32  # the rehearsal's windows
    # its n-grams fit on the 3 x 4 x 32 tokens its runs saw, not on the whole split (minutes at the real corpus)
    assert {g["train_tokens"] for g in summary["regime"]["cpu128-l8"]["ngrams"]} == {384}
    assert "(regime) cpu128-l8: the Llama-ALiBi baseline" in json.dumps(summary)
