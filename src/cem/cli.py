"""The `cem` command line: train, eval, generate, info (also `python -m cem`)."""

from __future__ import annotations

import argparse
import ast
import errno
import functools
import inspect
import json
import os
import signal
import sys
import textwrap
import typing
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path

USER_ERRORS = (ValueError, FileNotFoundError)
MOVED = {"experiment": "cem-study experiment", "report": "cem-study report"}  # commands that left cem, and where they went


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows "(default: X)" after every option that has a default of its own and does not state it."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default is None or action.default is False or action.default == argparse.SUPPRESS or "default" in text:
            return text
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
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


@functools.cache
def field_docs(cls) -> dict[str, str]:
    """The docstring under each field of the dataclass `cls` and the dataclasses it derives from (as litgpt's
    jsonargparse reads them), by name (read once: parsing the sources was most of the time a parser took to build)."""
    docs = {}
    for c in reversed([c for c in cls.__mro__ if "__dataclass_fields__" in vars(c)]):
        body = ast.parse(textwrap.dedent(inspect.getsource(c))).body[0].body
        docs.update({
            f.target.id: " ".join(doc.value.value.split())
            for f, doc in zip(body, body[1:])
            if isinstance(f, ast.AnnAssign) and isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)
        })
    return docs


def _add_field_flags(p, cls, names: tuple[str, ...] | None = None, defaults: dict[str, str] | None = None) -> None:
    """A flag for each field of the dataclass `cls` (those in `names`): `--field-name` (or the field's
    `metadata["flag"]`, and its `metadata["aliases"]`), of the field's type (a bool: --x / --no-x), its choices
    (`cls.CHOICES`) shown as argparse shows them, and its docstring as help, followed by the default it does not
    state itself (`defaults[name]`, else the field's). A field without a default is a required flag, or a
    positional argument with `metadata["positional"]` (a list: one or more). A flag not given is None: only what
    is given changes a setting, and the dataclass checks the value (one message for a flag and a key=value
    setting). Fields of an `Options` class (`OPTIONS`) take their defaults on the command line instead, and
    their `metadata["choices"]` are argparse's."""
    docs, hints, choices = field_docs(cls), typing.get_type_hints(cls), getattr(cls, "CHOICES", {})
    options = issubclass(cls, Options)
    for f in fields(cls):
        if names is not None and f.name not in names:
            continue
        hint = hints[f.name]
        kind = next(t for t in typing.get_args(hint) or (hint,) if t is not type(None))
        required = f.default is MISSING and f.default_factory is MISSING and "nargs" not in f.metadata
        shown = (defaults or {}).get(f.name, f.default)
        text = docs[f.name] if ("default" in docs[f.name] or required or options) else f"{docs[f.name]} (default: {shown})"  # options: argparse says it
        how: dict = {"help": text.replace("%", "%%")}
        if typing.get_origin(hint) is list:
            how.update(nargs=f.metadata.get("nargs", "+"), type=typing.get_args(hint)[0])
        elif kind is bool:
            how["action"] = "store_true" if options else argparse.BooleanOptionalAction
        else:
            how["type"] = kind
        if f.name in choices:
            how["metavar"] = "{" + ",".join(choices[f.name]) + "}"
        for key in ("choices", "metavar"):  # choices: a registry, read when the parser is built (it may import torch)
            if key in f.metadata:
                how[key] = f.metadata[key]() if callable(f.metadata[key]) else f.metadata[key]
        if "named" in f.metadata:  # the docstring's {} lists a registry's names
            how["help"] = how["help"].format(", ".join(f.metadata["named"]()))
        if options and not required:
            how["default"] = f.default_factory() if f.default_factory is not MISSING else f.default
        if f.metadata.get("positional"):
            p.add_argument(f.name, **how)
            continue
        flags = (f.metadata.get("flag", "--" + f.name.replace("_", "-")), *f.metadata.get("aliases", ()))
        p.add_argument(*flags, dest=f.name, required=required, **how)


