"""The `cem` command line: train, eval, generate, info (also `python -m cem`)."""

from __future__ import annotations

import argparse
import ast
import errno
import inspect
import json
import os
import signal
import sys
import textwrap
import typing
from dataclasses import fields
from pathlib import Path

USER_ERRORS = (ValueError, FileNotFoundError)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows "(default: X)" after every option that has a default of its own and does not state it."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default is None or action.default is False or action.default == argparse.SUPPRESS or "default" in text:
            return text
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """argparse with defaults in the help and usage errors on one line (`cem train: error: ...`, exit 2)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class Terminated(KeyboardInterrupt):
    """SIGTERM outside the training loop (which saves a checkpoint on it instead)."""


def _raise_terminated(signum, frame):
    raise Terminated()


def _one_line(e: BaseException) -> str:
    """An exception as one line: an OSError with its file, a full disk and a file size limit said as such."""
    if isinstance(e, OSError) and not isinstance(e, FileNotFoundError) and e.strerror:
        text = f"{e.strerror}: {e.filename}" if e.filename else e.strerror
        if e.errno == errno.ENOSPC and "space" not in text.lower():
            text = f"no space left on device: {text}"
        if e.errno == errno.EFBIG and "limit" not in text.lower():
            text = f"file size limit (ulimit -f) reached: {text}"
    else:
        text = str(e) or type(e).__name__
    return " ".join(text.split())


def _field_docs(cls) -> dict[str, str]:
    """The docstring under each field of the dataclass `cls` (as litgpt's jsonargparse reads them), by name."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    return {
        field.target.id: " ".join(doc.value.value.split())
        for field, doc in zip(body, body[1:])
        if isinstance(field, ast.AnnAssign) and isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)
    }


def _add_field_flags(p, cls, names: tuple[str, ...] | None = None, defaults: dict[str, str] | None = None) -> None:
    """A flag for each field of the dataclass `cls` (those in `names`): `--field-name`, of the field's type (a
    bool: --x / --no-x), its choices (`cls.CHOICES`) shown as argparse shows them, and its docstring as help,
    followed by the default it does not state itself (`defaults[name]`, else the field's). A flag not given
    is None: only what is given changes a setting; the dataclass checks the value (one message for a flag
    and a key=value setting)."""
    docs, hints, choices = _field_docs(cls), typing.get_type_hints(cls), getattr(cls, "CHOICES", {})
    for f in fields(cls):
        if names is not None and f.name not in names:
            continue
        kind = next(t for t in typing.get_args(hints[f.name]) or (hints[f.name],) if t is not type(None))
        text = docs[f.name] if "default" in docs[f.name] else f"{docs[f.name]} (default: {(defaults or {}).get(f.name, f.default)})"
        how = {"action": argparse.BooleanOptionalAction} if kind is bool else {"type": kind}
        if f.name in choices:
            how["metavar"] = "{" + ",".join(choices[f.name]) + "}"
        p.add_argument("--" + f.name.replace("_", "-"), dest=f.name, help=text.replace("%", "%%"), **how)


def _given(args, cls) -> dict:
    """The fields of the dataclass `cls` as the command line gave them (None: not given), by name."""
    return {f.name: getattr(args, f.name, None) for f in fields(cls)}


RUN_FIELDS = ("preset", "arch", "data", "data_dir", "tokenizer")  # what a run is (train and info)


def _add_run_args(p: argparse.ArgumentParser, names: tuple[str, ...] | None = RUN_FIELDS, defaults: dict[str, str] | None = None) -> None:
    """The training settings' flags (`names` of them; None: all), a YAML file and key=value settings."""
    from .training import TrainConfig

    _add_field_flags(p, TrainConfig, names, defaults)
    p.add_argument("--config", help="a YAML file of settings (flat keys or train:/model: sections)")
    p.add_argument("overrides", nargs="*", help="key=value settings, e.g. lr=1e-3 attn_steps=2 kq_diag=per_head (every training "
                   "setting, and the model's: `cem info --keys`)")


def _run_config(args, base=None):
    from .training import TrainConfig, load_run_config

    return load_run_config(args.config, args.overrides, base=base, **_given(args, TrainConfig))


def _recorded_config(out: Path):
    """The config a run directory recorded (run.json), None if it has none."""
    from .training import RunDir

    return RunDir(out).recorded_config() if out.is_dir() else None


def _check_named(flag: str, value: str | None, instead: str) -> None:
    """ValueError for a path or name given as empty text (`--out ''`), which would mean the current folder or a default."""
    if value is not None and not value.strip():
        raise ValueError(f"{flag} is empty: {instead}")


def _seeds(text: str) -> tuple[int, ...]:
    """--seeds "0,1,2": distinct integers >= 0."""
    try:
        seeds = tuple(int(s) for s in text.split(","))
    except ValueError:
        raise ValueError(f"--seeds must be comma-separated integers, e.g. 0,1,2; got {text!r}") from None
    if not seeds or min(seeds) < 0 or max(seeds) >= 2**63 or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds must be distinct integers in [0, 2**63), got {text!r}")
    return seeds


