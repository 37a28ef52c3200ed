"""A run directory: the one place that knows its layout, whether it holds "the same run", and how to load
what a run left behind.

    run.json        the run's identity (model, tokenizer, corpus, training settings), its full config and
                    total steps; written when training starts
    tokenizer/      the tokenizer, reloadable with `cem.data.load_tokenizer`
    ckpt/           the latest checkpoint (`checkpoint.py`; `ckpt.old/` while a swap is interrupted)
    .lock           held (flock) by the process writing the run; holds its pid
    metrics.jsonl   one record per logged step (`metrics.read_metrics`; also tensorboard/; runs started before
                    2026-11-27 also hold metrics.csv, `metrics.drop_duplicate_csv`)
    results.json    the final results; its presence means the run is finished
    evals/          what analyses of the run computed from its final weights (written by whoever analyses it)

One rule decides whether two runs are the same: `run_identity` (the model, the tokenizer, the corpus, and
every training setting except the `RUNTIME_KEYS`, which may change between a run and its resumption); one
rule names run folders: `run_name` (the command line's `default_run_dir`, the sweep's `RunSpec.slug`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import shutil
from collections.abc import Sequence
from pathlib import Path

import torch

from ..io import LOCK_FILE, LockedError, atomic_write_json, lock_folder, refuse_link
from ..model import LanguageModel, ModelConfig, load_pretrained
from ..records import RESULTS, RUN, read_record
from .checkpoint import MANIFEST as CKPT_MANIFEST, find_checkpoint, load_checkpoint, load_trainer_state, verify_checkpoint
from .config import RunConfig, TrainConfig

# training settings that may change between a run and its resumption without making it a different run
RUNTIME_KEYS = frozenset(
    {"device", "compile", "eval_every", "eval_batches", "log_every", "save_every", "wandb", "wandb_project",
     "tensorboard", "data_dir", "parallel", "diverge_factor", "diverge_warmup", "final_eval_tokens",
     "activation_checkpointing"}
)  # fmt: skip
# the training budget: a finished run asked for more steps is extended (the rule in `RunDir.claim`)
BUDGET_KEYS = frozenset({"max_steps", "tokens"})
_TRAIN_DEFAULTS = dataclasses.asdict(TrainConfig())


def _same_model(recorded, model: dict) -> bool:
    """Whether a recorded model config (flat, as older run.json files hold it, or nested) is `model`'s. A setting
    the record lacks was added to ModelConfig since: the record ran with its default (each new setting's
    default keeps the behaviour from before it existed)."""
    try:
        return ModelConfig.from_dict(recorded) == ModelConfig.from_dict(model)
    except ValueError:  # a record this cem cannot read is not this run
        return False


def run_identity(run: RunConfig, model: ModelConfig | None = None, tokenizer: str | None = None, corpus: dict | None = None) -> dict:
    """What makes a run this run. The trainer knows all four parts; a caller that only has the config
    (e.g. a sweep deciding whether a finished run can be reused) leaves the others out, and only the parts
    given are compared."""
    identity = {"train": {k: v for k, v in run.to_dict()["train"].items() if k not in RUNTIME_KEYS}}
    for key, value in (("model", None if model is None else model.to_dict()), ("tokenizer", tokenizer), ("corpus", corpus)):
        if value is not None:
            identity[key] = value
    return identity


MAX_NAME_BYTES = 200  # a longer run name is cut (with a digest, `run_name`), leaving room for suffixes


def run_name(head: Sequence[str], settings: tuple = (), tail: Sequence[str] = (), cut: int | None = None) -> str:
    """A run folder's name: `head`, then `key=value` for every setting (`settings`: a tuple of groups of
    (key, value) pairs), joined by "-"; with `cut`, that text cut to `cut` characters and followed by a
    digest of the settings, so that cut names stay apart; then `tail`. Characters other than letters,
    digits (ASCII) and -_.= become _. A name over MAX_NAME_BYTES is cut as if `cut` were given."""
    text = "-".join([*head, *(f"{k}={v}" for group in settings for k, v in group)])
    if cut is None and len(text) > MAX_NAME_BYTES:  # file systems refuse names over 255 bytes
        cut = MAX_NAME_BYTES // 2
    if cut is not None:
        text = f"{text[:cut]}-{hashlib.sha1(repr(settings).encode()).hexdigest()[:6]}"
    return "".join(c if (c.isascii() and c.isalnum()) or c in "-_.=" else "_" for c in "-".join([text, *tail]))


def default_run_dir(run: RunConfig) -> Path:
    """runs/ARCH-PRESET-DATA-sSEED, then every other setting that differs from its default (key=value), so
    that runs with different settings never share a folder."""
    t = run.train
    named = {"arch", "preset", "data", "seed"} | RUNTIME_KEYS
    from .budget import DEFAULT_STEPS

    defaults = {**_TRAIN_DEFAULTS, **({"max_steps": DEFAULT_STEPS} if t.tokens is None else {})}  # the budget a plain `cem train` gets
    changed = tuple((k, v) for k, v in dataclasses.asdict(t).items() if k not in named and v != defaults[k] and v != _TRAIN_DEFAULTS[k])
    return Path("runs") / run_name([t.arch, t.preset, Path(t.data).name, f"s{t.seed}"], (changed, tuple(sorted(run.model_overrides.items()))))


EVAL_BATCH_SIZE = 8  # sequences per batch when evaluating a directory that records no training settings


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    """What a run is evaluated on (`RunDir.eval_settings`)."""

    data: str
    data_dir: str | None
    encoding: str
    seq_len: int
    batch_size: int
    precision: str
    tokenizer: str = "byte"  # the run's tokenizer spec: which token shards of `data` are its own


def _remove_folder(directory: Path) -> None:
    """Remove a run's folder; a link there is removed, never what it points to."""
    if directory.is_symlink():
        directory.unlink()
    else:
        shutil.rmtree(directory, ignore_errors=True)