def _given(args, cls) -> dict:
    """The fields of the dataclass `cls` as the command line gave them (None: not given), by name."""
    return {f.name: getattr(args, f.name, None) for f in fields(cls)}


class Options:
    """A command's own flags (not settings of a run or a model): a dataclass of them, one field a flag, its
    docstring the help (`_add_field_flags`); the command reads them from its parsed arguments."""


def _flag(flag: str | None = None, **metadata):
    """A field's metadata for `_add_field_flags`: its flag's spelling, aliases, argparse choices or metavar, or
    the registry whose names its help lists (`named`)."""
    return {**({"flag": flag} if flag else {}), **metadata}


def _registry(module: str, name: str):
    """A registry's names, imported when a parser is built (`_flag(choices=...)`)."""
    import importlib

    return lambda: tuple(getattr(importlib.import_module(module, __package__), name))


@dataclass(kw_only=True)
class OnDevice(Options):
    device: str = "auto"
    """the device: auto (CUDA when available, else the CPU), cpu, cuda, cuda:N, mps"""


@dataclass(kw_only=True)
class SettingsOptions(Options):
    config: str | None = None
    """a YAML file of settings (flat keys or train:/model: sections)"""
    overrides: list[str] = field(default_factory=list, metadata=_flag(positional=True, nargs="*", metavar="KEY=VALUE"))
    """key=value settings, e.g. lr=1e-3 attn_steps=2 kq_diag=per_head (every training setting, and the model's: `cem info --keys`)"""


@dataclass(kw_only=True)
class TrainOptions(Options):
    out: str | None = None
    """run directory (default: runs/ARCH-PRESET-DATA-sSEED plus every non-default setting as key=value)"""
    resume: bool = False
    """continue the run in --out from its checkpoint, with the settings it recorded (an error if the folder holds no run)"""
    overwrite: bool = False
    """remove what --out holds (run.json, checkpoints, metrics, results) and start again"""
    stop_at: int | None = field(default=None, metadata=_flag("--stop-at"))
    """stop after this step with a checkpoint (schedule unchanged)"""
    quiet: bool = False
    """no progress bar; print the final metrics as JSON"""


@dataclass(kw_only=True)
class EvalOptions(OnDevice):
    ckpt: str
    """run directory written by `cem train`"""
    data: str | None = None
    """corpus (default: the run's)"""
    data_dir: str | None = None
    """data directory (default: the run's, else as for train)"""
    split: str = field(default="test", metadata=_flag(choices=("train", "valid", "test")))
    """split to evaluate"""
    batch_size: int | None = None
    """sequences per batch (default: the run's)"""
    seq_len: int | None = None
    """sequence length (default: the run's)"""
    max_batches: int | None = None
    """stop after this many batches (default: the whole split)"""
    stride: int | None = None
    """score with sliding windows every this many tokens, so every token has at least seq_len - stride tokens of context (default: disjoint windows, the context reset at each, as the run's validation)"""
    json: bool = False
    """print the metrics as one JSON line"""


@dataclass(kw_only=True)
class SampleOptions(Options):
    ckpt: str
    """run directory written by `cem train`"""
    prompt: str = ""
    """text to continue"""
    max_new_tokens: int = 200
    """tokens to sample"""
    temperature: float = 0.8
    """sampling temperature (0: greedy)"""
    top_k: int | None = None
    """sample among the k likeliest tokens (default: all)"""
    top_p: float = 0.95
    """nucleus sampling mass"""


@dataclass(kw_only=True)
class DecodeOptions(OnDevice):
    seed: int = 0
    """sampling seed"""
    static: bool = False
    """decode with a static-shape cache (fixed buffers, masked by position)"""
    compile: bool = False
    """static, and each decoding step compiled (CUDA graphs on a GPU; fixed steps only)"""