def cmd_train(args) -> int:
    from .training import Interrupted, NothingToDo, train
    from .training.budget import with_default_steps
    from .training.rundir import default_run_dir

    _check_named("--out", args.out, "give a folder, or leave --out out for the default runs/NAME")
    if args.resume and args.overwrite:
        raise ValueError("--resume continues a run and --overwrite deletes it: give one of them")
    out = Path(args.out) if args.out else None
    base = _recorded_config(out) if out is not None and args.resume else None
    run = _run_config(args, base)  # with --resume: the run's own settings, changed only by what is given
    t = run.train
    if args.stop_at is not None and args.stop_at < 1:
        raise ValueError(f"--stop-at must be a step >= 1, got {args.stop_at}")
    with_default_steps(t)
    if Path(t.data).expanduser().exists():  # a local corpus: recorded by its absolute path, usable from anywhere
        t.data = str(Path(t.data).expanduser().resolve())
    out = out or default_run_dir(run)
    if args.resume and _recorded_config(out) is None:  # a typo must not start a fresh run
        raise ValueError(f"--resume: {out} holds no run (no run.json); check the folder, or drop --resume to start one there")
    result = train(run, out, resume=args.resume, progress=not args.quiet, stop_at=args.stop_at, overwrite=args.overwrite)
    if isinstance(result, Interrupted):
        return 128 + result.signum if result.signum else 0
    if int(os.environ.get("RANK", "0")) == 0:
        if args.quiet:
            print(json.dumps({k: result[k] for k in ("test_loss", "test_perplexity", "test_bits_per_byte")}))
        elif not isinstance(result, NothingToDo):  # a run finished before: the trainer said so, nothing more to show
            _show_sample(out)
    return 0


SAMPLE_TOKENS = 120


def _show_sample(out: Path) -> None:
    """A short sample from the trained model (seeded, temperature 0.8), and where the run went."""
    import torch

    model, tokenizer, _ = _load_run(str(out))
    if tokenizer is None or tokenizer.vocab_size != model.config.vocab_size:
        return
    prompt = tokenizer.encode("\n") or [tokenizer.eot_id]
    ids = model.generate(torch.tensor(prompt), SAMPLE_TOKENS, temperature=0.8, top_p=0.95, generator=torch.Generator().manual_seed(0),
                         eos_id=tokenizer.eot_id)
    text, ended = _sampled_text(tokenizer, [], ids[len(prompt):].tolist())
    print(f"--- a sample (at most {SAMPLE_TOKENS} tokens, temperature 0.8, top-p 0.95{', up to the end of text' if ended else ''}; "
          f"more with: cem generate --ckpt {out})\n{text}\n---")
    print(f"run: {out} (results.json, metrics.jsonl, ckpt/, tokenizer/); cem eval --ckpt {out} | cem export {out} OUT")


def _sampled_text(tokenizer, prompt: list[int], sampled: list[int]) -> tuple[str, bool]:
    """The text of `prompt` and the `sampled` ids up to the first end-of-text (not shown), and whether there was one."""
    ended = tokenizer.eot_id in sampled
    return tokenizer.decode(prompt + (sampled[: sampled.index(tokenizer.eot_id)] if ended else sampled)), ended


def _load_run(path: str):
    """Model and tokenizer of a run directory (its checkpoint) or of a saved model directory."""
    from .training import RunDir

    run = RunDir(path)
    return run.load_model(), run.load_tokenizer(), run


def _check_tokenizer(model, tokenizer, run, what: str) -> None:
    if tokenizer is None:
        raise ValueError(f"{run.path} has no tokenizer/ directory; {what} a run directory written by `cem train`")
    if tokenizer.vocab_size != model.config.vocab_size:
        raise ValueError(f"vocabulary mismatch: tokenizer has {tokenizer.vocab_size} symbols, model {model.config.vocab_size}")


def cmd_eval(args) -> int:
    from .data.tokenshards import token_split
    from .model import parameter_breakdown
    from .device import autocast_for, pick_device
    from .training.evaluate import evaluate

    device = pick_device(args.device)
    model, tokenizer, run = _load_run(args.ckpt)
    _check_tokenizer(model, tokenizer, run, "evaluate")
    if args.seq_len is not None and args.seq_len < 1:
        raise ValueError(f"--seq-len must be >= 1, got {args.seq_len}")
    if args.batch_size is not None and args.batch_size < 1:
        raise ValueError(f"batch_size (--batch-size) must be >= 1, got {args.batch_size}")
    e = run.eval_settings(model.config.context, args.data, args.data_dir, args.seq_len, args.batch_size)
    split = token_split(e.data, tokenizer, e.tokenizer, args.split, e.data_dir, e.encoding)
    metrics = evaluate(model.to(device), split, e.seq_len, e.batch_size, device, args.max_batches, autocast_for(e.precision, device),
                       progress=not args.json, desc=f"{e.data} {args.split}")
    metrics = {"data": e.data, "split": args.split, **metrics, "parameters": parameter_breakdown(model)}
    if args.json:
        print(json.dumps(metrics))
    else:
        print(f"{e.data} {args.split}: loss {metrics['loss']:.4f}, perplexity {metrics['perplexity']:.2f}, bits per byte {metrics['bits_per_byte']:.4f} ({metrics['tokens']} tokens)")
    return 0


