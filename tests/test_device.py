"""cem.device and cem.io: device choice, autocast, the machine's name, atomic writes."""

import contextlib
import json

import pytest
import torch

from cem.device import autocast_for, device_name, pick_device
from cem.io import atomic_write_json, atomic_write_text


def test_pick_device():
    assert pick_device("cpu") == torch.device("cpu")
    assert pick_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="unknown device"):
        pick_device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            pick_device("cuda")


def test_autocast_and_name():
    assert isinstance(autocast_for("fp32", torch.device("cpu")), contextlib.nullcontext)
    assert isinstance(autocast_for("bf16", torch.device("cpu")), torch.autocast)
    with pytest.raises(ValueError, match="unknown precision"):
        autocast_for("fp8", torch.device("cpu"))
    assert "thread" in device_name(torch.device("cpu"))


def test_atomic_writes(tmp_path):
    atomic_write_json(tmp_path / "a" / "x.json", {"k": 1})
    assert json.loads((tmp_path / "a" / "x.json").read_text()) == {"k": 1}
    atomic_write_text(tmp_path / "a" / "x.json", "new")
    assert (tmp_path / "a" / "x.json").read_text() == "new"
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["x.json"]  # no temp file left