@dataclass(kw_only=True)
class ExportOptions(Options):
    run: str = field(metadata=_flag(positional=True))
    """run directory written by `cem train`"""
    out: str = field(metadata=_flag(positional=True))
    """output directory"""
    format: str = field(default="hf", metadata=_flag(choices=("hf", "llama")))
    """hf: LlamaForCausalLM for a plain Llama, else the CEM format (needs cem-transformers where it is loaded); llama: LlamaForCausalLM, an error for other models"""
    remote_code: bool = False
    """CEM format: also write a modeling_cem.py shim and auto_map, for `trust_remote_code=True` without `import cem.hf` (then AutoTokenizer asks to run that code too); default: no code in the folder"""


@dataclass(kw_only=True)
class LmEvalOptions(OnDevice):
    run: str = field(metadata=_flag(positional=True))
    """run directory written by `cem train`"""
    tasks: str
    """comma-separated lm-eval tasks: the local cem_local_text, cem_local_choice (shipped with cem, offline) or any of lm-eval's (downloaded by lm-eval)"""
    limit: int | None = None
    """at most this many documents per task"""
    num_fewshot: int | None = None
    """few-shot examples (default: the task's)"""
    batch_size: int = 8
    """sequences per batch (default 8)"""
    json: bool = False
    """print the results as JSON"""


@dataclass(kw_only=True)
class InfoOptions(Options):
    keys: bool = False
    """list every setting with its meaning, default and choices"""


@dataclass(kw_only=True)
class MemoryOptions(Options):
    memory: bool = False
    """also print the predicted training memory per device and whether it fits"""
    mem_batch: int | None = field(default=None, metadata=_flag("--batch"))
    """sequences per micro-batch and device (default: the run's batch_size)"""
    mem_seq: int | None = field(default=None, metadata=_flag("--seq"))
    """tokens per sequence (default: the run's seq_len, else the context)"""
    mem_vocab: int | None = field(default=None, metadata=_flag("--vocab"))
    """vocabulary size to count and plan for (default: the run's tokenizer's; with --memory, 32000, the paper's Llama tokenizer, for the paper's sizes 86M-256M on the default byte tokenizer)"""
    mem_precision: str = field(default="bf16", metadata=_flag("--precision", choices=_registry(".model.memory", "PLANNED_PRECISIONS")))
    """bf16 autocast (default, the GPU recipe) or fp32"""
    gpus: int = 1
    """devices (default 1)"""
    mem_parallel: str | None = field(default=None, metadata=_flag("--parallel", choices=_registry(".model.memory", "PLANNED_PARALLEL")))
    """default: ddp with several devices, else none"""
    checkpointing: str | None = field(default=None, metadata=_flag(choices=_registry(".model.lm", "CHECKPOINTING")))
    """default: the run's activation_checkpointing"""
    device_gib: float = field(default=40.0, metadata=_flag("--device-gib", aliases=("--device-gb",)))
    """device memory in GiB (2^30 bytes, the unit of the plan; a GPU sold as "40 GB" holds 40 GiB) to check the fit against (default 40: the paper's A100)"""


@dataclass(kw_only=True)
class PrepareOptions(Options):
    name: str = field(metadata=_flag(positional=True, named=_registry(".data.prepare", "PREPARABLE")))
    """the corpus: {}; with --tokenizer: hf:NAME[:CONFIG] or a local file or folder"""
    tokenizer: str | None = None
    """write token shards with this tokenizer (byte, bpe:N trained on the corpus' first 50M characters, a tokenizer folder or Hugging Face name)"""
    tokens: str | None = None
    """token shards: training tokens to write, e.g. 2.7e9 (default: the whole corpus; hf: needs it)"""
    held_out_tokens: str | None = None
    """token shards: at most this many valid and test tokens each (default: 1% of --tokens, at least 1e6)"""
    shard_tokens: str = "1e8"
    """token shards: tokens per shard file (default 1e8)"""
    workers: int | None = None
    """token shards: tokenising processes (default: the CPU count)"""
    out: str | None = None
    """token shards: the folder (default: <data dir>/shards/<corpus>--<tokenizer>-<hash>, where cem train finds them)"""
    data_dir: str | None = None
    """where to put it (default $CEM_DATA_DIR, else ~/.cache/cem/data, where every command looks)"""
    source: str | None = field(default=None, metadata=_flag("--from"))
    """copy the files from this local folder (same layout) instead of downloading"""
    force: bool = False
    """fetch again even if the corpus is already there"""
    encoding: str = "utf-8"
    """token shards: the encoding of local .txt/.jsonl files (default utf-8; text that does not decode is refused)"""
    doc_separator: str | None = None
    """token shards: the text that ends a document in local .txt files, e.g. '<|endoftext|>' (\\n for a line end; default: blank lines, and a folder's file of at most 1 MB is one document)"""


