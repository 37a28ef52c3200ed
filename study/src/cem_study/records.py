"""Run records as data: a campaign's finished runs are two JSON-lines tables beside its runs folder, and one
reader (`Run`) reads a run from its live folder where one holds it, else from the tables.

    RESULTS/runs/          live run folders (`cem.training.rundir`): runs in progress, and finished ones that keep
                           their checkpoints; ignored by git
    RESULTS/runs.jsonl     one row per finished run, sorted by slug: {"slug", "run" (run.json), "results"
                           (results.json), "evals" ({name: evals/NAME}), "files" ({name: any other file: parsed JSON
                           for .json, else its text})}
    RESULTS/steps.jsonl    one row per logged step, sorted by slug, in the order logged: {"slug", **metrics row}

Both read with `pd.read_json(path, lines=True)` (or `json.loads` per line); a row keeps every field of the files it
holds (`folder_files(folder) == RunTable(runs).files(slug)`). They stay plain text, not gzip: they are 1-7 MB, and git
stores the small change of a run added to a text table as a delta, where a compressed table would be a new blob each
time. A table is written whole (atomically, under the runs folder's lock), its rows in one order and their keys as
the run wrote them, so that writing the same runs gives the same bytes.

A run finished in its folder joins the tables with `python -m cem_study.records add RUNS_DIR [SLUG ...]`
(`drop` removes rows, `unpack` writes folders from rows); a run the sweep trains again leaves them when it starts.
A run that both a live folder and a row hold must be the same run in both: where they differ the reader raises,
naming both.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import sys
import time
from pathlib import Path

from cem.io import LOCK_FILE, LockedError, atomic_write_text, lock_folder, read_json
from cem.records import RESULTS, RUN, check
from cem.training.metrics import read_metrics
from cem.training.rundir import RunDir

RUNS_TABLE, STEPS_TABLE = "runs.jsonl", "steps.jsonl"
RECORD_KEYS = ("slug", "run", "results", "evals", "files")  # a row's keys, in this order
# what a run folder holds that is not its record: weights, tokenizer, logs for TensorBoard, the writer's lock
NOT_RECORDED = ("ckpt", "ckpt.old", "tokenizer", "tensorboard", LOCK_FILE)
TIMES = "times.json"  # evals/times.json: the seconds each product took (`products.recorded_times`); it grows as they are computed
LOCK_WAIT_S = 120.0  # how long a writer waits for another writer of the same tables


def folder_files(folder: str | Path) -> dict[str, object]:
    """Every file of a run folder's record, by path within the folder: parsed JSON for .json files and each
    metrics.jsonl row (a list), text for the rest (train.log); weights, tokenizer and lock left out."""
    folder, out = Path(folder), {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()):
        name = path.relative_to(folder).as_posix()
        if name.split("/")[0] in NOT_RECORDED or path.name.endswith(".tmp"):
            continue
        if name == "metrics.jsonl":
            out[name] = read_metrics(folder)
        elif name.endswith(".json"):
            out[name] = read_json(path, mapping=False)
        else:
            out[name] = path.read_text(encoding="utf-8")
    return out


def _is_eval(name: str) -> bool:
    return name.startswith("evals/") and name.endswith(".json")


def _evals(folder: Path) -> dict[str, object]:
    """A run folder's products (evals/NAME), by name."""
    return {k.removeprefix("evals/"): v for k, v in folder_files(folder).items() if _is_eval(k)}


def _record(slug: str, files: dict[str, object]) -> tuple[dict, list[dict]]:
    """A finished run's row and step rows, from its `folder_files`."""
    rest = {k: v for k, v in files.items() if not _is_eval(k)}
    steps = rest.pop("metrics.jsonl", [])
    row = {"slug": slug, "run": rest.pop("run.json", None), "results": rest.pop("results.json"),
           "evals": {k.removeprefix("evals/"): v for k, v in files.items() if _is_eval(k)}, "files": rest}
    if any("slug" in s for s in steps):
        raise ValueError(f"{slug}: a metrics row has a 'slug' key, which steps.jsonl keeps for the run's name")
    return row, [{"slug": slug, **s} for s in steps]


