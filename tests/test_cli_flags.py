"""Issue 63, item 2: every flag of every `cem` subcommand, in every mode (and on every kind of model) its command
runs in, either has an effect or is refused in one line naming it (`cem.cli.flag_table`, `check_flags`).

The subcommands' flags are read from the parser (a new flag without a table entry fails); each is given, with a
value of its own, to `main()` in each mode of its command. Refused: exit 2 and one line. Else the command's
probe (what it ran with, or printed) differs from the same command without the flag: the flag had an effect."""

from __future__ import annotations

import argparse
import importlib
import json
from dataclasses import dataclass, field

import pytest
import torch

import cem.cli as cli
from cem.cli import build_parser, main


def subcommands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(words, parser) of each subcommand (those with subcommands of their own: theirs)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
    for a in subs:
        for name, p in a.choices.items():
            yield from subcommands(p, (*path, name))


def flags(parser) -> dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions if a.dest != "help"}


def test_every_flag_of_every_subcommand_has_its_rules():
    """The table knows each subcommand's flags, no more and no fewer, and each of its rules says why."""
    table = cli.flag_table()
    found = {" ".join(path): set(flags(p)) for path, p in subcommands(build_parser())}
    assert found.keys() == table.keys()
    for command, dests in found.items():
        assert dests == table[command].keys(), command
        assert all(rule.why.split()[0] in ("with", "without", "at", "on") for rules in table[command].values() for rule in rules)


def sample(action: argparse.Action) -> list[str]:
    """The flag with a value of its own: on, or the last choice that is not its default, or a number."""
    flag = action.option_strings[0]
    if action.nargs == 0:
        return [flag]
    if action.choices:
        return [flag, [c for c in action.choices if c != action.default][-1]]
    return [flag, {int: "3", float: "0.5"}.get(action.type, "x")]


@dataclass
class Command:
    """A subcommand's modes (mode -> its arguments), the flags refused in each (mode -> dest -> text of the one
    line), the value each flag is given where `sample` is not enough, and its probe (None: no effect checked)."""

    words: tuple[str, ...]
    modes: dict[str, list[str]]
    refused: dict[str, dict[str, str]] = field(default_factory=dict)
    values: dict[str, list[str]] = field(default_factory=dict)
    exempt: dict[tuple[str, str], str] = field(default_factory=dict)  # (mode, dest): why its effect is not seen here
    probe: str | None = None


MEMORY_ONLY = ("mem_batch", "mem_seq", "mem_precision", "gpus", "mem_parallel", "checkpointing", "device_gib")
INFERENCE = ("steps", "attn_steps", "mlp_steps", "adaptive_tol", "adaptive_rule", "guard")
SHARD_FLAGS = ("tokens", "held_out_tokens", "shard_tokens", "workers", "out", "encoding", "doc_separator")
EVERY_INFO_FLAG = ("preset", "arch", "data", "data_dir", "tokenizer", "config", "overrides", "memory", "mem_vocab", *MEMORY_ONLY)

