"""The schema of every record cem reads back (run.json, results.json, a checkpoint's trainer state and manifest, a
token-shard manifest, tokenizer configs, provenance), checked at the one place each is read: a record that is not
what cem writes is refused in one line naming the file and the field (`results.json: sessions[2] must be an object,
got str`), never a KeyError or AttributeError later. Objects are open (a newer cem's extra keys are kept); a field
is checked where present, and `required` ones must be. The study reads the same records through `check`.
"""

from __future__ import annotations

import math
import os
import reprlib
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "CHECKPOINT_MANIFEST", "HF_TOKENIZER_META", "PROCESSOR_INFERRED", "PROVENANCE", "RESULTS", "RUN", "SESSION",
    "SHARD_MANIFEST", "SHARD_RESUME", "TOKENIZER_CONFIG", "TOKENIZER_META", "TRAINER_STATE", "RecordError", "check", "read_record",
]


class RecordError(ValueError):
    """A record that does not match its schema: the file (or row) and the field."""


def _got(value) -> str:
    """A value as an error shows it: its type, and for a scalar its text (cut short)."""
    kind = type(value).__name__
    return kind if isinstance(value, (dict, list, tuple)) else f"{kind} {reprlib.repr(value)}"


class Kind:
    """A field's kind: `what` it must be, in words, and `problem(value, at)`: None if `value` is one, else what
    is wrong with the field at `at` (a path such as "sessions[2].processor")."""

    what = "anything"

    def problem(self, value, at: str) -> str | None:
        return None if self.accepts(value) else f"{at or 'the record'} must be {self.what}, got {_got(value)}"

    def accepts(self, value) -> bool:
        return True


@dataclass(frozen=True)
class Int(Kind):
    """An integer (not a boolean) in [low, high]."""

    low: int | None = 0
    high: int | None = None

    @property
    def what(self) -> str:
        if self.low is not None and self.high is not None:
            return f"an integer in [{self.low:,}, {self.high:,}]"
        return "an integer" + (f" >= {self.low}" if self.low is not None else "") + (f" <= {self.high:,}" if self.high is not None else "")

    def accepts(self, value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and (self.low is None or value >= self.low) \
            and (self.high is None or value <= self.high)


@dataclass(frozen=True)
class Num(Kind):
    """A real number (not a boolean), finite unless `finite` is False (never NaN), >= `low` when given."""

    low: float | None = None
    finite: bool = True

    @property
    def what(self) -> str:
        return ("a finite number" if self.finite else "a number (not NaN)") + (f" >= {self.low:g}" if self.low is not None else "")

    def accepts(self, value) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value) \
            and (math.isfinite(value) or not self.finite) and (self.low is None or value >= self.low)


@dataclass(frozen=True)
class Str(Kind):
    """A string: non-empty with `nonempty`, one of `choices` when given."""

    nonempty: bool = False
    choices: tuple[str, ...] | None = None

    @property
    def what(self) -> str:
        if self.choices:
            return f"one of {', '.join(map(repr, self.choices))}"
        return "a non-empty string" if self.nonempty else "a string"

    def accepts(self, value) -> bool:
        return isinstance(value, str) and (bool(value) or not self.nonempty) and (self.choices is None or value in self.choices)


@dataclass(frozen=True)
class Bool(Kind):
    what = "true or false"

    def accepts(self, value) -> bool:
        return isinstance(value, bool)


@dataclass(frozen=True)
class Null(Kind):
    """`kind`, or null."""

    kind: Kind

    @property
    def what(self) -> str:
        return f"{self.kind.what} or null"

    def problem(self, value, at: str) -> str | None:
        return None if value is None else _outer(self, [self.kind.problem(value, at)], value, at)


@dataclass(frozen=True)
class Either(Kind):
    """One of `kinds` (e.g. a string or an object)."""

    kinds: tuple[Kind, ...]

    @property
    def what(self) -> str:
        return " or ".join(k.what for k in self.kinds)

    def problem(self, value, at: str) -> str | None:
        return _outer(self, [k.problem(value, at) for k in self.kinds], value, at)


@dataclass(frozen=True)
class List(Kind):
    """A list of `item`s (at least one with `nonempty`)."""

    item: Kind = field(default_factory=Kind)
    nonempty: bool = False
    container, noun = list, "a list"

    @property
    def what(self) -> str:
        return f"a non-empty {self.noun.split()[1]}" if self.nonempty else self.noun

    def problem(self, value, at: str) -> str | None:
        if not isinstance(value, self.container) or (self.nonempty and not value):
            got = f"an empty {self.noun.split()[1]}" if isinstance(value, self.container) else _got(value)
            return f"{at or 'the record'} must be {self.what}, got {got}"
        return next((p for where, v in self.entries(value, at) if (p := self.item.problem(v, where))), None)

    def entries(self, value, at: str):
        """Each item of `value` with its path."""
        return ((f"{at}[{i}]", v) for i, v in enumerate(value))


@dataclass(frozen=True)
class Map(List):
    """An object of any string keys, each value an `item` (at least one with `nonempty`)."""

    container, noun = dict, "an object"

    def entries(self, value, at: str):
        return ((_key(at, k), v) for k, v in value.items())


@dataclass(frozen=True)
class Object(Kind):
    """An object whose named `fields` are of their kinds where present (others are kept unchecked), `required` ones
    always present."""

    fields: dict[str, Kind] = field(default_factory=dict)
    required: tuple[str, ...] = ()
    what = "an object"

    def problem(self, value, at: str) -> str | None:
        if not isinstance(value, dict):
            return f"{at or 'the record'} must be {self.what}, got {_got(value)}"
        missing = next((k for k in self.required if k not in value), None)
        if missing is not None:
            return f"{_key(at, missing)} is missing"
        return next((p for k, kind in self.fields.items() if k in value and (p := kind.problem(value[k], _key(at, k)))), None)