def cmd_generate(args) -> int:
    import torch

    from .device import pick_device
    from .layers import Inference

    device = pick_device(args.device)
    inference = Inference(**_given(args, Inference))
    model, tokenizer, run = _load_run(args.ckpt)
    _check_tokenizer(model, tokenizer, run, "generate from")
    if not 0 <= args.seed < 2**63:
        raise ValueError(f"--seed must be in [0, 2**63), got {args.seed}")
    try:
        prompt = tokenizer.encode(args.prompt)
    except UnicodeEncodeError as e:  # argv bytes that are not UTF-8 arrive as lone surrogates
        raise ValueError(f"--prompt is not valid UTF-8 text (character {e.object[e.start:e.end]!r} at {e.start})") from None
    gen = torch.Generator(device).manual_seed(args.seed)
    model.reset_steps_used()
    most = max((inference.depth(m.sublayer) or m.steps for m in model.descent_layers()), default=0)
    ids = prompt or [tokenizer.eot_id]  # no prompt: continue from the start of a document
    out = model.to(device).generate(torch.tensor(ids, device=device), args.max_new_tokens, args.temperature, args.top_k, args.top_p,
                                     generator=gen, inference=inference, static=args.static, compile=args.compile, eos_id=tokenizer.eot_id)
    sampled = out[len(ids):].tolist()
    text, ended = _sampled_text(tokenizer, prompt, sampled)
    print(text)
    if ended:
        print(f"stopped at the end of text after {sampled.index(tokenizer.eot_id)} of at most {args.max_new_tokens} tokens", file=sys.stderr)
    used = model.steps_used()
    adaptive = inference.adaptive_tol if inference.adaptive_tol is not None else model.config.adaptive_tol
    if adaptive is not None and used["all"] is not None:
        print(f"adaptive steps: {used['all']:.2f} per position and CEM layer on average (attention {used['attn'] or 0:.2f}, "
              f"MLP {used['mlp'] or 0:.2f}; at most {most})", file=sys.stderr)
    return 0


def cmd_lm_eval(args) -> int:
    from .device import pick_device

    try:
        from .hf.harness import harness_evaluate
        import lm_eval.models.huggingface  # noqa: F401 - lm-eval's HFLM, and accelerate
    except ImportError as e:  # before the run loads: the eval extra names what is missing
        raise ValueError(f"cem lm-eval needs the eval extra ({(e.name or getattr(e.__cause__, 'name', None) or 'a package').split('.')[0]} is missing): "
                         "pip install -e '.[eval]' in the cem clone") from None

    model, tokenizer, run = _load_run(args.run)
    _check_tokenizer(model, tokenizer, run, "evaluate")
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not tasks:
        raise ValueError("--tasks is empty: name one or more lm-eval tasks, e.g. cem_local_text,cem_local_choice")
    for name, value in (("--limit", args.limit), ("--batch-size", args.batch_size)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if args.num_fewshot is not None and args.num_fewshot < 0:
        raise ValueError(f"--num-fewshot must be >= 0, got {args.num_fewshot}")
    device = str(pick_device(args.device))
    results = harness_evaluate(model, tokenizer, tasks, args.limit, args.batch_size, device, args.num_fewshot)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for task, metrics in results.items():
            print(f"{task}: " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items()))
    return 0


def cmd_export(args) -> int:
    try:
        from .hf import export_hf
        from .hf.llama_export import is_plain_llama
    except ImportError as e:
        raise ValueError(str(e)) from None

    _check_named("OUT", args.out, "name the folder to export into")
    model, tokenizer, run = _load_run(args.run)
    _check_tokenizer(model, tokenizer, run, "export")
    if run.holds(args.out) is not None:
        raise ValueError(f"cannot export into {args.out}: it is, or lies in, {run.holds(args.out)} of the run being exported; choose another output folder")
    out = Path(args.out)
    if out.is_symlink():
        raise ValueError(f"cannot export into {out}: it is a symbolic link; refusing to write through it (name a real folder)")
    if out.exists() and not out.is_dir():
        raise ValueError(f"cannot export into {out}: it is a file; name a folder")
    if out.is_dir() and any(out.iterdir()) and not (out / "config.json").is_file():
        raise ValueError(f"cannot export into {out}: it holds other files and no earlier export (no config.json); name a new or empty folder")
    from safetensors import SafetensorError

    try:
        out = export_hf(model, args.out, tokenizer=tokenizer, format="llama" if args.format == "llama" else "auto", remote_code=args.remote_code)
    except (OSError, SafetensorError) as e:  # a full disk, a file size limit, a folder not writable
        raise OSError(f"could not write the export into {args.out} ({_one_line(e)}); the folder was left as it was") from None
    kind = "LlamaForCausalLM format" if is_plain_llama(model) else f"CEM format: the model loads after `import cem.hf`, as {out / 'README.md'} says"
    print(f"exported {run.path} to {out} ({kind}); load it with AutoTokenizer / AutoModelForCausalLM.from_pretrained")
    return 0


def _info_vocab(args, run) -> tuple[int, str]:
    """The vocabulary `cem info` counts and plans for, and where it comes from: --vocab; with --memory, the paper's
    Llama tokenizer for the paper's sizes on the default byte tokenizer; else the run's tokenizer's."""
    from .model.config import SIZES
    from .training.config import LLAMA_VOCAB

    if args.mem_vocab is not None:
        return args.mem_vocab, "--vocab"
    if args.memory and "vocab_size" not in SIZES[run.train.preset] and run.train.tokenizer == "byte" and "vocab_size" not in run.model_overrides:
        return LLAMA_VOCAB, f"assumed: the paper's Llama tokenizer, for the paper's size {run.train.preset}; --vocab N plans another"
    return run.vocab_hint(), f"the run's tokenizer, {run.train.tokenizer}; --vocab N counts another"


