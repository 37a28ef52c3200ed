"""Analyses of trained runs: test-time recursion (evaluate at other T) and the energy at each step."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..data import build_split, load_corpus, load_tokenizer
from ..layers.steps import DescentLayer
from ..training import RunDir
from ..training.evaluate import evaluate


def load_run(run_dir: Path, data_dir: str | None = None):
    """The trained model, its test split and sequence length, from a run directory."""
    run = RunDir(run_dir)
    model, state = run.load_checkpoint()
    train = state["run"]["train"]
    tokenizer = load_tokenizer(run.tokenizer_dir)
    corpus = load_corpus(train["data"], data_dir or train.get("data_dir"))
    split = build_split(corpus, tokenizer, "test")
    return model.eval(), split, train["seq_len"] or model.config.context


def test_time_curve(run_dir: Path, steps=range(1, 7), data_dir: str | None = None, max_batches: int | None = None) -> list[dict]:
    """Test perplexity of a trained model with every CEM layer run at T = each of `steps`."""
    model, split, seq_len = load_run(run_dir, data_dir)
    rows = []
    for t in steps:
        model.set_steps(t)
        m = evaluate(model, split, seq_len, 16, torch.device("cpu"), max_batches)
        rows.append({"eval_steps": t, "test_perplexity": m["perplexity"], "test_bits_per_byte": m["bits_per_byte"]})
    return rows


@torch.no_grad()
def energy_trace(run_dir: Path, max_steps: int = 4, n_seqs: int = 4, data_dir: str | None = None) -> list[dict]:
    """For every CEM layer of a trained model: the mean energy over held-out positions at steps t = 0..max_steps,
    each step taken from the layer's true input h (x^(0) = h, context fixed), as in the forward pass."""
    model, split, seq_len = load_run(run_dir, data_dir)
    ids = torch.from_numpy(split.tokens[: n_seqs * seq_len].astype("int64")).view(n_seqs, seq_len)
    inputs: dict[str, torch.Tensor] = {}
    layers = {name: m for name, m in model.named_modules() if isinstance(m, DescentLayer)}
    hooks = [m.register_forward_pre_hook(lambda mod, args, name=name: inputs.__setitem__(name, args[0])) for name, m in layers.items()]
    model(ids)
    for h in hooks:
        h.remove()
    rows = []
    for name, layer in layers.items():
        h, trained = inputs[name], layer.steps
        energies = []
        for t in range(max_steps + 1):
            x = h
            if t > 0:
                layer.steps = t
                x = layer(h)
            energies.append(layer.energy(layer.norm(x), h).mean().item())
        layer.steps = trained
        kind = "attention" if ".attn" in name else "mlp"
        rows.append({"layer": name, "kind": kind, "trained_steps": trained, "energy": energies})
    return rows


def save_json(obj, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=2))
    tmp.replace(path)
