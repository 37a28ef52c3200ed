"""benchmarks/gpu_issue37.sh --dry-run: every section of the GPU script runs on the CPU at tiny shapes and
writes its report, beside env.txt (machine, commit, settings) and one exit status per section."""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ["train", "attention", "decode_b1", "decode_b2", "memory", "plan"]


@pytest.mark.slow
def test_gpu_script_dry_run_runs_every_section(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_issue37.sh"), str(tmp_path), "--dry-run"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    status = (tmp_path / "status.txt").read_text().splitlines()
    assert status == [f"{name}: exit 0" for name in SECTIONS], (status, done.stdout[-3000:])
    env_txt = (tmp_path / "env.txt").read_text()
    assert "commit: " in env_txt and "settings: " in env_txt and "torch" in env_txt
    for report in ("train_throughput.md", "attention.md", "decode_b1.md", "decode_b2.md", "train_memory.md"):
        assert (tmp_path / report).read_text().startswith("# "), report
    assert "## Best against best" in (tmp_path / "decode_b2.md").read_text()
    assert "cem-t2 T=4" in (tmp_path / "plan.log").read_text()