def cmd_info(args) -> int:
    import torch

    from .model import LanguageModel, format_breakdown, model_config, parameter_breakdown
    from .model.flops import train_flops_per_token

    if args.keys:
        from dataclasses import fields

        from .model import ModelConfig
        from .training import TrainConfig

        for cls in (TrainConfig, ModelConfig):
            print(f"# {cls.__name__}")
            for f in fields(cls):
                print(f"{f.name} = {f.default!r}")
        return 0
    if args.memory:  # the planner's own flags, each named (before the run's config, which --vocab sizes)
        from .checks import check_finite, check_positive_int
        from .model.config import MAXIMA

        check_finite("--device-gib (--device-gb)", args.device_gib, 0, low_open=True)
        for flag, value, high in (("--batch", args.mem_batch, None), ("--seq", args.mem_seq, MAXIMA["context"]),
                                  ("--vocab", args.mem_vocab, MAXIMA["vocab_size"]), ("--gpus", args.gpus, None)):
            if value is not None:
                check_positive_int(flag, value, high)
    run = _run_config(args)
    vocab, vocab_source = _info_vocab(args, run)
    cfg = run.model(vocab)
    if args.memory:  # the answer first, then what it was worked out for
        _print_memory_plan(args, run, cfg)
    print(json.dumps({"train": run.to_dict()["train"], "model": cfg.to_dict()}, indent=2))
    rows = {}
    for name, c in (("llama", model_config(run.train.preset, "llama", vocab_size=vocab, context=cfg.context)), (run.train.arch, cfg)):
        with torch.device("meta"):
            rows[name] = parameter_breakdown(LanguageModel(c))
    print(f"note: vocabulary {vocab:,} ({vocab_source})")
    print(format_breakdown(rows))
    print(f"training FLOPs per token: {train_flops_per_token(cfg):,}")
    return 0


def _print_memory_plan(args, run, cfg) -> None:
    """`cem info --memory`: the predicted peak and whether it fits, then what it was counted for and its terms."""
    from .model.memory import depth_note, format_answer, format_plan, other_backend, path_note, plan_memory

    batch = args.mem_batch if args.mem_batch is not None else run.train.batch_size
    seq = args.mem_seq if args.mem_seq is not None else (run.train.seq_len or cfg.context)
    parallel = args.mem_parallel or ("ddp" if args.gpus > 1 else "none")
    checkpointing = args.checkpointing or run.train.activation_checkpointing
    if seq > cfg.context:
        print(f"cem info: warning: --seq {seq} exceeds the model's context ({cfg.context:,}): planned as if trained with context={seq}", file=sys.stderr)
    planned = cfg.replace(context=max(cfg.context, seq))
    plan = plan_memory(planned, batch, seq, args.mem_precision, args.gpus, parallel, checkpointing)
    alt = other_backend(planned)  # the attention path a machine without triton counts: its figure beside this one
    other = plan_memory(planned, batch, seq, args.mem_precision, args.gpus, parallel, checkpointing, backend=alt) if alt else None
    print(format_answer(plan, args.device_gib))
    print(f"  for batch {batch} x {seq} tokens, vocabulary {planned.vocab_size:,}, {args.mem_precision}, {args.gpus} device(s), "
          f"parallel {parallel}, checkpointing {checkpointing}, in GiB (2^30 bytes; cem.model.memory)")
    for note in (depth_note(planned), path_note(planned, plan, other)):
        if note:
            print(f"  {note}")
    print(format_plan(plan))


def cmd_data_prepare(args) -> int:
    from .data.prepare import prepare
    from .data.local import UndecodableText
    from .data.tokenshards import parse_tokens, prepare_shards

    if args.tokenizer is None:
        if args.encoding != "utf-8" or args.doc_separator is not None:
            raise ValueError("--encoding and --doc-separator apply to the token shards of a local corpus (with --tokenizer)")
        print(prepare(args.name, args.data_dir, source=args.source, force=args.force))
        return 0
    from .checks import check_nonnegative_int
    from .data.tokenizers import check_spec

    _check_named("--tokenizer", args.tokenizer, "give byte, bpe:N or a tokenizer")
    check_spec(args.tokenizer)
    _check_named("--out", args.out, "give a folder, or leave --out out for the default under the data directory")
    if args.out and Path(args.out).exists() and not Path(args.out).is_dir() and not Path(args.out).is_symlink():  # a link: refused as one
        raise ValueError(f"--out {args.out} is a file; name a folder for the token shards")
    if args.workers is not None:
        check_nonnegative_int("--workers", args.workers)
    tokens = {k: parse_tokens(getattr(args, k), "--" + k.replace("_", "-")) for k in ("tokens", "held_out_tokens", "shard_tokens")}
    if args.doc_separator == "":
        raise ValueError("--doc-separator is empty (leave it out for blank lines)")
    separator = None if args.doc_separator is None else args.doc_separator.replace("\\n", "\n").replace("\\t", "\t")
    try:
        print(prepare_shards(args.name, args.tokenizer, args.out, tokens=tokens["tokens"], held_out_tokens=tokens["held_out_tokens"],
                             shard_tokens=tokens["shard_tokens"], workers=args.workers, data_dir=args.data_dir,
                             encoding=args.encoding, separator=separator))
    except UndecodableText as e:
        raise e.with_flag("--encoding") from None
    return 0