def _line(row: dict) -> str:
    return json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n"


_CACHE: dict[Path, tuple[tuple, object]] = {}  # a table's parsed contents, by path, while the file is unchanged


def _cached(path: Path, parse):
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    key = (st.st_mtime_ns, st.st_size, st.st_ino)
    hit = _CACHE.get(path)
    if hit is None or hit[0] != key:
        hit = _CACHE[path] = (key, parse(path))
    return hit[1]


def _lines(path: Path):
    """The JSON objects of a table's lines, each with a "slug"; a ValueError naming the file and line otherwise."""
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    value = json.loads(line)
                except ValueError as e:
                    raise ValueError(f"{path} is corrupted: line {n} is not JSON ({str(e).split(';')[0]})") from None
                if not isinstance(value, dict) or not isinstance(value.get("slug"), str):
                    raise ValueError(f"{path} is corrupted: line {n} is not a row with a slug")
                yield value


def _parse_runs(path: Path) -> dict[str, dict]:
    return {r["slug"]: r for r in _lines(path)}


def _parse_steps(path: Path) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for step in _lines(path):
        out.setdefault(step.pop("slug"), []).append(step)
    return out


class RunTable:
    """The tables of the finished runs of one runs folder `runs`: RUNS.parent/runs.jsonl and steps.jsonl."""

    def __init__(self, runs: str | Path) -> None:
        self.runs = Path(runs)
        self.path = self.runs.parent / RUNS_TABLE
        self.steps_path = self.runs.parent / STEPS_TABLE

    def rows(self) -> dict[str, dict]:
        """Every row, by slug ({} without a table)."""
        return _cached(self.path, _parse_runs) or {}

    def row(self, slug: str) -> dict | None:
        return self.rows().get(slug)

    def steps(self, slug: str) -> list[dict]:
        """The metrics rows a run logged, oldest first."""
        return [dict(s) for s in (_cached(self.steps_path, _parse_steps) or {}).get(slug, [])]

    def files(self, slug: str) -> dict[str, object]:
        """The run's record as its folder held it (`folder_files`)."""
        row = self.row(slug)
        if row is None:
            raise KeyError(f"no run {slug} in {self.path}")
        out = {"results.json": row["results"], **({"run.json": row["run"]} if row["run"] is not None else {}), **row["files"],
               **{f"evals/{k}": v for k, v in row["evals"].items()}}
        if steps := self.steps(slug):
            out["metrics.jsonl"] = steps
        return dict(sorted(out.items()))

    @contextlib.contextmanager
    def _held(self):
        """The runs folder's lock (its `.lock`), waited for while another writer holds it."""
        waited = 0.0
        while True:
            try:
                with lock_folder(self.runs, f"the run tables of {self.runs}"):
                    yield
                return
            except LockedError:
                if waited > LOCK_WAIT_S:
                    raise
                time.sleep(0.2)
                waited += 0.2

    def _write(self, rows: dict[str, dict], steps: dict[str, list[dict]]) -> None:
        """Both tables, rows sorted by slug (the steps first: a row never names steps that are not there)."""
        order = sorted(rows)
        atomic_write_text(self.steps_path, "".join(_line(s) for slug in order for s in steps.get(slug, [])))
        atomic_write_text(self.path, "".join(_line({k: rows[slug][k] for k in RECORD_KEYS}) for slug in order))

    def _all_steps(self) -> dict[str, list[dict]]:
        return {slug: [{"slug": slug, **s} for s in self.steps(slug)] for slug in self.rows()}

    def add(self, slugs=None, replace: bool = False) -> list[str]:
        """Add finished run folders (all of the runs folder's by default) to the tables; returns the slugs added or
        updated. A row already there is updated where it is the same run (run.json, results.json and metrics equal:
        products computed since are added); a row of another run is a ValueError naming both, unless `replace`.
        A folder that holds only a tabled run's checkpoint (no run.json) adds the products computed from it."""
        with self._held():
            rows, steps = dict(self.rows()), self._all_steps()
            names = sorted(p.name for p in self.runs.iterdir() if p.is_dir()) if slugs is None else list(slugs)
            done = []
            for slug in names:
                folder, old = RunDir(self.runs / slug), rows.get(slug)
                if not folder.results_json.is_file():
                    if old is not None and not folder.run_json.is_file():  # a tabled run's folder, kept for its checkpoint
                        row, run_steps = {**old, "evals": _evals(folder.path)}, steps.get(slug)
                    elif slugs is not None:
                        raise ValueError(f"{folder.path} holds no finished run (no results.json): nothing to add")
                    else:
                        continue
                else:
                    row, run_steps = _record(slug, folder_files(folder.path))
                if old is not None and not replace:
                    differ = [k for k in ("run", "results", "files") if old[k] != row[k]] + (["metrics"] if steps.get(slug) != run_steps else [])
                    differ += [f"evals/{k}" for k in old["evals"] if k != TIMES and k in row["evals"] and old["evals"][k] != row["evals"][k]]
                    if differ:
                        raise ValueError(f"{folder.path} and its row in {self.path} are different runs ({', '.join(differ)} differ); "
                                         "keep one: remove the folder, or pass --replace to replace the row")
                    row["evals"] = dict(sorted({**old["evals"], **row["evals"]}.items()))
                if old != row or steps.get(slug) != run_steps:
                    rows[slug], steps[slug] = row, run_steps
                    done.append(slug)
            if done:
                self._write(rows, steps)
            return done

    def drop(self, slugs) -> None:
        """Remove runs' rows (a run trained again: `sweep`); a slug with no row is ignored."""
        with self._held():
            rows, steps = dict(self.rows()), self._all_steps()
            if any(rows.pop(s, None) is not None for s in list(slugs)):
                self._write(rows, steps)

    def copy(self, slugs, runs: str | Path) -> "RunTable":
        """The rows of `slugs` (and their steps) as the tables of another runs folder: a campaign of some of these runs."""
        other, rows = RunTable(runs), self.rows()
        other._write({s: rows[s] for s in slugs}, {s: [{"slug": s, **step} for step in self.steps(s)] for s in slugs})
        return other

    def unpack(self, slugs=None) -> list[Path]:
        """Write runs' folders (all rows by default) from their rows, as the run wrote them (`files`); refuses a folder
        that exists. Returns the folders."""
        out = []
        for slug in sorted(self.rows()) if slugs is None else slugs:
            folder = self.runs / slug
            if folder.exists():
                raise ValueError(f"{folder} exists; refusing to unpack {slug} over it")
            for name, value in self.files(slug).items():
                text = ("".join(json.dumps(r) + "\n" for r in value) if name == "metrics.jsonl"
                        else json.dumps(value, indent=2) if name.endswith(".json") else value)
                atomic_write_text(folder / name, text)
            out.append(folder)
        return out

    def set_results(self, results: dict[str, dict]) -> None:
        """Replace runs' results, by slug: in their rows, and in their live folders where those hold them finished."""
        with self._held():
            rows = dict(self.rows())
            for slug, res in results.items():
                if (live := RunDir(self.runs / slug)).results_json.is_file():
                    live.write_results(res)
                if slug in rows:
                    rows[slug] = {**rows[slug], "results": res}
            if any(slug in rows for slug in results):
                self._write(rows, self._all_steps())


