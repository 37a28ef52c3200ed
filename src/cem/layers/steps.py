"""The recursion of a CEM layer (paper §2.3): the number of steps T, the step size η of each step, and
where the recursion starts, held together by one `Recursion` value.

Step-size schedules (η_t for step t = 0..T-1 of T):
- `constant`: η_t = η (the paper's reading; it fixes η = 1 for T = 1 and says nothing for T > 1);
- `inverse`: η_t = η / T, so the total step length does not grow with T;
- `learned`: η_t = η · g_t with a learned gain per step (init 1); a step beyond the learned ones uses the
  last gain, so a model can be run with more steps than it was trained with;
- `geometric`: η_t = η · ρ^t (ρ = `decay` < 1): the total step length η (1 - ρ^T) / (1 - ρ) converges as T
  grows, and each step is the same whatever T, so steps added at test time are ever smaller.
`learn_step_size=True` multiplies every step by one more learned scalar gain (any schedule).

Training options of the recursion (test-time compute that keeps helping):
- `backprop_steps` = k (0 = all): truncated backpropagation, as in recurrent-depth models (Huginn):
  while recording gradients, the first T - k steps run without a graph and only the last k steps are
  differentiated, so the activation memory is that of k steps whatever the (drawn) T. The skipped steps are
  taken as the identity in the backward pass: x^(T-k) = x^(0) + stop_gradient(x^(T-k) - x^(0)), so the
  residual path to earlier layers keeps its gradient (their Jacobian I + η ∂d/∂x is read as I).
- `track_fixed_point` (a layer attribute, set by the model when its `fixed_point_weight` > 0): a training
  forward also computes the step the layer would take next, and keeps its relative size
  r = mean_i ‖η_T d(u_i^(T))‖² / ‖x_i^(T)‖² in `fixed_point_residual` (with an `anchor` λ, the next step
  includes its pull: d - λ (x^(T) - x^(0))), a penalty that pulls x^(T) towards a fixed point of the
  recursion, so that further steps change little.
- `anchor` = λ (0 = off): every step is also pulled back towards the start point,
  x^(t+1) = x^(t) + η_t (d(u^(t)) - λ (x^(t) - x^(0))), the step of the energy plus λ/2 ‖x - x^(0)‖² (the input
  re-injected at every step, as in recurrent-depth models). Without it the recursion has no fixed point in x:
  once u = norm(x) has converged, d(u) points along x and the steps keep adding it, so x drifts away from
  the residual stream h it started at, linearly in T (docs/LOG.md). With it, ‖x^(t) - x^(0)‖ stays below
  max ‖d‖ / λ for η_t λ <= 1, and a fixed point solves λ (x - x^(0)) = d(norm(x)); with η λ = 1 the step is
  x^(t+1) = x^(0) + η d(u^(t)), a fixed-point iteration of the sublayer from its input. The first step
  (x = x^(0)) is the plain one, so T = 1 is unchanged.
- `gate` (flat `step_gate`; LoopUS, arXiv 2605.11011): an input-dependent gate on every step,
  x^(t+1) = x^(t) + g(u^(t)) η_t (d(u^(t)) - λ (x^(t) - x^(0))), g(u) = σ(w · u + b) a scalar per position
  (`StepGate`, D + 1 parameters per CEM layer), the learned form of a damped step aimed at the drift of x.
  It starts at w = 0, b = +3 (g = σ(3) ≈ 0.95, nearly the plain step); g → 1 is the plain step, g → 0 no
  step. Position i's gate reads only its own u_i, so cached decoding equals the full forward pass.

Training depths (`cem.model.config.RecursionTraining`, applied by `cem.model.LanguageModel`): a fixed T, one
drawn per batch (`draw_depths`), a depth curriculum (`curriculum_depth`: T grown during training, as in
retrofitted recurrence, arXiv 2511.07384), or random deep supervision (`draw_supervised_depths`: the loss read
at K depths of one batch, LoopUS).

Start points x^(0):
- `residual`: x^(0) = h, the raw residual stream (docs/design.md; the residual connection is the start of the
  optimisation), so T = 1 is exactly a pre-norm residual sublayer;
- `norm`: x^(0) = RMSNorm(h), Algorithm 1 read literally (`h ← RMSNorm(h); x ← h`): the sublayer's output
  replaces the residual stream by its normalised value plus the steps.

Inference options (eval mode or `torch.no_grad()` only; a training forward with either on raises ValueError).
They read the layer's own energy E (attention ε, MLP ξ) at u^(t) = norm(x^(t)) with the layer's fixed
context (with an `anchor` λ, E + λ/2 ‖x^(t) - x^(0)‖², the objective the anchored step descends), computed
together with the step's direction (`direction(u, with_energy=True)`), or the size of the step itself, so
position i's steps depend only on its own u_i and its causal context: cached decoding takes the same steps
as the full forward pass.
- `adaptive_tol` (None = off): position i stops after the step t where the exit rule (`adaptive_rule`,
  `EXIT_RULES`) says more steps will change little, and keeps x^(t+1); the recursion ends early once every
  position has stopped, at most T steps in all. The rules:
  `energy`: the relative energy decrease is small, E(u^(t)) - E(u^(t+1)) <= adaptive_tol · |E(u^(t))| (a step
  that raises E stops it too);
  `update`: the step is small, ‖x^(t+1) - x^(t)‖ <= adaptive_tol · ‖x^(t)‖ (no energy needed: cheap for the
  MLP, whose energy takes a quadrature);
  `second-difference`: the step size has stopped changing, |s_t - 2 s_{t-1} + s_{t-2}| <= adaptive_tol · ‖x^(t)‖
  with s_t = ‖x^(t+1) - x^(t)‖, checked from the third step on (t >= 2): the exit on the second-order
  difference of the step size of Pappone et al., "Two-Scale Latent Dynamics for Recurrent-Depth
  Transformers" (arXiv 2509.23314), against Huginn's KL exit and the first-order one (`update`). The paper
  names the quantity, not its scale: here it is relative to ‖x^(t)‖, as `update` is, so a tolerance means
  the same in both (relative to s_{t-2} a geometric decay of the steps would never stop).
- `guard` (0 = off): energy-guarded steps. A step whose E(u^(t+1)) > E(u^(t)) is retried with η_t halved,
  per position, up to `guard` times (Armijo backtracking with c = 0: accept on non-increase); a position
  whose step still raises E after `guard` halvings takes no step and stops.
Every layer counts the steps its positions took (`steps_used()`, `reset_steps_used()`), whatever the mode;
with an option on, `last_steps_used` holds the steps of every position (B, J) of the last forward pass.
The test-time settings (T and the inference options) travel together as one `Inference` value.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace

import torch
import torch.utils.checkpoint
from torch import Tensor, nn

from ..checks import check_choice, check_finite, check_nonnegative_int, check_positive_int, check_tolerance

STEP_SCHEDULES = ("constant", "inverse", "learned", "geometric")
STARTS = ("residual", "norm")
EXIT_RULES = ("energy", "update", "second-difference")  # what `adaptive_tol` is compared with (module docstring)
MAX_STEPS = 256  # the deepest T a setting may ask for (a bound, as `cem.model.config.MAXIMA`; trained depths are at most 5)
MAX_GUARD = 64  # halvings of a step: 2^-64 is below any float's resolution


@dataclass(frozen=True)
class Recursion:
    """The recursion of one CEM layer (module docstring): T = `steps` descent steps of size η = `step_size`
    under `schedule`, from the `start` point; the `learned` schedule holds `learned_steps` per-step gains
    (None: T), the `geometric` one shrinks each step by `decay`, and `learn_step_size=True` adds one learned
    scalar gain. `backprop_steps` truncates the backward pass to the last k steps; `anchor` pulls each
    step back towards x^(0); `gate` multiplies each step by a learned gate g(u) in (0, 1). Validated when made."""

    steps: int = 1
    """recursion steps T: descent steps of the energy per forward (§2.3)"""
    step_size: float = 1.0
    """step size η of each descent step (> 0)"""
    schedule: str = "constant"
    """η_t over the T steps: constant (η), inverse (η / T), learned (η · a learned gain per step), geometric (η · decay^t)"""
    learned_steps: int | None = None
    """the learned schedule's number of per-step gains (None: T; a model config sets it from its random depths)"""
    start: str = "residual"
    """x^(0): residual (= h, docs/design.md) or norm (= RMSNorm(h), Algorithm 1 read literally)"""
    learn_step_size: bool = False
    """multiply every step by one more learned scalar gain"""
    decay: float = 0.5
    """ρ of the geometric schedule, in (0, 1]"""
    backprop_steps: int = 0
    """truncated backpropagation: differentiate only the last k steps of each CEM layer (0 = all)"""
    anchor: float = 0.0
    """λ: each step also pulls x back towards x^(0), x += η_t (d(u) - λ (x - x^(0))) (0 = off)"""
    gate: bool = False
    """a learned gate per position on each step, x += σ(w · u + b) η_t d(u) (`StepGate`; starts near 1)"""

    CHOICES = {"schedule": STEP_SCHEDULES, "start": STARTS}

    def __post_init__(self) -> None:
        Inference.check("steps", self.steps)
        check_finite("step_size", self.step_size, 0, low_open=True)
        check_choice("step_schedule", self.schedule, STEP_SCHEDULES)
        if self.learned_steps is not None:
            check_positive_int("learned_steps", self.learned_steps)
        check_choice("start", self.start, STARTS)
        check_finite("step_decay", self.decay, 0, 1, low_open=True)
        check_nonnegative_int("backprop_steps", self.backprop_steps, MAX_STEPS)
        check_finite("anchor_weight", self.anchor, 0)
        for name, value in (("learn_step_size", self.learn_step_size), ("step_gate", self.gate)):
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be true or false, got {value!r}")