def cmd_data_verify(args) -> int:
    """Each file checked against its manifest's sha256, one line each, then a summary; exit 1 if one is not intact."""
    from .data.tokenshards import MANIFEST as SHARDS_MANIFEST, verify_shards
    from .io import read_json
    from .training.checkpoint import MANIFEST as CKPT_MANIFEST, checkpoint_problems

    checked = []
    for folder in map(Path, args.folders):
        if not folder.is_dir():
            raise FileNotFoundError(f"{folder}: no such folder (give a token-shard folder, a run folder or a checkpoint folder)")
        manifest = folder / SHARDS_MANIFEST
        if manifest.is_file() and "settings" in read_json(manifest):  # a checkpoint's manifest has none (`verify_shards` checks the rest)
            checked += verify_shards(folder)
            continue
        checkpoints = [folder] if (folder / CKPT_MANIFEST).is_file() else [c for c in (folder / "ckpt", folder / "ckpt.old") if c.is_dir()]
        if not checkpoints:
            raise ValueError(f"{folder} is neither a token-shard folder, a run folder with a checkpoint (ckpt/) nor a checkpoint folder")
        for ckpt in checkpoints:
            checked += checkpoint_problems(ckpt)
    bad = [(path, problem) for path, problem in checked if problem]
    for path, problem in checked:
        print(f"{'ok ' if problem is None else 'BAD'} {path}" + (f": {problem}" if problem else ""))
    if bad:
        print(f"cem data verify: {len(bad)} of {len(checked)} files are not what their manifest records", file=sys.stderr)
        return 1
    print(f"verified {len(checked)} files (sha256 against their manifests): all intact")
    return 0


def _experiments():
    try:
        import cem.experiments as experiments
    except ImportError as e:
        raise ValueError(f"experiments need the experiments extra ({e.name} is missing): pip install -e '.[experiments]' in the cem clone") from None
    return experiments


def cmd_experiment(args) -> int:
    ex = _experiments()
    run_suite, write_report = ex.run_suite, ex.write_report
    from .checks import check_positive_int

    _check_named("--results", args.results, "give a folder, or leave --results out for the default results/SCALE")
    _check_named("--processor", args.processor, "give a processor's name as its runs record it, or leave --processor out")
    if args.jobs is not None:
        check_positive_int("--jobs", args.jobs)
    ids = None if args.id == "all" else tuple(args.id.split(","))  # all: the scale's suite
    overrides = {}
    if args.seeds:
        seeds = _seeds(args.seeds)
        overrides.update(seeds=seeds, recursion_seeds=seeds)
    if args.rehearse:
        overrides.update(ex.rehearsal(ex.get_scale(args.scale)))
    if args.processor:
        overrides.update(processor=args.processor)
    results = args.results or f"results/{args.scale}" + ("-rehearsal" if args.rehearse else "")
    if args.device not in (None, "auto"):
        from .device import pick_device

        pick_device(args.device)  # an unknown device is refused before any run starts
    if Path(results).exists() and not Path(results).is_dir():
        raise ValueError(f"--results {results} is a file; name a folder for the results")
    if args.plan:
        print(ex.format_plan(ex.plan(args.scale, results, ids, **overrides)))
        return 0
    if args.analyse_only:
        summaries, waiting = ex.analyse_finished(args.scale, results, args.data_dir, ids, args.device, **overrides)
        for i, what in waiting.items():
            print(f"{i}: not analysed, waiting for {what}")
        _print_findings(ex, args.scale, summaries)
        if not summaries:
            print(f"no experiment has all its runs finished in {results}: no report written")
            return 0
        print(f"report: {write_report(results, allow_short=args.allow_short or args.rehearse)}")
        return 0
    options = {k: v for k, v in (("slurm_partition", args.partition), ("timeout_min", args.time_min), ("gpus_per_node", args.gpus_per_run),
                                 ("cpus_per_task", args.cpus_per_run)) if v is not None}
    from .experiments.costs import Deadline, DeadlineReached

    until = Deadline.parse(args.until) if args.until else None
    launcher = ex.make_launcher(args.launcher, args.jobs, args.devices, args.nproc_per_run, Path(results) / ".submitit", until,
                                **options, **ex.slurm_options(args.slurm_option))
    try:
        summaries = run_suite(args.scale, results, args.data_dir, launcher.jobs, ids, args.device, launcher, **overrides)
    except DeadlineReached as e:  # the runs that fitted have finished: an orderly stop, no report until all are in
        print(e)
        return 0
    _print_findings(ex, args.scale, summaries)
    # the smoke scale's and a rehearsal's runs are short by design (a few steps): the report says so in its first line
    short = args.allow_short or args.rehearse or not ex.get_scale(args.scale).findings
    print(f"report: {write_report(results, allow_short=short)}")
    return 0


def _print_findings(ex, scale: str, summaries: list[dict]) -> None:
    from .experiments.report import pipeline_check

    for summary in summaries:
        for f in summary["findings"]:  # a scale that never speaks (smoke): differences as pipeline checks, no verdicts
            print(f"{summary['experiment']}: [{f['verdict']}] {f['claim']} -- {f['evidence']}" if ex.get_scale(scale).findings
                  else f"{summary['experiment']}: pipeline check: {pipeline_check(f)}")


def cmd_report(args) -> int:
    print(_experiments().write_report(args.results_dir, allow_short=args.allow_short))
    return 0


def _version() -> str:
    try:
        from importlib.metadata import version

        return f"cem-transformers {version('cem-transformers')}"
    except Exception:  # not installed (run from a source tree)
        from . import __version__

        return f"cem-transformers {__version__}"