class Run(RunDir):
    """One run, read from its live folder where that holds it (run.json there), else from its runs folder's
    tables (`RunTable`). Where both hold it they must agree: a difference is a ValueError naming both."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(path)
        self.table = RunTable(self.path.parent)

    @property
    def slug(self) -> str:
        return self.path.name

    @property
    def row(self) -> dict | None:
        return self.table.row(self.slug)

    def live(self) -> bool:
        """Whether the run's folder holds it (its run.json or results.json), not only a checkpoint kept for products."""
        return self.run_json.is_file() or self.results_json.is_file()

    def where(self) -> str:
        """The run's folder, or its row where no folder holds it."""
        return str(self.path) if self.live() or self.row is None else f"{self.slug} in {self.table.path}"

    def _differ(self, what: str) -> ValueError:
        return ValueError(f"{self.path} and its row in {self.table.path} differ ({what}); keep one: remove the folder, or "
                          f"replace the row (python -m cem_study.records add {self.path.parent} {self.slug} --replace)")

    def read_run(self) -> dict | None:
        row = self.row
        if self.live():
            recorded = super().read_run()
            if row is not None and row["run"] != recorded:
                raise self._differ("run.json")
            return recorded
        return self._from_row("run.json", RUN) if row is not None else None

    def results(self) -> dict | None:
        row = self.row
        if self.live():
            res = super().results()
            if row is not None and res != row["results"]:
                raise self._differ("results.json" if res is not None else "the folder's run is unfinished, the row's finished")
            return res
        return self._from_row("results.json", RESULTS) if row is not None else None

    def _from_row(self, name: str, schema):
        """The record `name` of the run's row (None where the row holds none), checked as cem checks the file (`cem.records`)."""
        value = self.row[name.removesuffix(".json")]
        where = f"{self.path / name} (its row in {self.table.path})"
        return None if value is None else copy.deepcopy(check(schema, value, where))

    def started_only(self) -> bool:
        return self.live() and super().started_only()

    def metrics(self) -> list[dict] | None:
        """The metrics rows the run logged (`read_metrics`: its folder's, else its row's), None where none are recorded."""
        row = self.row
        if self.metrics_jsonl.is_file():
            rows = read_metrics(self.path)
            if row is not None and rows != self.table.steps(self.slug):
                raise self._differ("metrics.jsonl")
            return rows
        return (self.table.steps(self.slug) or None) if row is not None else None

    def has_eval(self, name: str) -> bool:
        return (self.evals_dir / name).is_file() or name in (self.row or {}).get("evals", {})

    def eval(self, name: str):
        """A product of the run (`evals/NAME`), None where it has none."""
        path, row = self.evals_dir / name, (self.row or {}).get("evals", {})
        if path.is_file():
            value = read_json(path, mapping=False)
            if name != TIMES and name in row and row[name] != value:
                raise self._differ(f"evals/{name}")
            return value
        return copy.deepcopy(row.get(name))