@dataclass(kw_only=True)
class VerifyOptions(Options):
    folders: list[str] = field(metadata=_flag(positional=True, metavar="DIR"))
    """a token-shard folder (cem data prepare --tokenizer), a run folder or a checkpoint folder"""


RUN_FIELDS = ("preset", "arch", "data", "data_dir", "tokenizer")  # what a run is (train and info)


def _add_run_args(p: argparse.ArgumentParser, names: tuple[str, ...] | None = RUN_FIELDS, defaults: dict[str, str] | None = None) -> None:
    """The training settings' flags (`names` of them; None: all), a YAML file and key=value settings."""
    from .training import TrainConfig

    _add_field_flags(p, TrainConfig, names, defaults)
    _add_field_flags(p, SettingsOptions)


def _run_config(args, base=None):
    from .training import TrainConfig, load_run_config

    return load_run_config(args.config, args.overrides, base=base, **_given(args, TrainConfig))


def _recorded_config(out: Path):
    """The config a run directory recorded (run.json), None if it has none."""
    from .training import RunDir

    return RunDir(out).recorded_config() if out.is_dir() else None


def check_named(flag: str, value: str | None, instead: str) -> None:
    """ValueError for a path or name given as empty text (`--out ''`), which would mean the current folder or a default."""
    if value is not None and not value.strip():
        raise ValueError(f"{flag} is empty: {instead}")


@dataclass(frozen=True)
class Applies:
    """Where a flag has an effect: where `when(args)` holds (`when(args, model)` with `on_model`, checked once the
    command has loaded its model); elsewhere it means nothing, as `why` says ("--x has no effect WHY"): refused
    (exit 2), or, with `warn`, named in a one-line warning (a flag only checked in that mode)."""

    when: typing.Callable
    why: str
    warn: bool = False
    on_model: bool = False


ALWAYS: tuple[Applies, ...] = ()  # a flag with an effect in every mode of its command


def given_flags(parser: argparse.ArgumentParser, argv: list[str]) -> dict[str, str]:
    """The flags and arguments `argv` gives, by dest, each spelled as its help shows it: `argv` parsed again with
    every default of `parser` and its subcommands suppressed, so that what is left was given (even at its default)."""

    def actions(p):
        for a in p._actions:
            yield a
            if isinstance(a, argparse._SubParsersAction):
                for sub in dict.fromkeys(a.choices.values()):
                    yield from actions(sub)

    every = list(actions(parser))
    defaults = [a.default for a in every]
    try:
        for a in every:
            a.default = argparse.SUPPRESS
        given = vars(parser.parse_known_args(argv)[0])
    finally:
        for a, default in zip(every, defaults):
            a.default = default
    return {a.dest: (a.option_strings[0] if a.option_strings else a.metavar or a.dest.upper()) for a in every
            if a.dest in given and not isinstance(a, argparse._SubParsersAction)}


def check_flags(args, model=None) -> None:
    """Refuse, in one line, each flag given (`args.given`) that has no effect in the mode its command runs in (the
    command's `args.applies`: dest -> `Applies` rules; those `on_model` when `model` is given), or keep it for the
    one-line warning `run_command` prints once the command has run (`args.warned`; a refusal is the only line)."""
    found: dict[Applies, list[str]] = {}
    for dest, flag in getattr(args, "given", {}).items():
        for rule in args.applies[dest]:
            if rule.on_model == (model is not None) and not (rule.when(args, model) if rule.on_model else rule.when(args)):
                found.setdefault(rule, []).append(flag)
                break

    def said(warn: bool) -> str:
        return "; ".join(f"{', '.join(flags)} {'has' if len(flags) == 1 else 'have'} no effect {rule.why}" for rule, flags in found.items() if rule.warn == warn)

    if said(False):
        raise ValueError(said(False))
    if said(True):
        args.warned = [*getattr(args, "warned", []), said(True)]