def build_parser() -> argparse.ArgumentParser:
    from .layers import Inference
    from .model.lm import CHECKPOINTING
    from .model.memory import PLANNED_PARALLEL, PLANNED_PRECISIONS
    from .training import TrainConfig
    from .training.budget import DEFAULT_STEPS

    docs = _field_docs(TrainConfig)
    device_help = docs["device"]

    parser = _Parser(prog="cem", description="Causal Energy Minimization language models")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True)  # subcommands are _Parser too

    p = sub.add_parser("train", help="train a model (no arguments: a small CEM model on the embedded shakespeare corpus, minutes on a CPU)",
                       description="Train a model. Running the same command again: an unfinished run needs --resume, "
                       "a finished one is left as it is (exit 0), or extended from its last checkpoint when asked for more "
                       "steps; --overwrite starts again.")
    _add_run_args(p, None, {"max_steps": f"{DEFAULT_STEPS} when neither this nor --tokens is given"})
    p.add_argument("--out", help="run directory (default: runs/ARCH-PRESET-DATA-sSEED plus every non-default setting as key=value)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint, with the settings it recorded (an error if the folder holds no run)")
    p.add_argument("--overwrite", action="store_true", help="remove what --out holds (run.json, checkpoints, metrics, results) and start again")
    p.add_argument("--stop-at", type=int, dest="stop_at", help="stop after this step with a checkpoint (schedule unchanged)")
    p.add_argument("--quiet", action="store_true", help="no progress bar; print the final metrics as JSON")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("eval", help="evaluate a trained run on a split (its own corpus, sequence length and batch size)")
    p.add_argument("--ckpt", required=True, help="run directory written by `cem train`")
    p.add_argument("--data", help="corpus (default: the run's)")
    p.add_argument("--data-dir", help="data directory (default: the run's, else as for train)")
    p.add_argument("--split", default="test", choices=("train", "valid", "test"), help="split to evaluate")
    p.add_argument("--batch-size", type=int, dest="batch_size", help="sequences per batch (default: the run's)")
    p.add_argument("--seq-len", type=int, dest="seq_len", help="sequence length (default: the run's)")
    p.add_argument("--max-batches", type=int, dest="max_batches", help="stop after this many batches (default: the whole split)")
    p.add_argument("--device", default="auto", help=device_help)
    p.add_argument("--json", action="store_true", help="print the metrics as one JSON line")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("generate", help="sample text from a trained run (past the context: a window of the latest tokens)")
    p.add_argument("--ckpt", required=True, help="run directory written by `cem train`")
    p.add_argument("--prompt", default="", help="text to continue")
    p.add_argument("--max-new-tokens", type=int, default=200, dest="max_new_tokens", help="tokens to sample")
    p.add_argument("--temperature", type=float, default=0.8, help="sampling temperature (0: greedy)")
    p.add_argument("--top-k", type=int, default=None, dest="top_k", help="sample among the k likeliest tokens (default: all)")
    p.add_argument("--top-p", type=float, default=0.95, dest="top_p", help="nucleus sampling mass")
    _add_field_flags(p, Inference, defaults={f.name: "the model's" for f in fields(Inference)})
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--device", default="auto", help=device_help)
    p.add_argument("--static", action="store_true", help="decode with a static-shape cache (fixed buffers, masked by position)")
    p.add_argument("--compile", action="store_true", help="static, and each decoding step compiled (CUDA graphs on a GPU; fixed steps only)")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("export", help="write a run as a Hugging Face model directory (AutoTokenizer, AutoModelForCausalLM, pipeline)")
    p.add_argument("run", help="run directory written by `cem train`")
    p.add_argument("--format", default="hf", choices=("hf", "llama"),
                   help="hf: LlamaForCausalLM for a plain Llama, else the CEM format (needs cem-transformers where it is "
                   "loaded); llama: LlamaForCausalLM, an error for other models")
    p.add_argument("--remote-code", dest="remote_code", action="store_true",
                   help="CEM format: also write a modeling_cem.py shim and auto_map, for `trust_remote_code=True` without "
                   "`import cem.hf` (then AutoTokenizer asks to run that code too); default: no code in the folder")
    p.add_argument("out", help="output directory")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("lm-eval", help="score a trained run with lm-evaluation-harness tasks (offline: cem_local_text, cem_local_choice)")
    p.add_argument("run", help="run directory written by `cem train`")
    p.add_argument("--tasks", required=True, help="comma-separated lm-eval tasks: the local cem_local_text, cem_local_choice "
                   "(shipped with cem, offline) or any of lm-eval's (downloaded by lm-eval)")
    p.add_argument("--limit", type=int, default=None, help="at most this many documents per task")
    p.add_argument("--num-fewshot", type=int, default=None, dest="num_fewshot", help="few-shot examples (default: the task's)")
    p.add_argument("--batch-size", type=int, default=8, dest="batch_size", help="sequences per batch (default 8)")
    p.add_argument("--device", default="auto", help=device_help)
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(func=cmd_lm_eval)

    p = sub.add_parser("data", help="prepare the named corpora")
    data_sub = p.add_subparsers(dest="data_command", required=True)
    from .data.prepare import PREPARABLE

    p = data_sub.add_parser("prepare", help="fetch a named corpus into the data directory (Hugging Face datasets or its canonical file), "
                            "or with --tokenizer write the token shards of a corpus of any size")
    p.add_argument("name", help=f"the corpus: {', '.join(PREPARABLE)}; with --tokenizer: hf:NAME[:CONFIG] or a local file or folder")
    p.add_argument("--tokenizer", help="write token shards with this tokenizer (byte, bpe:N trained on the corpus' first 50M characters, a tokenizer folder or Hugging Face name)")
    p.add_argument("--tokens", help="token shards: training tokens to write, e.g. 2.7e9 (default: the whole corpus; hf: needs it)")
    p.add_argument("--held-out-tokens", dest="held_out_tokens", help="token shards: at most this many valid and test tokens each "
                   "(default: 1%% of --tokens, at least 1e6)")
    p.add_argument("--shard-tokens", dest="shard_tokens", default="1e8", help="token shards: tokens per shard file (default 1e8)")
    p.add_argument("--workers", type=int, help="token shards: tokenising processes (default: the CPU count)")
    p.add_argument("--out", help="token shards: the folder (default: <data dir>/shards/<corpus>--<tokenizer>-<hash>, where cem train finds them)")
    p.add_argument("--data-dir", dest="data_dir", help="where to put it (default $CEM_DATA_DIR, else ~/.cache/cem/data, where every command looks)")
    p.add_argument("--from", dest="source", help="copy the files from this local folder (same layout) instead of downloading")
    p.add_argument("--force", action="store_true", help="fetch again even if the corpus is already there")
    p.add_argument("--encoding", default="utf-8", help="token shards: the encoding of local .txt/.jsonl files (default utf-8; "
                   "text that does not decode is refused)")
    p.add_argument("--doc-separator", dest="doc_separator", help="token shards: the text that ends a document in local .txt "
                   "files, e.g. '<|endoftext|>' (\\n for a line end; default: blank lines, and a folder's file of at most 1 MB is one document)")
    p.set_defaults(func=cmd_data_prepare)

    p = data_sub.add_parser("verify", help="check every file of token-shard folders, run folders (their checkpoints) or checkpoint "
                            "folders against the sha256 its manifest records; exit 1 if one is missing or altered")
    p.add_argument("folders", nargs="+", metavar="DIR", help="a token-shard folder (cem data prepare --tokenizer), a run folder or a checkpoint folder")
    p.set_defaults(func=cmd_data_verify)

    try:
        from .experiments import ALL_IDS, LAUNCHERS, SCALES
        from .experiments.costs import DEADLINE_MARGIN

        margin = f"times {DEADLINE_MARGIN:g}"
    except ImportError:  # the experiments extra (scipy, matplotlib) is not installed
        ALL_IDS, SCALES, LAUNCHERS = ("see docs/experiments.md",), ("smoke", "cpu", "gpu", "paper"), ("process", "local", "slurm")
        margin = "with a margin"

    p = sub.add_parser("experiment", help="run the paper's experiments (one, several, or 'all') at a scale, then write the report")
    p.add_argument("id", help=f"an experiment, a comma-separated list, or all: {', '.join(ALL_IDS)}")
    p.add_argument("--scale", default="cpu", choices=tuple(SCALES), help="cpu, gpu and paper follow the paper's budget; smoke is a few steps (default cpu)")
    p.add_argument("--results", help="results directory (default results/SCALE); finished runs there are skipped")
    p.add_argument("--data-dir", dest="data_dir", help=docs["data_dir"])
    p.add_argument("--jobs", type=int, help="runs trained at once (CPU: processes sharing the cores; default: one per device group "
                                            "with --devices, else 1); with --launcher slurm, the jobs in the queue at once")
    p.add_argument("--devices", help="device ids shared out to the jobs, --nproc-per-run to a group, e.g. 0,1,2,3 (default with --jobs "
                                     "or --nproc-per-run above 1 on a CUDA machine: its visible devices; each job sees only its group)")
    p.add_argument("--nproc-per-run", dest="nproc_per_run", type=int, default=1,
                   help="processes per run, under torchrun's launcher (DDP, the same global batch; default 1)")
    p.add_argument("--launcher", default="process", choices=tuple(LAUNCHERS),
                   help="where runs train: process (this machine, default), local or slurm (each run a submitit job, needs "
                        "the cluster extra; job files in RESULTS/.submitit)")
    p.add_argument("--partition", help="slurm: the partition")
    p.add_argument("--time-min", dest="time_min", type=int, help="local, slurm: a job's time limit in minutes (default 1440; a job "
                                                                   "timed out is requeued and resumes from its checkpoint)")
    p.add_argument("--gpus-per-run", dest="gpus_per_run", type=int, help="slurm: GPUs per job (default --nproc-per-run; 0 on a CPU cluster)")
    p.add_argument("--cpus-per-run", dest="cpus_per_run", type=int, help="local, slurm: CPUs per job")
    p.add_argument("--slurm-option", dest="slurm_option", action="append", default=[], metavar="KEY=VALUE",
                   help="slurm: another sbatch setting, as submitit names it (e.g. account=ABC, qos=high, constraint=h100); repeatable")
    p.add_argument("--seeds", help="comma-separated seeds for every experiment (default: the scale's)")
    p.add_argument("--until", metavar="WHEN", help="start no run that would not finish by WHEN (HH:MM, the next such time, or an ISO date and "
                                                   f"time), its time estimated as --plan's, {margin}; the runs that fit train, then "
                                                   "the command stops and says what is left (run it again to go on)")
    p.add_argument("--device", default="auto", help="device of the analyses that evaluate trained models: " + device_help)
    p.add_argument("--allow-short", action="store_true", dest="allow_short",
                   help="write the report even if runs are short of the Chinchilla budget (its first line says so)")
    p.add_argument("--plan", action="store_true", help="only say what would be trained and evaluated, per experiment, and an estimate of the time")
    p.add_argument("--analyse-only", action="store_true", dest="analyse_only",
                   help="train and evaluate nothing: analyse the experiments whose runs have all finished (under the paper's rate rule "
                        "at least; a rule still waiting is named in the report) and write the report; say what the others wait for")
    p.add_argument("--processor", help="train only on this processor, named as its runs record it (a GPU's name; a CPU's model name with its family, "
                                       "e.g. 'AMD EPYC (AuthenticAMD family 25 model 17 stepping 1)': elsewhere the refusal names the machine's): "
                                       "refuse elsewhere, and train again any finished run recorded on another, so that no pair of runs crosses processors")
    p.add_argument("--rehearse", action="store_true",
                   help="the suite in shape (corpus, sizes, learning-rate sweeps, seeds, analyses, report) at 3 steps per run, into "
                        "results/SCALE-rehearsal unless --results: finds a pipeline error in minutes, before a suite of hours; never findings")
    p.set_defaults(func=cmd_experiment)

    p = sub.add_parser("report", help="write RESULTS_DIR/report.md from experiment results")
    p.add_argument("results_dir", help="a results directory written by `cem experiment`")
    p.add_argument("--allow-short", action="store_true", dest="allow_short", help="accept runs short of the Chinchilla budget (the report's first line says so); the smoke scale's "
                   "report needs none: a pipeline check, without verdicts")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("info", help="print the resolved config and the parameter breakdown")
    _add_run_args(p)
    p.add_argument("--keys", action="store_true", help="list every setting with its default")
    m = p.add_argument_group("memory planner (--memory): predicted peak training memory per device")
    m.add_argument("--memory", action="store_true", help="also print the predicted training memory per device and whether it fits")
    m.add_argument("--batch", type=int, default=None, dest="mem_batch", help="sequences per micro-batch and device (default: the run's batch_size)")
    m.add_argument("--seq", type=int, default=None, dest="mem_seq", help="tokens per sequence (default: the run's seq_len, else the context)")
    m.add_argument("--vocab", type=int, default=None, dest="mem_vocab",
                   help="vocabulary size to count and plan for (default: the run's tokenizer's; with --memory, 32000, the paper's "
                   "Llama tokenizer, for the paper's sizes 86M-256M on the default byte tokenizer)")
    m.add_argument("--precision", default="bf16", dest="mem_precision", choices=PLANNED_PRECISIONS, help="bf16 autocast (default, the GPU recipe) or fp32")
    m.add_argument("--gpus", type=int, default=1, help="devices (default 1)")
    m.add_argument("--parallel", default=None, dest="mem_parallel", choices=PLANNED_PARALLEL, help="default: ddp with several devices, else none")
    m.add_argument("--checkpointing", default=None, choices=CHECKPOINTING, help="default: the run's activation_checkpointing")
    m.add_argument("--device-gib", "--device-gb", type=float, default=40.0, dest="device_gib",
                   help="device memory in GiB (2^30 bytes, the unit of the plan; a GPU sold as \"40 GB\" holds 40 GiB) to check the "
                   "fit against (default 40: the paper's A100)")
    p.set_defaults(func=cmd_info)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()  # imports torch: seconds in which a Ctrl-C is one line too
        args, extra = parser.parse_known_args(argv)
        stray = [a for a in extra if a.startswith("-") or "=" not in a]
        if stray or (extra and not hasattr(args, "overrides")):
            parser.error(f"unrecognized arguments: {' '.join(stray or extra)}")
        if extra:  # key=value settings written among the options
            args.overrides = [*args.overrides, *extra]
        return _run(args)
    except KeyboardInterrupt:  # before a command runs (`_run` says it for the command itself)
        print("cem: error: interrupted (Ctrl-C)", file=sys.stderr)
        return 130


