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


def test_a_cpu_session_is_named_by_the_cpus_family_where_known_or_inferred():
    """One model name covers CPUs that round differently (docs/LOG.md, 2026-11-28): a CPU session is named with its
    family, model and stepping, recorded or (for sessions before that record) inferred; a GPU session by the GPU."""
    zen2, zen4 = "AuthenticAMD family 23 model 49 stepping 0", "AuthenticAMD family 25 model 17 stepping 1"
    cpu = {"processor": "AMD EPYC", "device": "AMD EPYC (1 thread)"}
    assert recorded_processors({"sessions": [{**cpu, "cpu_id": zen2}]}) == [f"AMD EPYC ({zen2})"]
    assert recorded_processors({"sessions": [{**cpu, "processor": f"AMD EPYC ({zen2})", "cpu_id": zen2}]}) == [f"AMD EPYC ({zen2})"]
    gpu = {"processor": "NVIDIA H200", "device": "NVIDIA H200", "cpu_id": zen4}  # the host CPU does not name a GPU run
    assert recorded_processors({"sessions": [gpu]}) == ["NVIDIA H200"]
    inferred = {"processor_inferred": {"processor": f"AMD EPYC ({zen4})", "by": "a check"}}
    assert recorded_processors({**inferred, "sessions": [cpu]}) == [f"AMD EPYC ({zen4})"]
    assert recorded_processors({**inferred, "device": "AMD EPYC (1 thread)"}) == [f"AMD EPYC ({zen4})"]
    # a session that recorded its CPU keeps it: an inference never overrides a record
    assert recorded_processors({**inferred, "sessions": [cpu, {**cpu, "cpu_id": zen2}]}) == [f"AMD EPYC ({zen4})", f"AMD EPYC ({zen2})"]
    assert recorded_processors({"sessions": [cpu]}) == ["AMD EPYC"]  # neither recorded nor inferred: the model name alone


def test_the_cpu_id_tells_apart_cpus_that_share_a_model_name(tmp_path, monkeypatch):
    """A VM names an AMD Zen 2 and a newer EPYC both "AMD EPYC", and their runs differ in the last bits from step
    25 on (docs/LOG.md, 2026-11-28): the family, model and stepping and torch's vector kernels are recorded too."""
    from cem import device

    zen2 = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 23\nmodel\t\t: 49\nmodel name\t: AMD EPYC\nstepping\t: 0\n\n" \
           "processor\t: 1\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: other\n"
    monkeypatch.setattr(device, "CPUINFO", tmp_path / "cpuinfo")
    (tmp_path / "cpuinfo").write_text(zen2)
    assert device.cpu_model() == "AMD EPYC" and device.cpu_id() == "AuthenticAMD family 23 model 49 stepping 0"
    p = provenance()
    assert p["processor"] == "AMD EPYC (AuthenticAMD family 23 model 49 stepping 0)" and p["cpu_id"] == "AuthenticAMD family 23 model 49 stepping 0"
    assert p["cpu_capability"] == torch.backends.cpu.get_cpu_capability() and type(p["cpu_capability"]) is str
    (tmp_path / "cpuinfo").write_text("processor\t: 0\nmodel name\t: Some ARM core\n")
    assert device.cpu_id() is None and device.cpu_model() == "Some ARM core" == provenance()["processor"]
    (tmp_path / "cpuinfo").unlink()
    assert device.cpu_id() is None and device.cpu_model()  # platform's answer