COMMANDS = [
    Command(("train",), {"new": [], "resume": ["--resume", "--out", "{tmp}/run"]},
            {"resume": {"overwrite": "--overwrite has no effect with --resume"}}, values={"config": ["--config", "{tmp}/c.yaml"]}),
    Command(("eval",), {"": ["--ckpt", "run"]}),
    Command(("lm-eval",), {"": ["run", "--tasks", "cem_local_text"]}),
    Command(("data", "verify"), {"": ["{tmp}"]}),
    Command(("info",), {"plain": [], "memory": ["--memory"], "keys": ["--keys"]},
            {"plain": {d: "has no effect without --memory" for d in MEMORY_ONLY},
             "keys": {d: "has no effect with --keys" for d in EVERY_INFO_FLAG}, "memory": {"keys": "--memory has no effect with --keys"}},
            values={"preset": ["--preset", "micro"], "arch": ["--arch", "llama"], "data": ["--data", "enwik8"], "tokenizer": ["--tokenizer", "bpe:300"],
                    "config": ["--config", "{tmp}/c.yaml"], "overrides": ["lr=0.1"], "mem_vocab": ["--vocab", "300"], "mem_seq": ["--seq", "16"]},
            exempt={("keys", "keys"): "the mode itself", ("memory", "memory"): "the mode itself"}, probe="stdout"),
    Command(("generate",), {"cem": ["--ckpt", "cem"], "llama": ["--ckpt", "llama"], "cem-mlp": ["--ckpt", "cem-mlp"], "greedy": ["--ckpt", "cem", "--temperature", "0"],
                            "adaptive": ["--ckpt", "cem", "--adaptive-tol", "0.1"], "both kinds": ["--ckpt", "cem", "--attn-steps", "2", "--mlp-steps", "2"],
                            "compiled": ["--ckpt", "cem", "--compile"]},
            {"cem": {"adaptive_rule": "--adaptive-rule has no effect without adaptive steps"},
             "adaptive": {"compile": "compile=True decodes with fixed steps"},
             "llama": {d: "has no effect on a model without CEM" for d in INFERENCE},  # CEM layers, or CEM attention layers (--attn-steps)
             "cem-mlp": {"attn_steps": "--attn-steps has no effect on a model without CEM attention layers", "adaptive_rule": "without adaptive steps"},
             "greedy": {d: "has no effect at --temperature 0" for d in ("top_k", "top_p", "seed")} | {"adaptive_rule": "without adaptive steps"},
             "both kinds": {"steps": "--steps has no effect with --attn-steps and --mlp-steps given", "adaptive_rule": "without adaptive steps"},
             "compiled": {"static": "--static has no effect with --compile", "adaptive_rule": "without adaptive steps",
                          "adaptive_tol": "compile=True decodes with fixed steps", "guard": "compile=True decodes with fixed steps"}},
            values={"ckpt": ["--ckpt", "cem-t2"], "device": ["--device", "cpu"], "adaptive_rule": ["--adaptive-rule", "update"], "prompt": ["--prompt", "ab"], "adaptive_tol": ["--adaptive-tol", "0.01"], "top_k": ["--top-k", "2"], "guard": ["--guard", "2"]},
            exempt={**{(m, "device"): "auto is the CPU on a machine without a GPU" for m in ("cem", "llama", "cem-mlp", "greedy", "adaptive", "both kinds", "compiled")},
                    ("compiled", "compile"): "the mode itself"},
            probe="generate"),
    Command(("export",), {"cem": ["cem", "{tmp}/exp"], "llama": ["llama", "{tmp}/exp"]},
            {"llama": {"remote_code": "--remote-code has no effect on a LlamaForCausalLM export"}, "cem": {"format": "cannot export to the LlamaForCausalLM format"}},
            exempt={("llama", "format"): "--format llama asserts a LlamaForCausalLM export, which a plain Llama's is already"}, probe="export"),
    Command(("data", "prepare"), {"named": ["wikitext-2"], "local shards": ["{tmp}", "--tokenizer", "byte"], "hf shards": ["hf:org/name", "--tokenizer", "byte", "--tokens", "100"]},
            {"named": {d: "has no effect without --tokenizer" for d in SHARD_FLAGS},
             "local shards": {d: "has no effect with --tokenizer" for d in ("source", "force")},
             "hf shards": {"source": "has no effect with --tokenizer", "force": "has no effect with --tokenizer",
                           "encoding": "has no effect with an hf: source", "doc_separator": "has no effect with an hf: source"}},
            values={"tokenizer": ["--tokenizer", "bpe:300"], "tokens": ["--tokens", "200"], "held_out_tokens": ["--held-out-tokens", "50"],
                    "shard_tokens": ["--shard-tokens", "1000"], "workers": ["--workers", "1"], "out": ["--out", "{tmp}/sh"], "data_dir": ["--data-dir", "{tmp}/dd"],
                    "source": ["--from", "{tmp}/src"], "encoding": ["--encoding", "latin-1"], "doc_separator": ["--doc-separator", "@@"]},
            probe="calls"),
]


def cases():
    parsers = dict(subcommands(build_parser()))
    for command in COMMANDS:
        for mode in command.modes:
            for dest, action in flags(parsers[command.words]).items():
                if action.option_strings or dest in command.values:  # positionals: in every mode's arguments
                    yield pytest.param(command, mode, dest, id=f"{' '.join(command.words)}[{mode}] {dest}")


MODELS = {"cem": "cem", "llama": "llama", "cem-mlp": "cem-mlp", "cem-t2": "cem-t2"}  # a run folder's name: its architecture