def _sampled(args) -> bool:
    return args.temperature != 0


def _descent(model, sublayer: str | None = None) -> bool:
    """Whether `model` has CEM layers (of the `sublayer` kind), whose recursion the test-time settings change."""
    return any(sublayer in (None, m.sublayer) for m in model.descent_layers())


def _local_text(args) -> bool:
    from .data.corpora import parse_corpus

    return not parse_corpus(args.name).is_hf


def _plain_llama(model) -> bool:
    from .hf.llama_export import is_plain_llama

    return is_plain_llama(model)


def _table(rules: dict, *names: str, fields_of=()) -> dict:
    """A command's flags (its dests) and the rules of each: `rules`, and `names` and the fields of `fields_of` ALWAYS."""
    return {**{n: ALWAYS for n in names}, **{f.name: ALWAYS for c in fields_of for f in fields(c)}, **rules}


NOT_KEYS = Applies(lambda a: not a.keys, "with --keys (it lists the settings and exits)")
MEMORY = Applies(lambda a: a.memory, "without --memory (a setting of the memory plan)")
SHARDS = Applies(lambda a: a.tokenizer is not None, "without --tokenizer (a setting of the token shards)")
FETCH = Applies(lambda a: a.tokenizer is None, "with --tokenizer (the token shards read the corpus where it is)")
LOCAL_TEXT = Applies(_local_text, "with an hf: source (read as the dataset gives its rows; a setting of local text files)")
SAMPLED = Applies(_sampled, "at --temperature 0 (greedy decoding takes the likeliest token)")
CEM_LAYERS = Applies(lambda a, m: _descent(m), "on a model without CEM layers (no recursion to change)", on_model=True)


def flag_table() -> dict[str, dict[str, tuple[Applies, ...]]]:
    """Each subcommand's flags (by dest) and where each has an effect: the one place that knows it (`check_flags`);
    a flag without an entry is a KeyError, and tests/test_cli_flags.py walks them all in every mode."""
    from .layers import Inference
    from .training import TrainConfig

    return {
        "train": _table({"overwrite": (Applies(lambda a: not a.resume, "with --resume, which continues the run --overwrite would delete: give one of them"),)},
                        fields_of=(TrainConfig, SettingsOptions, TrainOptions)),
        "eval": _table({}, fields_of=(EvalOptions,)),
        "generate": _table({
            "top_k": (SAMPLED,), "top_p": (SAMPLED,), "seed": (SAMPLED,),
            "static": (Applies(lambda a: not a.compile, "with --compile (which decodes with the static cache already)"),),
            "steps": (CEM_LAYERS, Applies(lambda a, m: any({"attn": a.attn_steps, "mlp": a.mlp_steps}[x.sublayer] is None for x in m.descent_layers()),
                                          "with --attn-steps and --mlp-steps given (each CEM layer's T is its kind's)", on_model=True)),
            "attn_steps": (Applies(lambda a, m: _descent(m, "attn"), "on a model without CEM attention layers", on_model=True),),
            "mlp_steps": (Applies(lambda a, m: _descent(m, "mlp"), "on a model without CEM MLP layers", on_model=True),),
            "adaptive_tol": (CEM_LAYERS,), "guard": (CEM_LAYERS,),
            "adaptive_rule": (CEM_LAYERS, Applies(lambda a, m: a.adaptive_tol is not None or m.config.inference.adaptive_tol is not None,
                                                  "without adaptive steps (--adaptive-tol, or the model's adaptive_tol)", on_model=True)),
        }, fields_of=(SampleOptions, Inference, DecodeOptions)),
        "export": _table({"remote_code": (Applies(lambda a, m: a.format == "hf" and not _plain_llama(m),
                                                  "on a LlamaForCausalLM export (a plain Llama, or --format llama): its folder needs no code", on_model=True),)},
                         fields_of=(ExportOptions,)),
        "lm-eval": _table({}, fields_of=(LmEvalOptions,)),
        "data prepare": _table({**dict.fromkeys(("tokens", "held_out_tokens", "shard_tokens", "workers", "out"), (SHARDS,)),
                                **dict.fromkeys(("encoding", "doc_separator"), (SHARDS, LOCAL_TEXT)), **dict.fromkeys(("source", "force"), (FETCH,))},
                               fields_of=(PrepareOptions,)),
        "data verify": _table({}, fields_of=(VerifyOptions,)),
        "info": _table({**{f.name: (NOT_KEYS, MEMORY) for f in fields(MemoryOptions)}, "memory": (NOT_KEYS,), "mem_vocab": (NOT_KEYS,),
                        **{n: (NOT_KEYS,) for n in (*RUN_FIELDS, "config", "overrides")}}, "keys"),
    }


