"""The `cem` command line (`cem.cli`): train, eval, generate and info end to end, default run folders, and
bad inputs, tried as an attacker and a careless user would (issue 12): each case of the table runs the
CLI's `main()` in-process and must end with a non-zero exit code and exactly one line on stderr, never a
traceback.

Cases are a table: the arguments (with {corpus}, {run}, {out}, {tmp} filled in), an optional setup that
writes bad files or injects a failure, and a piece of text the one line must contain."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import time
import types
from pathlib import Path

import pytest
import torch

from cem.cli import _run_config, build_parser, main
from cem.training.rundir import default_run_dir

TRAIN = ["train", "--data", "{corpus}", "--preset", "tiny", "--batch-size", "2", "--quiet", "--out", "{out}", "context=32", "tensorboard=false"]
STEP = ["--max-steps", "1"]
RESUME = [*TRAIN, *STEP, "--arch", "cem", "--out", "{tmp}/run2", "--resume"]  # the trained run's settings


def write(rel, content):
    def setup(tmp, run, monkeypatch):
        path = tmp / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())

    return setup


def damaged_run(rel, content):
    """The trained run, copied to {tmp}/run2 with one file replaced and made unfinished (no results.json),
    so that `--resume` has to read its checkpoint (a finished run has nothing to resume)."""

    def setup(tmp, run, monkeypatch):
        shutil.copytree(run, tmp / "run2")
        (tmp / "run2" / "results.json").unlink(missing_ok=True)
        (tmp / "run2" / rel).write_bytes(content if isinstance(content, bytes) else content.encode())

    return setup


def unfinished_copy(tmp, run, monkeypatch):
    """The trained run copied to {tmp}/run2 without its results (a finished run run again is no error)."""
    shutil.copytree(run, tmp / "run2")
    (tmp / "run2" / "results.json").unlink()


def parquet_ints(tmp, run, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": list(range(50))}), tmp / "ints.parquet")


def patch(target, exc_factory):
    def setup(tmp, run, monkeypatch):
        def boom(*a, **kw):
            raise exc_factory()

        monkeypatch.setattr(target, boom)

    return setup


class SimulatedCtrlC(KeyboardInterrupt):
    """A Ctrl-C a case injects: one that escapes `main` fails the case (not the whole session)."""


def sigterm_while_tokenising(tmp, run, monkeypatch):
    def build_split(*a, **kw):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)

    monkeypatch.setattr("cem.training.trainer.build_split", build_split)


def disk_full_in_checkpoint(tmp, run, monkeypatch):
    from cem.training import checkpoint

    def op(name, fn, *a, **kw):
        if name == "torch.save":
            raise RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed")
        return fn(*a, **kw)

    monkeypatch.setattr(checkpoint, "_op", op)
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9, 0))


def hold_lock(tmp, run, monkeypatch):
    from cem.training import RunDir

    lock = RunDir(tmp / "run2").lock()
    shutil.copytree(run, tmp / "run2")
    lock.__enter__()
    monkeypatch.setattr("cem.training.rundir._held_for_test", lock, raising=False)


def bpe_tokenizer_in_run(tmp, run, monkeypatch):
    from cem.data import get_tokenizer, load_corpus

    shutil.copytree(run, tmp / "run2")
    shutil.rmtree(tmp / "run2" / "tokenizer")
    get_tokenizer("bpe:300", load_corpus(str(run.parent / "corpus")), cache_dir=tmp / "bpe").save(tmp / "run2" / "tokenizer")


def malicious_state(tmp, run, monkeypatch):
    from cem.io import sha256_file as _sha256
    from cem.training.checkpoint import MANIFEST

    class Evil:
        def __reduce__(self):
            return (open, (str(tmp / "pwned"), "w"))

    shutil.copytree(run, tmp / "run2")
    (tmp / "run2" / "results.json").unlink()
    state = tmp / "run2" / "ckpt" / "trainer_state.pt"
    torch.save({"step": 1, "x": Evil()}, state)
    manifest = json.loads((tmp / "run2" / "ckpt" / MANIFEST).read_text())
    manifest["files"]["trainer_state.pt"] = {"bytes": state.stat().st_size, "sha256": _sha256(state)}
    (tmp / "run2" / "ckpt" / MANIFEST).write_text(json.dumps(manifest))


def linked(rel, target="victim"):
    """The trained run copied to {tmp}/run2, unfinished, with `rel` a symbolic link to {tmp}/victim (a file
    holding "keep", or an empty folder when `target` is "victim/")."""

    def setup(tmp, run, monkeypatch):
        unfinished_copy(tmp, run, monkeypatch)
        if target.endswith("/"):
            (tmp / target).mkdir()
        else:
            (tmp / target).write_text("keep")
        path = tmp / "run2" / rel
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
        path.symlink_to(tmp / target)

    return setup


def planted(rel):
    """A symbolic link {tmp}/x/rel to {tmp}/victim, a file holding "keep"."""

    def setup(tmp, run, monkeypatch):
        (tmp / "victim").write_text("keep")
        (tmp / "x").mkdir()
        (tmp / "x" / rel).symlink_to(tmp / "victim")

    return setup


def resigned(edit):
    """The trained run copied to {tmp}/run2 (unfinished), its checkpoint edited by `edit(ckpt)` and the
    manifest re-signed to match: checksums cannot catch it, the loader's own checks must."""

    def setup(tmp, run, monkeypatch):
        from cem.io import sha256_file as _sha256
        from cem.training.checkpoint import MANIFEST

        unfinished_copy(tmp, run, monkeypatch)
        ckpt = tmp / "run2" / "ckpt"
        edit(ckpt)
        manifest = json.loads((ckpt / MANIFEST).read_text())
        manifest["files"] = {p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p)} for p in ckpt.iterdir() if p.name != MANIFEST}
        manifest["step"] = torch.load(ckpt / "trainer_state.pt", weights_only=False)["step"]
        (ckpt / MANIFEST).write_text(json.dumps(manifest))

    return setup


def edited_state(drop=(), **changes):
    """An edit for `resigned`: the trainer state with `changes` made and the keys in `drop` removed."""

    def edit(ckpt):
        state = torch.load(ckpt / "trainer_state.pt", weights_only=False)
        torch.save({k: v for k, v in {**state, **changes}.items() if k not in drop}, ckpt / "trainer_state.pt")

    return edit


negative_step = edited_state(step=-5)


def int_weights(ckpt):
    from safetensors.torch import load_file, save_file

    weights = load_file(ckpt / "model.safetensors")
    save_file({k: v.to(torch.int32) for k, v in weights.items()}, ckpt / "model.safetensors")


def no_tokenizer(tmp, run, monkeypatch):
    unfinished_copy(tmp, run, monkeypatch)
    shutil.rmtree(tmp / "run2" / "tokenizer")


def lost_manifest(tmp, run, monkeypatch):
    unfinished_copy(tmp, run, monkeypatch)
    (tmp / "run2" / "ckpt" / "manifest.json").unlink()


def edited(rel, edit, finished=False):
    """The trained run copied to {tmp}/run2 (unfinished, unless `finished`), its JSON record `rel` edited by `edit(record)`."""

    def setup(tmp, run, monkeypatch):
        shutil.copytree(run, tmp / "run2")
        if not finished:
            (tmp / "run2" / "results.json").unlink()
        path = tmp / "run2" / rel
        record = json.loads(path.read_text())
        edit(record)
        path.write_text(json.dumps(record))

    return setup


def recorded(edit):
    """The trained run copied to {tmp}/run2 (unfinished), its run.json's record edited by `edit(record)`."""
    return edited("run.json", edit)


def resulted(**changes):
    """The trained run copied to {tmp}/run2, finished, its results.json with `changes` made (None: the key removed)."""
    return edited("results.json", lambda r: [r.pop(k) if v is None else r.update({k: v}) for k, v in changes.items()], finished=True)


def manifested(edit):
    """The trained run copied to {tmp}/run2 (unfinished), its checkpoint's manifest.json edited by `edit(manifest)`."""
    return edited("ckpt/manifest.json", edit)


def first_file(manifest):
    """The first entry of a checkpoint manifest's file table."""
    return next(iter(manifest["files"].values()))


def shard_resume(text):
    """Unfinished token shards of {tmp}/c.txt in {tmp}/sh with `text` as their resume.json."""

    def setup(tmp, run, monkeypatch):
        shards(lambda m: m.update(complete=False))(tmp, run, monkeypatch)
        (tmp / "sh" / "resume.json").write_text(text)

    return setup


def llama_record(record):
    """run.json of the same run as a Llama (its config and identity agree; the checkpoint is CEM's)."""
    from cem.training import RunConfig

    record["config"]["train"]["arch"] = record["train"]["arch"] = "llama"
    record["model"] = RunConfig.from_dict(record["config"]).model(record["model"]["vocab_size"]).to_dict()


def no_checkpoint(tmp, run, monkeypatch):
    unfinished_copy(tmp, run, monkeypatch)
    shutil.rmtree(tmp / "run2" / "ckpt")


def hf_tokenizer(config):
    """A tokenizer.json in {tmp}/tok with `config` as its tokenizer_config.json."""

    def setup(tmp, run, monkeypatch):
        import tokenizers

        (tmp / "tok").mkdir()
        model = tokenizers.models.WordLevel({"<|endoftext|>": 0, "a": 1}, unk_token="<|endoftext|>")
        tokenizers.Tokenizer(model).save(str(tmp / "tok" / "tokenizer.json"))
        (tmp / "tok" / "tokenizer_config.json").write_text(config)
        (tmp / "c.txt").write_text("hello world\n" * 100)

    return setup


def shards(edit=None, text=None):
    """Token shards of {tmp}/c.txt in {tmp}/sh (byte tokenizer), their manifest edited by `edit(manifest)`
    or replaced by `text`."""

    def setup(tmp, run, monkeypatch):
        from cem.data.tokenshards import prepare_shards

        (tmp / "c.txt").write_text("hello world\n" * 100)
        prepare_shards(str(tmp / "c.txt"), "byte", tmp / "sh", tokens=100, workers=0, progress=False)
        manifest = json.loads((tmp / "sh" / "manifest.json").read_text())
        if edit is not None:
            edit(manifest)
        (tmp / "sh" / "manifest.json").write_text(text if text is not None else json.dumps(manifest))

    return setup


def altered_shard(tmp, run, monkeypatch):
    shards()(tmp, run, monkeypatch)
    shard = tmp / "sh" / "train-00000.bin"
    shard.write_bytes(bytes(len(shard.read_bytes())))


def file_size_limit_in_checkpoint(tmp, run, monkeypatch):
    """`ulimit -f` of 1 MB reached by torch.save (which says only "file write failed"), after the weights (0.4 MB)."""
    from cem.training import checkpoint

    def op(name, fn, *a, **kw):
        if name == "torch.save":
            Path(a[1]).write_bytes(bytes(10**6))
            raise RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed")
        return fn(*a, **kw)

    monkeypatch.setattr(checkpoint, "_op", op)
    monkeypatch.setattr(checkpoint.resource, "getrlimit", lambda which: (10**6, 10**6))


