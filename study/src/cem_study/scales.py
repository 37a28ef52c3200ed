"""The scales of the experiment suite. Every scale follows the paper's protocol (App. C): each run trains
on the Chinchilla budget of the Llama baseline of its size (20 tokens per Llama parameter, embeddings and
head included, as the paper counts them) with the 5% warm-up. A scale that cannot afford that uses
smaller models, never a smaller budget.

Learning rates follow the paper's rule where a scale has an `lr_grid`: per size, the Llama baseline is swept
over the grid (extended by factors of 2 until its best rate is inside it) and the rate with the lowest mean
*validation* loss is chosen; every variant of that size then trains at that rate (`cem_study.lr`).
The test split is read once per run, at its end, and never chooses anything.

- `smoke`: a few steps per run, to test the pipeline; its results are never findings (the report refuses
  them unless asked, and then says so on its first line).
- `micro`: the first CPU regime (Tiny Shakespeare bytes, 2-layer `micro`/`tiny` models at lr 2e-3): a
  pipeline-level regime. Its models are at n-gram level, so it cannot speak to attention claims.
- `cpu`: WikiText-2 bytes, 4-layer models with head width 32 and context 256 at three sizes (`cpu64`
  base, `cpu96`, `cpu128`: 0.20M, 0.44M, 0.80M non-embedding parameters), the paper's learning-rate
  protocol, position-matched controls; see docs/experiments.md for what it costs.
- `gpu8`: fig4's position-matched quartet (CEM attention T=1, T=2; Llama-ALiBi x1, x2) at `cpu128-l8` (cpu128 twice as
  deep), 3 seeds, at a fixed rate, in one call on a lent H200 (study/results/gpu8/).
- `gpu`: WikiText-2 with a BPE of 8,192 symbols, presets `small` and `medium` (base); see
  docs/experiments.md for the expected time per figure on one H100/H200.
- `paper`: the paper's presets, SlimPajama and the Llama tokenizer, 2,048 context, batch 128. Its runs
  train on token shards prepared once for every size (`cem data prepare hf:cerebras/SlimPajama-627B
  --tokenizer hf-internal-testing/llama-tokenizer --tokens 3.3e9`, `cem.data.tokenshards`), which the
  trainer finds by corpus and tokenizer; without them a run is refused (its 7-13 GB of text would be
  held in memory).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path

from cem.checks import check_choice


class LearningRateNotChosen(ValueError):
    """A variant asked for the learning rate of a size whose Llama sweep has not finished."""


@dataclass(frozen=True)
class Scale:
    name: str
    data: str
    tokenizer: str
    sizes: tuple[str, ...]  # model sizes of the per-size figures (2a, size trend); the base comes first where it is one
    base: str  # the size of every other figure
    seeds: tuple[int, ...]  # every experiment
    recursion_seeds: tuple[int, ...]  # the recursion findings (fig2c, fig2d, fig3c, fig4, step-size, test-time)
    seq_len: int
    batch_size: int
    grad_accum: int = 1
    tokens: str | None = "chinchilla"
    max_steps: int | None = None  # only the smoke scale: a few steps, never findings
    lrs: tuple[float, ...] = (5e-4, 1e-3, 2e-3, 4e-3, 8e-3)  # fig3a's grid, and the Llama sweep's first grid
    lr_sweep: bool = False  # True: the paper's rule (module docstring); False: every run at the training default
    lr_extend: int = 3  # at most this many factor-2 extensions of a grid on each side to bracket its optimum
    chosen_lrs: tuple[tuple[str, float], ...] = ()  # (size, lr) chosen by the sweep (`cem_study.lr`), or by another campaign's without `lr_sweep`
    lr_grids: tuple[tuple[str, tuple[float, ...]], ...] = ()  # (size-arch key, final grid) of every finished sweep
    eval_steps: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8)  # test-time: T at evaluation
    test_time_batches: int | None = None  # test-time: batches of 16 test windows evaluated at every T (None: the whole split)
    suite: tuple[str, ...] | None = None  # the experiments `all` runs at this scale (None: every one)
    findings: bool = True  # False: results of this scale are never reported as findings
    final_eval_tokens: int = 0  # tokens of the valid and test splits each run is judged on at its end (0: the whole splits)
    limits: str = ""  # what this scale's regime cannot test, said in its report's opening
    lr_sweep_seeds: int | None = None  # seeds of a sweep at the base size (None: every seed); other sizes sweep the first
    lr_tie: float = 0.0  # nats: rates whose validation loss is within this of the best are tied, and the lowest of them is chosen
    rate_rules: tuple[str, ...] = ("paper",)  # the rate rules of the findings (`RATE_RULES`)
    own_lrs: tuple[tuple[str, float], ...] = ()  # (sweep key, lr) chosen by the own-rate sweeps (`cem_study.lr`)
    runs_from: str | None = None  # the results folder (a sibling of this scale's) whose runs/ this scale shares
    processor: str | None = None  # train only on this processor; a finished run recorded on another is trained again
    # each (size, seed) a campaign of one processor (its block): a block's runs train on the processor of its first
    # finished run, a finished run is never trained again elsewhere, and a machine with another leaves that block's runs
    # to it (`sweep.BlocksElsewhere`); pairs by seed (always within a size) then never cross processors, and the campaign
    # goes on wherever a block no other processor has started can train
    seed_blocks: bool = False
    # the committed runs folder (under study/results) of runs trained together on the GPU this scale's runs train on in
    # one call: its plan estimates that call's wall time from them (`costs.wave_seconds`)
    measured_on: str | None = None
    # (experiment, seeds) a recursion experiment's T=1/T=2 pair adds where its recursion seeds do not resolve half
    # their observed validation difference (`cem_study.seeds`, which decides `pair_seeds`)
    more_pair_seeds: tuple[tuple[str, tuple[int, ...]], ...] = ()
    pair_seeds: tuple[tuple[str, tuple[int, ...]], ...] = ()  # (experiment, seeds) of each pair decided so far
    # seeds that the RoPE Llama and each variant compared with it add (fig2a, fig2c, fig2d and fig3a against Llama, fig4's plain
    # reuse, the regime check): RoPE's seeds spread 5-15x more than ALiBi's or CEM attention's, so its comparisons need more
    rope_seeds: tuple[int, ...] = ()

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
            "final_eval_tokens": self.final_eval_tokens,  # 0, the whole splits: every run is judged on the same text
            "diverge_factor": 0.0,  # only a non-finite loss stops a run (a sweep over learning rates must not
        }  # stop at a merely high loss; the paper's runs had no such guard)
        if self.max_steps is not None:
            out["max_steps"] = self.max_steps
        if self.tokens is not None:
            out["tokens"] = self.tokens
        return out

    def train_for(self, size: str) -> dict:
        """Training overrides of a variant of `size`: the Llama baseline's chosen learning rate, if this
        scale sweeps (LearningRateNotChosen before the sweep of that size has finished)."""
        chosen = dict(self.chosen_lrs)
        if not self.lr_sweep:  # a rate chosen by another campaign's sweep (said in `limits`), else the training default
            return {"lr": chosen[size]} if size in chosen else {}
        if size not in chosen:
            raise LearningRateNotChosen(f"the learning rate of size {size!r} is not chosen yet: its Llama sweep runs first")
        return {"lr": chosen[size]}

    def own_lr(self, key: str) -> float:
        """The rate an own-rate sweep chose for the variants of `key` (`cem_study.lr.sweep_key`)."""
        chosen = dict(self.own_lrs)
        if key not in chosen:
            raise LearningRateNotChosen(f"the own learning rate of {key} is not chosen yet: its seed-0 sweep runs first")
        return chosen[key]

    def sweep_seeds(self, size: str) -> tuple[int, ...]:
        """Seeds of a learning-rate sweep: at the base size every seed (or the first `lr_sweep_seeds`), at the
        others the first one (a larger size costs several times more; its sweep only has to find the optimum's
        grid point)."""
        if size != self.base:
            return self.seeds[:1]
        return self.seeds[: self.lr_sweep_seeds] if self.lr_sweep_seeds else self.seeds

    def pair_seeds_of(self, exp_id: str) -> tuple[int, ...] | None:
        """The seeds decided for `exp_id`'s T=1/T=2 pair where it has more than its controls (None: the recursion seeds)."""
        return dict(self.pair_seeds).get(exp_id)

    def more_pair_seeds_of(self, exp_id: str) -> tuple[int, ...] | None:
        """The seeds `exp_id`'s T=1/T=2 pair may add (`cem_study.seeds`); None if it never adds any."""
        return dict(self.more_pair_seeds).get(exp_id)

    @property
    def own_rates(self) -> bool:
        """Whether the findings are also judged with each CEM variant at its own best rate."""
        return "own" in self.rate_rules

    def runs(self, root: str | Path) -> Path:
        """The folder holding the run folders of results folder `root`: root/runs, or the shared one."""
        return Path(root).parent / self.runs_from / "runs" if self.runs_from else Path(root) / "runs"

    def grid(self, size: str, arch: str) -> tuple[float, ...]:
        """The final (bracketing) grid of a finished sweep, else its first grid: the scale's `lrs` at the base
        size; at another size (b/2, b, 2b) around the base size's chosen rate b, which a larger model's optimum
        is near (the sweep still extends it until the optimum is bracketed). `arch` is an architecture, or an
        architecture with model settings (an own-rate sweep's key without its size)."""
        if f"{size}-{arch}" in dict(self.lr_grids):
            return dict(self.lr_grids)[f"{size}-{arch}"]
        base = dict(self.chosen_lrs).get(self.base)
        if size == self.base or base is None:
            return self.lrs
        return (base / 2, base, base * 2)

    def seeds_for(self, kind: str) -> tuple[int, ...]:
        return self.recursion_seeds if kind == "recursion" else self.seeds

    def to_dict(self) -> dict:
        return asdict(self)


