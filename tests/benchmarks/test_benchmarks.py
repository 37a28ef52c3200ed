"""Smoke tests of the benchmark scripts: each `main([...])` runs on the CPU at a tiny size, returns a report
whose table has the expected rows and a ratio column with Llama at 1.00, and `--out` writes Markdown."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import attention, common, decode, kernel_tiles, train_memory, train_throughput  # noqa: E402


def num(cell: str) -> float:
    return float(cell.replace(",", ""))


def by(records: list[dict], *keys: str) -> dict:
    return {tuple(r[k] for k in keys) if len(keys) > 1 else r[keys[0]]: r for r in records}


def check_markdown(path: Path, title: str, columns: list[str]) -> str:
    text = path.read_text()
    assert text.startswith(f"# {title}")
    header = text.splitlines()[2]
    assert header.startswith("device: ") and f"torch {torch.__version__}" in header
    assert "| " + " | ".join(columns) + " |" in text
    return text


# ----------------------------------------------------------------------------------------------- common


def test_interleaved_round_robin_rotates_and_survives_failures():
    calls = []

    def make(name):
        return lambda: calls.append(name)

    def broken():
        calls.append("broken")
        raise RuntimeError("CUDA out of memory. Tried to allocate 1 GiB")

    cands = {"a": make("a"), "b": make("b"), "broken": broken, "c": make("c")}
    res = common.interleaved(cands, torch.device("cpu"), repeats=3, warmup=1, progress=False)
    assert res["broken"].error == "out of memory" and res["broken"].median is None
    assert calls == ["a", "b", "broken", "c", "a", "b", "c", "b", "c", "a", "c", "a", "b"]
    for name in "abc":
        assert len(res[name].times) == 3 and res[name].median >= 0


def test_table_ratio_and_report(tmp_path):
    assert common.ratio(3.0, 2.0) == "1.50" and common.ratio(None, 2.0) == "-" and common.ratio(1.0, None) == "-"
    t = common.Table(["name", "ms"])
    t.add("x", "1.00")
    with pytest.raises(ValueError):
        t.add("only one cell")
    report = common.Report("T", torch.device("cpu"), settings={"k": 1}, tables=[("", t)], notes=["n"])
    text = report.emit(tmp_path / "sub" / "r.md")
    assert (tmp_path / "sub" / "r.md").read_text() == text
    assert "| name | ms |\n|---|---:|\n| x | 1.00 |" in text
    assert common.cpu_model() in text and "Settings: k 1." in text


# ----------------------------------------------------------------------------------------------- attention


@pytest.mark.slow
def test_attention_smoke(tmp_path, capsys, monkeypatch):
    out = tmp_path / "attention.md"
    args = ["--device", "cpu", "--dim", "64", "--heads", "4", "--seqs", "32", "--batch", "2", "--repeats", "2", "--warmup", "1"]
    measured = []  # the timings themselves: a ratio printed with two decimals reads 0.00 under load

    def bench_seq(*a, **kw):
        rows = real_bench_seq(*a, **kw)
        measured.extend(rows)
        return rows

    real_bench_seq = attention.bench_seq
    monkeypatch.setattr(attention, "bench_seq", bench_seq)
    report = attention.main([*args, "--out", str(out)])
    rows = report.table.records()
    variants = {r["variant"] for r in rows}
    assert variants == {"Llama", "CEM T=1 kq=none", "CEM T=1 kq=shared", "CEM T=2 kq=none", "CEM T=2 kq=shared"}
    cells = by(rows, "variant", "backend")
    llama = cells["Llama", "sdpa"]
    assert llama["fwd ×Llama"] == "1.00" and llama["fwd+bwd ×Llama"] == "1.00"
    assert llama["peak MiB"] == "-" and llama["mem ×Llama"] == "-"  # no memory figure on the CPU
    for v in variants - {"Llama"}:
        for backend in ("eager", "sdpa"):
            row = cells[v, backend]
            assert num(row["fwd ms"]) >= 0 and num(row["fwd+bwd ms"]) >= 0, row
            assert num(row["fwd ×Llama"]) >= 0 and num(row["fwd+bwd ×Llama"]) >= 0, row
            assert row["note"] == "", row
        flex = cells[v, "flex"]
        assert num(flex["fwd ms"]) > 0 and flex["fwd+bwd ms"] == "-" and "forward-only" in flex["note"]
    assert ("CEM T=1 kq=none", "triton") not in cells  # CUDA only
    timed = {(r["spec"].variant, r["spec"].backend): r for r in measured}
    for key, r in timed.items():
        if key[1] != "flex":
            assert r["fwd"] > 0 and r["bwd"] > 0, key
            assert r["fwd"] / timed["Llama", "sdpa"]["fwd"] > 0 and r["bwd"] / timed["Llama", "sdpa"]["bwd"] > 0, key
    printed = capsys.readouterr().out
    assert "| Llama | sdpa | 32 | 2 |" in printed
    check_markdown(out, "Attention layer", attention.COLUMNS)


def test_attention_failures_are_notes_not_a_crash(monkeypatch):
    class FailingEager(attention.CEMAttention):
        def forward(self, h, cache=None):
            if self.backend == "eager":
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")
            return super().forward(h, cache)

    monkeypatch.setattr(attention, "CEMAttention", FailingEager)
    report = attention.main(["--device", "cpu", "--dim", "32", "--heads", "2", "--seqs", "16", "--repeats", "1", "--warmup", "0",
                             "--cem-steps", "1", "--kq-diag", "none", "--backends", "eager", "sdpa", "triton"])  # fmt: skip
    rows = by(report.table.records(), "variant", "backend")
    assert set(rows) == {("Llama", "sdpa"), ("CEM T=1 kq=none", "eager"), ("CEM T=1 kq=none", "sdpa"), ("CEM T=1 kq=none", "triton")}
    eager = rows["CEM T=1 kq=none", "eager"]
    assert eager["fwd ms"] == "-" and eager["fwd+bwd ×Llama"] == "-"
    assert eager["note"] == "fwd: out of memory; fwd+bwd: out of memory"
    triton = rows["CEM T=1 kq=none", "triton"]  # CUDA only: skipped with a note
    assert triton["fwd ms"] == "-" and triton["fwd ×Llama"] == "-" and "CUDA" in triton["note"]
    sdpa = rows["CEM T=1 kq=none", "sdpa"]
    assert num(sdpa["fwd ×Llama"]) > 0 and num(sdpa["fwd+bwd ×Llama"]) > 0 and sdpa["note"] == ""
    assert rows["Llama", "sdpa"]["fwd ×Llama"] == "1.00"


# ----------------------------------------------------------------------------------------------- training


@pytest.mark.slow
def test_train_throughput_smoke(tmp_path):
    out = tmp_path / "train.md"
    report = train_throughput.main(
        ["--device", "cpu", "--presets", "tiny", "--steps", "2", "--warmup", "1", "--seq-len", "32", "--batch", "2", "--out", str(out),
         "--compile", "off", "--profile"]  # fmt: skip
    )
    rows = by(report.table.records(), "model")
    assert list(rows) == ["Llama", "Llama (HF LlamaForCausalLM)", "CEM T=1", "CEM T=2", "cem-t2"]
    assert rows["Llama"]["tok/s ×Llama [min-max]"] == "1.00 [1.00-1.00]"
    assert rows["Llama (HF LlamaForCausalLM)"]["params M"] == rows["Llama"]["params M"]  # same shape
    for name, r in rows.items():
        assert r["preset"] == "tiny" and r["seq"] == "32" and r["batch"] == "2"
        assert num(r["tokens/s"]) > 0 and 0 < num(r["MFU %"]) and num(r["tok/s ×Llama [min-max]"].split()[0]) > 0, r
        assert r["note"] == "", r
    assert num(rows["CEM T=2"]["GFLOP/token"]) > num(rows["CEM T=1"]["GFLOP/token"])
    text = check_markdown(out, "Training throughput", train_throughput.COLUMNS)
    assert "measured peak (fp32 matmul)" in text and "## Profile: tiny cem-t2" in text and "self ms" in text


def test_train_throughput_models_picks_the_cem_rows_and_keeps_llama():
    report = train_throughput.main(
        ["--device", "cpu", "--presets", "tiny", "--steps", "1", "--warmup", "0", "--seq-len", "16", "--batch", "1",
         "--compile", "off", "--no-hf", "--models", "CEM T=2"]  # fmt: skip
    )
    assert [r["model"] for r in report.table.records()] == ["Llama", "CEM T=2"]
    with pytest.raises(SystemExit):
        train_throughput.main(["--device", "cpu", "--models", "CEM T=3"])


@pytest.mark.slow
@pytest.mark.skipif(not kernel_tiles.HAS_TRITON, reason="needs triton (its interpreter on the CPU)")
def test_kernel_tiles_smoke(tmp_path, monkeypatch):
    """Every candidate is checked against float64 before it is timed; a config that fails to launch is a
    note, and the walk goes on to the next."""
    real = kernel_tiles.triton_cem_attention

    def flaky(*a, config=None, **kw):
        if config is not None and config.heads_per_program == 2:
            raise RuntimeError("out of resource: shared memory")
        return real(*a, config=config, **kw)

    monkeypatch.setattr(kernel_tiles, "triton_cem_attention", flaky)
    out = tmp_path / "tiles.md"
    report = kernel_tiles.main(["--device", "cpu", "--seq", "20", "--diag", "shared", "none", "--out", str(out)])
    rows = report.table.records()
    assert [r["diag"] for r in rows] == ["shared"] * 3 + ["none"] * 3
    for r in rows:
        if "(16, 16, 2, 4, 1)" in r["config (m, n, G, warps, stages)"]:
            assert r["fwd ms"] == "-" and "out of resource" in r["note"]
        else:
            assert r["note"] == "" and float(r["max rel err"]) < 1e-4 and float(r["fwd+bwd ms"]) > float(r["fwd ms"]) > 0
    assert rows[0]["fwd ×default"] == "1.00" and "scores" in rows[0]["config (m, n, G, warps, stages)"]
    check_markdown(out, "Fused CEM attention kernel: tile sizes", kernel_tiles.COLUMNS)


@pytest.mark.slow
def test_train_memory_smoke(tmp_path):
    """Each cell in its own process: activation memory grows with T without checkpointing, and either
    checkpointing mode keeps less of it; static memory does not depend on the mode."""
    out = tmp_path / "memory.md"
    report = train_memory.main(["--device", "cpu", "--preset", "small", "--seq", "256", "--batch", "4", "--depths", "1", "3",
                                "--repeats", "1", "--out", str(out)])  # fmt: skip
    rows = by(report.table.records(), "T", "checkpointing")
    assert list(rows) == [(t, m) for t in ("1", "3") for m in ("none", "layer", "step")]
    for r in rows.values():
        assert r["note"] == "" and num(r["peak MiB"]) >= num(r["static MiB"]) and num(r["step ms"]) > 0, r
    act = {key: num(r["activations MiB"]) for key, r in rows.items()}
    assert act[("3", "none")] > 1.5 * act[("1", "none")]
    assert act[("3", "layer")] < 0.5 * act[("3", "none")] and act[("3", "step")] < 0.5 * act[("3", "none")]
    assert rows[("1", "none")]["act. ×(T=1, none)"] == "1.00"
    check_markdown(out, "Training memory", train_memory.COLUMNS)


def test_paired_ratios():
    t, ref = common.Timing([2.0, 4.0, 3.0]), common.Timing([1.0, 1.0, 3.0])
    assert common.paired(t, ref) == (2.0, 1.0, 4.0)
    assert common.paired(t, ref, invert=True) == (0.5, 0.25, 1.0)
    assert common.fmt_paired(common.paired(t, ref)) == "2.00 [1.00-4.00]" and common.paired(None, ref) is None


# ----------------------------------------------------------------------------------------------- decoding


def test_decode_smoke(tmp_path):
    out = tmp_path / "decode.md"
    report = decode.main(["--device", "cpu", "--preset", "tiny", "--contexts", "64", "--steps", "3", "--warmup", "1", "--out", str(out)])
    rows = by(report.table.records(), "model")
    assert list(rows) == ["Llama", "CEM kq=none", "CEM kq=shared", "CEM kq=per_head", "CEM T=2 kq=shared", "cem-t2"]
    tiny = decode.model_config("tiny")
    assert num(rows["Llama"]["cache B/token"]) == 2 * tiny.dim * tiny.n_layers * 4  # keys and values, fp32
    assert rows["Llama"]["mem ×Llama"] == "1.00" and rows["Llama"]["tok/s ×Llama [min-max]"] == "1.00 [1.00-1.00]"
    for name, r in rows.items():
        assert name == "Llama" or r["mem ×Llama"] == "0.50"  # keys only, with or without a diagonal
        assert r["context"] == "64" and num(r["tokens/s"]) > 0 and num(r["tok/s ×Llama [min-max]"].split()[0]) > 0, r
        assert r["note"] == "", r
    check_markdown(out, "Decoding with the cache", decode.COLUMNS)


def test_tiled_cache_has_the_prefilled_shape_and_repeats_the_chunk():
    """`--fill tile`: one chunk prefilled, repeated up to the context; the same buffers, lengths and bytes as a
    full prefill, and a decode step runs on it."""
    import torch

    for arch, kw in (("llama", {}), ("cem", {"kq_diag": "shared"}), ("cem", {"kq_diag": "none"})):
        torch.manual_seed(0)
        model = decode.LanguageModel(decode.model_config("tiny", arch, **kw)).eval()
        prompt = torch.randint(0, 64, (2, 40))
        full = decode.prefill(model, prompt, 48, 40)
        tiled = decode.prefill(model, prompt[:, :16], 48, 16)
        decode.tile_cache(tiled, 40)
        assert tiled.length == full.length == 40 and tiled.bytes_per_token() == full.bytes_per_token()
        for name, slot in full._slots.items():
            other = tiled._slots[name]
            assert other.buffers.keys() == slot.buffers.keys()
            for key, buf in other.buffers.items():
                assert buf.shape == slot.buffers[key].shape
                assert torch.equal(buf[..., 16:32, :], buf[..., :16, :]) and torch.equal(buf[..., 32:40, :], buf[..., :8, :])
        decode.decode_step(model, torch.randint(0, 64, (2, 1)), tiled)()
        assert tiled.length == 41


@pytest.mark.slow
def test_decode_dtypes_modes_best_against_best_and_split(tmp_path):
    """Several dtypes and modes in one run: each row against Llama at its own dtype and mode, the second table
    each model at its fastest setting against Llama's fastest, both paired per round; --split fills its columns."""
    report = decode.main(["--device", "cpu", "--preset", "tiny", "--contexts", "48", "--steps", "2", "--warmup", "1", "--dtype", "fp32", "bf16",
                          "--modes", "eager", "static", "--models", "CEM kq=shared", "--split", "--fill", "tile", "--prefill-chunk", "16"])
    rows = by(report.table.records(), "model", "dtype", "mode")
    assert len(rows) == 8 and all(r["note"] == "" for r in rows.values())
    for (name, dt, mode), r in rows.items():
        assert name != "Llama" or r["tok/s ×Llama [min-max]"] == "1.00 [1.00-1.00]"
        assert r["mem ×Llama"] == ("1.00" if name == "Llama" else "0.50")
        assert num(r["cache pass ms"]) + num(r["rest ms"]) == pytest.approx(num(r["ms/token"]), abs=0.15)
    best = by(report.tables[1][1].records(), "model")
    assert list(best) == ["Llama", "CEM kq=shared"] and best["Llama"]["tok/s ×Llama best [min-max]"] == "1.00 [1.00-1.00]"
    fastest = min((k for k in rows if k[0] == "CEM kq=shared"), key=lambda k: num(rows[k]["ms/token"]))
    assert best["CEM kq=shared"]["best setting"] == " ".join(fastest[1:])


def test_static_tiled_cache_advances_to_the_context():
    torch.manual_seed(0)
    model = decode.LanguageModel(decode.model_config("tiny", "cem")).eval()
    cache = decode.prefill(model, torch.randint(0, 64, (1, 16)), 48, 8, static=True)
    decode.tile_cache(cache, 40)
    assert cache.length == 40 and int(cache.position) == 40
    decode.decode_step(model, torch.randint(0, 64, (1, 1)), cache, "static")()
    assert cache.length == 40  # a static step writes at the same position every call


@pytest.mark.slow
def test_script_runs_as_a_file(tmp_path):
    out = tmp_path / "decode.md"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(ROOT / "benchmarks" / "decode.py"), "--device", "cpu", "--preset", "tiny", "--contexts", "16",
           "--steps", "2", "--warmup", "0", "--out", str(out)]  # fmt: skip
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "| CEM kq=none | fp32 | eager | 16 | 1 |" in done.stdout and out.is_file()