def _check_depth(name: str, value: int) -> None:
    check_positive_int(name, value, MAX_STEPS)


@dataclass(frozen=True)
class Inference:
    """The test-time settings of CEM layers (module docstring), each None to keep a layer's own: T = `steps`
    (`attn_steps` / `mlp_steps` for the layers of one sublayer kind, before `steps`), the exit rule
    `adaptive_rule` with its tolerance `adaptive_tol`, and `guard` halvings. Validated when made."""

    steps: int | None = None
    """recursion steps T of every CEM layer (test-time compute; the most with adaptive_tol)"""
    attn_steps: int | None = None
    """T of the CEM attention layers (before steps)"""
    mlp_steps: int | None = None
    """T of the CEM MLP layers (before steps)"""
    adaptive_tol: float | None = None
    """adaptive steps: a position stops once its exit rule's quantity is <= this"""
    adaptive_rule: str | None = None
    """the exit rule of adaptive steps: energy (relative energy decrease) or update (relative step size)"""
    guard: int | None = None
    """energy-guarded steps: halve a step that raises the energy up to this many times (0 = off)"""

    CHOICES = {"adaptive_rule": EXIT_RULES}
    CHECKS = {
        "steps": _check_depth, "attn_steps": _check_depth, "mlp_steps": _check_depth,
        "adaptive_tol": check_tolerance,  # None is off
        "adaptive_rule": lambda name, value: check_choice(name, value, EXIT_RULES),
        "guard": lambda name, value: check_nonnegative_int(name, value, MAX_GUARD),
    }  # fmt: skip

    def __post_init__(self) -> None:
        for f in fields(self):
            if getattr(self, f.name) is not None:
                self.check(f.name, getattr(self, f.name))

    @classmethod
    def check(cls, name: str, value) -> None:
        """Raise ValueError, naming the setting, unless `value` is a valid `name` (the one set of bounds, also
        of the layers' attributes and of a config's)."""
        cls.CHECKS[name](name, value)

    def depth(self, sublayer: str) -> int | None:
        """The T of a CEM layer of the `sublayer` kind ("attn" or "mlp"): its kind's own, else `steps` (None: keep)."""
        own = {"attn": self.attn_steps, "mlp": self.mlp_steps}.get(sublayer)
        return self.steps if own is None else own

    def changed(self, changes: Inference) -> Inference:
        """These settings with every setting `changes` gives (not None) in place of its own."""
        return replace(self, **{f.name: getattr(changes, f.name) for f in fields(changes) if getattr(changes, f.name) is not None})

    def options(self) -> Inference:
        """The inference options exactly as given (None: off, the exit rule `energy`, no guard), without depths:
        what a layer holds (its T is its `Recursion`'s)."""
        return Inference(adaptive_tol=self.adaptive_tol, adaptive_rule=self.adaptive_rule or "energy", guard=self.guard or 0)


