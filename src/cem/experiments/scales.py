"""The scales of the experiment suite. Every scale follows the paper's protocol (App. C): each run trains
on the Chinchilla budget of the Llama baseline of its size (20 tokens per Llama parameter, embeddings and
head included, as the paper counts them) with the 5% warm-up. A scale that cannot afford that uses
smaller models, never a smaller budget.

- `smoke`: a few steps per run, to test the pipeline; its results are never findings (the report refuses
  them unless asked, and then says so on its first line).
- `cpu`: Tiny Shakespeare bytes, presets `micro` (base) and `tiny`; the suite (`cem experiment all
  --scale cpu --jobs 2`) takes about 2 hours on a 2-core CPU.
- `gpu`: WikiText-2 with a BPE of 8,192 symbols, presets `small` and `medium` (base); see
  docs/experiments.md for the expected time per figure on one H100/H200.
- `paper`: the paper's presets, SlimPajama and the Llama tokenizer, 2,048 context, batch 128.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from ..checks import check_choice


@dataclass(frozen=True)
class Scale:
    name: str
    data: str
    tokenizer: str
    sizes: tuple[str, ...]  # model sizes of the per-size figures (2a, 2b)
    base: str  # the size of every other figure
    seeds: tuple[int, ...]  # every experiment
    recursion_seeds: tuple[int, ...]  # the recursion findings (fig2c, fig2d, fig3c, fig4, step-size, test-time)
    seq_len: int
    batch_size: int
    grad_accum: int = 1
    tokens: str | None = "chinchilla"
    max_steps: int | None = None  # only the smoke scale: a few steps, never findings
    lrs: tuple[float, ...] = (5e-4, 1e-3, 2e-3, 4e-3, 8e-3)  # fig3a
    eval_steps: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8)  # test-time: T at evaluation
    findings: bool = True  # False: results of this scale are never reported as findings

    def train_settings(self) -> dict:
        """Training settings shared by every run of this scale."""
        out = {
            "data": self.data,
            "tokenizer": self.tokenizer,
            "seq_len": self.seq_len,
            "batch_size": self.batch_size,
            "grad_accum": self.grad_accum,
            "eval_every": 0,
            "save_every": 200,
            "log_every": 25,
            "tensorboard": False,
            "final_eval_tokens": 0,  # the whole valid and test splits: every run is judged on the same text
            "diverge_factor": 0.0,  # only a non-finite loss stops a run (a sweep over learning rates must not
        }  # stop at a merely high loss; the paper's runs had no such guard)
        if self.max_steps is not None:
            out["max_steps"] = self.max_steps
        if self.tokens is not None:
            out["tokens"] = self.tokens
        return out

    def seeds_for(self, kind: str) -> tuple[int, ...]:
        return self.recursion_seeds if kind == "recursion" else self.seeds

    def to_dict(self) -> dict:
        return asdict(self)


SCALES = {
    "smoke": Scale("smoke", "tinyshakespeare", "byte", ("micro",), "micro", (0, 1), (0, 1), 32, 4, tokens=None, max_steps=3, eval_steps=(1, 2, 3), findings=False),
    # char-level Tiny Shakespeare, 16 × 128 tokens per step: micro 1.6M tokens (782 steps), tiny 2.7M (1,303)
    "cpu": Scale("cpu", "tinyshakespeare", "byte", ("micro", "tiny"), "micro", (0, 1, 2), (0, 1, 2, 3, 4), 128, 16),
    # WikiText-2 with a BPE of 8,192 symbols, 32 × 256 tokens per step: small 51M tokens, medium 178M
    "gpu": Scale("gpu", "wikitext-2", "bpe:8192", ("small", "medium"), "medium", (0, 1, 2), (0, 1, 2, 3, 4), 256, 32),
    # the paper: SlimPajama, the 32k Llama tokenizer, 2,048 context, batch 128
    "paper": Scale(
        "paper", "hf:cerebras/SlimPajama-627B", "hf-internal-testing/llama-tokenizer",
        ("86M", "108M", "134M", "162M"), "134M", (0,), (0,), 2048, 8, grad_accum=16,
    ),
}


def get_scale(name: str, **overrides) -> Scale:
    check_choice("scale", name, tuple(SCALES))
    return replace(SCALES[name], **overrides)
