"""Provenance: what produced a run (commit, torch, processor), in plain types that a checkpoint can hold."""

import io
import re
import subprocess
from pathlib import Path

import torch

from cem.provenance import code_version, provenance, recorded_processors


def test_provenance_names_the_commit_torch_and_processor():
    p = provenance()
    assert p["torch"] == torch.__version__ and type(p["torch"]) is str  # not TorchVersion: weights_only must load it
    assert p["processor"] and p["threads"] == torch.get_num_threads()
    src = Path(__file__).resolve().parents[1] / "src" / "cem"
    head = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:  # a git checkout (CI's clean clone is one)
        assert p["commit"] == head.stdout.strip() and isinstance(p["dirty"], bool)
    buf = io.BytesIO()
    torch.save({"sessions": [p]}, buf)
    buf.seek(0)
    assert torch.load(buf, weights_only=True)["sessions"][0] == p  # a checkpoint's trainer state can carry it


def test_outside_a_git_checkout_the_version_stands_alone(tmp_path):
    out = code_version(str(tmp_path))
    assert out["commit"] is None and out["dirty"] is None and re.fullmatch(r"\d+\.\d+\.\d+.*", out["version"])


def test_recorded_processors_from_sessions_or_an_older_runs_device():
    assert recorded_processors({"device": "AMD EPYC (1 thread)"}) == ["AMD EPYC"]
    assert recorded_processors({"device": "Intel(R) Xeon(R) Processor (2 threads)"}) == ["Intel(R) Xeon(R) Processor"]
    assert recorded_processors({"device": "NVIDIA H100 80GB HBM3"}) == ["NVIDIA H100 80GB HBM3"]
    sessions = [{"processor": "AMD EPYC"}, {"processor": "Intel Xeon"}, {"processor": "AMD EPYC"}]
    assert recorded_processors({"device": "AMD EPYC (1 thread)", "sessions": sessions}) == ["AMD EPYC", "Intel Xeon"]
    assert recorded_processors({}) == []