OFF = Inference().options()  # a layer's inference options as built: no adaptive steps, no guard


class StepSize(nn.Module):
    """η_t of step t of T: the recursion's `step_size` (a plain float, changeable at test time) under its
    schedule, times a learned scalar gain if asked (`learn_step_size`)."""

    def __init__(self, recursion: Recursion) -> None:
        super().__init__()
        self.recursion = recursion
        self.gain = nn.Parameter(torch.empty(())) if recursion.learn_step_size else None
        gains = recursion.learned_steps or recursion.steps
        self.step_gains = nn.Parameter(torch.empty(gains)) if recursion.schedule == "learned" else None
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """The learned gains start at 1 (η_t as the schedule gives it)."""
        for gain in (self.gain, self.step_gains):
            if gain is not None:
                gain.fill_(1.0)

    def forward(self, t: int = 0, steps: int = 1) -> float | Tensor:
        """η_t for step t (0-based) of `steps`."""
        r = self.recursion
        eta: float | Tensor = r.step_size / steps if r.schedule == "inverse" else float(r.step_size)
        if r.schedule == "geometric":
            eta = eta * r.decay**t
        if self.step_gains is not None:
            eta = eta * self.step_gains[min(t, self.step_gains.numel() - 1)]
        return eta if self.gain is None else eta * self.gain

    @torch.no_grad()
    def path_length(self, steps: int) -> float:
        """Σ_t η_t over a recursion of `steps` steps: how far, in step sizes, its steps carry x in all."""
        return float(sum(self(t, steps) for t in range(steps)))

    def extra_repr(self) -> str:
        r = self.recursion
        decay = f", decay={r.decay}" if r.schedule == "geometric" else ""
        return f"step_size={r.step_size}, schedule={r.schedule}{decay}, learnable={self.gain is not None}"