def cmd_train(args) -> int:
    from .training import Interrupted, NothingToDo, train
    from .training.budget import with_default_steps
    from .training.rundir import default_run_dir

    check_named("--out", args.out, "give a folder, or leave --out out for the default runs/NAME")
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
    if args.stride is not None and not 1 <= args.stride <= e.seq_len:
        raise ValueError(f"--stride must be between 1 and the sequence length {e.seq_len}, got {args.stride}")
    split = token_split(e.data, tokenizer, e.tokenizer, args.split, e.data_dir, e.encoding)
    metrics = evaluate(model.to(device), split, e.seq_len, e.batch_size, device, args.max_batches, autocast_for(e.precision, device),
                       progress=not args.json, desc=f"{e.data} {args.split}", stride=args.stride)
    metrics = {"data": e.data, "split": args.split, **metrics, "seq_len": e.seq_len, "stride": args.stride or e.seq_len,
               "parameters": parameter_breakdown(model)}
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
    check_flags(args, model)
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
    adaptive = inference.adaptive_tol if inference.adaptive_tol is not None else model.config.inference.adaptive_tol
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
    from .io import half_moved

    check_named("OUT", args.out, "name the folder to export into")
    model, tokenizer, run = _load_run(args.run)
    check_flags(args, model)
    _check_tokenizer(model, tokenizer, run, "export")
    if run.holds(args.out) is not None:
        raise ValueError(f"cannot export into {args.out}: it is, or lies in, {run.holds(args.out)} of the run being exported; choose another output folder")
    out = Path(args.out)
    if out.is_symlink():
        raise ValueError(f"cannot export into {out}: it is a symbolic link; refusing to write through it (name a real folder)")
    if out.exists() and not out.is_dir():
        raise ValueError(f"cannot export into {out}: it is a file; name a folder")
    if out.is_dir() and any(out.iterdir()) and not (out / "config.json").is_file():
        killed = half_moved(out)  # an export killed while it moved its files in: this one completes it
        if killed is None:
            raise ValueError(f"cannot export into {out}: it holds other files and no earlier export (no config.json); name a new or empty folder")
        print(f"cem export: {out} holds part of an export killed while moving its files in; exporting again over it "
              f"(its staging folder {killed} is removed)", file=sys.stderr)
    from safetensors import SafetensorError

    try:
        out = export_hf(model, args.out, tokenizer=tokenizer, format="llama" if args.format == "llama" else "auto", remote_code=args.remote_code)
    except (OSError, SafetensorError) as e:  # a full disk, a file size limit, a folder not writable
        raise OSError(f"could not write the export into {args.out} ({_one_line(e)}); the folder was left as it was") from None
    kind = "LlamaForCausalLM format" if is_plain_llama(model) else f"CEM format: the model loads after `import cem.hf`, as {out / 'README.md'} says"
    print(f"exported {run.path} to {out} ({kind}); load it with AutoTokenizer / AutoModelForCausalLM.from_pretrained")
    return 0


