"""Smoke test of benchmarks/prepare_memory.py at a tiny size: both corpora prepared, peaks measured, files removed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import prepare_memory  # noqa: E402


@pytest.mark.slow
def test_prepare_memory_smoke(tmp_path, monkeypatch):
    monkeypatch.setattr(prepare_memory, "BLOCK_BYTES", 200_000)
    report = prepare_memory.main(["--dir", str(tmp_path), "--gb", "0.002", "--files", "300", "--file-kb", "2",
                                  "--workers", "1", "--out", str(tmp_path / "r.md")])
    rows = {r["corpus"]: r for r in report.table.records()}
    assert rows["one file"]["files"] == "1" and rows["many files"]["files"] == "300"
    for row in rows.values():
        assert all(int(row[f"{s} tokens"].replace(",", "")) > 0 for s in ("train", "valid", "test"))
        assert 50 < float(row["main peak MiB"]) < 2000 and 10 < float(row["worker peak MiB"]) < 2000
    assert (tmp_path / "r.md").read_text().startswith("# Memory of cem data prepare")
    assert [p.name for p in tmp_path.iterdir()] == ["r.md"]  # the corpora and shards are removed
