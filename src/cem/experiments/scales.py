"""The three scales of the experiment suite: `cpu` (2-core CPU, hours for the suite), `gpu` (one GPU,
under an hour per figure) and `paper` (the paper's presets, SlimPajama and the Llama tokenizer)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..layers._checks import check_choice


@dataclass(frozen=True)
class Scale:
    name: str
    data: str
    tokenizer: str
    sizes: tuple[str, ...]  # model sizes of the per-size figures (2a, 2b)
    base: str  # the size of every other figure
    seeds: tuple[int, ...]
    seq_len: int
    batch_size: int
    grad_accum: int = 1
    max_steps: int | None = None
    tokens: str | None = None
    lrs: tuple[float, ...] = (5e-4, 1e-3, 2e-3, 4e-3, 8e-3)  # fig3a
    eval_batches: int = 8

    def train_settings(self) -> dict:
        """Training settings shared by every run of this scale."""
        out = {
            "data": self.data,
            "tokenizer": self.tokenizer,
            "seq_len": self.seq_len,
            "batch_size": self.batch_size,
            "grad_accum": self.grad_accum,
            "eval_every": 0,
            "eval_batches": self.eval_batches,
            "save_every": 100,
            "log_every": 25,
            "tensorboard": False,
        }
        if self.max_steps is not None:
            out["max_steps"] = self.max_steps
        if self.tokens is not None:
            out["tokens"] = self.tokens
        return out

    def to_dict(self) -> dict:
        return asdict(self)


SCALES = {
    # char-level Tiny Shakespeare; 300 steps of 16 × 128 tokens (0.61M tokens) per run
    "cpu": Scale("cpu", "tinyshakespeare", "byte", ("tiny", "small"), "tiny", (0, 1, 2), 128, 16, max_steps=300),
    # WikiText-2 with a BPE of 8,192 symbols, 10M tokens per run
    "gpu": Scale("gpu", "wikitext-2", "bpe:8192", ("small", "medium"), "medium", (0, 1, 2), 256, 32, tokens="1e7"),
    # the paper: SlimPajama, the 32k Llama tokenizer, 2,048 context, batch 128, Chinchilla tokens
    "paper": Scale(
        "paper",
        "hf:cerebras/SlimPajama-627B",
        "hf-internal-testing/llama-tokenizer",
        ("86M", "108M", "134M", "162M"),
        "134M",
        (0,),
        2048,
        8,
        grad_accum=16,
        tokens="chinchilla",
    ),
}


def get_scale(name: str, **overrides) -> Scale:
    check_choice("scale", name, tuple(SCALES))
    from dataclasses import replace

    return replace(SCALES[name], **overrides)