def _keys_text() -> str:
    """Every setting a run takes as key=value (`cem info --keys`): the training settings and the model's flat keys
    (`cem.model.FLAT`, with the nested path each sets), each with its default, its choices (from the registries)
    and its meaning (the field's docstring)."""
    from .model.config import FLAT, PARTS, ModelConfig, flat_field
    from .training import TrainConfig

    def entry(key: str, owner, f, default, path: str = "") -> str:
        choices = getattr(owner, "CHOICES", {}).get(f.name)
        head = f"{key} = {default!r}" + (f"  {{{', '.join(choices)}}}" if choices else "") + (f"  [{path}]" if path else "")
        return f"{head}\n    {field_docs(owner).get(f.name, '')}"

    lines = ["# training settings (TrainConfig)"]
    lines += [entry(f.name, TrainConfig, f, f.default) for f in fields(TrainConfig)]
    lines.append("# model settings (ModelConfig; the defaults before a preset and an architecture; [the nested setting]; "
                 "start .. anchor_weight set both CEM sublayers)")
    model = ModelConfig()
    for key in [f.name for f in fields(ModelConfig) if f.name not in PARTS] + list(FLAT):
        owner, f = flat_field(key)
        lines.append(entry(key, owner, f, model.flat(key), ".".join(FLAT.get(key, ()))))
    return "\n".join(lines)


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
        print(_keys_text())
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
    from .data.tokenshards import WORKERS_PER_CPU, parse_tokens, prepare_shards

    if args.tokenizer is None:
        print(prepare(args.name, args.data_dir, source=args.source, force=args.force))
        return 0
    from .checks import check_nonnegative_int
    from .data.tokenizers import check_spec

    check_named("--tokenizer", args.tokenizer, "give byte, bpe:N or a tokenizer")
    check_spec(args.tokenizer)
    check_named("--out", args.out, "give a folder, or leave --out out for the default under the data directory")
    if args.out and Path(args.out).exists() and not Path(args.out).is_dir() and not Path(args.out).is_symlink():  # a link: refused as one
        raise ValueError(f"--out {args.out} is a file; name a folder for the token shards")
    if args.workers is not None:
        check_nonnegative_int("--workers", args.workers, high=WORKERS_PER_CPU * (os.cpu_count() or 1))
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
    from .records import SHARD_MANIFEST
    from .training.checkpoint import MANIFEST as CKPT_MANIFEST, checkpoint_problems

    checked = []
    for folder in map(Path, args.folders):
        if not folder.is_dir():
            raise FileNotFoundError(f"{folder}: no such folder (give a token-shard folder, a run folder or a checkpoint folder)")
        manifest = folder / SHARDS_MANIFEST
        if manifest.is_file() and SHARD_MANIFEST.fields.keys() & read_json(manifest).keys():  # a checkpoint's lists "files" (`verify_shards` checks the rest)
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


def _version() -> str:
    try:
        from importlib.metadata import version

        return f"cem-transformers {version('cem-transformers')}"
    except Exception:  # not installed (run from a source tree)
        from . import __version__

        return f"cem-transformers {__version__}"