def _outer(kind: Kind, problems: list[str | None], value, at: str) -> str | None:
    """The problem of a value of `kind` (a choice among kinds) from those of the kinds it may be: none if it is one;
    the problem inside the one it is, of the wrong content (an object lacking a field); else what `kind` is."""
    if None in problems:
        return None
    inner = [p for p in problems if not p.startswith(f"{at or 'the record'} must be")]
    return inner[0] if inner else f"{at or 'the record'} must be {kind.what}, got {_got(value)}"


def _key(at: str, key) -> str:
    """The path of `key` inside the field at `at` ("" at the top)."""
    return f"{at}.{key}" if at else str(key)


def check(schema: Kind, value, where: str | os.PathLike):
    """`value` if it matches `schema`, else a RecordError naming `where` (a file, or a row) and the field."""
    problem = schema.problem(value, "")
    if problem is not None:
        raise RecordError(f"{where}: {problem}")
    return value


def read_record(path: str | os.PathLike, schema: Kind):
    """The JSON object in `path` (`cem.io.read_json`), checked against `schema`."""
    from .io import read_json

    return check(schema, read_json(path), Path(path))


# ------------------------------------------------------------------ the records

TOKENS = Int(0, 10**15)  # a token or byte count (a petabyte: a bound no real corpus reaches, so 1e300 is refused)
STEPS = TOKENS  # a step count: at most one per token
SECONDS = Num(0)

PROVENANCE = Object({  # `cem.provenance.provenance`: what produced a training session
    "version": Str(), "commit": Null(Str()), "dirty": Null(Bool()), "torch": Str(), "python": Str(), "processor": Str(),
    "cpu_id": Null(Str()), "cpu_capability": Null(Str()), "device": Str(), "threads": Int(1), "cpu_count": Null(Int(1)),
    "platform": Str(),
})
SESSION = Object({**PROVENANCE.fields, "compiled": Bool(), "from_step": STEPS})  # one training session of a run
PROCESSOR_INFERRED = Object({"processor": Str(nonempty=True), "by": Str()}, required=("processor",))  # a same-bits check's

RUN = Object({  # run.json (`RunDir.write_run`): the run's identity, its config (checked by `RunConfig.from_dict`) and budget
    "train": Object(), "model": Object(), "tokenizer": Str(), "corpus": Either((Str(), Object())), "config": Object(),
    "total_steps": STEPS,
})

_SPLIT_METRICS = {f"{split}_{k}": kind for split in ("valid", "test") for k, kind in (
    ("loss", Num(0)), ("perplexity", Num(0, finite=False)), ("bits_per_byte", Num(0)), ("tokens", TOKENS), ("whole_split", Bool()))}
RESULTS = Object({  # results.json (`trainer._finish`): a finished run's final metrics and what produced it
    "status": Str(), "steps": STEPS, "tokens_seen": TOKENS, "train_wall_time_s": SECONDS, **_SPLIT_METRICS,
    "parameters": Map(Int(0)), "tokens_per_s": Num(0), "wall_time_s": SECONDS, "total_time_s": SECONDS, "device": Str(),
    "world_size": Int(1), "provenance": PROVENANCE, "sessions": List(SESSION), "processor_inferred": PROCESSOR_INFERRED,
    "model": Object(), "config": Object(), "tokenizer": Str(), "data": Str(),
})

TRAINER_STATE = Object({  # trainer_state.pt (`trainer._save`), as `torch.load(weights_only=True)` gives it
    "step": STEPS, "format": Int(0), "tokens_seen": TOKENS, "elapsed": SECONDS, "optimizer": Object(), "scheduler": Object(),
    "sampler": List(nonempty=True), "rng": List(nonempty=True), "guard": Object(), "run": Object(), "sessions": List(SESSION),
}, required=("step",))

CHECKPOINT_MANIFEST = Object({  # a checkpoint's manifest.json (`save_checkpoint`), format 0 read as {"files": ...}
    "format": Int(0), "step": Null(STEPS),
    "files": Map(Object({"bytes": Int(0), "sha256": Str(nonempty=True)}, required=("bytes", "sha256")), nonempty=True),
}, required=("files",))

_SHARD = Object({"file": Str(nonempty=True), "n_tokens": TOKENS, "sha256": Str(nonempty=True)}, required=("file", "n_tokens", "sha256"))
SHARD_MANIFEST = Object({  # a token-shard folder's manifest.json (`prepare_shards`)
    "settings": Object({"source": Str(), "tokenizer": Str(), "tokenizer_spec": Str(), "dtype": Str(choices=("uint16", "uint32"))},
                       required=("format", "source", "tokenizer", "tokenizer_spec", "dtype")),
    "source_files": Null(Map(List())),
    "splits": Map(Object({"shards": List(_SHARD), "end": List(Int(0)), "n_bytes": TOKENS, "done": Bool()},
                         required=("shards", "end", "n_bytes", "done"))),
    "complete": Bool(),
}, required=("settings", "splits", "complete"))
SHARD_RESUME = Map(Object({"doc": Int(0)}, required=("doc", "position")))  # resume.json: where each split's stream stands

TOKENIZER_META = Object({"kind": Str(choices=("byte", "hf"))}, required=("kind",))  # cem_tokenizer.json (`Tokenizer.save`)
HF_TOKENIZER_META = Object({"name": Str(nonempty=True), "eot_id": Int(0)}, required=("name", "eot_id"))  # of kind "hf"
TOKENIZER_CONFIG = Object({  # a Hugging Face tokenizer folder's tokenizer_config.json: the end-of-text token it names
    "eos_token": Null(Either((Str(), Object({"content": Str()}, required=("content",))))),
})