class StepGate(nn.Module):
    """g(u) = σ(w · u + b), one scalar in (0, 1) per position (module docstring, `gate`): w (D) and b start at 0
    and GATE_BIAS, so g starts near 1 (a Linear(D, 1) kept apart from the model's N(0, σ²) initialisation)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.empty(dim))
        self.b = nn.Parameter(torch.empty(()))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        self.w.zero_()
        self.b.fill_(GATE_BIAS)

    def forward(self, u: Tensor) -> Tensor:
        """g(u) (..., 1) for u (..., D)."""
        return torch.sigmoid(u @ self.w + self.b).unsqueeze(-1)


GATE_BIAS = 3.0  # b at initialisation: g = σ(3) ≈ 0.953


class DescentLayer(nn.Module):
    """Base of the CEM layers, built from a `Recursion`, which it keeps as `recursion`: its T (`steps`) and η
    (`step_size`) are changeable on a built or trained model (the test-time compute knob of §2.3).

    In training, `drawn_steps` can set the T of the next forward passes (random-depth training); evaluation
    always uses `steps`. `inference` holds the inference options of the module docstring (an `Inference`
    without depths, `Inference.options`); `test_time` swaps T and them for one `with` block. A layer with
    `recurs = False` (`cem.model.config.RECUR_LAYERS`) keeps its T whatever test-time or drawn depth is asked.
    `dim` is the width of the residual stream (the step gate's).
    """

    sublayer = ""  # which of a block's `SUBLAYERS` the layer is, "attn" or "mlp" (`Inference.depth`)

    def __init__(self, recursion: Recursion, dim: int | None = None) -> None:
        super().__init__()
        self.eta = StepSize(recursion)
        if recursion.gate and dim is None:
            raise ValueError("a CEM layer with a step gate needs its width (dim)")
        self.gate = StepGate(dim) if recursion.gate else None
        self.recurs = True  # False: T stays as built (recursion in some layers only, `recur_layers`)
        self.inference = OFF
        self.drawn_steps: int | None = None
        self.last_steps_used: Tensor | None = None
        self.checkpoint_steps = False  # recompute each step in the backward pass (`LanguageModel.set_activation_checkpointing`)
        self.track_fixed_point = False  # keep `fixed_point_residual` in training forwards (module docstring)
        self.fixed_point_residual: Tensor | None = None
        self.reset_steps_used()

    @property
    def recursion(self) -> Recursion:
        """The layer's recursion (held by its step sizes `eta`); a new one keeps what the learned gains are made
        for (`schedule`, `learned_steps`, `learn_step_size`)."""
        return self.eta.recursion

    @recursion.setter
    def recursion(self, value: Recursion) -> None:
        made_for = ("schedule", "learned_steps", "learn_step_size", "gate")
        if not isinstance(value, Recursion) or any(getattr(value, k) != getattr(self.recursion, k) for k in made_for):
            raise ValueError(f"a built CEM layer keeps its recursion's {', '.join(made_for)} (its parameters are made for them), got {value!r}")
        self.eta.recursion = value

    @property
    def steps(self) -> int:
        return self.recursion.steps

    @steps.setter
    def steps(self, value: int) -> None:
        self.recursion = replace(self.recursion, steps=value)

    @property
    def step_size(self) -> float:
        return self.recursion.step_size

    @step_size.setter
    def step_size(self, value: float) -> None:
        self.recursion = replace(self.recursion, step_size=value)

    adaptive_tol = property(lambda self: self.inference.adaptive_tol, doc="the exit rule's tolerance (`inference`; None: off)")
    adaptive_rule = property(lambda self: self.inference.adaptive_rule, doc="the exit rule (`inference`)")
    guard = property(lambda self: self.inference.guard, doc="the energy guard's halvings (`inference`; 0: off)")

    def set_inference(self, inference: Inference) -> None:
        """T from `inference` (its depth for this layer's kind; None keeps it) and its options exactly (`Inference.options`)."""
        depth = inference.depth(self.sublayer) if self.recurs else None
        if depth is not None:
            self.steps = depth
        self.inference = inference.options()

    @contextmanager
    def test_time(self, inference: Inference = Inference(), step_size: float | None = None):
        """Run the `with` block at these test-time settings (an `Inference`: None keeps this layer's own) and η =
        `step_size`; afterwards the layer has its own back, whatever happened."""
        if not isinstance(inference, Inference):
            raise ValueError(f"test-time settings must be an Inference, got {type(inference).__name__} {inference!r}")
        saved = self.recursion, self.inference
        try:
            depth = inference.depth(self.sublayer) if self.recurs else None
            self.recursion = replace(self.recursion, steps=self.steps if depth is None else depth,
                                     step_size=self.step_size if step_size is None else step_size)
            self.inference = self.inference.changed(inference).options()
            yield self
        finally:
            self.eta.recursion, self.inference = saved

    def reset_steps_used(self) -> None:
        """Zero the step counters read by `steps_used`."""
        self.steps_total: int | Tensor = 0
        self.positions_total = 0

    def steps_used(self) -> float | None:
        """Average steps per position over the forward passes since `reset_steps_used` (None before any)."""
        return float(self.steps_total) / self.positions_total if self.positions_total else None

    def _count(self, steps: int | Tensor, positions: int) -> None:
        if not torch.compiler.is_compiling():  # plain Python counters: kept out of compiled graphs
            self.steps_total = self.steps_total + steps
            self.positions_total += positions

    def depth(self) -> int:
        """The T of this forward pass: a drawn depth while training with random depth, else `steps`."""
        return self.drawn_steps if (self.training and self.drawn_steps is not None and self.recurs) else self.steps

    def start_point(self, h: Tensor, hn: Tensor) -> tuple[Tensor, Tensor | None]:
        """x^(0) and, when it is already known, u^(0) = norm(x^(0)) (with x^(0) = h it is ĥ)."""
        return (h, hn) if self.recursion.start == "residual" else (hn, None)

    def descend(self, h: Tensor, hn: Tensor, direction) -> Tensor:
        """x^(0) from `start`, then x^(t+1) = x^(t) + η_t direction(norm(x^(t))) for t < T (minus η_t λ (x^(t) - x^(0))
        with an `anchor` λ); returns x^(T).

        `direction(u, with_energy=False)` is the layer's -P ∇_u E; with `with_energy=True` it returns
        (direction, E(u)) with E per position (B, J), which the inference options need.
        """
        x, u = self.start_point(h, hn)
        steps = self.depth()
        if self.inference.adaptive_tol is not None or self.inference.guard:
            return self._descend_checked(x, u, steps, direction)
        grad = torch.is_grad_enabled()
        checkpointed = self.checkpoint_steps and grad
        # truncated backpropagation: the first T - k steps without a graph (module docstring)
        k = self.recursion.backprop_steps
        skipped = max(steps - k, 0) if (grad and k) else 0
        x0 = x
        for t in range(steps):
            u_t = u if t == 0 else None
            if t < skipped:
                with torch.no_grad():
                    x = self._step(x, u_t, t, steps, direction, x0)
                if t == skipped - 1:  # the skipped steps read as the identity in the backward pass
                    x = x0 + (x - x0.detach())
            elif checkpointed:  # only x^(t) is kept; the step's activations are recomputed in the backward pass
                x = torch.utils.checkpoint.checkpoint(self._step, x, u_t, t, steps, direction, x0, use_reentrant=False)
            else:
                x = self._step(x, u_t, t, steps, direction, x0)
        if self.track_fixed_point and self.training and grad:
            self.fixed_point_residual = self._next_step_size(x, steps, direction, x0)
        self._count(steps * x.shape[:-1].numel(), x.shape[:-1].numel())
        return x

    def _pull(self, d: Tensor, x: Tensor, x0: Tensor, u: Tensor) -> Tensor:
        """The step's direction with the anchor and the gate: g(u) (d - λ (x - x^(0))) (d itself when λ = 0 and
        there is no gate)."""
        anchor = self.recursion.anchor
        p = d - anchor * (x - x0) if anchor else d
        return p if self.gate is None else self.gate(u) * p

    def _next_step_size(self, x: Tensor, steps: int, direction, x0: Tensor) -> Tensor:
        """r = mean_i ‖η_T d(u_i^(T))‖² / ‖x_i^(T)‖²: the relative size of the step after the last (a scalar;
        d includes the anchor's pull)."""
        u = self.norm(x)
        step = self.eta(steps, steps + 1) * self._pull(direction(u), x, x0, u)
        dtype = torch.promote_types(x.dtype, torch.float32)  # bf16 activations: the ratio in float32
        return (step.to(dtype).pow(2).sum(-1) / x.to(dtype).pow(2).sum(-1).clamp_min(1e-12)).mean()

    def _step(self, x: Tensor, u: Tensor | None, t: int, steps: int, direction, x0: Tensor) -> Tensor:
        """x^(t+1) = x^(t) + η_t direction(u^(t)), with u^(t) = norm(x^(t)) unless given (and the anchor's pull,
        and the gate)."""
        u = self.norm(x) if u is None else u
        return x + _times(self.eta(t, steps), self._pull(direction(u), x, x0, u))

    def _descend_checked(self, x: Tensor, u: Tensor | None, steps: int, direction) -> Tensor:
        """The recursion with `adaptive_tol` and / or `guard` (module docstring): per-position steps."""
        if self.training and torch.is_grad_enabled():
            raise ValueError(
                f"adaptive_tol={self.inference.adaptive_tol} and guard={self.inference.guard} are inference options (eval mode or "
                "torch.no_grad()); turn them off (set_inference(Inference())) to train"
            )
        tol, guard, rule = self.inference.adaptive_tol, self.inference.guard, self.inference.adaptive_rule
        by_energy = tol is not None and rule == "energy"
        need_energy = bool(guard) or by_energy  # the update rules alone need no energy

        x0 = x

        def step_direction(point: Tensor, u_point: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
            """The step's direction at x = `point` (with the anchor's pull and the gate) and, when needed, the
            objective the step descends there: E(norm(x)), plus λ/2 ‖x - x^(0)‖² with an anchor λ."""
            u_point = self.norm(point) if u_point is None else u_point
            if not need_energy:
                return self._pull(direction(u_point), point, x0, u_point), None
            d_point, e_point = direction(u_point, with_energy=True)
            if self.recursion.anchor:
                e_point = e_point + 0.5 * self.recursion.anchor * (point - x0).pow(2).sum(-1)
            return self._pull(d_point, point, x0, u_point), e_point

        p, e = step_direction(x, u)
        active = torch.ones(x.shape[:-1], dtype=torch.bool, device=x.device)
        used = torch.zeros(x.shape[:-1], dtype=torch.long, device=x.device)
        sizes: list[Tensor] = []  # s_t = ‖x^(t+1) - x^(t)‖ of the steps taken (second-difference rule)
        for t in range(steps):
            eta = self.eta(t, steps)
            if t == steps - 1 and not guard:  # the last step: no energy needed after it
                x = torch.where(active.unsqueeze(-1), x + eta * p, x)
                used += active
                break
            eta = torch.full(x.shape[:-1], float(eta), dtype=x.dtype, device=x.device).unsqueeze(-1)  # η_t per position, halved by the guard
            x_new = x + eta * p
            p_new, e_new = step_direction(x_new)
            for _ in range(guard):
                worse = active & (e_new > e)
                if not bool(worse.any()):
                    break
                eta = torch.where(worse.unsqueeze(-1), eta / 2, eta)
                x_try = x + eta * p
                p_try, e_try = step_direction(x_try)
                w = worse.unsqueeze(-1)
                x_new, p_new, e_new = torch.where(w, x_try, x_new), torch.where(w, p_try, p_new), torch.where(worse, e_try, e_new)
            take = active & (e_new <= e) if guard else active
            going = self._going(rule, tol, x, x_new, sizes, t) if tol is not None and not by_energy else None
            x, p = torch.where(take.unsqueeze(-1), x_new, x), torch.where(take.unsqueeze(-1), p_new, p)
            e_old, e = e, (torch.where(take, e_new, e) if need_energy else None)
            used += take
            if by_energy:
                active = take & (e_old - e > tol * e_old.abs())
            else:
                active = take & going if going is not None else take
            if not bool(active.any()):
                break
        self.last_steps_used = used  # (B, J): the steps each position took in this (checked) forward
        self._count(used.sum(), used.numel())
        return x

    @staticmethod
    def _going(rule: str, tol: float, x: Tensor, x_new: Tensor, sizes: list[Tensor], t: int) -> Tensor:
        """Whether each position goes on after step t from x = x^(t) to x_new = x^(t+1) under an exit rule that
        reads the step sizes (module docstring): `update`, ‖x^(t+1) - x^(t)‖ > tol ‖x^(t)‖; `second-difference`,
        |s_t - 2 s_{t-1} + s_{t-2}| > tol ‖x^(t)‖, always for t < 2. `sizes` keeps s_0..s_t (appended here)."""
        scale = tol * x.norm(dim=-1)
        sizes.append((x_new - x).norm(dim=-1))
        if rule == "update":
            return sizes[-1] > scale
        if t < 2:
            return torch.ones_like(scale, dtype=torch.bool)
        return (sizes[-1] - 2 * sizes[-2] + sizes[-3]).abs() > scale


def _times(eta: float | Tensor, d: Tensor) -> Tensor:
    """η d, or d itself for the plain η = 1.0 (d · 1.0 is d exactly: one operator less a step, and its backward)."""
    return d if isinstance(eta, float) and eta == 1.0 else eta * d


def _uniform_depths(n: int, high: int, mean: float) -> Tensor:
    """T ~ uniform{1..high} (`mean` is (1 + high) / 2 and not used)."""
    return torch.randint(1, high + 1, (n,))


POISSON_LOGNORMAL_SIGMA = 0.5  # Huginn's σ (Geiping et al. 2025)


def _poisson_lognormal_depths(n: int, high: int, mean: float) -> Tensor:
    """T = 1 + Poisson(e^τ), τ ~ N(log(mean - 1) - σ²/2, σ²): heavy-tailed with E[T] = `mean` (before the cap
    at `high`), as Huginn draws its recurrence depth."""
    if mean <= 1:
        return torch.ones(n, dtype=torch.long)
    sigma = POISSON_LOGNORMAL_SIGMA
    tau = torch.randn(n, dtype=torch.float64) * sigma + (math.log(mean - 1) - sigma**2 / 2)
    return (torch.poisson(tau.exp()) + 1).clamp(max=high).long()


DEPTH_DISTRIBUTIONS = {"uniform": _uniform_depths, "poisson-lognormal": _poisson_lognormal_depths}


def draw_depths(distribution: str, n: int, high: int, mean: float) -> list[int]:
    """n training depths T in 1..high from a `DEPTH_DISTRIBUTIONS` kind, drawn from torch's global generator
    (so a resumed run, which restores it, draws the same ones)."""
    check_choice("train_depth_dist", distribution, tuple(DEPTH_DISTRIBUTIONS))
    return DEPTH_DISTRIBUTIONS[distribution](n, high, mean).tolist()


def draw_supervised_depths(k: int, high: int) -> list[int]:
    """K distinct depths T_1 < ... < T_K = `high` for random deep supervision (LoopUS, arXiv 2605.11011): the
    deepest always (the depth the model is trained for, and the one the monotonicity term ends at), the other
    K - 1 uniform without replacement from 1..high-1, drawn from torch's global generator (exact resume)."""
    check_positive_int("supervise_depths", k, high)
    others = (torch.randperm(high - 1)[: k - 1] + 1).tolist()
    return sorted(others) + [high]


def curriculum_depth(curriculum: tuple[int, ...], step: int, total: int) -> int:
    """The T of optimiser step `step` (0-based) of `total` under a depth curriculum (retrofitted recurrence, arXiv
    2511.07384): training split into len(curriculum) equal fractions, T = curriculum[k] in fraction k, i.e.
    k = ⌊step · len / total⌋ (the last fraction past the end)."""
    check_positive_int("total steps", total)
    return curriculum[min(max(step, 0) * len(curriculum) // total, len(curriculum) - 1)]


def set_inference(module: nn.Module, inference: Inference) -> int:
    """Set the test-time settings of every CEM layer inside any `module` (your own model too), for good: T from
    `inference` by kind (`Inference.depth`: `attn_steps` for the `CEMAttention` layers, `mlp_steps` for the
    `CEMMLP` layers, `steps` for those not named; None keeps a layer's T) and the inference options exactly as
    given (`Inference.options`: None is off). Returns how many layers were set.

    This changes the test-time compute, not what the layers learned: a layer trained at T = 2 is usually worse
    at T = 4 or 8, unless trained for it (random depths)."""
    if not isinstance(inference, Inference):
        raise ValueError(f"test-time settings must be an Inference, got {type(inference).__name__} {inference!r}")
    layers = [m for m in module.modules() if isinstance(m, DescentLayer)]
    for m in layers:
        m.set_inference(inference)
    return len(layers)
