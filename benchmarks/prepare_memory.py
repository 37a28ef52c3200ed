"""Memory of `cem data prepare SOURCE --tokenizer byte` against the size and shape of a local corpus.

    python benchmarks/prepare_memory.py [--dir /tmp] [--gb 2] [--files 4000] [--file-kb 50] [--workers 2] [--out FILE.md]

Writes two corpora under `--dir` (removed afterwards): one text file of `--gb` GB of blank-line separated
paragraphs (a 16 MB block of pseudo-random words, written again and again with a numbered line per
paragraph), and a folder of `--files` files of `--file-kb` KB each. Each is prepared into token shards in a
fresh process (`python -m cem data prepare`, `--workers`), while this script samples every 0.2 s the
resident set (RSS) of that process and of each of its workers (psutil); the high-water mark of the largest
process (`wait4`'s `ru_maxrss`, exact) is reported as well. Wall time depends on the
machine's load; memory should not.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make `benchmarks.common` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil

from benchmarks.common import Report, Table, parser

MB = 10**6
BLOCK_BYTES = 16 * MB
COLUMNS = ["corpus", "size MB", "files", "train tokens", "valid tokens", "test tokens", "wall s", "main peak MiB",
           "worker peak MiB", "largest process peak MiB (ru_maxrss)"]


def _paragraphs(rng: random.Random, n_bytes: int) -> str:
    """Blank-line separated paragraphs of pseudo-random words, about `n_bytes` long."""
    words = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9))) for _ in range(5000)]
    out, size = [], 0
    while size < n_bytes:
        para = " ".join(rng.choices(words, k=rng.randint(20, 120))) + ".\n"
        out.append(para)
        size += len(para) + 1
    return "\n".join(out)


def write_one_file(path: Path, n_bytes: int) -> None:
    """One text file of about `n_bytes`: a block of paragraphs repeated, each copy's paragraphs numbered."""
    block = _paragraphs(random.Random(0), BLOCK_BYTES).split("\n\n")
    with open(path, "w", encoding="utf-8") as f:
        copy = 0
        while f.tell() < n_bytes:
            f.write("".join(f"{copy}.{i} {p}\n\n" for i, p in enumerate(block)))
            copy += 1


def write_many_files(folder: Path, n_files: int, file_bytes: int) -> None:
    """`n_files` text files of about `file_bytes` each."""
    folder.mkdir(parents=True)
    rng = random.Random(1)
    text = _paragraphs(rng, file_bytes * 8)
    for i in range(n_files):
        start = rng.randrange(len(text) - file_bytes)
        (folder / f"{i:05d}.txt").write_text(f"file {i}\n" + text[start : start + file_bytes], encoding="utf-8")


def measure(source: Path, out: Path, workers: int) -> dict:
    """Run one prepare, sampling the RSS of its process and of its workers; its tokens per split and peaks."""
    cmd = [sys.executable, "-m", "cem", "data", "prepare", str(source), "--tokenizer", "byte", "--out", str(out),
           "--workers", str(workers)]
    log = out.with_suffix(".log")
    start = time.perf_counter()
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
    main, peak_main, peak_worker = psutil.Process(proc.pid), 0, 0
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        try:
            peak_main = max(peak_main, main.memory_info().rss)
            for child in main.children(recursive=True):
                peak_worker = max(peak_worker, child.memory_info().rss)
        except psutil.Error:  # a process ended between the listing and the reading
            pass
        time.sleep(0.2)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    lines = log.read_text().replace("\r", "\n").splitlines()
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {lines[-1:]}")
    manifest = json.loads((out / "manifest.json").read_text())
    tokens = {s: sum(x["n_tokens"] for x in st["shards"]) for s, st in manifest["splits"].items()}
    return {"tokens": tokens, "wall": wall, "main": peak_main, "worker": peak_worker, "maxrss": usage.ru_maxrss * 1024,
            "warnings": [line for line in lines if line.startswith("warning:")]}


def main(argv: list[str] | None = None) -> Report:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--dir", default=tempfile.gettempdir(), help="where to write the corpora and shards (removed afterwards)")
    p.add_argument("--gb", type=float, default=2.0, help="size of the one-file corpus in GB (default 2)")
    p.add_argument("--files", type=int, default=4000, help="files of the many-files corpus (default 4000)")
    p.add_argument("--file-kb", type=int, default=50, help="size of each of them in KB (default 50)")
    p.add_argument("--workers", type=int, default=2, help="tokenising processes (default 2)")
    args = p.parse_args(argv)
    import torch

    report = Report("Memory of cem data prepare (byte tokenizer)", torch.device("cpu"),
                    {"workers": args.workers, "cpu": f"{psutil.cpu_count()} cores, load {psutil.getloadavg()[0]:.1f} at the start"})
    table = Table(COLUMNS)
    root = Path(tempfile.mkdtemp(prefix="cem-prepare-memory-", dir=args.dir))
    try:
        corpora = [("many files", root / "many", lambda d: write_many_files(d, args.files, args.file_kb * 1000)),
                   ("one file", root / "one.txt", lambda f: write_one_file(f, int(args.gb * 1e9)))]
        for name, source, write in corpora:
            write(source)
            size = sum(f.stat().st_size for f in source.rglob("*")) if source.is_dir() else source.stat().st_size
            r = measure(source, root / f"shards-{source.stem}", args.workers)
            n_files = len(list(source.iterdir())) if source.is_dir() else 1
            table.add(name, f"{size / MB:,.0f}", n_files, *(f"{r['tokens'][s]:,}" for s in ("train", "valid", "test")),
                      f"{r['wall']:.0f}", f"{r['main'] / 2**20:.0f}", f"{r['worker'] / 2**20:.0f}", f"{r['maxrss'] / 2**20:.0f}")
            report.notes += [f"{name}: {w}" for w in r["warnings"]]
            shutil.rmtree(source) if source.is_dir() else source.unlink()
            shutil.rmtree(root / f"shards-{source.stem}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report.tables.append(("", table))
    report.notes.append(f"load average at the end {psutil.getloadavg()[0]:.1f}; peaks sampled every 0.2 s (psutil RSS)")
    report.emit(args.out)
    return report


if __name__ == "__main__":
    main()