def build_parser() -> argparse.ArgumentParser:
    from .layers import Inference
    from .training.budget import DEFAULT_STEPS

    applies = flag_table()

    parser = Parser(prog="cem", description="Causal Energy Minimization language models")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True)  # subcommands are Parser too

    p = sub.add_parser("train", help="train a model (no arguments: a small CEM model on the embedded shakespeare corpus, minutes on a CPU)",
                       description="Train a model. Running the same command again: an unfinished run needs --resume, "
                       "a finished one is left as it is (exit 0), or extended from its last checkpoint when asked for more "
                       "steps; --overwrite starts again.")
    _add_run_args(p, None, {"max_steps": f"{DEFAULT_STEPS} when neither this nor --tokens is given"})
    _add_field_flags(p, TrainOptions)
    p.set_defaults(func=cmd_train, applies=applies["train"])

    p = sub.add_parser("eval", help="evaluate a trained run on a split (its own corpus, sequence length and batch size)")
    _add_field_flags(p, EvalOptions)
    p.set_defaults(func=cmd_eval, applies=applies["eval"])

    p = sub.add_parser("generate", help="sample text from a trained run (past the context: a window of the latest tokens)")
    _add_field_flags(p, SampleOptions)
    _add_field_flags(p, Inference, defaults={f.name: "the model's" for f in fields(Inference)})
    _add_field_flags(p, DecodeOptions)
    p.set_defaults(func=cmd_generate, applies=applies["generate"])

    p = sub.add_parser("export", help="write a run as a Hugging Face model directory (AutoTokenizer, AutoModelForCausalLM, pipeline)")
    _add_field_flags(p, ExportOptions)
    p.set_defaults(func=cmd_export, applies=applies["export"])

    p = sub.add_parser("lm-eval", help="score a trained run with lm-evaluation-harness tasks (offline: cem_local_text, cem_local_choice)")
    _add_field_flags(p, LmEvalOptions)
    p.set_defaults(func=cmd_lm_eval, applies=applies["lm-eval"])

    p = sub.add_parser("data", help="prepare the named corpora")
    data_sub = p.add_subparsers(dest="data_command", required=True)
    p = data_sub.add_parser("prepare", help="fetch a named corpus into the data directory (Hugging Face datasets or its canonical file), "
                            "or with --tokenizer write the token shards of a corpus of any size")
    _add_field_flags(p, PrepareOptions)
    p.set_defaults(func=cmd_data_prepare, applies=applies["data prepare"])

    p = data_sub.add_parser("verify", help="check every file of token-shard folders, run folders (their checkpoints) or checkpoint "
                            "folders against the sha256 its manifest records; exit 1 if one is missing or altered")
    _add_field_flags(p, VerifyOptions)
    p.set_defaults(func=cmd_data_verify, applies=applies["data verify"])

    p = sub.add_parser("info", help="print the resolved config and the parameter breakdown")
    _add_run_args(p)
    _add_field_flags(p, InfoOptions)
    _add_field_flags(p.add_argument_group("memory planner (--memory): predicted peak training memory per device"), MemoryOptions)
    p.set_defaults(func=cmd_info, applies=applies["info"])
    return parser


def main(argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None) -> int:
    """The `cem` command on `argv` (default: the command line's), with the parser `build_parser` makes (or `parser`,
    made already)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in MOVED:
        print(f"cem: error: `cem {argv[0]}` moved to its own package: `{MOVED[argv[0]]}`", file=sys.stderr)
        return 2
    try:
        parser = build_parser() if parser is None else parser  # imports torch: seconds in which a Ctrl-C is one line too
        args, extra = parser.parse_known_args(argv)
        stray = [a for a in extra if a.startswith("-") or "=" not in a]
        if stray or (extra and not hasattr(args, "overrides")):
            parser.error(f"unrecognized arguments: {' '.join(stray or extra)}")
        args.given = given_flags(parser, argv)
        if extra:  # key=value settings written among the options
            args.overrides = [*args.overrides, *extra]
            args.given["overrides"] = "KEY=VALUE"
        return run_command(args)
    except KeyboardInterrupt:  # before a command runs (`run_command` says it for the command itself)
        print("cem: error: interrupted (Ctrl-C)", file=sys.stderr)
        return 130


def run_command(args, prog: str = "cem") -> int:
    """Run the command `args.func` of the program `prog`; every expected failure is one line on stderr and a
    non-zero exit code: 2 for bad input, 1 for a failed run, 130 / 143 for Ctrl-C / SIGTERM. Anything else is
    also one line, unless $CEM_DEBUG is set (then the traceback)."""
    import torch
    import yaml

    from .training import TrainingError

    def fail(message: str, code: int) -> int:
        print(f"{prog} {args.command}: error: {message}", file=sys.stderr)
        return code

    previous = signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:  # not the main thread
        previous = None
    try:
        check_flags(args)
        code = args.func(args)
        for warning in getattr(args, "warned", ()):
            print(f"{prog} {args.command}: warning: {warning}", file=sys.stderr)
        return code
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