def offline(tmp, run, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


CASES = [
    # -- training settings: refused at parse time, naming the setting
    ("grad_clip negative", [*TRAIN, *STEP, "grad_clip=-1"], None, "grad_clip"),
    ("grad_clip zero", [*TRAIN, *STEP, "grad_clip=0"], None, "grad_clip"),
    ("grad_accum zero", [*TRAIN, *STEP, "--grad-accum", "0"], None, "grad_accum"),
    ("max_steps zero", [*TRAIN, "--max-steps", "0"], None, "max_steps"),
    ("max_steps negative", [*TRAIN, "--max-steps", "-5"], None, "max_steps"),
    ("final_lr_frac negative", [*TRAIN, *STEP, "final_lr_frac=-3"], None, "final_lr_frac"),
    ("warmup_frac negative", [*TRAIN, *STEP, "warmup_frac=-5"], None, "warmup_frac"),
    ("warmup_frac one", [*TRAIN, *STEP, "warmup_frac=1"], None, "warmup_frac"),
    ("seq_len zero", [*TRAIN, *STEP, "--seq-len", "0"], None, "seq_len"),
    ("stop_at negative", [*TRAIN, *STEP, "--stop-at", "-1"], None, "--stop-at"),
    ("max_steps and tokens", [*TRAIN, "--max-steps", "3", "--tokens", "1e5"], None, "not both"),
    ("parallel zero3", [*TRAIN, *STEP, "parallel=zero3"], None, "parallel"),
    ("tokens inf", [*TRAIN, "--tokens", "inf"], None, "tokens"),
    ("tokens nan", [*TRAIN, "--tokens", "nan"], None, "tokens"),
    ("tokens words", [*TRAIN, "--tokens", "lots"], None, "tokens"),
    ("tokens zero", [*TRAIN, "--tokens", "0"], None, "tokens"),
    ("batch size 1e8 option", [*TRAIN, *STEP, "--batch-size", "1e8"], None, "--batch-size"),
    ("batch size 1e8 setting", [*TRAIN, *STEP, "batch_size=1e8"], None, "batch_size"),
    ("batch size zero", [*TRAIN, *STEP, "--batch-size", "0"], None, "batch_size"),
    ("lr nan", [*TRAIN, *STEP, "--lr", "nan"], None, "lr"),
    ("lr negative", [*TRAIN, *STEP, "--lr", "-1"], None, "lr"),
    ("lr inf", [*TRAIN, *STEP, "lr=inf"], None, "lr"),
    ("beta1 one", [*TRAIN, *STEP, "beta1=1"], None, "beta1"),
    ("beta2 negative", [*TRAIN, *STEP, "beta2=-0.5"], None, "beta2"),
    ("eps zero", [*TRAIN, *STEP, "eps=0"], None, "eps"),
    ("weight_decay negative", [*TRAIN, *STEP, "weight_decay=-0.1"], None, "weight_decay"),
    ("log_every zero", [*TRAIN, *STEP, "log_every=0"], None, "log_every"),
    ("eval_batches zero", [*TRAIN, *STEP, "eval_batches=0"], None, "eval_batches"),
    ("save_every negative", [*TRAIN, *STEP, "save_every=-1"], None, "save_every"),
    ("seed negative", [*TRAIN, *STEP, "--seed", "-1"], None, "seed"),
    ("seed word", [*TRAIN, *STEP, "seed=abc"], None, "seed"),
    ("seed option word", [*TRAIN, *STEP, "--seed", "abc"], None, "--seed"),
    ("seed huge", [*TRAIN, *STEP, "seed=1e30"], None, "seed"),
    ("precision fp8", [*TRAIN, *STEP, "precision=fp8"], None, "precision"),
    ("diverge_factor half", [*TRAIN, *STEP, "diverge_factor=0.5"], None, "diverge_factor"),
    ("compile maybe", [*TRAIN, *STEP, "compile=maybe"], None, "compile"),
    ("data_encoding unknown", [*TRAIN, *STEP, "data_encoding=klingon"], None, "data_encoding"),
    ("unknown key", [*TRAIN, *STEP, "bogus=1"], None, "bogus"),
    ("unknown scoped key", [*TRAIN, *STEP, "optim.lr=1"], None, "optim.lr"),
    ("override without =", [*TRAIN, *STEP, "--", "lr"], None, None),
    ("unknown option", [*TRAIN, *STEP, "--lrr", "1"], None, "--lrr"),
    # -- model settings
    ("init_std negative", [*TRAIN, *STEP, "init_std=-1"], None, "init_std"),
    ("norm_eps negative", [*TRAIN, *STEP, "norm_eps=-1"], None, "norm_eps"),
    ("attn_step_size nan", [*TRAIN, *STEP, "attn_step_size=nan"], None, "attn_step_size"),
    ("mlp_step_size zero", [*TRAIN, *STEP, "mlp_step_size=0"], None, "mlp_step_size"),
    ("mlp_width_mult inf", [*TRAIN, *STEP, "mlp_width_mult=inf"], None, "mlp_width_mult"),
    ("heads do not divide", [*TRAIN, *STEP, "dim=65"], None, "divisible"),
    ("kq_diag unknown", [*TRAIN, *STEP, "kq_diag=full"], None, "kq_diag"),
    ("attn_steps zero", [*TRAIN, *STEP, "attn_steps=0"], None, "attn_steps"),
    ("attn_steps a billion", [*TRAIN, *STEP, "--arch", "cem", "attn_steps=1000000000"], None, "attn_steps must be at most 256"),
    ("generate steps a billion", ["generate", "--ckpt", "{run}", "--steps", "1000000000", "--max-new-tokens", "2"], None, "steps must be at most 256"),
    ("precond rank zero", [*TRAIN, *STEP, "attn_precond_rank=0"], None, "attn_precond_rank"),
    ("preset unknown", [*TRAIN, *STEP, "--preset", "nope"], None, "preset"),
    ("arch unknown", [*TRAIN, *STEP, "--arch", "nope"], None, "arch"),
    ("triton on the CPU", [*TRAIN, *STEP, "--device", "cpu", "attn_backend=triton"], None, "triton"),
    # -- device
    ("device unknown", [*TRAIN, *STEP, "--device", "tpu9"], None, "device"),
    pytest.param("device cuda without CUDA", [*TRAIN, *STEP, "--device", "cuda"], None, "CUDA",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available")),
    # -- config files
    ("config missing", [*TRAIN, *STEP, "--config", "{tmp}/none.yaml"], None, "none.yaml"),
    ("config invalid YAML", [*TRAIN, *STEP, "--config", "{tmp}/bad.yaml"], write("bad.yaml", "lr: [1\nx: {"), "bad.yaml"),
    ("config python tag", [*TRAIN, *STEP, "--config", "{tmp}/tag.yaml"], write("tag.yaml", "lr: !!python/object/apply:os.system ['touch {tmp}/pwned']\n"), "!!python"),
    ("config a list", [*TRAIN, *STEP, "--config", "{tmp}/list.yaml"], write("list.yaml", "- lr\n- 1\n"), "mapping"),
    ("config not UTF-8", [*TRAIN, *STEP, "--config", "{tmp}/latin.yaml"], write("latin.yaml", b"lr: 1e-3 # caf\xe9\n"), "UTF-8"),
    ("config numeric key", [*TRAIN, *STEP, "--config", "{tmp}/num.yaml"], write("num.yaml", "1: 2\n"), "config keys"),
    ("config bad value", [*TRAIN, *STEP, "--config", "{tmp}/val.yaml"], write("val.yaml", "train:\n  batch_size: [1, 2]\n"), "batch_size"),
    ("config batch_size yes", [*TRAIN, *STEP, "--config", "{tmp}/b.yaml"], write("b.yaml", "batch_size: yes\n"), "batch_size: True is a boolean"),
    ("config lr true", [*TRAIN, *STEP, "--config", "{tmp}/b.yaml"], write("b.yaml", "lr: true\n"), "lr: True is a boolean"),
    ("config seed false", [*TRAIN, *STEP, "--config", "{tmp}/b.yaml"], write("b.yaml", "train:\n  seed: false\n"), "seed: False is a boolean"),
    ("config data null", ["train", "--config", "{tmp}/n.yaml", "--out", "{out}"], write("n.yaml", "data: null\n"), "data: it cannot be null"),
    ("config tokenizer null", [*TRAIN, *STEP, "--config", "{tmp}/n.yaml"], write("n.yaml", "tokenizer: ~\n"), "tokenizer: it cannot be null"),
    ("config device null", [*TRAIN, *STEP, "--config", "{tmp}/n.yaml"], write("n.yaml", "device:\n"), "device: it cannot be null"),
    ("config alias bomb", [*TRAIN, *STEP, "--config", "{tmp}/bomb.yaml"],
     write("bomb.yaml", "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi")) + "lr: *i\n"),
     "aliases (*name) are not allowed"),
    ("config nested deeply", [*TRAIN, *STEP, "--config", "{tmp}/deep.yaml"], write("deep.yaml", "lr: " + "[" * 5000 + "]" * 5000 + "\n"), "nested more than 8 levels"),
    # -- corpora
    ("corpus path missing", [*TRAIN, *STEP, "--data", "{tmp}/none.txt"], None, "none.txt"),
    ("corpus name unknown", [*TRAIN, *STEP, "--data", "no-such-corpus"], None, "no-such-corpus"),
    ("corpus latin-1 text", [*TRAIN, *STEP, "--data", "{tmp}/latin.txt"], write("latin.txt", "caf\xe9 au lait\n".encode("latin-1") * 400), "latin.txt"),
    ("corpus jsonl broken line", [*TRAIN, *STEP, "--data", "{tmp}/c.jsonl"], write("c.jsonl", '{"text": "a"}\n{"text": \n'), "c.jsonl:2"),
    ("corpus jsonl nested deeply", [*TRAIN, *STEP, "--data", "{tmp}/d.jsonl"], write("d.jsonl", '{"text": ' + "[" * 100000 + "]" * 100000 + "}\n"), "d.jsonl:1: a JSON value nested too deeply"),
    ("corpus jsonl no text", [*TRAIN, *STEP, "--data", "{tmp}/n.jsonl"], write("n.jsonl", '{"body": "a"}\n'), "n.jsonl:1"),
    ("corpus parquet integers", [*TRAIN, *STEP, "--data", "{tmp}/ints.parquet"], parquet_ints, "ints.parquet"),
    ("corpus parquet garbage", [*TRAIN, *STEP, "--data", "{tmp}/g.parquet"], write("g.parquet", b"PAR1 not really"), "g.parquet"),
    ("corpus empty txt", [*TRAIN, *STEP, "--data", "{tmp}/empty.txt"], write("empty.txt", ""), "empty.txt"),
    ("corpus unsupported suffix", [*TRAIN, *STEP, "--data", "{tmp}/c.csv"], write("c.csv", "text\nhello\n"), "c.csv"),
    ("corpus hf offline", [*TRAIN, *STEP, "--data", "hf:nobody/no-such-dataset"], offline, "hf:nobody/no-such-dataset"),
    ("corpus too short", [*TRAIN, *STEP, "--data", "{tmp}/short"], lambda t, r, m: [write(f"short/{s}.txt", "tiny")(t, r, m) for s in ("train", "valid", "test")], "fewer than one sequence"),
    # -- tokenizers
    ("tokenizer bpe too small", [*TRAIN, *STEP, "--tokenizer", "bpe:10"], None, "bpe:10"),
    ("tokenizer broken json", [*TRAIN, *STEP, "--tokenizer", "{tmp}/tok/tokenizer.json"], write("tok/tokenizer.json", "{not json"), "tokenizer.json"),
    ("tokenizer broken meta", [*TRAIN, *STEP, "--tokenizer", "{tmp}/meta"], write("meta/cem_tokenizer.json", "[1, 2]"), "cem_tokenizer.json"),
    ("tokenizer meta without file", [*TRAIN, *STEP, "--tokenizer", "{tmp}/meta2"], write("meta2/cem_tokenizer.json", '{"kind": "hf", "name": "x", "eot_id": 3}'), "tokenizer.json"),
    # -- run directories
    ("out is a file", [*TRAIN, *STEP, "--out", "{tmp}/afile"], write("afile", "x"), "afile"),
    ("resume a folder that holds no run (a typo)", [*TRAIN, *STEP, "--out", "{tmp}/nope", "--resume"], None, "nope holds no run"),
    ("resume a folder holding other files", [*TRAIN, *STEP, "--out", "{tmp}/other", "--resume"], write("other/notes.txt", "x"), "other holds no run"),
    ("resume a corrupt trainer state", RESUME, damaged_run("ckpt/trainer_state.pt", b"garbage"), "trainer_state.pt"),
    ("resume a crafted trainer state", RESUME, malicious_state, "not a plain trainer state (only tensors, numbers and containers are read): WeightsUnpickler error: Unsupported global"),
    ("resume a damaged manifest", RESUME, damaged_run("ckpt/manifest.json", "{"), "manifest"),
    ("resume a re-signed negative step", RESUME, resigned(negative_step), "step must be an integer in [0, 1,000,000,000,000,000]"),
    ("resume re-signed int32 weights", RESUME, resigned(int_weights), "not floating point"),
    ("eval re-signed int32 weights", ["eval", "--ckpt", "{tmp}/run2"], resigned(int_weights), "not floating point"),
    ("resume a newer format", RESUME,
     damaged_run("ckpt/manifest.json", '{"format": 7, "step": 1, "files": {}}'), "format version 7"),
    ("resume into a live run", RESUME, hold_lock, "in use by another process"),
    ("run.json corrupted", [*TRAIN, *STEP, "--out", "{tmp}/run2"], damaged_run("run.json", "{"), "run.json"),
    ("other run in --out", [*TRAIN, *STEP, "--out", "{run}", "--seed", "5"], None, "different run"),
    ("same unfinished run without --resume", [*TRAIN, *STEP, "--out", "{tmp}/run2"], unfinished_copy, "--resume"),
    ("a foreign ckpt in --out", [*TRAIN, *STEP, "--out", "{tmp}/x"], write("x/ckpt/precious", "keep"), "holds no cem run"),
    ("a foreign ckpt in --out, --overwrite", [*TRAIN, *STEP, "--out", "{tmp}/x", "--overwrite"], write("x/ckpt/precious", "keep"), "holds no cem run"),
    ("a foreign tokenizer, --overwrite", [*TRAIN, *STEP, "--out", "{tmp}/x", "--overwrite"], write("x/tokenizer/precious", "keep"), "x/tokenizer exists"),
    ("resume a checkpoint without its manifest", RESUME, lost_manifest, "no manifest.json"),
    ("rerun a checkpoint without its manifest", [*TRAIN, *STEP, "--arch", "cem", "--out", "{tmp}/run2"], lost_manifest, "--resume"),
    ("export into the run's checkpoint", ["export", "{tmp}/run2", "{tmp}/run2/ckpt"], unfinished_copy, "of the run being exported"),
    ("export into the run", ["export", "{run}", "{run}"], None, "of the run being exported"),
    # -- symbolic links planted in a shared run folder
    ("resume with .lock linked", RESUME, linked(".lock"), "symbolic link"),
    ("resume with metrics.jsonl linked", RESUME, linked("metrics.jsonl"), "symbolic link"),
    ("train with metrics.csv linked", [*TRAIN, *STEP, "--out", "{tmp}/x"], planted("metrics.csv"), "symbolic link"),
    ("train with .lock linked", [*TRAIN, *STEP, "--out", "{tmp}/x"], planted(".lock"), "symbolic link"),
    ("resume with tokenizer linked", RESUME, linked("tokenizer", "victim/"), "symbolic link"),
    # -- interruptions and a full disk
    ("Ctrl-C while tokenising", [*TRAIN, *STEP], patch("cem.training.trainer.build_split", KeyboardInterrupt), "interrupted"),
    ("SIGTERM while tokenising", [*TRAIN, *STEP], sigterm_while_tokenising, "terminated"),
    ("Ctrl-C in the final evaluation", [*TRAIN, *STEP], patch("cem.training.trainer._finish", KeyboardInterrupt), "interrupted"),
    ("disk full in a checkpoint", [*TRAIN, *STEP], disk_full_in_checkpoint, "no space left"),
    ("disk full writing run.json", [*TRAIN, *STEP], patch("cem.training.rundir.atomic_write_json", lambda: OSError(errno.ENOSPC, "No space left on device", "run.json")), "space"),
    ("divergence", [*TRAIN, "--max-steps", "5", "--lr", "1e3", "warmup_frac=0"], None, "diverged"),
    # -- odd but plausible input (issue 20)
    ("vocab_size unlike the byte tokenizer", [*TRAIN, *STEP, "vocab_size=1000"], None, "vocab_size=1000 does not match"),
    ("a BPE the library cannot train", [*TRAIN, *STEP, "--tokenizer", "bpe:4000000"], None, "at most 1,048,576 symbols"),
    ("a BPE above any vocabulary", [*TRAIN, *STEP, "--tokenizer", "bpe:1000000000"], None, "tokenizer bpe:1000000000: at most 1,048,576 symbols"),
    ("--resume with --overwrite", [*TRAIN, *STEP, "--resume", "--overwrite"], None, "give one of them"),
    ("--data empty", [*TRAIN, *STEP, "--data", ""], None, "data must name something"),
    ("--tokenizer empty", [*TRAIN, *STEP, "--tokenizer", " "], None, "tokenizer must name something"),
    ("activation checkpointing unknown", [*TRAIN, *STEP, "activation_checkpointing=block"], None, "unknown activation_checkpointing 'block'"),
    ("--out empty", [*TRAIN, *STEP, "--out", ""], None, "--out is empty"),
    # -- damaged run files and odd values (issue 20: messages that name the problem)
    ("eval run.json unreadable", ["eval", "--ckpt", "{tmp}/run2"], damaged_run("run.json", "{"), "run.json"),
    ("eval run.json a list", ["eval", "--ckpt", "{tmp}/run2"], damaged_run("run.json", "[1]"), "run.json"),
    ("eval run.json config a string", ["eval", "--ckpt", "{tmp}/run2"], damaged_run("run.json", '{"config": "x"}'), "run.json"),
    ("resume run.json unreadable", RESUME, damaged_run("run.json", "{"), "run.json"),
    ("resume run.json deeply nested", RESUME, damaged_run("run.json", "[" * 100000 + "]" * 100000), "run.json"),
    ("eval tokenizer meta a list", ["eval", "--ckpt", "{tmp}/run2"], damaged_run("tokenizer/cem_tokenizer.json", "[]"), "cem_tokenizer.json"),
    ("eval tokenizer meta of an unknown kind", ["eval", "--ckpt", "{tmp}/run2"], damaged_run("tokenizer/cem_tokenizer.json", '{"kind": "nope"}'), "cem_tokenizer.json"),
    ("train seed negative", [*TRAIN, *STEP, "--seed", "-1"], None, "seed"),
    ("train seed huge", [*TRAIN, *STEP, "--seed", str(2**70)], None, "seed"),
    ("train device unknown", [*TRAIN, *STEP, "--device", "tpu"], None, "device"),
    ("train device index not a number", [*TRAIN, *STEP, "--device", "cuda:x"], None, "device"),
    ("train device empty", [*TRAIN, *STEP, "--device", ""], None, "device"),
    ("generate prompt not UTF-8", ["generate", "--ckpt", "{run}", "--prompt", "\udcff", "--max-new-tokens", "2"], None, "prompt"),
    ("generate seed negative", ["generate", "--ckpt", "{run}", "--seed", "-1", "--max-new-tokens", "2"], None, "seed"),
    ("generate too many tokens", ["generate", "--ckpt", "{run}", "--max-new-tokens", str(10**12)], None, "max_new_tokens"),
    # -- eval
    ("eval missing run", ["eval", "--ckpt", "{tmp}/none"], None, "none"),
    ("eval max_batches zero", ["eval", "--ckpt", "{run}", "--max-batches", "0"], None, "max_batches"),
    ("eval batch size zero", ["eval", "--ckpt", "{run}", "--batch-size", "0"], None, "batch_size"),
    ("eval seq_len zero", ["eval", "--ckpt", "{run}", "--seq-len", "0"], None, "--seq-len"),
    ("eval unknown split", ["eval", "--ckpt", "{run}", "--split", "dev"], None, "--split"),
    ("eval config.json a list", ["eval", "--ckpt", "{tmp}/run2"], damaged_run("ckpt/config.json", "[1, 2]"), "config.json"),
    ("eval broken tokenizer", ["eval", "--ckpt", "{tmp}/run2"], damaged_run("tokenizer/cem_tokenizer.json", "{"), "cem_tokenizer.json"),
    ("eval truncated weights", ["eval", "--ckpt", "{tmp}/run2"], damaged_run("ckpt/model.safetensors", b"\x00" * 10), "model.safetensors"),
    pytest.param("eval on cuda without CUDA", ["eval", "--ckpt", "{run}", "--device", "cuda"], None, "CUDA",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available")),
    # -- generate
    ("generate temperature nan", ["generate", "--ckpt", "{run}", "--temperature", "nan", "--max-new-tokens", "2"], None, "temperature"),
    ("generate temperature negative", ["generate", "--ckpt", "{run}", "--temperature", "-1", "--max-new-tokens", "2"], None, "temperature"),
    ("generate top_p above one", ["generate", "--ckpt", "{run}", "--top-p", "2", "--max-new-tokens", "2"], None, "top_p"),
    ("generate top_k zero", ["generate", "--ckpt", "{run}", "--top-k", "0", "--max-new-tokens", "2"], None, "top_k"),
    ("generate negative tokens", ["generate", "--ckpt", "{run}", "--max-new-tokens", "-1"], None, "max_new_tokens"),
    ("generate adaptive tolerance negative", ["generate", "--ckpt", "{run}", "--adaptive-tol", "-1", "--max-new-tokens", "2"], None, "adaptive_tol"),
    ("generate guard negative", ["generate", "--ckpt", "{run}", "--guard", "-2", "--max-new-tokens", "2"], None, "guard"),
    ("generate steps zero", ["generate", "--ckpt", "{run}", "--steps", "0", "--max-new-tokens", "2"], None, "steps"),
    ("generate vocabulary mismatch", ["generate", "--ckpt", "{tmp}/run2", "--max-new-tokens", "2"], bpe_tokenizer_in_run, "vocabulary mismatch"),
    ("generate from a file", ["generate", "--ckpt", "{tmp}/afile"], write("afile", "x"), "afile is a file, not a run or model directory"),
    # -- others
    ("no command", [], None, "command"),
    ("info unknown preset", ["info", "--preset", "nope"], None, "preset"),
    ("info bad value", ["info", "lr=nan"], None, "lr"),
    ("info memory batch zero", ["info", "--memory", "--batch", "0"], None, "batch"),
    ("info memory vocabulary zero", ["info", "--memory", "--vocab", "0"], None, "--vocab must be an integer >= 1"),
    ("info memory several gpus, no parallelism", ["info", "--memory", "--gpus", "2", "--parallel", "none"], None, "parallel"),
    ("info memory zero gpus", ["info", "--memory", "--gpus", "0"], None, "gpus"),
    # -- 2026-11-24: lm-eval, the memory planner, export, generate, data (issue 20's wider table)
    ("lm-eval a folder that holds no run", ["lm-eval", "{tmp}/nope", "--tasks", "cem_local_text"], None, "nope"),
    ("lm-eval no tasks", ["lm-eval", "{run}", "--tasks", ","], None, "--tasks is empty"),
    ("lm-eval unknown task", ["lm-eval", "{run}", "--tasks", "no_such_task", "--device", "cpu"], None, "unknown lm-eval task(s) no_such_task"),
    ("lm-eval limit zero", ["lm-eval", "{run}", "--tasks", "cem_local_text", "--limit", "0"], None, "--limit must be >= 1"),
    ("lm-eval batch size zero", ["lm-eval", "{run}", "--tasks", "cem_local_text", "--batch-size", "0"], None, "--batch-size must be >= 1"),
    ("lm-eval device unknown", ["lm-eval", "{run}", "--tasks", "cem_local_text", "--device", "tpu9"], None, "device"),
    ("lm-eval a run without its tokenizer", ["lm-eval", "{tmp}/run2", "--tasks", "cem_local_text"], no_tokenizer, "tokenizer"),
    ("info memory seq zero", ["info", "--memory", "--seq", "0"], None, "seq must be"),
    ("info memory device of 0 GB", ["info", "--memory", "--device-gb", "0"], None, "--device-gb"),
    ("export a folder that holds no run", ["export", "{tmp}/nope", "{tmp}/o"], None, "nope"),
    ("export into a file", ["export", "{run}", "{tmp}/afile"], write("afile", "x"), "afile"),
    ("export a CEM run as Llama", ["export", "{run}", "--format", "llama", "{tmp}/o"], None, "Llama"),
    ("generate temperature negative", ["generate", "--ckpt", "{run}", "--temperature", "-1", "--max-new-tokens", "2"], None, "temperature"),
    ("generate temperature nan", ["generate", "--ckpt", "{run}", "--temperature", "nan", "--max-new-tokens", "2"], None, "temperature"),
    ("generate top_p above one", ["generate", "--ckpt", "{run}", "--top-p", "1.5", "--max-new-tokens", "2"], None, "top_p"),
    ("generate top_k negative", ["generate", "--ckpt", "{run}", "--top-k", "-3", "--max-new-tokens", "2"], None, "top_k"),
    ("generate a folder that holds no run", ["generate", "--ckpt", "{tmp}/nope", "--max-new-tokens", "2"], None, "nope"),
    ("eval a folder that holds no run", ["eval", "--ckpt", "{tmp}/nope"], None, "nope"),
    ("data prepare unknown corpus", ["data", "prepare", "no-such-corpus", "--data-dir", "{tmp}/dd"], None, "no-such-corpus"),
    ("data prepare --from a missing folder", ["data", "prepare", "tinyshakespeare", "--from", "{tmp}/nowhere", "--data-dir", "{tmp}/dd"], None, "nowhere"),
    ("data prepare --from a folder without the file", ["data", "prepare", "tinyshakespeare", "--from", "{tmp}/emptydir", "--data-dir", "{tmp}/dd"],
     write("emptydir/readme.txt", "x"), "input.txt"),
    ("data prepare shards of zero tokens", ["data", "prepare", "{tmp}/c.txt", "--tokenizer", "byte", "--tokens", "0", "--out", "{tmp}/sh"],
     write("c.txt", "hello world\n" * 100), "--tokens must be positive"),
    ("eval split unknown", ["eval", "--ckpt", "{run}", "--split", "dev"], None, "split"),
    ("eval batch size zero", ["eval", "--ckpt", "{run}", "--batch-size", "0"], None, "batch"),
    ("eval max batches zero", ["eval", "--ckpt", "{run}", "--max-batches", "0"], None, "max"),
    ("eval seq_len above the context", ["eval", "--ckpt", "{run}", "--seq-len", "100000"], None, "context"),
    ("eval on a missing corpus", ["eval", "--ckpt", "{run}", "--data", "{tmp}/none.txt"], None, "none.txt"),
    ("eval device unknown", ["eval", "--ckpt", "{run}", "--device", "gpu9"], None, "device"),
    ("eval a run without its tokenizer", ["eval", "--ckpt", "{tmp}/run2"], no_tokenizer, "tokenizer"),
    ("generate top_p zero", ["generate", "--ckpt", "{run}", "--top-p", "0", "--max-new-tokens", "2"], None, "top_p"),
    ("generate temperature inf", ["generate", "--ckpt", "{run}", "--temperature", "inf", "--max-new-tokens", "2"], None, "temperature"),
    ("generate adaptive tolerance nan", ["generate", "--ckpt", "{run}", "--adaptive-tol", "nan", "--max-new-tokens", "2"], None, "adaptive_tol"),
    ("generate a run without its tokenizer", ["generate", "--ckpt", "{tmp}/run2", "--max-new-tokens", "2"], no_tokenizer, "tokenizer"),
    ("generate from a damaged checkpoint", ["generate", "--ckpt", "{tmp}/run2", "--max-new-tokens", "2"], damaged_run("ckpt/model.safetensors", b"garbage"), "model.safetensors"),
    ("export a damaged checkpoint", ["export", "{tmp}/run2", "{tmp}/o"], damaged_run("ckpt/model.safetensors", b"garbage"), "model.safetensors"),
    ("export a run without its tokenizer", ["export", "{tmp}/run2", "{tmp}/o"], no_tokenizer, "tokenizer"),
    ("lm-eval a damaged checkpoint", ["lm-eval", "{tmp}/run2", "--tasks", "cem_local_text"], damaged_run("ckpt/model.safetensors", b"garbage"), "model.safetensors"),
    ("lm-eval few-shot negative", ["lm-eval", "{run}", "--tasks", "cem_local_choice", "--num-fewshot", "-1"], None, "--num-fewshot"),
    ("info memory batch a word", ["info", "--memory", "--batch", "many"], None, "--batch"),
    ("info memory seq above any context", ["info", "--memory", "--seq", "100000000"], None, "--seq must be at most"),
    ("info memory precision fp8", ["info", "--memory", "--precision", "fp8"], None, "precision"),
    ("info memory device of nan GB", ["info", "--memory", "--device-gb", "nan"], None, "--device-gb"),
    ("data prepare --from a file", ["data", "prepare", "tinyshakespeare", "--from", "{tmp}/afile", "--data-dir", "{tmp}/dd"], write("afile", "x"), "afile"),
    ("data prepare shards into a file", ["data", "prepare", "{tmp}/c.txt", "--tokenizer", "byte", "--tokens", "100", "--out", "{tmp}/afile"],
     lambda t, r, m: [write("c.txt", "hello world\n" * 100)(t, r, m), write("afile", "x")(t, r, m)], "--out {tmp}/afile is a file"),
    ("data prepare shards of a word's tokens", ["data", "prepare", "{tmp}/c.txt", "--tokenizer", "byte", "--tokens", "lots", "--out", "{tmp}/sh"],
     write("c.txt", "hello world\n" * 100), "--tokens must be a number"),
    ("data prepare shards from a missing file", ["data", "prepare", "{tmp}/none.txt", "--tokenizer", "byte", "--tokens", "100", "--out", "{tmp}/sh"], None, "none.txt"),
    ("data prepare shards with a broken tokenizer", ["data", "prepare", "{tmp}/c.txt", "--tokenizer", "{tmp}/tok/tokenizer.json", "--tokens", "100", "--out", "{tmp}/sh"],
     lambda t, r, m: [write("c.txt", "hello world\n" * 100)(t, r, m), write("tok/tokenizer.json", "{not json")(t, r, m)], "tokenizer.json"),
    ("train with a config that is a folder", [*TRAIN, *STEP, "--config", "{tmp}/cfgdir"], write("cfgdir/a.yaml", "lr: 1\n"), "cfgdir"),
    ("train with a config of one scalar", [*TRAIN, *STEP, "--config", "{tmp}/s.yaml"], write("s.yaml", "3\n"), "mapping"),
    ("train with an empty config", [*TRAIN, *STEP, "--config", "{tmp}/e.yaml", "bogus=1"], write("e.yaml", ""), "bogus"),
    ("lm-eval limit a word", ["lm-eval", "{run}", "--tasks", "cem_local_text", "--limit", "some"], None, "--limit"),
    ("info memory gpus negative", ["info", "--memory", "--gpus", "-2", "--parallel", "ddp"], None, "gpus"),
    ("export format unknown", ["export", "{run}", "--format", "onnx", "{tmp}/o"], None, "format"),
    ("data prepare shards with zero held-out tokens", ["data", "prepare", "{tmp}/c.txt", "--tokenizer", "byte", "--tokens", "100",
     "--held-out-tokens", "0", "--out", "{tmp}/sh"], write("c.txt", "hello world\n" * 100), "--held-out-tokens must be positive"),
    # -- 2026-11-27 (issue 39): settings read from a run's files say where they come from
    ("resume run.json lr a word", RESUME, recorded(lambda r: r["config"]["train"].update(lr="abc")), "run.json: recorded settings not usable: lr must be a finite number, got 'abc'"),
    ("resume run.json with an unknown setting", RESUME, recorded(lambda r: r["config"]["train"].update(bogus=1)), "run.json: recorded settings not usable: unknown setting 'train.bogus'"),
    ("resume run.json without its train block", RESUME, recorded(lambda r: r["config"].pop("train")), "run.json: recorded settings not usable: expected a 'train' mapping"),
    ("resume run.json train_depth_dist bogus", RESUME, recorded(lambda r: r["config"]["model_overrides"].update(train_depth_dist="bogus")),
     "run.json: recorded settings not usable: unknown train_depth_dist 'bogus'"),
    ("resume run.json model_overrides a list", RESUME, recorded(lambda r: r["config"].update(model_overrides=[1])), "run.json: recorded settings not usable"),
    ("eval run.json without its train block", ["eval", "--ckpt", "{tmp}/run2"], recorded(lambda r: r["config"].pop("train")), "run.json: recorded settings not usable"),
    ("eval run.json batch_size a word", ["eval", "--ckpt", "{tmp}/run2"], recorded(lambda r: r["config"]["train"].update(batch_size="many")), "run.json: recorded settings not usable: batch_size must be an integer >= 1, got 'many'"),
    ("resume a re-signed state without its optimizer", RESUME, resigned(edited_state(drop=("optimizer",))), "trainer_state.pt holds no optimizer state"),
    ("resume a re-signed state with no sampler state", RESUME, resigned(edited_state(sampler=[])), "trainer_state.pt: sampler must be a non-empty list, got an empty list"),
    ("resume a re-signed state with rng a number", RESUME, resigned(edited_state(rng=3)), "trainer_state.pt: rng must be a non-empty list, got int 3"),
    ("resume a re-signed state with sessions a string", RESUME, resigned(edited_state(sessions="7 chars")),
     "trainer_state.pt: sessions must be a list, got str '7 chars'"),
    ("resume a re-signed state with sessions of numbers", RESUME, resigned(edited_state(sessions=[1, 2])), "trainer_state.pt: sessions[0] must be an object, got int 1"),
    ("resume a run.json of another architecture", [*TRAIN, *STEP, "--out", "{tmp}/run2", "--resume"], recorded(llama_record), "the architectures differ (attn 'cem' there, 'llama' in run.json"),
    ("eval a run whose checkpoint was deleted", ["eval", "--ckpt", "{tmp}/run2"], no_checkpoint, "run2 holds a run (run.json) but no checkpoint"),
    ("generate from a run whose checkpoint was deleted", ["generate", "--ckpt", "{tmp}/run2", "--max-new-tokens", "2"], no_checkpoint, "but no checkpoint"),
    ("export a run whose checkpoint was deleted", ["export", "{tmp}/run2", "{tmp}/o"], no_checkpoint, "but no checkpoint"),
    ("lm-eval a run whose checkpoint was deleted", ["lm-eval", "{tmp}/run2", "--tasks", "cem_local_text"], no_checkpoint, "but no checkpoint"),
    # -- tokenizer and shard files, big numbers
    ("train with a broken tokenizer_config.json", [*TRAIN, *STEP, "--tokenizer", "{tmp}/tok"], hf_tokenizer("{"), "tokenizer_config.json is corrupted: not JSON"),
    ("train with a tokenizer_config.json that is a list", [*TRAIN, *STEP, "--tokenizer", "{tmp}/tok"], hf_tokenizer("[1]"), "tokenizer_config.json is corrupted: expected a JSON object"),
    ("data prepare shards with a list for tokenizer_config.json", ["data", "prepare", "{tmp}/c.txt", "--tokenizer", "{tmp}/tok", "--tokens", "100", "--out", "{tmp}/sh"],
     hf_tokenizer("[]"), "tokenizer_config.json is corrupted"),
    ("data verify shards whose manifest lacks its settings", ["data", "verify", "{tmp}/sh"], shards(lambda m: m.pop("settings")),
     "manifest.json: settings is missing; remove the folder and prepare again"),
    ("data prepare shards with workers beyond any machine", ["data", "prepare", "{tmp}/c.txt", "--tokenizer", "byte", "--tokens", "100",
     "--out", "{tmp}/sh", "--workers", "100000"], write("c.txt", "some text\n"), "--workers must be at most"),
    ("data prepare shards of an hf: source with --encoding", ["data", "prepare", "hf:org/name", "--tokenizer", "byte", "--tokens", "100",
     "--out", "{tmp}/sh", "--encoding", "latin-1"], None, "--encoding has no effect with an hf: source"),
    ("data verify shards whose manifest lacks its splits", ["data", "verify", "{tmp}/sh"], shards(lambda m: m.pop("splits")), "manifest.json: splits is missing"),
    ("data verify shards whose settings are a list", ["data", "verify", "{tmp}/sh"], shards(lambda m: m.update(settings=[1])), "manifest.json: settings must be an object, got list"),
    ("data verify shards whose manifest is a list", ["data", "verify", "{tmp}/sh"], shards(text="[1, 2]"), "manifest.json is corrupted: expected a JSON object"),
    ("data verify a shard entry without its sha256", ["data", "verify", "{tmp}/sh"], shards(lambda m: m["splits"]["train"]["shards"][0].pop("sha256")),
     "manifest.json: splits.train.shards[0].sha256 is missing"),
    ("data verify a shard manifest of a 5000-digit number", ["data", "verify", "{tmp}/sh"], shards(text='{"settings": {"format": ' + "9" * 5000 + "}}"), "manifest.json"),
    ("data verify altered shards", ["data", "verify", "{tmp}/sh"], altered_shard, "1 of 3 files are not what their manifest records"),
    ("data verify a checkpoint with altered weights", ["data", "verify", "{tmp}/run2"], damaged_run("ckpt/model.safetensors", b"garbage"), "are not what their manifest records"),
    ("data verify a missing folder", ["data", "verify", "{tmp}/nope"], None, "nope: no such folder"),
    ("data verify a folder of other files", ["data", "verify", "{tmp}/other"], write("other/notes.txt", "x"), "other is neither a token-shard folder"),
    ("train on shards whose manifest lacks complete", [*TRAIN, *STEP, "--data", "{tmp}/sh"], shards(lambda m: m.pop("complete")), "manifest.json: complete is missing"),
    ("train on shards whose settings are a list", [*TRAIN, *STEP, "--data", "{tmp}/sh"], shards(lambda m: m.update(settings=["format"])), "manifest.json: settings must be an object, got list"),
    ("train on shards of another tokenizer", [*TRAIN, *STEP, "--data", "{tmp}/sh", "--tokenizer", "bpe:300"], shards(), "train with --tokenizer byte"),
    ("jsonl corpus with an integer of 100000 digits", [*TRAIN, *STEP, "--data", "{tmp}/big.jsonl"], write("big.jsonl", '{"text": "a", "n": ' + "9" * 100000 + "}\n"),
     "big.jsonl:1: not readable JSON (Exceeds the limit"),
    ("a blank valid.txt", [*TRAIN, *STEP, "--data", "{tmp}/ev"],
     lambda t, r, m: [write(f"ev/{s}.txt", c)(t, r, m) for s, c in (("train", "some text\n" * 500), ("valid", "\n \n"), ("test", "more text\n" * 50))], "valid.txt is empty"),
    # -- flags named in their messages
    ("tokenizer bpe:0", [*TRAIN, *STEP, "--tokenizer", "bpe:0"], None, "tokenizer bpe:0: need at least 257 symbols"),
    ("data prepare shards with --workers -1", ["data", "prepare", "{tmp}/c.txt", "--tokenizer", "byte", "--tokens", "100", "--workers", "-1", "--out", "{tmp}/sh"],
     write("c.txt", "hello world\n" * 100), "--workers must be an integer >= 0"),
    ("info memory seq of two million", ["info", "--memory", "--seq", "2000000"], None, "--seq must be at most 1,048,576"),
    ("info memory device of inf GB", ["info", "--memory", "--device-gb", "inf"], None, "--device-gib (--device-gb) must be a finite number"),
    ("info memory device of 1e400 GB", ["info", "--memory", "--device-gb", "1e400"], None, "--device-gib (--device-gb) must be a finite number"),
    ("train_depth_max=1 under the default depth mean", [*TRAIN, *STEP, "train_depth=model", "train_depth_dist=poisson-lognormal", "train_depth_max=1"], None,
     "set train_depth_mean=1 (or less) as well"),
    # -- interruptions and limits
    ("Ctrl-C while the command line loads", ["info"], patch("cem.cli.build_parser", SimulatedCtrlC), "cem: error: interrupted (Ctrl-C)"),
    ("file size limit in a checkpoint", [*TRAIN, *STEP], file_size_limit_in_checkpoint, "file size limit (ulimit -f) reached while writing a checkpoint (the previous checkpoint is kept): {tmp}/out/ckpt/trainer_state.pt"),
    # -- token shards: cem data prepare --tokenizer
    ("data prepare shards --out empty", ["data", "prepare", "{tmp}/c.txt", "--tokenizer", "byte", "--tokens", "100", "--out", ""], write("c.txt", "hello\n"), "--out is empty"),
    ("data prepare shards --tokenizer empty", ["data", "prepare", "{tmp}/c.txt", "--tokenizer", "", "--out", "{tmp}/sh"], write("c.txt", "hello\n"), "--tokenizer is empty"),
    ("data prepare shards of zero tokens a shard", ["data", "prepare", "{tmp}/c.txt", "--tokenizer", "byte", "--shard-tokens", "0", "--out", "{tmp}/sh"],
     write("c.txt", "hello\n"), "--shard-tokens must be positive"),
    ("data prepare shards of nan tokens", ["data", "prepare", "{tmp}/c.txt", "--tokenizer", "byte", "--tokens", "nan", "--out", "{tmp}/sh"], write("c.txt", "hello\n"), "--tokens must be a number"),
    ("data prepare shards of inf tokens", ["data", "prepare", "{tmp}/c.txt", "--tokenizer", "byte", "--tokens", "inf", "--out", "{tmp}/sh"], write("c.txt", "hello\n"), "--tokens must be a number"),
    ("data prepare shards of negative tokens", ["data", "prepare", "{tmp}/c.txt", "--tokenizer", "byte", "--tokens", "-5", "--out", "{tmp}/sh"], write("c.txt", "hello\n"), "--tokens must be positive"),
    ("data prepare shards of a BPE too small", ["data", "prepare", "{tmp}/c.txt", "--tokenizer", "bpe:10", "--tokens", "100", "--out", "{tmp}/sh"],
     None, "tokenizer bpe:10: need at least 257"),
    ("data prepare shards into a folder of other files", ["data", "prepare", "{tmp}/c.txt", "--tokenizer", "byte", "--out", "{tmp}/other"],
     lambda t, r, m: [write("c.txt", "hello\n")(t, r, m), write("other/notes.txt", "x")(t, r, m)], "other is not empty and holds no token shards"),
    ("data prepare shards through a symbolic link", ["data", "prepare", "{tmp}/c.txt", "--tokenizer", "byte", "--out", "{tmp}/x/sh"],
     lambda t, r, m: [write("c.txt", "hello\n")(t, r, m), planted("sh")(t, r, m)], "is a symbolic link"),
    ("data prepare shards of an hf corpus without --tokens", ["data", "prepare", "hf:nobody/nothing", "--tokenizer", "byte", "--out", "{tmp}/sh"], None, "say how many training tokens"),
    ("data prepare shards onto shards of other settings", ["data", "prepare", "{tmp}/c.txt", "--tokenizer", "byte", "--tokens", "200", "--out", "{tmp}/sh", "--workers", "0"],
     shards(), "prepared with other settings (tokens differ)"),
    # -- the memory planner: cem info --memory
    ("info memory batch negative", ["info", "--memory", "--batch", "-1"], None, "--batch must be an integer >= 1"),
    ("info memory batch 1e3", ["info", "--memory", "--batch", "1e3"], None, "argument --batch: invalid int value"),
    ("info memory seq negative", ["info", "--memory", "--seq", "-5"], None, "--seq must be an integer >= 1"),
    ("info memory vocab above any", ["info", "--memory", "--vocab", "100000000"], None, "--vocab must be at most"),
    ("info memory device of -1 GB", ["info", "--memory", "--device-gb", "-1"], None, "--device-gib (--device-gb) must be > 0"),
    ("info memory device GB a word", ["info", "--memory", "--device-gb", "lots"], None, "argument --device-gib/--device-gb"),
    ("info memory parallel zero3", ["info", "--memory", "--parallel", "zero3"], None, "argument --parallel: invalid choice"),
    ("info memory precision fp16", ["info", "--memory", "--precision", "fp16"], None, "argument --precision: invalid choice"),
    ("info memory checkpointing block", ["info", "--memory", "--checkpointing", "block"], None, "argument --checkpointing: invalid choice"),
    ("info memory gpus a word", ["info", "--memory", "--gpus", "two"], None, "argument --gpus"),
    ("info memory random depth of 0", ["info", "--memory", "train_depth=model", "train_depth_max=0"], None, "train_depth_max must be an integer >= 1"),
    ("info memory random depth of 100000", ["info", "--memory", "train_depth=model", "train_depth_max=100000"], None, "train_depth_max must be at most 256"),
    ("info memory random depth unknown", ["info", "--memory", "train_depth=random"], None, "unknown train_depth 'random'"),
    ("info memory heavy-tailed depth mean above its maximum", ["info", "--memory", "train_depth=layer", "train_depth_dist=poisson-lognormal", "train_depth_max=2",
     "train_depth_mean=5"], None, "train_depth_mean=5 is above train_depth_max=2"),
    # -- lm-eval
    ("lm-eval tasks blank", ["lm-eval", "{run}", "--tasks", " , "], None, "--tasks is empty"),
    ("lm-eval limit negative", ["lm-eval", "{run}", "--tasks", "cem_local_text", "--limit", "-1"], None, "--limit must be >= 1"),
    ("lm-eval few-shot a word", ["lm-eval", "{run}", "--tasks", "cem_local_choice", "--num-fewshot", "two"], None, "argument --num-fewshot"),
    ("lm-eval batch size negative", ["lm-eval", "{run}", "--tasks", "cem_local_text", "--batch-size", "-4"], None, "--batch-size must be >= 1"),
    ("lm-eval a file", ["lm-eval", "{tmp}/afile", "--tasks", "cem_local_text"], write("afile", "x"), "afile is a file, not a run or model directory"),
    ("lm-eval an unknown task among known ones", ["lm-eval", "{run}", "--tasks", "cem_local_text,no_such_task", "--device", "cpu"], None, "no_such_task"),
    # -- export
    ("export through a symbolic link to a folder", ["export", "{run}", "{tmp}/x/out"], lambda t, r, m: [(t / "victim").mkdir(), (t / "x").mkdir(), (t / "x" / "out").symlink_to(t / "victim")],
     "is a symbolic link"),
    ("export through a dangling symbolic link", ["export", "{run}", "{tmp}/x/out"], lambda t, r, m: [(t / "x").mkdir(), (t / "x" / "out").symlink_to(t / "nowhere")], "is a symbolic link"),
    ("export into a folder of other files", ["export", "{run}", "{tmp}/other"], write("other/notes.txt", "x"), "holds other files and no earlier export"),
    ("export OUT empty", ["export", "{run}", ""], None, "OUT is empty"),
    ("export format bin", ["export", "{run}", "--format", "bin", "{tmp}/o"], None, "argument --format: invalid choice"),
    ("export into the run's tokenizer", ["export", "{run}", "{run}/tokenizer/hf"], None, "of the run being exported"),
    # -- random depth and anchors
    ("train_depth unknown", [*TRAIN, *STEP, "train_depth=random"], None, "unknown train_depth 'random'"),
    ("train_depth_max zero", [*TRAIN, *STEP, "train_depth=model", "train_depth_max=0"], None, "train_depth_max must be an integer >= 1"),
    ("train_depth_max a thousand", [*TRAIN, *STEP, "train_depth=model", "train_depth_max=1000"], None, "train_depth_max must be at most 256"),
    ("train_depth_mean below one", [*TRAIN, *STEP, "train_depth=model", "train_depth_mean=0.5"], None, "train_depth_mean must be >= 1"),
    ("train_depth_mean nan", [*TRAIN, *STEP, "train_depth_mean=nan"], None, "train_depth_mean must be a finite number"),
    ("train_depth_dist unknown", [*TRAIN, *STEP, "train_depth_dist=zipf"], None, "unknown train_depth_dist 'zipf'"),
    ("anchor_weight negative", [*TRAIN, *STEP, "anchor_weight=-1"], None, "anchor_weight must be >= 0"),
    ("anchor_weight inf", [*TRAIN, *STEP, "anchor_weight=inf"], None, "anchor_weight must be a finite number"),
    ("anchor_weight yes in a config", [*TRAIN, *STEP, "--config", "{tmp}/a.yaml"], write("a.yaml", "model:\n  anchor_weight: yes\n"), "anchor_weight: True is a boolean"),
    ("fixed_point_weight negative", [*TRAIN, *STEP, "fixed_point_weight=-1"], None, "fixed_point_weight must be >= 0"),
    ("backprop_steps negative", [*TRAIN, *STEP, "backprop_steps=-1"], None, "backprop_steps must be an integer >= 0"),
    ("backprop_steps a thousand", [*TRAIN, *STEP, "backprop_steps=1000"], None, "backprop_steps must be at most 256"),
    ("step_decay zero", [*TRAIN, *STEP, "step_schedule=geometric", "step_decay=0"], None, "step_decay must be > 0"),
    ("step_schedule unknown", [*TRAIN, *STEP, "step_schedule=cosine"], None, "unknown step_schedule 'cosine'"),
    ("start unknown", [*TRAIN, *STEP, "start=zero"], None, "unknown start 'zero'"),
    # -- flags that mean nothing in their mode or on their model (issue 63: `cem.cli.flag_table`), and config files
    ("info --batch without --memory", ["info", "--batch", "8"], None, "--batch has no effect without --memory"),
    ("info --keys with a setting", ["info", "--keys", "lr=1"], None, "KEY=VALUE has no effect with --keys"),
    ("generate --adaptive-rule without adaptive steps", ["generate", "--ckpt", "{run}", "--adaptive-rule", "update"], None,
     "--adaptive-rule has no effect without adaptive steps"),
    ("generate --seed at temperature 0", ["generate", "--ckpt", "{run}", "--temperature", "0", "--seed", "3"], None, "--seed has no effect at --temperature 0"),
    ("data prepare --tokens without --tokenizer", ["data", "prepare", "wikitext-2", "--tokens", "5"], None, "--tokens has no effect without --tokenizer"),
    ("data prepare shards --from", ["data", "prepare", "{tmp}/c.txt", "--tokenizer", "byte", "--from", "{tmp}"], write("c.txt", "hello\n"), "--from has no effect with --tokenizer"),
    ("data prepare shards of a folder with an empty valid.txt", ["data", "prepare", "{tmp}/c", "--tokenizer", "byte", "--out", "{tmp}/sh"],
     lambda t, r, m: [write(f"c/{s}.txt", "" if s == "valid" else "some text\n")(t, r, m) for s in ("train", "valid", "test")], "c/valid.txt is empty"),
    ("config a folder", ["info", "--config", "{tmp}"], None, "is a folder; give a YAML file"),
    ("config with a key twice", ["info", "--config", "{tmp}/d.yaml"], write("d.yaml", "lr: 0.1\nlr: 0.2\n"), "key 'lr' given twice"),
    ("config with a key flat and in its section", ["info", "--config", "{tmp}/d.yaml"], write("d.yaml", "lr: 0.1\ntrain:\n  lr: 0.2\n"),
     "lr and train.lr set the same setting"),
    ("config with a model key twice", ["info", "--config", "{tmp}/d.yaml"], write("d.yaml", "model:\n  attn_steps: 2\n  attn_steps: 3\n"), "key 'attn_steps' given twice"),
    # -- the study's commands, moved to the cem-study package
    ("experiment moved", ["experiment", "fig2a", "--scale", "smoke"], None, "`cem experiment` moved to its own package: `cem-study experiment`"),
    ("report moved", ["report", "{tmp}/res"], None, "`cem report` moved to its own package: `cem-study report`"),
]

# issue 63: every record read back is checked by its schema (`cem.records`), the message naming the file and the field
RECORD_CASES = [
    ("eval run.json total_steps a word", ["eval", "--ckpt", "{tmp}/run2"], recorded(lambda r: r.update(total_steps="x")),
     "run.json: total_steps must be an integer in [0, 1,000,000,000,000,000], got str 'x'"),
    ("resume run.json total_steps negative", RESUME, recorded(lambda r: r.update(total_steps=-4)), "run.json: total_steps must be an integer in [0, 1,000,000,000,000,000], got int -4"),
    ("resume run.json total_steps NaN", RESUME, recorded(lambda r: r.update(total_steps=float("nan"))), "run.json: total_steps must be an integer in [0, 1,000,000,000,000,000], got float nan"),
    ("resume run.json total_steps 1e300", RESUME, recorded(lambda r: r.update(total_steps=1e300)), "run.json: total_steps must be an integer in [0, 1,000,000,000,000,000], got float 1e+300"),
    ("resume run.json train a list", RESUME, recorded(lambda r: r.update(train=[1])), "run.json: train must be an object, got list"),
    ("eval run.json model a string", ["eval", "--ckpt", "{tmp}/run2"], recorded(lambda r: r.update(model="cem")), "run.json: model must be an object, got str 'cem'"),
    ("resume run.json tokenizer a number", RESUME, recorded(lambda r: r.update(tokenizer=7)), "run.json: tokenizer must be a string, got int 7"),
    ("resume run.json corpus a list", RESUME, recorded(lambda r: r.update(corpus=["a"])), "run.json: corpus must be a string or an object, got list"),
    ("eval run.json truncated", ["eval", "--ckpt", "{tmp}/run2"], damaged_run("run.json", '{"train": {"lr": 0.'), "run.json is corrupted: not JSON"),
    ("rerun results.json steps a word", [*TRAIN, *STEP, "--arch", "cem", "--out", "{tmp}/run2"], resulted(steps="one"),
     "results.json: steps must be an integer in [0, 1,000,000,000,000,000], got str 'one'"),
    ("rerun results.json steps negative", [*TRAIN, *STEP, "--arch", "cem", "--out", "{tmp}/run2"], resulted(steps=-1), "results.json: steps must be an integer in [0, 1,000,000,000,000,000], got int -1"),
    ("rerun results.json sessions a string", [*TRAIN, *STEP, "--arch", "cem", "--out", "{tmp}/run2"], resulted(sessions="x"), "results.json: sessions must be a list, got str 'x'"),
    ("rerun results.json sessions of numbers", [*TRAIN, *STEP, "--arch", "cem", "--out", "{tmp}/run2"], resulted(sessions=[{}, 2]),
     "results.json: sessions[1] must be an object, got int 2"),
    ("rerun results.json a session's processor a number", [*TRAIN, *STEP, "--arch", "cem", "--out", "{tmp}/run2"], resulted(sessions=[{"processor": 5}]),
     "results.json: sessions[0].processor must be a string, got int 5"),
    ("rerun results.json processor_inferred a list", [*TRAIN, *STEP, "--arch", "cem", "--out", "{tmp}/run2"], resulted(processor_inferred=["x"]),
     "results.json: processor_inferred must be an object, got list"),
    ("rerun results.json processor_inferred without its processor", [*TRAIN, *STEP, "--arch", "cem", "--out", "{tmp}/run2"],
     resulted(processor_inferred={"by": "a check"}), "results.json: processor_inferred.processor is missing"),
    ("rerun results.json test_loss NaN", [*TRAIN, *STEP, "--arch", "cem", "--out", "{tmp}/run2"], resulted(test_loss=float("nan")),
     "results.json: test_loss must be a finite number >= 0, got float nan"),
    ("rerun results.json world_size zero", [*TRAIN, *STEP, "--arch", "cem", "--out", "{tmp}/run2"], resulted(world_size=0), "results.json: world_size must be an integer >= 1, got int 0"),
    ("rerun results.json tokens_seen 1e400", [*TRAIN, *STEP, "--arch", "cem", "--out", "{tmp}/run2"], resulted(tokens_seen=float("inf")),
     "results.json: tokens_seen must be an integer in [0, 1,000,000,000,000,000], got float inf"),
    ("rerun results.json provenance a string", [*TRAIN, *STEP, "--arch", "cem", "--out", "{tmp}/run2"], resulted(provenance="me"),
     "results.json: provenance must be an object, got str 'me'"),
    ("rerun results.json parameters of words", [*TRAIN, *STEP, "--arch", "cem", "--out", "{tmp}/run2"], resulted(parameters={"total": "many"}),
     "results.json: parameters.total must be an integer >= 0, got str 'many'"),
    ("rerun results.json a list", [*TRAIN, *STEP, "--arch", "cem", "--out", "{tmp}/run2"],
     lambda t, r, m: [shutil.copytree(r, t / "run2"), (t / "run2" / "results.json").write_text("[]")], "results.json is corrupted: expected a JSON object"),
    ("rerun results.json truncated", [*TRAIN, *STEP, "--arch", "cem", "--out", "{tmp}/run2"],
     lambda t, r, m: [shutil.copytree(r, t / "run2"), (t / "run2" / "results.json").write_text('{"steps": 1, "test_')], "results.json is corrupted: not JSON"),
    ("resume a re-signed state with tokens_seen a word", RESUME, resigned(edited_state(tokens_seen="many")),
     "trainer_state.pt: tokens_seen must be an integer in [0, 1,000,000,000,000,000], got str 'many'"),
    ("resume a re-signed state with elapsed NaN", RESUME, resigned(edited_state(elapsed=float("nan"))), "trainer_state.pt: elapsed must be a finite number >= 0, got float nan"),
    ("resume a re-signed state with elapsed negative", RESUME, resigned(edited_state(elapsed=-1.0)), "trainer_state.pt: elapsed must be a finite number >= 0, got float -1.0"),
    ("resume a re-signed state with a session from step -1", RESUME, resigned(edited_state(sessions=[{"from_step": -1}])),
     "trainer_state.pt: sessions[0].from_step must be an integer in [0, 1,000,000,000,000,000], got int -1"),
    ("resume a re-signed state with a session of zero threads", RESUME, resigned(edited_state(sessions=[{"threads": 0}])),
     "trainer_state.pt: sessions[0].threads must be an integer >= 1, got int 0"),
    ("resume a re-signed state with step a float", RESUME, resigned(edited_state(step=1.0)), "step must be an integer"),
    ("resume a re-signed state with step 1e30", RESUME, resigned(edited_state(step=10**30)), "step must be an integer in [0, 1,000,000,000,000,000] or null, got int 1000000000000000000000000000000"),
    ("resume a re-signed state with the optimizer a list", RESUME, resigned(edited_state(optimizer=[1])), "trainer_state.pt: optimizer must be an object, got list"),
    ("eval a re-signed state with its run a string", ["eval", "--ckpt", "{tmp}/run2"],
     lambda t, r, m: [resigned(edited_state(run="x"))(t, r, m), (t / "run2" / "run.json").unlink()], "trainer_state.pt: run must be an object, got str 'x'"),
    ("resume a re-signed state with format a string", RESUME, resigned(edited_state(format="1")), "trainer_state.pt: format must be an integer >= 0, got str '1'"),
    ("resume a manifest whose files are a list", RESUME, manifested(lambda m: m.update(files=["model.safetensors"])),
     "manifest.json: files must be a non-empty object, got list"),
    ("resume a manifest whose bytes are a word", RESUME, manifested(lambda m: first_file(m).update(bytes="big")),
     "manifest.json: files.config.json.bytes must be an integer >= 0, got str 'big'"),
    ("resume a manifest entry without its sha256", RESUME, manifested(lambda m: first_file(m).pop("sha256")), "manifest.json: files.config.json.sha256 is missing"),
    ("resume a manifest whose step is a word", RESUME, manifested(lambda m: m.update(step="one")), "manifest.json: step must be an integer in [0, 1,000,000,000,000,000] or null, got str 'one'"),
    ("eval a manifest listing a file above its folder", ["eval", "--ckpt", "{tmp}/run2"], manifested(lambda m: m["files"].update({"../run.json": first_file(m)})),
     "lists '../run.json', which is not a file in its folder"),
    ("eval a manifest listing an absolute path", ["eval", "--ckpt", "{tmp}/run2"], manifested(lambda m: m["files"].update({"/etc/passwd": first_file(m)})),
     "lists '/etc/passwd', which is not a file in its folder"),
    ("resume a manifest nested deeply", RESUME, damaged_run("ckpt/manifest.json", "[" * 100000 + "]" * 100000), "manifest.json is corrupted: JSON nested too deeply"),
    ("data verify shards whose manifest lacks its settings and splits", ["data", "verify", "{tmp}/sh"], shards(lambda m: [m.pop("settings"), m.pop("splits")]),
     "manifest.json: settings is missing"),
    ("data verify shards of float64", ["data", "verify", "{tmp}/sh"], shards(lambda m: m["settings"].update(dtype="float64")),
     "manifest.json: settings.dtype must be one of 'uint16', 'uint32', got str 'float64'"),
    ("data verify a shard of a word's tokens", ["data", "verify", "{tmp}/sh"], shards(lambda m: m["splits"]["train"]["shards"][0].update(n_tokens="many")),
     "manifest.json: splits.train.shards[0].n_tokens must be an integer in [0, 1,000,000,000,000,000], got str 'many'"),
    ("train on a shard of 1e30 tokens", [*TRAIN, *STEP, "--data", "{tmp}/sh"], shards(lambda m: m["splits"]["train"]["shards"][0].update(n_tokens=10**30)),
     "manifest.json: splits.train.shards[0].n_tokens must be an integer in [0, 1,000,000,000,000,000]"),
    ("data verify a shard file above its folder", ["data", "verify", "{tmp}/sh"], shards(lambda m: m["splits"]["train"]["shards"][0].update(file="../c.txt")),
     "lists '../c.txt', which is not a file in its folder"),
    ("data verify shards whose splits are a list", ["data", "verify", "{tmp}/sh"], shards(lambda m: m.update(splits=[1])), "manifest.json: splits must be an object, got list"),
    ("train on shards whose complete is a word", [*TRAIN, *STEP, "--data", "{tmp}/sh"], shards(lambda m: m.update(complete="yes")),
     "manifest.json: complete must be true or false, got str 'yes'"),
    ("data verify shards whose source files are a string", ["data", "verify", "{tmp}/sh"], shards(lambda m: m.update(source_files="c.txt")),
     "manifest.json: source_files must be an object or null, got str 'c.txt'"),
    ("data verify shards of another format", ["data", "verify", "{tmp}/sh"], shards(lambda m: m["settings"].update(format="other/9")),
     "is not a cem token-shard manifest (cem-token-shards/1): its settings.format is 'other/9'"),
    ("data verify shards whose end is of words", ["data", "verify", "{tmp}/sh"], shards(lambda m: m["splits"]["valid"].update(end=["a", 0])),
     "manifest.json: splits.valid.end[0] must be an integer >= 0, got str 'a'"),
    ("data prepare onto shards whose resume.json is a list", ["data", "prepare", "{tmp}/c.txt", "--tokenizer", "byte", "--tokens", "100", "--out", "{tmp}/sh", "--workers", "0"],
     shard_resume("[1]"), "resume.json is corrupted: expected a JSON object"),
    ("data prepare onto shards whose resume.json lacks a position", ["data", "prepare", "{tmp}/c.txt", "--tokenizer", "byte", "--tokens", "100", "--out", "{tmp}/sh",
     "--workers", "0"], shard_resume('{"train": {"doc": 3}}'), "resume.json: train.position is missing"),
    ("eval tokenizer meta of a numeric kind", ["eval", "--ckpt", "{tmp}/run2"], damaged_run("tokenizer/cem_tokenizer.json", '{"kind": 3}'),
     "cem_tokenizer.json: kind must be one of 'byte', 'hf', got int 3"),
    ("eval tokenizer meta without a kind", ["eval", "--ckpt", "{tmp}/run2"], damaged_run("tokenizer/cem_tokenizer.json", '{"name": "x"}'), "cem_tokenizer.json: kind is missing"),
    ("train with a tokenizer meta of a negative eot_id", [*TRAIN, *STEP, "--tokenizer", "{tmp}/meta"], write("meta/cem_tokenizer.json", '{"kind": "hf", "name": "x", "eot_id": -1}'),
     "cem_tokenizer.json: eot_id must be an integer >= 0, got int -1"),
    ("train with a tokenizer meta of a word for eot_id", [*TRAIN, *STEP, "--tokenizer", "{tmp}/meta"], write("meta/cem_tokenizer.json", '{"kind": "hf", "name": "x", "eot_id": "0"}'),
     "cem_tokenizer.json: eot_id must be an integer >= 0, got str '0'"),
    ("train with a tokenizer meta of an empty name", [*TRAIN, *STEP, "--tokenizer", "{tmp}/meta"], write("meta/cem_tokenizer.json", '{"kind": "hf", "name": "", "eot_id": 0}'),
     "cem_tokenizer.json: name must be a non-empty string, got str ''"),
    ("train with a tokenizer_config.json of a numeric eos_token", [*TRAIN, *STEP, "--tokenizer", "{tmp}/tok"], hf_tokenizer('{"eos_token": 5}'),
     "tokenizer_config.json: eos_token must be a string or an object or null, got int 5"),
    ("train with a tokenizer_config.json whose eos_token lacks its content", [*TRAIN, *STEP, "--tokenizer", "{tmp}/tok"], hf_tokenizer('{"eos_token": {"lstrip": false}}'),
     "tokenizer_config.json: eos_token.content is missing"),
    ("eval an export", ["eval", "--ckpt", "{tmp}/exp"], lambda t, r, m: main(["export", str(r), str(t / "exp")]),
     "exp is a Hugging Face model folder (its config.json has model_type 'cem'"),
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus_dir):
    """One tiny trained run (one step), shared by the eval/generate/resume cases."""
    root = tmp_path_factory.mktemp("fuzz")
    shutil.copytree(corpus_dir, root / "corpus")
    env = os.environ.get("CEM_CACHE_DIR")
    os.environ["CEM_CACHE_DIR"] = str(root / "cache")
    try:
        args = [a.format(corpus=root / "corpus", out=root / "run") for a in [*TRAIN, *STEP, "--arch", "cem"]]
        assert main(args) == 0
    finally:
        if env is None:
            os.environ.pop("CEM_CACHE_DIR")
        else:
            os.environ["CEM_CACHE_DIR"] = env
    return root


SLOW_CASES = ("lm-eval", "corpus")  # the cases that take tens of seconds (a harness run, a corpus tokenised): the slow tier


def _tiered(case, k: int, every: int = 2):
    """The case in the slow tier when it takes tens of seconds, or unless it is the `every`-th one of its table (`k`): the
    fast tier holds every other case of the table (about a minute of the fast tier's three) and every eighth damaged
    record, CI's two tiers hold them all."""
    values = getattr(case, "values", case)
    if not values[0].startswith(SLOW_CASES) and k % every == 0:
        return case
    marks = tuple(getattr(case, "marks", ())) + (pytest.mark.slow,)
    return pytest.param(*values, marks=marks, id=getattr(case, "id", None))


CASES = [_tiered(c, k) for k, c in enumerate(CASES)] + [_tiered(c, k, 8) for k, c in enumerate(RECORD_CASES)]


@pytest.mark.parametrize("name,argv,setup,expect", CASES, ids=[getattr(c, "values", c)[0] for c in CASES])
def test_bad_input_is_one_line(name, argv, setup, expect, trained, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CEM_CACHE_DIR", str(trained / "cache"))
    monkeypatch.chdir(tmp_path)
    run = trained / "run"
    if setup is not None:
        setup(tmp_path, run, monkeypatch)
    capsys.readouterr()
    args = [a.format(corpus=trained / "corpus", run=run, out=tmp_path / "out", tmp=tmp_path) for a in argv]
    try:
        code = main(args)
    except SystemExit as e:  # argparse
        code = e.code
    except SimulatedCtrlC:
        pytest.fail(f"{name}: the Ctrl-C escaped main()")
    err = capsys.readouterr().err
    if os.environ.get("CEM_FUZZ_LOG"):  # the messages, for reading them all at once
        with open(os.environ["CEM_FUZZ_LOG"], "a") as log:
            log.write(f"{name} -> {code}: {err}")
    assert code not in (0, None), f"{name}: accepted: {err}"
    assert "Traceback" not in err
    assert err.count("\n") == 1 and err.endswith("\n"), f"{name}: {err!r}"
    if expect is not None:
        assert expect.format(tmp=tmp_path) in err, f"{name}: {err!r}"
    assert not (tmp_path / "pwned").exists()
    for kept in (tmp_path / "victim", tmp_path / "x" / "ckpt" / "precious", tmp_path / "x" / "tokenizer" / "precious"):
        assert not kept.is_file() or kept.read_text() == "keep", f"{name}: {kept} was written"
    assert not (tmp_path / "victim").is_dir() or not any((tmp_path / "victim").iterdir()), f"{name}: written into the victim folder"


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/PID/maps to see torch loading")
@pytest.mark.parametrize("launch", [["-m", "cem"], ["-c", "import sys; from cem.__main__ import run; sys.exit(run())"]], ids=["python -m cem", "the cem script"])
def test_ctrl_c_while_the_modules_load_is_one_line(launch, tmp_path):
    """Issue 39: Ctrl-C in the first seconds of a command, while torch is imported, printed a 30-line
    traceback; it is one line and exit 130, as during the command (`cem` is `cem.__main__:run`, as the
    console script pip writes calls it). The signal is sent once torch's library is mapped: well inside its
    import however loaded the machine is."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, *launch, "info"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    def loading_torch() -> bool:
        try:
            return "libtorch" in Path(f"/proc/{proc.pid}/maps").read_text(errors="replace")
        except OSError:  # the process has ended
            return True

    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline and not loading_torch():
        time.sleep(0.005)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert (proc.returncode, err) == (130, "cem: error: interrupted (Ctrl-C)\n")


# The `cem` script (as pip writes it) with a Ctrl-C at the import of a module (argv[1]; "first": the first one
# `cem.__main__` makes that Python has not made already), saying whether SIGINT was held then.
CTRL_C_AT_IMPORT = """
import _signal, os, sys

AT = sys.argv[1]

class CtrlC:
    @staticmethod
    def find_spec(name, path, target=None):
        frame = sys._getframe(1)
        while frame is not None and frame.f_globals.get("__name__") != "cem.__main__":
            frame = frame.f_back
        if name == AT or (AT == "first" and frame is not None):
            sys.meta_path.remove(CtrlC)
            held = _signal.SIGINT in _signal.pthread_sigmask(_signal.SIG_BLOCK, [])
            print(f"Ctrl-C at the import of {name}; held: {held}", flush=True)
            os.kill(os.getpid(), _signal.SIGINT)
        return None

sys.meta_path.insert(0, CtrlC)
sys.argv = ["cem", "info"]
from cem.__main__ import run
sys.exit(run())
"""


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="SIGINT is held with pthread_sigmask")
@pytest.mark.parametrize("at", ["first", "torch._dynamo"])
def test_ctrl_c_at_an_import_of_the_command_is_held_and_one_line(at, tmp_path):
    """Issue 63: a Ctrl-C in the first milliseconds, while `cem.__main__` imported `signal` (before it held SIGINT),
    printed a traceback; one while the parser's modules loaded (torch._dynamo, triton: after the hold) could land in
    their imports and come out as a RuntimeError or an abort. SIGINT is held from that module's first statement until
    the parser is made."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    run = subprocess.run([sys.executable, "-c", CTRL_C_AT_IMPORT, at], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert run.stdout.startswith("Ctrl-C at the import of ") and run.stdout.endswith("; held: True\n"), run.stdout
    assert (run.returncode, run.stderr) == (130, "cem: error: interrupted (Ctrl-C)\n")


# The `cem` script with a command that a Ctrl-C stops while a finalizer runs (garbage collected in the middle of it).
IN_A_FINALIZER = """
import os, sys, time
import cem.cli

class Garbage:
    def __del__(self):
        os.kill(os.getpid(), 2)

def command(parser=None):
    Garbage()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        pass
    print("the command went on", flush=True)
    return 0

cem.cli.main = command
from cem.__main__ import run
sys.exit(run())
"""


@pytest.mark.slow
def test_ctrl_c_in_a_finalizer_stops_the_command_with_one_line(tmp_path):
    """Issue 63: a Ctrl-C that landed in a finalizer (a `__del__` of the prepare's pool pipes or progress bar) was
    printed as "Exception ignored in ..." and a traceback, and the command went on; it is sent again and stops it."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    run = subprocess.run([sys.executable, "-c", IN_A_FINALIZER], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert (run.returncode, run.stdout, run.stderr) == (130, "", "cem: error: interrupted (Ctrl-C)\n")


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(__import__("resource"), "RLIMIT_FSIZE"), reason="needs RLIMIT_FSIZE")
def test_a_file_size_limit_in_a_checkpoint_is_one_line_naming_the_file(trained, tmp_path):
    """Issue 39: under `ulimit -f` (Python ignores SIGXFSZ, so the write fails with EFBIG) a checkpoint save
    ended in "RuntimeError: ... file write failed (unexpected)"; it says the file size limit and the file.
    The limit lets the weights (about 0.4 MB) through and stops the trainer state (about 0.8 MB)."""
    import resource
    import subprocess
    import sys

    args = [a.format(corpus=trained / "corpus", out=tmp_path / "run") for a in [*TRAIN, *STEP, "--arch", "cem"]]
    limit = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (500_000, 500_000))  # noqa: E731
    env = {**os.environ, "CEM_CACHE_DIR": str(trained / "cache")}  # the corpus' tokens are cached there
    run = subprocess.run([sys.executable, "-m", "cem", *args], capture_output=True, text=True, preexec_fn=limit, env=env, timeout=600)
    assert run.returncode == 1 and run.stderr.count("\n") == 1, run.stderr
    assert "file size limit (ulimit -f) reached while writing a checkpoint" in run.stderr and str(tmp_path / "run" / "ckpt" / "trainer_state.pt") in run.stderr


@pytest.mark.slow
def test_more_few_shot_examples_than_a_task_holds_are_named_by_the_flag(trained, monkeypatch, capsys):
    """Issue 63: `cem lm-eval --num-fewshot 1000000` ended in random.sample's "Sample larger than population or is
    negative"; the error names the flag and the task. (Not a case of the table: lm-eval's and transformers' progress bars
    on stderr come before it.)"""
    monkeypatch.setenv("CEM_CACHE_DIR", str(trained / "cache"))
    assert main(["lm-eval", str(trained / "run"), "--tasks", "cem_local_choice", "--num-fewshot", "1000000", "--device", "cpu"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == ("cem lm-eval: error: num_fewshot (--num-fewshot) 1,000,000: more few-shot examples "
                                                        "than cem_local_choice holds documents to draw them from; give fewer")


def test_the_table_is_large_enough():
    assert len(CASES) >= 60


@pytest.mark.slow
def test_cli_train_eval_generate(tiny_args, tmp_path, capsys):
    out = str(tmp_path / "run")
    args = ["train", "--data", tiny_args["data"], "--preset", "tiny", "--arch", "cem", "--max-steps", "4", "--batch-size", "4",
            "--out", out, "--quiet", "context=32", "tensorboard=false", "final_eval_tokens=0"]
    assert main(args) == 0
    final = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main(["eval", "--ckpt", out, "--split", "test", "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["loss"] == pytest.approx(final["test_loss"], rel=1e-6)
    assert metrics["bits_per_byte"] == pytest.approx(final["test_bits_per_byte"], rel=1e-6)
    assert main(["generate", "--ckpt", out, "--prompt", "the ", "--max-new-tokens", "10", "--steps", "2"]) == 0
    assert capsys.readouterr().out.startswith("the ")
    assert main(["generate", "--ckpt", out, "--prompt", "the ", "--max-new-tokens", "5", "--steps", "4", "--adaptive-tol", "1e-3", "--guard", "2"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("the ") and "adaptive steps:" in captured.err and "at most 4)" in captured.err
    assert main(["generate", "--ckpt", out, "--max-new-tokens", "2", "--adaptive-tol", "-1"]) == 2
    assert "adaptive_tol" in capsys.readouterr().err
    assert main(["info", "--preset", "134M", "--arch", "cem"]) == 0
    assert "| attention | 28.312M | 14.165M | 0.500 |" in capsys.readouterr().out
    assert main(["info", "--preset", "small", "--memory", "--batch", "2", "--seq", "64", "--device-gb", "0.5"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("predicted peak training memory per device: ") and "does NOT fit a 0.5 GiB device" in out.splitlines()[0]
    assert "  for batch 2 x 64 tokens" in out


def test_cli_errors_are_one_line(tiny_args, tmp_path, capsys):
    assert main(["train", "--data", "no-such-corpus", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cem train: error:") and "Traceback" not in err and err.count("\n") == 1
    assert main(["train", "--preset", "nope", "--data", tiny_args["data"], "--out", str(tmp_path / "x")]) == 2
    assert "unknown preset 'nope'" in capsys.readouterr().err
    assert main(["train", "--data", tiny_args["data"], "--out", str(tmp_path / "x"), "bogus=1"]) == 2
    assert "unknown config key 'bogus'" in capsys.readouterr().err
    assert main(["eval", "--ckpt", str(tmp_path / "missing")]) == 2
    assert "no run or model directory" in capsys.readouterr().err


def test_relative_data_is_recorded_absolute_and_a_failed_start_does_not_block(corpus_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CEM_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "book.txt").write_text((corpus_dir / "train.txt").read_text())
    monkeypatch.chdir(tmp_path / "work")
    args = ["train", "--data", "book.txt", "--preset", "tiny", "--max-steps", "1", "--quiet", "--out", str(tmp_path / "run"),
            "context=32", "tensorboard=false"]  # fmt: skip
    assert main([*args, "--batch-size", "100000"]) == 2  # fails at start-up, after run.json was written
    assert main([*args, "--batch-size", "2"]) == 0  # the corrected rerun into the same --out
    recorded = json.loads((tmp_path / "run" / "run.json").read_text())["config"]["train"]["data"]
    assert recorded == str(tmp_path / "work" / "book.txt")
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["eval", "--ckpt", str(tmp_path / "run"), "--json"]) == 0  # from another directory
    assert json.loads(capsys.readouterr().out)["data"] == recorded
    assert main(["generate", "--ckpt", str(tmp_path / "run"), "--temperature", "1e-45", "--max-new-tokens", "3"]) == 0


def test_default_run_names_hold_the_overrides():
    parse = build_parser().parse_args
    a = default_run_dir(_run_config(parse(["train", "attn_steps=2"])))
    b = default_run_dir(_run_config(parse(["train", "attn_steps=3", "--lr", "1e-3"])))
    assert a.name == "cem-small-shakespeare-s0-attn_steps=2"
    assert b.name == "cem-small-shakespeare-s0-lr=0.001-attn_steps=3"
    assert default_run_dir(_run_config(parse(["train", "--device", "cpu"]))).name == "cem-small-shakespeare-s0"
    from cem.training.budget import with_default_steps

    for argv, name in ((["train"], "cem-small-shakespeare-s0"), (["train", "--max-steps", "100"], "cem-small-shakespeare-s0-max_steps=100")):
        run = _run_config(parse(argv))
        with_default_steps(run.train)  # as `cem train` does: the default budget of 600 steps is not in the name
        assert default_run_dir(run).name == name


def test_long_run_names_are_cut_with_a_digest():
    """About 20 valid overrides used to make the default run folder's name longer than the 255 bytes file
    systems allow: a name over MAX_NAME_BYTES is cut and followed by a digest of the settings."""
    from cem.training.rundir import MAX_NAME_BYTES

    parse = build_parser().parse_args
    many = [f"{k}={v}" for k, v in (("attn_steps", 2), ("mlp_steps", 2), ("attn_precond", "diag_lowrank"), ("mlp_precond", "diag_lowrank"),
                                     ("kq_diag", "per_head"), ("learn_step_size", "true"), ("attn_step_size", 0.5), ("mlp_step_size", 0.5),
                                     ("weight_decay", 0.05), ("beta2", 0.99), ("warmup_frac", 0.1), ("final_lr_frac", 0.2), ("grad_clip", 0.5),
                                     ("eps", 1e-8), ("log_every", 7), ("save_every", 11), ("eval_every", 13), ("diverge_warmup", 9))]
    a = default_run_dir(_run_config(parse(["train", *many])))
    b = default_run_dir(_run_config(parse(["train", *many, "beta1=0.8"])))
    assert len(a.name.encode()) <= MAX_NAME_BYTES + 20 and a.name.startswith("cem-small-shakespeare-s0-")
    assert a.name != b.name  # the digest keeps cut names apart


def test_stop_at_says_so_and_a_failed_start_leaves_no_folder(tiny_args, tmp_path, capsys):
    """--stop-at ends with a line saying where the checkpoint is; a run that fails before writing anything
    leaves no folder holding only `.lock` behind."""
    out = tmp_path / "run"
    args = ["train", "--data", tiny_args["data"], "--preset", "tiny", "--arch", "cem", "--max-steps", "6", "--batch-size", "2",
            "--out", str(out), "--stop-at", "2", "context=32", "tensorboard=false"]
    assert main(args) == 0
    assert "stopped at step 2 as asked (--stop-at); checkpoint saved" in capsys.readouterr().err
    bad = tmp_path / "bad" / "run"
    assert main(["train", "--data", "no-such-corpus", "--out", str(bad)]) == 2
    assert not bad.exists()


def test_train_ends_with_a_sample_and_where_the_run_went(tiny_args, tmp_path, capsys):
    """Without --quiet, `cem train` ends as nanoGPT's sample step does: a short seeded sample, and the run's folder."""
    out = tmp_path / "run"
    assert main(["train", "--data", tiny_args["data"], "--preset", "tiny", "--max-steps", "2", "--batch-size", "2", "--out", str(out),
                 "context=32", "tensorboard=false"]) == 0  # fmt: skip
    stdout = capsys.readouterr().out
    assert "--- a sample (at most 120 tokens" in stdout and f"run: {out} (results.json" in stdout


def test_train_says_what_it_trains_where_and_how_long_with_a_loss_from_the_first_step(tiny_args, tmp_path, monkeypatch, capsys):
    """Issue 61: the start of `cem train` said neither what was trained nor where (that line went to train.log
    only), and the bar had no loss for the first log_every (10) steps."""
    from tqdm import tqdm

    import cem.training.trainer as trainer
    from cem.model import LanguageModel, model_config, parameter_breakdown

    shown = []

    class Bar(tqdm):
        def set_postfix(self, *args, **kwargs):
            shown.append((self.n, kwargs))
            return super().set_postfix(*args, **kwargs)

    monkeypatch.setattr(trainer, "tqdm", Bar)
    out = tmp_path / "run"
    assert main(["train", "--data", tiny_args["data"], "--preset", "tiny", "--max-steps", "8", "--batch-size", "2", "--out", str(out),
                 "context=32", "tensorboard=false"]) == 0  # fmt: skip
    err = capsys.readouterr().err
    n = parameter_breakdown(LanguageModel(model_config("tiny", "cem", vocab_size=257, context=32)))["total"]
    assert f"training cem tiny ({n:,} parameters) on {tiny_args['data']}: 8 steps of 64 tokens (512 tokens) on cpu, into {out}\n" in err
    assert "expected time: about " in err and " s a step over steps 2-6; " in err
    assert shown[0][0] == 0 and "loss" in shown[0][1]  # set after the first step, before the bar counts it
    default = types.SimpleNamespace(budget=types.SimpleNamespace(steps=600))  # `cem train`'s 600 steps at 0.5 s a step
    assert trainer._expected_time(default, 0.5, 6).startswith("expected time: about 5 min more for the 594 steps left (0.50 s a step over steps 2-6;")
    assert trainer._expected_time(default, 0.5, 6).endswith("; a quicker first run: --max-steps 240 (about 2 min here)")
    assert "quicker" not in trainer._expected_time(default, 0.1, 6)  # a minute: no need


def test_resume_of_a_finished_run_says_nothing_to_do_and_loads_no_model(tiny_args, tmp_path, monkeypatch, capsys):
    """Issue 61: `cem train --resume` on a finished run said "nothing to do", then loaded the model and printed
    a sample (a minute on the loaded machine)."""
    import cem.cli as cli

    out = tmp_path / "run"
    assert main(["train", "--data", tiny_args["data"], "--preset", "tiny", "--max-steps", "2", "--batch-size", "2", "--out", str(out),
                 "--quiet", "context=32", "tensorboard=false"]) == 0  # fmt: skip
    capsys.readouterr()
    monkeypatch.setattr(cli, "_load_run", lambda path: pytest.fail("a finished run's model was loaded"))
    assert main(["train", "--out", str(out), "--resume"]) == 0
    captured = capsys.readouterr()
    assert "holds this run, finished (2 steps); nothing to do" in captured.err and "a sample" not in captured.out


def _subcommand(name):
    """The parser of `cem NAME`."""
    return build_parser()._subparsers._group_actions[0].choices[name]


def test_training_flags_are_the_config_fields():
    """`cem train` has a flag for every TrainConfig field, made from the field: its name, type, docstring and
    default in the help, its choices from one place (PARALLEL, PRECISIONS defined once); every flag it had
    still parses; a flag not given is None, so only what is given changes the config."""
    from dataclasses import fields

    from cem.device import PARALLEL, PRECISIONS
    from cem.model.lm import CHECKPOINTING
    from cem.model.memory import PLANNED_PARALLEL, PLANNED_PRECISIONS
    from cem.training import TrainConfig

    train = _subcommand("train")
    flags = {a.dest: a for a in train._actions}
    for f in fields(TrainConfig):
        assert flags[f.name].option_strings[0] == "--" + f.name.replace("_", "-") and flags[f.name].default is None
        assert "default: " in flags[f.name].help, f.name
    assert [flags[name].metavar for name in ("parallel", "precision", "activation_checkpointing")] == [
        "{" + ",".join(choices) + "}" for choices in (PARALLEL, PRECISIONS, CHECKPOINTING)]
    assert TrainConfig.CHOICES["parallel"] is PARALLEL and TrainConfig.CHOICES["precision"] is PRECISIONS
    assert PLANNED_PARALLEL == ("none", *PARALLEL) and set(PLANNED_PRECISIONS) < set(PRECISIONS)
    text = " ".join(train.format_help().split())
    assert "peak learning rate (default: 0.002)" in text and "{auto,bf16,fp32}" in text and "(default: 600 when neither" in text
    for old in ("--preset", "--arch", "--data", "--data-dir", "--tokenizer", "--seed", "--max-steps", "--tokens", "--batch-size", "--grad-accum",
                "--lr", "--seq-len", "--device", "--compile", "--activation-checkpointing", "--config", "--out", "--resume", "--overwrite",
                "--stop-at", "--quiet"):
        assert old in train._option_string_actions, old
    parse = build_parser().parse_args
    run = _run_config(parse(["train", "--batch-size", "3", "--no-tensorboard", "--parallel", "fsdp", "--compile", "lr=1e-3"]))
    assert run.train == TrainConfig(batch_size=3, tensorboard=False, parallel="fsdp", compile=True, lr=1e-3)
    assert _run_config(parse(["train"])).train == TrainConfig()
    with pytest.raises(ValueError, match="unknown parallel 'zero3'; expected one of 'ddp', 'fsdp'"):  # as parallel=zero3 says
        _run_config(parse(["train", "--parallel", "zero3"]))
    # the memory planner's --precision / --parallel are its own, not the run's
    assert _run_config(parse(["info", "--memory", "--precision", "fp32", "--parallel", "fsdp"])).train == TrainConfig()


def test_generate_flags_reach_every_layer_unchanged(monkeypatch, capsys):
    """`cem generate`'s test-time flags are the fields of `Inference`: the one value they make reaches every
    CEM layer unchanged, and each layer runs at it."""
    from dataclasses import fields

    import cem.cli as cli
    from cem.data.tokenizers import ByteTokenizer
    from cem.layers import Inference
    from cem.layers.steps import DescentLayer
    from cem.model import LanguageModel, model_config

    flags = {a.dest: a for a in _subcommand("generate")._actions}
    assert all(flags[f.name].default is None and "default: the model's" in flags[f.name].help for f in fields(Inference))
    model = LanguageModel(model_config("micro", "cem", vocab_size=ByteTokenizer.vocab_size))
    monkeypatch.setattr(cli, "_load_run", lambda path: (model, ByteTokenizer(), None))
    entered, ran = [], set()
    test_time, descend = DescentLayer.test_time, DescentLayer.descend

    def spy_test_time(self, inference=None, **knobs):
        entered.append(inference)
        return test_time(self, inference, **knobs)

    def spy_descend(self, h, hn, direction):
        ran.add((self.sublayer, self.steps, self.adaptive_tol, self.adaptive_rule, self.guard))
        return descend(self, h, hn, direction)

    monkeypatch.setattr(DescentLayer, "test_time", spy_test_time)
    monkeypatch.setattr(DescentLayer, "descend", spy_descend)
    assert main(["generate", "--ckpt", "run", "--max-new-tokens", "2", "--steps", "3", "--mlp-steps", "4", "--adaptive-tol", "0.01",
                 "--adaptive-rule", "update", "--guard", "2"]) == 0
    assert entered == [Inference(steps=3, mlp_steps=4, adaptive_tol=0.01, adaptive_rule="update", guard=2)] * len(model.descent_layers())
    assert ran == {("attn", 3, 0.01, "update", 2), ("mlp", 4, 0.01, "update", 2)}
    assert "at most 4)" in capsys.readouterr().err
    assert {(m.steps, m.adaptive_tol, m.guard) for m in model.descent_layers()} == {(1, None, 0)}


def test_generate_static_flag_gives_the_eager_text(monkeypatch, capsys):
    """`cem generate --static` decodes with the static-shape cache: at temperature 0 the same text as the default."""
    import cem.cli as cli
    from cem.data.tokenizers import ByteTokenizer
    from cem.model import LanguageModel, model_config

    torch.manual_seed(0)
    model = LanguageModel(model_config("micro", "cem", vocab_size=ByteTokenizer.vocab_size))
    monkeypatch.setattr(cli, "_load_run", lambda path: (model, ByteTokenizer(), None))
    texts = []
    for extra in ([], ["--static"]):
        assert main(["generate", "--ckpt", "run", "--prompt", "ab", "--max-new-tokens", "6", "--temperature", "0", *extra]) == 0
        texts.append(capsys.readouterr().out)
    assert texts[0] == texts[1] and len(texts[0]) > 2



COMMANDS = (("train",), ("eval",), ("generate",), ("export",), ("lm-eval",), ("info",), ("data", "prepare"), ("data", "verify"))


def test_every_subcommands_flags_are_documented_dataclass_fields():
    """Each flag and argument of the library's subcommands is a dataclass field (a run's TrainConfig, the test-time
    `Inference`, or a command's `Options`), its help the field's docstring."""
    from dataclasses import fields

    from cem import cli
    from cem.layers import Inference
    from cem.training import TrainConfig

    owners = [TrainConfig, Inference, *(c for c in vars(cli).values() if isinstance(c, type) and issubclass(c, cli.Options) and c is not cli.Options)]
    docs: dict[str, list[str]] = {}
    for c in owners:
        for f in fields(c):
            docs.setdefault(f.name, []).append(cli.field_docs(c)[f.name].split("{}")[0][:20])
    for path in COMMANDS:
        parser = build_parser()
        for name in path:
            parser = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices[name]
        for action in parser._actions:
            if action.dest == "help":
                continue
            assert action.dest in docs, (path, action.dest)
            assert any(action.help.replace("%%", "%").startswith(doc) for doc in docs[action.dest]), (path, action.dest)


def test_info_keys_explains_every_setting(capsys):
    """`cem info --keys`: every training setting and every model key (the flat spellings, with the nested setting
    each sets) with its default, its choices from the registries and its meaning."""
    from cem.layers import KQ_DIAGONALS
    from cem.model import FLAT

    assert main(["info", "--keys"]) == 0
    out = capsys.readouterr().out
    for key in FLAT:
        assert f"\n{key} = " in out
    assert "attn_steps = 1  [attn.recursion.steps]\n    recursion steps T: descent steps of the energy" in out
    assert f"kq_diag = 'shared'  {{{', '.join(KQ_DIAGONALS)}}}  [attn.kq_diag]\n    the diagonal d_k" in out
    assert "position = 'rope'  {rope, alibi}  [attn.position]\n    Llama attention's positions: rope or alibi (CEM attention always uses ALiBi)" in out
    assert "\nlr = 0.002\n    " in out


def test_generate_and_the_sample_stop_at_the_end_of_text_and_never_print_it(monkeypatch, tmp_path, capsys):
    """Issue 61: `cem generate` printed `<|endoftext|>` mid-text (and first of all without a prompt) and went on
    past it. Both it and the end-of-training sample now stop at the end-of-text token and show the text before it."""
    import importlib

    import cem.cli as cli
    from cem.data.tokenizers import EOT_TOKEN, ByteTokenizer
    from cem.model import LanguageModel, model_config

    tokenizer = ByteTokenizer()
    model = LanguageModel(model_config("micro", "cem", vocab_size=tokenizer.vocab_size))
    monkeypatch.setattr(cli, "_load_run", lambda path: (model, tokenizer, None))
    drawn = []

    def sample_next(logits, *args, **kwargs):  # "ok", then the end of text, then "zz" if asked for more
        drawn.append(len(drawn))
        return torch.full(logits.shape[:1], [ord("o"), ord("k"), tokenizer.eot_id, ord("z"), ord("z")][len(drawn) - 1])

    monkeypatch.setattr(importlib.import_module("cem.model.generate"), "sample_next", sample_next)  # the module, not the function `cem.model.generate`
    for prompt, expect in (("say ", "say ok"), ("", "ok")):
        drawn.clear()
        assert main(["generate", "--ckpt", "run", "--prompt", prompt, "--max-new-tokens", "5"]) == 0
        out, err = capsys.readouterr()
        assert out == expect + "\n" and len(drawn) == 3 and "stopped at the end of text after 2 of at most 5 tokens" in err
    drawn.clear()
    cli._show_sample(tmp_path)
    out = capsys.readouterr().out
    assert "up to the end of text" in out and "\nok\n---" in out and EOT_TOKEN not in out and "\ufffd" not in out and len(drawn) == 3



def test_info_shows_no_setting_that_does_nothing(capsys):
    """Issue 61, item 9: a CEM model's resolved config said "position": "rope" although CEM attention always uses
    ALiBi; the nested config shows each sublayer's settings of its kind only (Llama's positions for Llama)."""
    assert main(["info", "--preset", "micro", "--arch", "cem-t2"]) == 0
    shown, _ = json.JSONDecoder().raw_decode(capsys.readouterr().out)
    assert shown["model"]["attn"]["kind"] == "cem" and "position" not in shown["model"]["attn"]
    assert shown["model"]["attn"]["recursion"]["steps"] == 2 and shown["model"]["mlp"]["precond"] == "diag_lowrank"
    assert main(["info", "--preset", "micro", "--arch", "llama-alibi"]) == 0
    shown, _ = json.JSONDecoder().raw_decode(capsys.readouterr().out)
    assert shown["model"]["attn"] == {"kind": "llama", "position": "alibi", "alibi": "standard", "reuse": 1} and "training" not in shown["model"]