RunLockedError = LockedError  # another live process holds the run directory


class RunDir:
    """Paths and contents of one run directory (see the module doc for its layout)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    # ------------------------------------------------------------------ layout

    @property
    def run_json(self) -> Path:
        return self.path / "run.json"

    @property
    def tokenizer_dir(self) -> Path:
        return self.path / "tokenizer"

    @property
    def ckpt_dir(self) -> Path:
        return self.path / "ckpt"

    @property
    def lock_file(self) -> Path:
        return self.path / LOCK_FILE

    @property
    def results_json(self) -> Path:
        return self.path / "results.json"

    @property
    def metrics_jsonl(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def log_file(self) -> Path:
        """train.log: every message of the run and a line per logged step, appended by each session."""
        return self.path / "train.log"

    @property
    def metrics_csv(self) -> Path:
        """The table older runs wrote beside metrics.jsonl (see `metrics`); new runs do not."""
        return self.path / "metrics.csv"

    @property
    def tensorboard_dir(self) -> Path:
        return self.path / "tensorboard"

    @property
    def evals_dir(self) -> Path:
        return self.path / "evals"

    # ------------------------------------------------------------------ identity

    def read_run(self) -> dict | None:
        """The contents of run.json, None if there is none (ValueError if it is unreadable)."""
        if not self.run_json.exists():
            return None
        return read_record(self.run_json, RUN)

    def differences(self, identity: dict) -> list[str]:
        """What differs between the run recorded here and `identity` (`run_identity`): "tokenizer",
        "corpus", "model", or "training setting NAME"; [] for the same run or when nothing is recorded.
        A training or model setting the record lacks (added to TrainConfig or ModelConfig since) counts as
        its default."""
        recorded = self.read_run()
        if recorded is None:
            return []
        diff = [key for key in ("tokenizer", "corpus") if key in identity and recorded.get(key) != identity[key]]
        if "model" in identity:
            if not _same_model(recorded.get("model"), identity["model"]):
                diff.append("model")
        saved = recorded.get("train", {})
        for key, value in identity.get("train", {}).items():
            if saved.get(key, _TRAIN_DEFAULTS.get(key)) != value:
                diff.append(f"training setting {key}")
        return diff

    def lock(self) -> contextlib.AbstractContextManager[None]:
        """Hold the run directory for this process (`cem.io.lock_folder`: an exclusive flock on `.lock`, which
        records the pid): a second writer gets a RunLockedError naming the holder."""
        return lock_folder(self.path, f"run directory {self.path}")

    def parts(self) -> tuple[Path, ...]:
        """The folders a run writes here (removed by `clear`)."""
        return (self.tokenizer_dir, self.ckpt_dir, self.path / "ckpt.old", self.tensorboard_dir, self.evals_dir)

    def foreign(self) -> Path | None:
        """One of the run's folders (`parts`) in a directory that records no run (no run.json), so that
        something else made it; None if there is none. A run writes run.json before any of them, and
        `clear` removes it after them."""
        if self.run_json.exists():
            return None
        return next((p for p in self.parts() if p.exists() or p.is_symlink()), None)

    def refuse_foreign(self) -> None:
        """ValueError naming a folder that no cem run of this directory made (`foreign`): never replaced."""
        part = self.foreign()
        if part is not None:
            raise ValueError(f"{part} exists but {self.path} holds no cem run (no run.json); refusing to replace it: choose another --out")

    def holds(self, path: str | Path) -> Path | None:
        """The run's own file or folder that `path` is, or lies in (the run directory itself, its parts,
        run.json, results.json); None if none: a place another command must not write to."""
        path = Path(path).resolve()
        own = (self.path, *self.parts(), self.run_json, self.results_json)
        return next((p for p in own if path == p.resolve() or (p != self.path and p.resolve() in path.parents)), None)

    def started_only(self) -> bool:
        """Whether the directory records a run that made no progress: run.json, but neither a checkpoint
        nor results (it failed at start-up, or before its first checkpoint). Such a run may be replaced."""
        return self.read_run() is not None and self.checkpoint() is None and not self.results_json.exists()

    def claim(self, identity: dict, resume: bool, total_steps: int | None = None) -> str:
        """Refuse to mix runs. Returns "new" (nothing recorded here), "resume" (this run, to continue),
        "finished" (this run, finished with `total_steps` steps or more: nothing to do) or "extend" (this run
        finished with fewer steps than `total_steps`: only its budget differs, and it continues from its
        final checkpoint). Raises ValueError for a different run, or for this unfinished run without
        `resume` (the message says what to do)."""
        recorded = self.read_run()
        if recorded is None:
            self.refuse_foreign()
            return "new"
        if self.started_only():  # a run that never saved a checkpoint is no run to protect: start afresh
            if self.differences(identity):  # its metrics are another run's; this run's rerun appends to its own
                for path in (self.metrics_jsonl, self.metrics_csv):
                    path.unlink(missing_ok=True)
            return "new"
        results = self.results()
        if results is not None and total_steps is not None and total_steps > results.get("steps", 0):
            budget = {"train": {k: v for k, v in identity.get("train", {}).items() if k not in BUDGET_KEYS}}
            if not self.differences({**identity, **budget}):
                return "extend"
        diff = self.differences(identity)
        if diff:
            raise ValueError(
                f"output directory {self.path} already holds a different run ({diff[0]} differs); "
                "choose another --out, or pass --overwrite to replace it"
            )
        if results is not None:
            return "finished"
        if not resume:
            raise ValueError(
                f"output directory {self.path} already holds this run, unfinished; pass --resume to continue it, "
                "or --overwrite to start it again"
            )
        return "resume"

    def clear(self) -> None:
        """Remove what a run writes here (tokenizer, checkpoints, metrics, log, results, and run.json last); other
        files stay. A directory that holds no cem run is left alone (`refuse_foreign`)."""
        self.refuse_foreign()
        for path in (self.results_json, self.metrics_jsonl, self.metrics_csv, self.log_file):
            path.unlink(missing_ok=True)
        for directory in self.parts():
            _remove_folder(directory)
        self.run_json.unlink(missing_ok=True)

    def start_extension(self) -> None:
        """Mark a finished run as unfinished again before it is extended (its results.json goes, and so do
        the evaluations of its final weights, which change)."""
        self.results_json.unlink(missing_ok=True)
        _remove_folder(self.evals_dir)

    def write_run(self, identity: dict, run: RunConfig, total_steps: int, tokenizer) -> None:
        """Record the run (run.json) and save its tokenizer."""
        atomic_write_json(self.run_json, {**identity, "config": run.to_dict(), "total_steps": total_steps})
        tokenizer.save(refuse_link(self.tokenizer_dir))

    def eval_settings(self, context: int, data: str | None = None, data_dir: str | None = None, seq_len: int | None = None,
                      batch_size: int | None = None) -> EvalSettings:
        """How to evaluate the run: its own corpus, data directory (unless another corpus is given), text
        encoding, sequence length (else `context`), batch size and precision, except what is given."""
        saved = self.train_settings() if self.checkpoint() is not None or self.run_json.exists() else {}
        return EvalSettings(
            data=data or saved.get("data", _TRAIN_DEFAULTS["data"]),
            data_dir=data_dir or (saved.get("data_dir") if data is None else None),
            encoding=saved.get("data_encoding", _TRAIN_DEFAULTS["data_encoding"]),
            tokenizer=saved.get("tokenizer", _TRAIN_DEFAULTS["tokenizer"]),
            seq_len=seq_len or saved.get("seq_len") or context,
            batch_size=batch_size or saved.get("batch_size", EVAL_BATCH_SIZE),
            precision=saved.get("precision", _TRAIN_DEFAULTS["precision"]),
        )

    def recorded_config(self) -> RunConfig | None:
        """The config the run recorded in run.json (checked as a command line's, errors naming run.json), None
        if it records none."""
        recorded = self.read_run()
        return RunConfig.from_dict(recorded["config"], str(self.run_json)) if recorded is not None and "config" in recorded else None

    def train_settings(self) -> dict:
        """The run's training settings (`TrainConfig` as a dict), from run.json or else the checkpoint."""
        run = self.recorded_config()
        if run is None:
            ckpt = self.checkpoint()
            if ckpt is None:
                raise FileNotFoundError(f"no run.json or checkpoint in {self.path}")
            run = RunConfig.from_dict(load_trainer_state(ckpt).get("run"), str(ckpt / "trainer_state.pt"))
        return dataclasses.asdict(run.train)

    # ------------------------------------------------------------------ contents

    def checkpoint(self) -> Path | None:
        """The checkpoint directory to resume from, None if there is none."""
        return find_checkpoint(self.path)

    def results(self) -> dict | None:
        """The final results, None while the run is unfinished."""
        return read_record(self.results_json, RESULTS) if self.results_json.exists() else None

    def write_results(self, results: dict) -> None:
        atomic_write_json(self.results_json, results)

    def load_tokenizer(self):
        """The run's tokenizer, None if the directory has none (a saved model directory)."""
        from ..data import load_tokenizer

        return load_tokenizer(self.tokenizer_dir) if self.tokenizer_dir.exists() else None

    def load_checkpoint(self, map_location: str | torch.device = "cpu") -> tuple[LanguageModel, dict]:
        """The verified model and trainer state of the run's checkpoint."""
        ckpt = self.checkpoint()
        if ckpt is None:
            raise FileNotFoundError(f"no checkpoint in {self.path}")
        return load_checkpoint(ckpt, map_location)

    def load_model(self, map_location: str | torch.device = "cpu") -> LanguageModel:
        """The model of the run's (verified) checkpoint, or of the directory itself when it is a checkpoint
        (verified too) or a model saved with `save_pretrained`."""
        if not self.path.exists():
            raise FileNotFoundError(f"no run or model directory at {self.path}")
        if not self.path.is_dir():
            raise ValueError(f"{self.path} is a file, not a run or model directory")
        ckpt = self.checkpoint()
        if ckpt is None and (self.path / CKPT_MANIFEST).is_file():  # a checkpoint folder itself (`--ckpt RUN/ckpt`)
            ckpt = self.path
        if ckpt is None and self.run_json.exists():
            raise FileNotFoundError(f"{self.path} holds a run (run.json) but no checkpoint: {self.ckpt_dir} is missing, so there are no weights "
                                    "to load (train the run again)")
        if ckpt is not None:
            verify_checkpoint(ckpt)
        return load_pretrained(ckpt if ckpt is not None else self.path, map_location=map_location)