def runs_in(runs: str | Path) -> list[Run]:
    """Every run of a runs folder, live or in its tables, by slug."""
    runs = Path(runs)
    live = {p.name for p in runs.iterdir() if p.is_dir()} if runs.is_dir() else set()
    return [Run(runs / slug) for slug in sorted(live | set(RunTable(runs).rows()))]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m cem_study.records", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("add", help="add finished run folders to the tables beside their runs folder")
    a.add_argument("runs", type=Path, help="the runs folder, e.g. study/results/cpu/runs")
    a.add_argument("slugs", nargs="*", help="the runs to add (default: every finished one)")
    a.add_argument("--replace", action="store_true", help="replace a row that holds another run")
    d = sub.add_parser("drop", help="remove runs' rows from the tables")
    d.add_argument("runs", type=Path)
    d.add_argument("slugs", nargs="+")
    u = sub.add_parser("unpack", help="write runs' folders from their rows (for a tool that reads folders)")
    u.add_argument("runs", type=Path)
    u.add_argument("slugs", nargs="*", help="the runs to write (default: every row)")
    args = p.parse_args(argv)
    if not args.runs.is_dir() and args.command == "add":
        p.error(f"runs folder {args.runs} does not exist")
    try:
        if args.command == "add":
            done = RunTable(args.runs).add(args.slugs or None, args.replace)
            print(f"{len(done)} run{'s' if len(done) != 1 else ''} added to {RunTable(args.runs).path}")
        elif args.command == "unpack":
            print(f"{len(RunTable(args.runs).unpack(args.slugs or None))} run folders written in {args.runs}")
        else:
            RunTable(args.runs).drop(args.slugs)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