class Probe:
    """Runs `cem` in-process with what a command would load or write stubbed, and says what it ran with."""

    def __init__(self, monkeypatch, tmp_path, capsys):
        from cem.data.tokenizers import ByteTokenizer
        from cem.model import LanguageModel, model_config

        self.tmp, self.capsys, self.seen = tmp_path, capsys, []
        models = {}

        def model(path: str):  # a micro model of the architecture the run folder names
            torch.manual_seed(0)
            if path not in models:
                models[path] = LanguageModel(model_config("micro", MODELS.get(path, "cem"), vocab_size=ByteTokenizer.vocab_size))
            return models[path]

        class Run:  # what `cem export` reads of a run folder
            path = "run"

            def holds(self, out):
                return None

        monkeypatch.setattr(cli, "_load_run", lambda path: (model(path), ByteTokenizer(), Run()))
        for name in ("cmd_train", "cmd_eval", "cmd_lm_eval", "cmd_data_verify"):  # the flags' checks only: the commands ran elsewhere
            monkeypatch.setattr(cli, name, lambda args: 0)
        generate = LanguageModel.generate
        step = importlib.import_module("cem.model.generate")  # the module, not the function `cem.model.generate`

        def spy(model, ids, *a, generator=None, **kw):
            self.seen.append((ids.tolist(), a, generator.initial_seed(), sorted((k, str(v)) for k, v in kw.items() if k != "inference")))
            return generate(model, ids, *a, generator=generator, **kw)

        def descend(layer, h, hn, direction):  # the settings each CEM layer runs at
            self.seen.append((layer.sublayer, layer.steps, layer.adaptive_tol, layer.adaptive_rule, layer.guard))
            return descend_(layer, h, hn, direction)

        from cem.layers.steps import DescentLayer

        descend_ = DescentLayer.descend
        monkeypatch.setattr(LanguageModel, "generate", spy)
        monkeypatch.setattr(DescentLayer, "descend", descend)
        monkeypatch.setattr(step, "compiled_step", lambda device: step.static_step)  # its path, not torch.compile's minutes
        record = lambda name: lambda *a, **kw: self.seen.append((name, [str(x) for x in a], sorted((k, str(v)) for k, v in kw.items()))) or "done"  # noqa: E731
        monkeypatch.setattr("cem.data.prepare.prepare", record("prepare"))
        monkeypatch.setattr("cem.data.tokenshards.prepare_shards", record("prepare_shards"))
        (tmp_path / "c.yaml").write_text("lr: 0.1\n")
        (tmp_path / "src").mkdir()

    def __call__(self, argv: list[str]):
        """(exit code, stderr, what it ran with) of `cem ARGV`."""
        import shutil

        shutil.rmtree(self.tmp / "exp", ignore_errors=True)
        self.seen.clear()
        self.capsys.readouterr()
        try:
            code = main([a.format(tmp=self.tmp) for a in argv])
        except SystemExit as e:
            code = e.code
        out, err = self.capsys.readouterr()
        files = sorted(p.name for p in (self.tmp / "exp").iterdir()) if (self.tmp / "exp").is_dir() else []
        return code, err, json.dumps([out, files, [repr(s) for s in self.seen]])


@pytest.mark.slow  # about 240 in-process commands: a minute on an idle machine
@pytest.mark.parametrize("command,mode,dest", cases())
def test_each_flag_has_an_effect_or_is_refused_in_each_mode(command, mode, dest, monkeypatch, tmp_path, capsys):
    action = flags(dict(subcommands(build_parser()))[command.words])[dest]
    run = Probe(monkeypatch, tmp_path, capsys)
    base = [*command.words, *command.modes[mode]]
    given = command.values.get(dest) or sample(action)
    code, err, seen = run([*base, *given])
    expect = command.refused.get(mode, {}).get(dest)
    if expect is not None:
        assert code == 2 and err.count("\n") == 1 and expect in err, (err, code)
        return
    assert code == 0 and "error" not in err, err
    if command.probe is not None and (mode, dest) not in command.exempt:
        assert run(base)[2] != seen, f"{' '.join(given)} changed nothing"


def test_train_depth_max_alone_is_not_refused_for_a_mean_never_set():
    """Issue 63: `train_depth_max=1` with the default fixed depth was refused for train_depth_mean, which only the
    poisson-lognormal draw reads; that draw's mean above its maximum is still refused."""
    from cem.cli import _run_config

    parse = build_parser().parse_args
    assert _run_config(parse(["info", "train_depth_max=1"])).model().training.depth_max == 1
    with pytest.raises(ValueError, match="train_depth_mean=2 is above train_depth_max=1"):
        _run_config(parse(["info", "train_depth=model", "train_depth_dist=poisson-lognormal", "train_depth_max=1"]))