# the experiments of the `cpu` scale (step-size is not run: the test-time experiment's recipes take up the schedules)
CPU_SUITE = ("lr", "fig2c", "fig2d", "fig4", "fig3c", "fig2a", "fig2b", "fig3b", "readings", "positional", "fig3a", "size-trend", "test-time", "energy", "table3")

# the experiments of the `cpu128` scale, the core first (issue 35)
CPU128_SUITE = ("lr", "fig2c", "fig2d", "fig4", "fig3b", "positional", "fig3a", "fig2a", "fig2b", "fig3c", "readings")

SCALES = {
    "smoke": Scale("smoke", "tinyshakespeare", "byte", ("micro",), "micro", (0, 1), (0, 1), 32, 4, tokens=None, max_steps=3, eval_steps=(1, 2, 3),
                   test_time_batches=2, findings=False, final_eval_tokens=4096),
    # char-level Tiny Shakespeare, 16 × 128 tokens per step: micro 1.6M tokens (784 steps), tiny 2.7M (1,305)
    "micro": Scale("micro", "tinyshakespeare", "byte", ("micro", "tiny"), "micro", (0, 1, 2), (0, 1, 2, 3, 4), 128, 16, limits=(
        "a pipeline-level regime: 2-layer models with head width 12-16 and context 128 on 1 MB of Tiny Shakespeare, at the "
        "level of a count-based 5-gram model, so it cannot speak to attention claims; with 2 layers, plain reuse x2 doubles "
        "the attention depth, so fig4's reuse comparison is structural")),
    # WikiText-2 bytes, 16 × 256 tokens per step: cpu64 4.7M tokens, cpu96 9.8M, cpu128 17.4M (1.6 passes)
    "cpu": Scale(
        "cpu", "wikitext-2", "byte", ("cpu64", "cpu96", "cpu128"), "cpu64", (0, 1, 2), (0, 1, 2, 3, 4), 256, 16,
        lrs=(1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2), lr_sweep=True, suite=CPU_SUITE, eval_steps=(1, 2, 3, 4, 6, 8, 12, 16), test_time_batches=32, limits=(
            "models of 0.2-0.8M non-embedding parameters on 4.7-17M bytes of WikiText-2: the size trend is fitted inside that "
            "range and says nothing about 86M-162M models on SlimPajama; the preconditioner comparisons (diag vs "
            "diag+low-rank) and fig3c's parameter-matched pair are not run (their effects were below what 5 seeds resolve); "
            "the step-size experiment is not run; the test-time experiment evaluates every T on the first 131k test tokens "
            "(32 batches of 16 windows) and its fixed-point weight 0.1 is not swept at this scale; Table 3 (GP regression, not a "
            "language model) trains on 4,096 points, and with twice the data (8,192, the project's own check in "
            "docs/experiments/table3.md) its T=2 vs T=1 comparison changes sign in favour of recursion; nothing here is a GPU speed")),
    # the cpu suite's largest size, the only one above n-gram level, as the base of the paper's core findings
    # (issue 35): its runs are the cpu suite's (one runs/ folder; a run asked for by both is trained once)
    # ties: within the noise of a seed-0 rate comparison there, measured on CEM attention's five seeds at 1e-3 and
    # 2e-3 (paired difference sd 0.0006 nats; seed sd 0.0008-0.0023 for every ALiBi-attention variant): 0.005 had
    # chosen rates 0.0045 nats worse on those five seeds' validation (docs/LOG.md, 2026-11-29)
    "cpu128": Scale(
        "cpu128", "wikitext-2", "byte", ("cpu128",), "cpu128", (0, 1, 2), (0, 1, 2), 256, 16,
        lrs=(1e-3, 2e-3, 4e-3), lr_sweep=True, lr_sweep_seeds=1, lr_tie=0.002, rate_rules=("paper", "own"), runs_from="cpu",
        more_pair_seeds=tuple((i, (3, 4)) for i in ("fig2c", "fig2d", "fig4", "fig3c")), rope_seeds=(3, 4), suite=CPU128_SUITE, limits=(
            "models of 0.80M non-embedding parameters (4 layers, 4 heads of width 32, context 256) on 17M bytes of "
            "WikiText-2 (1.6 passes): one size, so no trend; learning rates chosen by seed-0 sweeps on validation loss (ties "
            "within 0.002 nats go to the lower rate); nothing here is a GPU speed")),
    # the test-time recipes' screening (issue 64): the cpu scale's base size on its data and budget, in a runs folder of
    # its own (never paired with the cpu campaign's runs), each seed's runs on one processor (`seed_blocks`: a session's
    # machine is drawn, and one processor's campaign of 21 runs waits for that machine), every run at the rate the cpu
    # campaign's cpu64 Llama sweep chose (0.008, on validation, on another processor): not swept again here. Its seeds
    # are 0, 2 and 3, all three the Intel Xeon's: seed 1's block went to a Zen 3 drawn once, which left 4 of its 7
    # runs untrained; seed 3 took its place before any of its runs trained (study/docs/LOG.md, 2026-12-03)
    "screen64": Scale(
        "screen64", "wikitext-2", "byte", ("cpu64",), "cpu64", (0, 2, 3), (0, 2, 3), 256, 16, chosen_lrs=(("cpu64", 8e-3),), seed_blocks=True,
        suite=("recipes",), eval_steps=(1, 2, 3, 4, 6, 8, 12, 16), test_time_batches=32, limits=(
            "a screening: 0.2M non-embedding parameters (cpu64: 4 layers, width 64, context 256) on 4.7M bytes of WikiText-2, "
            "far below n-gram level (the cpu campaign's regime check), so it only ranks recipes for the larger sizes; every run "
            "at the learning rate the cpu campaign's cpu64 Llama sweep chose (0.008), not swept again here; each seed's runs "
            "train on one processor, and seeds on different processors add that processor's rounding to the seed spread; "
            "the recipes' settings (μ = 1, the gate's start, the curriculum's thirds) are not swept; each T evaluated on the "
            "first 131k test tokens (32 batches of 16 windows), the choices read the first 131k validation tokens")),
    # the test-time recipes' confirmation (issue 64): the two recipes the screening chose (`registry.screening_choice`) at
    # the cpu scale's two larger sizes, in a results folder of its own, each seed's runs on one processor; every run at the
    # rate the cpu campaign's Llama sweep chose at its size (cpu96 0.008; cpu128 0.002, as the cpu128 campaign's sweep
    # chose under its 0.002 tie): not swept again here. Its blocks are (size, seed): a seed's cpu96 and cpu128 runs may
    # train on two processors (no finding pairs runs across sizes; study/docs/LOG.md, 2026-12-03)
    "confirm": Scale(
        "confirm", "wikitext-2", "byte", ("cpu96", "cpu128"), "cpu128", (0, 1, 2), (0, 1, 2), 256, 16, chosen_lrs=(("cpu96", 8e-3), ("cpu128", 2e-3)),
        seed_blocks=True, suite=("recipes-confirm",), eval_steps=(1, 2, 3, 4, 6, 8, 12, 16), test_time_batches=32, limits=(
            "a confirmation of the screening's two recipes at 0.44M and 0.80M non-embedding parameters (cpu96, cpu128: 4 layers, "
            "heads of width 32, context 256) on 9.8M and 17M bytes of WikiText-2, both at n-gram level in the cpu campaign's "
            "regime check; every run at the learning rate the cpu campaign's Llama sweep chose at its size (cpu96 0.008, cpu128 "
            "0.002), not swept again here; the deeper Llama (8 layers) at the 4-layer Llama's rate, untuned; the recipes' "
            "settings (μ = 1, the gate's start, the curriculum's thirds) are not swept; each seed's runs at a size train on one "
            "processor, and seeds on different processors add that processor's rounding to the seed spread; each T evaluated "
            "on the first 131k test tokens (32 batches of 16 windows), the choices read the first 131k validation tokens")),
    # fig4's position-matched quartet at cpu128's width, twice as deep (issue 62): one call on one lent H200, its twelve
    # runs together. 64 x 256 tokens per step: 33.5M tokens (20 x the 1.67M parameters of Llama-ALiBi x1) in 2,043 steps.
    # A run there is bound by its steps (kernel launches), not FLOPs (twelve runs together trained 1.3x slower each than
    # one to three: study/results/h200/README.md), so 4x cpu128's batch keeps cpu128's depth of budget per step and fits
    # the call, where cpu128's 16 sequences would take 8,172 steps and a narrower model would be at n-gram level.
    "gpu8": Scale(
        "gpu8", "wikitext-2", "byte", ("cpu128-l8",), "cpu128-l8", (0, 1, 2), (0, 1, 2), 256, 64, suite=("fig4-alibi",), chosen_lrs=(("cpu128-l8", 2e-3),),
        measured_on="h200/cpu/runs", limits=(
            "one size (8 layers, 4 heads of width 32, context 256; 1.67M parameters with embeddings) on 33M bytes of WikiText-2 "
            "(3.1 passes), fig4's position-matched quartet only (no Llama-RoPE, no learned-step or CEM-twice controls), 3 seeds; "
            "NO LEARNING-RATE SWEEP: every run trains at a fixed 2e-3, the cpu128 evidence (the rate both cpu128 campaigns' "
            "Llama sweeps choose under the 0.002 tie, and CEM attention's own there), at 2x its depth and 4x its batch, where "
            "it is untested; batch 64 x 256 (cpu128: 16); trained on one GPU in bf16 autocast, its own campaign")),
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


def rehearsal(s: Scale) -> dict:
    """Overrides that keep a scale's suite in shape (its corpus, sizes, learning-rate sweeps, seeds,
    experiments, products and analyses) but train every run 3 steps on 4 x 32 tokens, judge it on the first
    4,096 tokens of each split and evaluate the test-time T on 2 batches: `cem-study experiment ... --rehearse`
    finds an error of the pipeline in minutes, not at the end of a suite of many hours. Its runs are short
    of the budget: never findings."""
    return dict(seq_len=32, batch_size=4, grad_accum=1, tokens=None, max_steps=3, final_eval_tokens=4096,
                eval_steps=s.eval_steps[:4], test_time_batches=2)