def _run(args) -> int:
    """Run a command; every expected failure is one line on stderr and a non-zero exit code: 2 for bad
    input, 1 for a failed run, 130 / 143 for Ctrl-C / SIGTERM. Anything else is also one line, unless
    $CEM_DEBUG is set (then the traceback)."""
    import torch
    import yaml

    from .training import TrainingError

    def fail(message: str, code: int) -> int:
        print(f"cem {args.command}: error: {message}", file=sys.stderr)
        return code

    previous = signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:  # not the main thread
        previous = None
    try:
        return args.func(args)
    except Terminated as e:  # its args: where the run stands and how to go on, when the trainer says (`train`)
        return fail(" ".join(("terminated (SIGTERM)", *map(str, e.args))), 143)
    except KeyboardInterrupt as e:
        return fail(" ".join(("interrupted (Ctrl-C)", *map(str, e.args))), 130)
    except USER_ERRORS as e:
        return fail(_one_line(e), 2)
    except yaml.YAMLError as e:
        return fail(f"invalid YAML: {_one_line(e)}", 2)
    except TrainingError as e:
        return fail(_one_line(e), 1)
    except (MemoryError, torch.OutOfMemoryError) as e:
        return fail(f"out of memory ({_one_line(e)}); try a smaller batch_size, seq_len or model", 1)
    except OSError as e:
        return fail(_one_line(e), 1)
    except Exception as e:  # noqa: BLE001 - one line instead of a traceback; CEM_DEBUG=1 shows it
        if os.environ.get("CEM_DEBUG"):
            raise
        return fail(f"{type(e).__name__}: {_one_line(e)} (unexpected; set CEM_DEBUG=1 for the traceback)", 1)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
