"""Aten operators and host synchronisations of one training forward + backward, per model kind and attention
backend (issue 37): the per-operation overhead of an eager step, counted instead of timed (deterministic).

    python benchmarks/op_count.py [--preset 134M] [--seq 64] [--batch 1] [--layers N] [--backends cpu eager triton]
        [--models Llama "CEM T=1" ...] [--out FILE.md]

`OpCounter`, a TorchDispatchMode, counts every aten operator that reaches the dispatcher (views included: each
costs a dispatch on a GPU too) and every host synchronisation: the operators that read a tensor's value on the
host (`SYNC_OPS`: `.item()`, `bool(t)`, `int(t)`, data-dependent shapes, ...) and the Tensor methods that copy
to the host (`.tolist()`, `.cpu()`, `.numpy()`), which on a GPU stall the host until the device has caught up.
On the CPU these cost nothing, but the same code path syncs on a GPU, so counting them here pins the GPU's.
The operators Triton's interpreter runs to emulate a kernel launch (copies to and from its host buffers) are
not counted: on a GPU the launch is one kernel. On the CPU, `triton` runs the kernel path in the interpreter.
"""

from __future__ import annotations

import collections
import sys
from contextlib import contextmanager
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make `benchmarks.common` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.common import Report, Table
from cem.model import LanguageModel, model_config

# operators that read a value on the host (a device sync on a GPU) or whose output shape depends on values
SYNC_OPS = frozenset({
    "_local_scalar_dense", "item", "is_nonzero", "nonzero", "nonzero_static", "masked_select", "_unique", "_unique2",
    "unique_dim", "unique_consecutive", "equal", "repeat_interleave", "bincount", "histc",
})  # fmt: skip
HOST_METHODS = ("tolist", "cpu", "numpy")  # Tensor methods that copy a tensor to the host
_INTERPRETER = ("triton/runtime/interpreter.py", "triton/runtime/jit.py")  # frames of the interpreter's launch emulation


def _in_interpreter(depth: int = 40) -> bool:
    frame = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return False
        if frame.f_code.co_filename.endswith(_INTERPRETER):
            return True
        frame = frame.f_back
    return False


class OpCounter(TorchDispatchMode):
    """Counts aten operators (`ops`, by name) and host synchronisations (`syncs`, by name) while active."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter = collections.Counter()
        self.syncs: collections.Counter = collections.Counter()
        self._saved: dict = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not _in_interpreter():
            name = func.overloadpacket.__name__
            self.ops[name] += 1
            if name in SYNC_OPS:
                self.syncs[name] += 1
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        for name in HOST_METHODS:
            self._saved[name] = original = getattr(torch.Tensor, name)
            setattr(torch.Tensor, name, self._host_copy(name, original))
        return super().__enter__()

    def __exit__(self, *exc):
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)
        return super().__exit__(*exc)

    def _host_copy(self, name, original):
        def method(tensor, *args, **kwargs):
            if not _in_interpreter():
                self.syncs[name] += 1
            return original(tensor, *args, **kwargs)

        return method

    @property
    def n_ops(self) -> int:
        return sum(self.ops.values())

    @property
    def n_syncs(self) -> int:
        return sum(self.syncs.values())


@contextmanager
def counting():
    """`with counting() as c:` counts the operators and syncs of the block (`c.n_ops`, `c.n_syncs`)."""
    counter = OpCounter()
    with counter:
        yield counter


def count_train_step(model: torch.nn.Module, ids: torch.Tensor, warm: bool = True) -> OpCounter:
    """The operators and syncs of `model(ids[:, :-1], ids[:, 1:]).backward()`, after one uncounted call (which
    fills the per-shape caches and runs the backend's self-check); the gradients are dropped after each."""
    x, y = ids[:, :-1], ids[:, 1:]
    for _ in range(2 if warm else 1):
        model.zero_grad(set_to_none=True)
        with counting() as counter:
            model(x, y).backward()
    model.zero_grad(set_to_none=True)
    return counter


MODELS = {  # name -> (arch, overrides), as benchmarks/train_throughput.py
    "Llama": ("llama", {}),
    "CEM T=1": ("cem", {}),
    "CEM T=2": ("cem", {"attn_steps": 2, "mlp_steps": 2}),
    "cem-t2": ("cem-t2", {}),
}


def count_model(name: str, backend: str, preset: str, seq: int, batch: int, layers: int | None = None) -> OpCounter:
    """Count one training forward + backward of model `name` (a `MODELS` key) on the CPU, fp32."""
    arch, overrides = MODELS[name]
    extra = {"n_layers": layers} if layers else {}
    cfg = model_config(preset, arch, context=max(seq, 1), **({} if arch == "llama" else {"attn_backend": backend}), **overrides, **extra)
    torch.manual_seed(0)
    model = LanguageModel(cfg)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq + 1), generator=torch.Generator().manual_seed(0))
    return count_train_step(model, ids)


def main(argv: list[str] | None = None) -> Report:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="134M")
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--layers", type=int, default=None, help="n_layers override (default: the preset's)")
    p.add_argument("--backends", nargs="+", default=["cpu"], help="CEM attention backends (cpu, eager, sdpa, triton)")
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    report = Report("Operators and host synchronisations of a training forward + backward", torch.device("cpu"),
                    {"preset": args.preset, "layers": args.layers or "preset", "seq": args.seq, "batch": args.batch, "dtype": "fp32"})
    table = Table(["model", "backend", "aten ops", "×Llama", "syncs", "sync ops"])
    llama = None
    for backend in args.backends:
        for name in args.models:
            if name == "Llama" and llama is not None:
                continue
            c = count_model(name, backend, args.preset, args.seq, args.batch, args.layers)
            llama = c.n_ops if name == "Llama" else llama
            ratio = f"{c.n_ops / llama:.2f}" if llama else "-"
            table.add(name, "-" if name == "Llama" else backend, f"{c.n_ops:,}", ratio, c.n_syncs,
                      ", ".join(f"{k} {v}" for k, v in sorted(c.syncs.items())) or "-")
    report.tables.append(("", table))
    report.notes.append("aten ops: every operator reaching the dispatcher, views included; syncs: host reads of tensor values "
                        f"({', '.join(sorted(SYNC_OPS))}) and the Tensor methods {', '.join(HOST_METHODS)}")
    report.emit(args.out)
    return report


if __name__ == "__main__":
    main()
