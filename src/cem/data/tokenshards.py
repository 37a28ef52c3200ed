"""Token shards of a corpus of any size: `cem data prepare SOURCE --tokenizer TOK [--tokens N]`.

Documents are streamed (`cem.data.stream`), tokenised in worker processes with a bounded number of tasks
in flight, and written per split as fixed-size shards `<split>-NNNNN.bin` (`token_dtype`: uint16 when the
vocabulary fits, else uint32; each document followed by end-of-text, as `build_split` lays out a small
corpus) plus `manifest.json`, in a folder that also holds the tokenizer (`tokenizer/`). Memory is bounded
by the tasks in flight, never by the corpus.

Each shard is written atomically, then recorded in the manifest (atomically) with where the stream
stands after it: (documents consumed, tokens of the next document already written). A rerun after a kill
starts from the last recorded shard and writes the same bytes as an uninterrupted prepare, since the
stream's order, the tokenisation of a document and the shard boundaries do not depend on when it stopped.
It skips the documents already consumed by reading them again, except where the source can say where it
stands (`Stream.position`, a Hugging Face dataset split): then `resume.json` holds such a position at
most one task before the last shard's end, and the rerun reopens the source there.

The folder is held by one prepare at a time (`cem.io.lock_folder`: a second is refused, naming the holder's
pid), which removes the temp files a killed prepare left. The manifest records the size and modification
time of the local source's files when the prepare begins; a rerun refuses, naming the file, a source
changed since (a file added, removed or edited), whose shards would mix the old text and the new.

The trainer reads a prepared split as one token stream through memory maps (`ShardedTokens`): windows
may cross shard boundaries, so the shards behave exactly as one `.bin` of the whole split would.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import re
import reprlib
import signal
import sys
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from cem.data.corpora import load_corpus, parse_corpus, prepare_target
from cem.data.corpus import CorpusSpec
from cem.data.corpus import SPLITS
from cem.data.shards import TokenSplit, build_split, encode_pieces, piece_batches, token_dtype
from cem.data.stream import DocumentStreams, Stream, open_streams
from cem.data.chunking import pieces
from cem.data.tokenizers import META_FILE, Tokenizer, bpe_from_texts, get_tokenizer, load_tokenizer
from cem.data.local import SUFFIXES
from cem.io import LOCK_FILE, atomic_write, atomic_write_json, lock_folder, outside_folder, read_json, refuse_link, remove_stale_temp_files, sha256_file
from cem.records import SHARD_MANIFEST, SHARD_RESUME, RecordError, check, read_record
from cem.processes import die_with_parent, stop_pool, submit_quietly

FORMAT = "cem-token-shards/1"
MANIFEST = "manifest.json"
RESUME = "resume.json"  # per split, where a rerun can reopen the source (removed when the prepare is done)
TOKENIZER_DIR = "tokenizer"
SHARD_TOKENS = 100_000_000  # tokens per shard (200 MB as uint16)
TASK_CHARS = 2_000_000  # characters of documents handed to a worker per task
WORKERS_PER_CPU = 4  # the most tokenising workers `cem data prepare --workers` starts per CPU (each loads the tokenizer)
BPE_SAMPLE_CHARS = 50_000_000  # `--tokenizer bpe:N` is trained on the leading training documents up to this size
TASKS_PER_WORKER = 2  # tasks in flight per worker: what bounds the memory
HELD_OUT_FRACTION = 0.01  # with --tokens N, valid and test take at most this fraction of N (at least 1M) each
MIN_HELD_OUT_TOKENS = 1_000_000


def shard_dir(source: str | CorpusSpec, tokenizer_spec: str, data_dir: str | Path | None = None) -> Path:
    """Where `cem data prepare` puts the shards of `source` tokenised by `tokenizer_spec`, and where the
    trainer finds them: `<data dir>/shards/<readable name>-<hash of both>`, the data directory as for
    `cem data prepare NAME` (`--data-dir`, else $CEM_DATA_DIR, else ~/.cache/cem/data)."""
    source = parse_corpus(source)
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{Path(source.label).name}--{Path(tokenizer_spec).name}")
    digest = hashlib.sha256(f"{source.text}\n{tokenizer_spec}".encode()).hexdigest()[:12]
    return prepare_target(data_dir) / "shards" / f"{readable[:80]}-{digest}"


def parse_tokens(value: str | int | None, name: str = "a token count") -> int | None:
    """A token count written as an integer or in e-notation (2.7e9); ValueError (naming `name`) unless positive."""
    if value is None:
        return None
    try:
        n = int(float(value))
    except (ValueError, OverflowError):
        raise ValueError(f"{name} must be a number such as 2.7e9, got {value!r}") from None
    if n < 1:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return n


def prepare_shards(
    source: str | CorpusSpec,
    tokenizer_spec: str,
    out: str | Path | None = None,
    *,
    tokens: int | None = None,
    held_out_tokens: int | None = None,
    shard_tokens: int = SHARD_TOKENS,
    workers: int | None = None,
    data_dir: str | Path | None = None,
    encoding: str = "utf-8",
    separator: str | None = None,
    progress: bool = True,
) -> Path:
    """Write the token shards of `source` into `out` (default `shard_dir`); return the folder.

    `tokens`: train tokens to write (None: the whole train stream; an hf: source needs a number);
    `held_out_tokens`: at most this many for valid and for test each (default: HELD_OUT_FRACTION of
    `tokens`, at least MIN_HELD_OUT_TOKENS; the whole split without `tokens`). `workers`: tokenising
    processes (default: the CPU count; 0 tokenises in this process). `encoding`, `separator`: of local `.txt`
    files, read and cut into documents as `cem.data.local` says (default: UTF-8, blank lines). `tokenizer_spec` "bpe:N" trains a
    BPE on the leading training documents (BPE_SAMPLE_CHARS characters) and keeps it in the folder. A
    folder holding an unfinished prepare of the same settings is continued; one of other settings is refused.
    """
    source = parse_corpus(source)
    if tokens is None and source.is_hf:
        raise ValueError(f"{source}: say how many training tokens to prepare (--tokens N, e.g. 2.7e9)")
    for name, value in (("tokens", tokens), ("held_out_tokens", held_out_tokens), ("shard_tokens", shard_tokens)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be positive, got {value}")
    if not source.is_hf:  # a local corpus is named by its absolute path (as `cem train` records it)
        source = source.resolved()
    if held_out_tokens is None and tokens is not None:
        held_out_tokens = max(MIN_HELD_OUT_TOKENS, int(HELD_OUT_FRACTION * tokens))
    out = refuse_link(Path(out) if out is not None else shard_dir(source, tokenizer_spec, data_dir))
    if _read_manifest(out) is None and out.is_dir() and any(p.name != LOCK_FILE for p in out.iterdir()):
        raise ValueError(f"{out} is not empty and holds no token shards; choose a new or empty folder (--out)")
    with lock_folder(out, f"token-shard folder {out}"):  # one prepare at a time: a second one would take the first's temp files for stale
        sizes = _prepare_locked(source, tokenizer_spec, out, tokens, held_out_tokens, shard_tokens, workers, encoding, separator, progress)
    _say(progress, f"token shards of {source} ready in {out}: {sizes} tokens")  # the folder released: nothing left to do but return
    return out


def _prepare_locked(source: CorpusSpec, tokenizer_spec: str, out: Path, tokens: int | None, held_out_tokens: int | None,
                    shard_tokens: int, workers: int | None, encoding: str, separator: str | None, progress: bool) -> str:
    """`prepare_shards` in the folder `out`, held by this process; the tokens of each split (for the line saying it is ready)."""
    files = _source_files(source)  # before anything is read from it
    manifest = _read_manifest(out)
    documents = None
    bpe = re.fullmatch(r"bpe:(\d+)", tokenizer_spec)
    if bpe and manifest is not None and (out / TOKENIZER_DIR / META_FILE).is_file():
        tokenizer = load_tokenizer(out / TOKENIZER_DIR)  # trained by the prepare this one continues
    elif bpe:
        documents = open_streams(source, encoding, separator)
        sample = _sample(documents("train"), BPE_SAMPLE_CHARS)
        tokenizer = bpe_from_texts(sample, int(bpe.group(1)), f"the first {sum(map(len, sample)):,} characters of {source}'s training documents")
    else:
        tokenizer = get_tokenizer(tokenizer_spec)
    settings = {
        "format": FORMAT,
        "source": source.text,
        "tokenizer_spec": tokenizer_spec,
        "tokenizer": tokenizer.name,
        "vocab_size": tokenizer.vocab_size,
        "eot_id": tokenizer.eot_id,
        "dtype": token_dtype(tokenizer.vocab_size).name,
        "shard_tokens": shard_tokens,
        "tokens": {"train": tokens, "valid": held_out_tokens, "test": held_out_tokens},
        "encoding": encoding,
        **({} if separator is None else {"separator": separator}),  # absent by default: older manifests stay valid
        "bpe_sample_chars": BPE_SAMPLE_CHARS if bpe else None,
    }
    if manifest is not None and manifest["settings"] != settings:
        changed = sorted(k for k in settings if manifest["settings"].get(k) != settings[k])
        raise ValueError(f"{out} holds token shards prepared with other settings ({', '.join(changed)} differ); "
                         "choose another folder (--out) or remove it")
    if manifest is not None and manifest["complete"]:
        _say(progress, f"{out} already holds these token shards")
        return out
    if manifest is not None:
        _refuse_changed_source(source, out, manifest.get("source_files"), files)
    documents = documents or open_streams(source, encoding, separator)  # a source that cannot be read is refused before anything is written
    if manifest is None:
        manifest = {"settings": settings, "source_files": files, "splits": {}, "complete": False}
        atomic_write_json(out / MANIFEST, manifest)  # first: from now on the folder is a prepare's own
    tokenizer.save(refuse_link(out / TOKENIZER_DIR))
    own = "|".join([re.escape(MANIFEST), re.escape(RESUME), *(rf"{split}-\d+\.bin" for split in SPLITS)])
    remove_stale_temp_files(out, own)  # what a killed prepare left: this folder is held by this one
    remove_stale_temp_files(out / TOKENIZER_DIR, r".+")
    workers = (os.cpu_count() or 1) if workers is None else workers
    resume = read_record(out / RESUME, SHARD_RESUME) if (out / RESUME).is_file() else {}
    with _executor(workers, out / TOKENIZER_DIR, encoding) as pool:
        for split in SPLITS:
            state = manifest["splits"].setdefault(split, {"shards": [], "end": [0, 0], "n_bytes": 0, "done": False})
            if not state["done"]:
                _write_split(out, manifest, resume, split, documents, tokenizer, pool, max(workers, 1), progress)
    for split, state in manifest["splits"].items():
        if not state["shards"]:
            raise ValueError(f"{source}: the {split} split has no text")
    manifest["complete"] = True
    atomic_write_json(out / MANIFEST, manifest)
    (out / RESUME).unlink(missing_ok=True)
    return ", ".join(f"{s} {sum(x['n_tokens'] for x in st['shards']):,}" for s, st in manifest["splits"].items())


def _sample(docs: Iterable[str], max_chars: int) -> list[str]:
    """Pieces (`chunking.pieces`) of the leading documents, until `max_chars` characters are taken."""
    texts, size = [], 0
    for doc in docs:
        texts += pieces(doc)
        size += len(doc)
        if size >= max_chars:
            break
    return texts


def _write_split(out: Path, manifest: dict, resume: dict, split: str, documents: DocumentStreams, tokenizer: Tokenizer,
                 pool: Executor | None, workers: int, progress: bool) -> None:
    """Tokenise `split` from where its manifest entry stands, shard after shard, recording each."""
    settings, state = manifest["settings"], manifest["splits"][split]
    limit, shard_tokens = settings["tokens"][split], settings["shard_tokens"]
    dtype = np.dtype(settings["dtype"])
    doc_index, skip = state["end"]  # the next document to read, and its tokens already in a shard
    written = sum(s["n_tokens"] for s in state["shards"])
    n_bytes = state["n_bytes"]  # bytes of the documents wholly before `doc_index`
    start = resume.get(split, {"doc": 0, "position": None})  # a position at or before `doc_index`, where known
    if start["position"] is None or start["doc"] > doc_index:
        start = {"doc": 0, "position": None}
    docs = documents(split, start["position"])
    for _ in itertools.islice(docs, doc_index - start["doc"]):  # documents already in shards
        pass
    tasks = _tasks(docs, start["position"] if doc_index == start["doc"] else docs.position())
    writer = None
    bar = tqdm(total=limit, initial=written, unit="tok", unit_scale=True, desc=f"{split} tokens", file=sys.stderr,
               disable=not progress, delay=2.0)
    try:
        for (ids, doc_tokens, doc_bytes), position in _in_order(pool, tasks, TASKS_PER_WORKER * workers):
            ends = np.cumsum(doc_tokens)
            pos, skip = skip, 0
            while pos < len(ids):
                if writer is None:
                    writer = _ShardWriter(out / f"{split}-{len(state['shards']):05d}.bin", dtype)
                take = min(len(ids) - pos, shard_tokens - writer.n_tokens, (limit or sys.maxsize) - written)
                writer.write(ids[pos : pos + take])
                pos, written = pos + take, written + take
                bar.update(take)
                if writer.n_tokens == shard_tokens or written == limit:
                    whole = int(np.searchsorted(ends, pos, side="right"))  # documents of the batch wholly written
                    offset = pos - (int(ends[whole - 1]) if whole else 0)
                    done_bytes = n_bytes + int(doc_bytes[:whole].sum())
                    if written == limit and offset:  # the last document is cut: its bytes in proportion
                        done_bytes += round(int(doc_bytes[whole]) * offset / int(doc_tokens[whole]))
                    resume[split] = {"doc": doc_index, "position": position}  # where this batch began
                    _record(out, manifest, resume, split, writer.close(), [doc_index + whole, offset], done_bytes, written == limit)
                    writer = None
                    if written == limit:
                        return
            n_bytes += int(doc_bytes.sum())
            doc_index += len(doc_tokens)
        if writer is not None:
            _record(out, manifest, resume, split, writer.close(), [doc_index, 0], n_bytes, True)
        else:
            state["done"] = True
            atomic_write_json(out / MANIFEST, manifest)
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    finally:
        bar.close()


def _record(out: Path, manifest: dict, resume: dict, split: str, shard: dict, end: list[int], n_bytes: int, done: bool) -> None:
    """Add a written shard to the manifest with where the stream stands after it, and save the manifest,
    then the resume positions (a kill between the two leaves an older position: more to skip, still right)."""
    state = manifest["splits"][split]
    state["shards"].append(shard)
    state.update(end=end, n_bytes=n_bytes, done=done)
    atomic_write_json(out / MANIFEST, manifest)
    atomic_write_json(out / RESUME, resume)


class _ShardWriter:
    """One shard written through `atomic_write`: the file appears, whole, on `close`."""

    def __init__(self, path: Path, dtype: np.dtype) -> None:
        self.path, self.dtype, self.n_tokens = path, dtype, 0
        self._sha = hashlib.sha256()
        self._stack = contextlib.ExitStack()
        self._file = self._stack.enter_context(atomic_write(path))

    def write(self, ids: np.ndarray) -> None:
        data = np.ascontiguousarray(ids, dtype=self.dtype).tobytes()
        self._file.write(data)
        self._sha.update(data)
        self.n_tokens += len(ids)

    def close(self) -> dict:
        self._stack.close()
        return {"file": self.path.name, "n_tokens": self.n_tokens, "sha256": self._sha.hexdigest()}

    def abort(self) -> None:
        """Remove the unfinished file (the exception propagating is the caller's)."""
        self._stack.__exit__(*sys.exc_info())


def _tasks(docs: Stream, position: Any) -> Iterator[tuple[list[str], Any]]:
    """Consecutive groups of documents of about TASK_CHARS characters, each with the stream's position
    before its first document (`position` for the first group)."""
    group, size = [], 0
    for doc in docs:
        group.append(doc)
        size += len(doc)
        if size >= TASK_CHARS:
            yield group, position
            group, size, position = [], 0, docs.position()
    if group:
        yield group, position


def _in_order(pool: Executor | None, tasks: Iterator[tuple[list[str], Any]], window: int) -> Iterator[tuple[tuple, Any]]:
    """(`_encode(group)`, position) of each task, in order, with at most `window` tasks submitted and not yet
    taken (`Executor.map` would submit them all at once); in this process without a pool. The tasks left when
    it stops are the pool's shutdown's to cancel (`_executor`): one cancelled here, while the pool's manager
    thread fails those of a broken pool, would kill that thread (`stop_pool`)."""
    if pool is None:
        yield from ((_encode(group), position) for group, position in tasks)
        return
    pending = deque()
    for group, position in tasks:
        pending.append((submit_quietly(pool, _encode, group), position))
        if len(pending) >= window:
            future, position = pending.popleft()
            yield future.result(), position
    while pending:
        future, position = pending.popleft()
        yield future.result(), position


@contextlib.contextmanager
def _executor(workers: int, tokenizer_dir: Path, encoding: str) -> Iterator[Executor | None]:
    """Worker processes (spawned, so that no thread of this process is forked) that load the tokenizer
    once each; None (tokenise here) for 0 workers."""
    if workers == 0:
        _init_worker(str(tokenizer_dir), encoding)
        yield None
        return
    pool = ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=_init_worker,
                               initargs=(str(tokenizer_dir), encoding, os.getpid()))
    try:
        yield pool
        pool.shutdown(wait=True, cancel_futures=True)  # every task taken: the workers end as their queue closes
    except BaseException:  # Ctrl-C (in the shutdown too), SIGTERM, an error: the queues may be in any state, so wait on none of them
        stop_pool(pool)
        raise


_worker: dict = {}


def _init_worker(tokenizer_dir: str, encoding: str, parent: int | None = None) -> None:
    """A tokenising worker: it dies with the prepare (`die_with_parent`, even after a kill -9 of it), leaves
    Ctrl-C to the prepare (which stops it: `stop_pool`; it is born with SIGINT blocked, `submit_quietly`),
    and loads the tokenizer once."""
    if parent is not None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        die_with_parent(parent, signal.SIGKILL)  # nothing to save: the prepare's rerun redoes its task
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one thread per worker: the workers are the parallelism
    _worker.update(tokenizer=load_tokenizer(tokenizer_dir), encoding=encoding)


def _encode(docs: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Token ids of the documents (each followed by end-of-text), and each document's token and byte count."""
    tokenizer, encoding = _worker["tokenizer"], _worker["encoding"]
    arrays, doc_tokens, current = [], [], 0
    for batch, ends_doc in piece_batches(docs):
        ids, piece_tokens = encode_pieces(tokenizer, batch, ends_doc)
        arrays.append(ids)
        for n, end in zip(piece_tokens.tolist(), ends_doc):
            current += n
            if end:
                doc_tokens.append(current)
                current = 0
    doc_bytes = [len(doc.encode(encoding)) for doc in docs]
    return np.concatenate(arrays), np.array(doc_tokens, dtype=np.int64), np.array(doc_bytes, dtype=np.int64)


def _read_manifest(out: Path) -> dict | None:
    path = out / MANIFEST
    if not path.is_file():
        return None
    manifest = read_json(path)
    if isinstance(manifest.get("settings"), dict) and manifest["settings"].get("format", FORMAT) != FORMAT:
        raise ValueError(f"{path} is not a cem token-shard manifest ({FORMAT}): its settings.format is {reprlib.repr(manifest['settings']['format'])}")
    try:
        check(SHARD_MANIFEST, manifest, path)
    except RecordError as e:
        raise RecordError(f"{e}; remove the folder and prepare again") from None
    outside = outside_folder(path, [shard["file"] for state in manifest["splits"].values() for shard in state["shards"]])
    if outside:
        raise ValueError(f"{outside}; remove the folder and prepare again")
    return manifest


def _source_files(source: CorpusSpec) -> dict[str, list] | None:
    """Size, modification time (ns) and sha256 of each file of a local source (a file, or a folder's corpus files
    by relative path); None for an hf: source. A resumed prepare checks that they are unchanged: the hash catches
    text replaced with its size and modification time put back (`cp -p`, `rsync -t`), for one read of the source,
    less than tokenising it takes."""
    if source.is_hf:
        return None
    path, found = source.path, {}
    for file in sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES and p.is_file()) if path.is_dir() else [path]:
        with contextlib.suppress(FileNotFoundError):  # a missing source is refused when it is opened
            st = file.stat()
            found[file.relative_to(path).as_posix() if path.is_dir() else file.name] = [st.st_size, st.st_mtime_ns, sha256_file(file)]
    return found


def _refuse_changed_source(source: CorpusSpec, out: Path, recorded: dict | None, now: dict | None) -> None:
    """ValueError naming a file of `source` added, removed or changed since the unfinished prepare in `out`
    began (`recorded`: its `_source_files`, or their size and time alone from an older prepare; None, for an
    older prepare or an hf: source, is not checked)."""
    if recorded is None or now is None:
        return
    added = sorted(now.keys() - recorded.keys())
    changed = [n for n in recorded if n not in now or now[n][: len(recorded[n])] != recorded[n]]
    if not added and not changed:
        return
    name = (added or changed)[0]
    how = "added" if added else "removed" if name not in now else "changed (its size or modification time differ)" \
        if now[name][:2] != recorded[name][:2] else "changed (its content differs, with the same size and modification time)"
    path = source.path / name if source.path.is_dir() else source.path
    raise ValueError(f"{path}: {how} since the unfinished token shards in {out} were begun from {source}; "
                     f"remove {out} and prepare again to start over from the new text")


def _say(show: bool, message: str) -> None:
    if show:
        print(message, file=sys.stderr)


class ShardedTokens:
    """The tokens of a split stored as consecutive shards, memory-mapped, sliced like one 1-D array
    (`tokens[a:b]`, a view inside one shard, else a copy joining the shards it crosses)."""

    def __init__(self, paths: list[Path], sizes: list[int], dtype: np.dtype) -> None:
        self.dtype = np.dtype(dtype)
        self.shards = [np.memmap(p, dtype=self.dtype, mode="r", shape=(n,)) for p, n in zip(paths, sizes)]
        self.starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, key: slice) -> np.ndarray:
        if not isinstance(key, slice):
            raise TypeError(f"ShardedTokens takes slices, not {type(key).__name__}")
        start, stop, step = key.indices(len(self))
        if step != 1:
            raise ValueError("ShardedTokens slices take no step")
        parts, i = [], int(np.searchsorted(self.starts, start, side="right")) - 1
        while start < stop:
            local = start - int(self.starts[i])
            take = min(stop, int(self.starts[i + 1])) - start
            parts.append(self.shards[i][local : local + take])
            start, i = start + take, i + 1
        if not parts:
            return np.empty(0, dtype=self.dtype)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def tolist(self) -> list[int]:
        return self[:].tolist()


IN_MEMORY_MAX_BYTES = 1 << 30  # an hf: corpus needing more text than this for its budget must be prepared as shards


def find_shards(data: str | CorpusSpec, tokenizer_spec: str, data_dir: str | Path | None = None, budget_bytes: int | None = None) -> Path | None:
    """The token shards a run of `data` with `tokenizer_spec` trains on: `data` itself when it is a shard
    folder (its tokenizer must be `tokenizer_spec`), else `shard_dir(data, tokenizer_spec, data_dir)` when a
    prepare there has finished, else None (the corpus is loaded whole). An hf: corpus whose budget needs
    more than IN_MEMORY_MAX_BYTES of text (`budget_bytes`) and has no shards is refused, naming the command."""
    data = parse_corpus(data)
    folder = data.path
    if (folder / MANIFEST).is_file():
        spec = _read_manifest(folder)["settings"]["tokenizer_spec"]
        if spec != tokenizer_spec:
            raise ValueError(f"{folder} holds shards tokenised with {spec!r}; train with --tokenizer {spec}")
        return folder
    prepared = shard_dir(data, tokenizer_spec, data_dir)
    manifest = _read_manifest(prepared) if prepared.is_dir() else None
    if manifest is not None and manifest["complete"]:
        return prepared
    if data.is_hf and budget_bytes is not None and budget_bytes > IN_MEMORY_MAX_BYTES:
        tokens = f"{budget_bytes // 4:.3g}"  # about 4 bytes a token: hf_bytes_for_budget's rate
        raise ValueError(f"{data}: this budget needs about {budget_bytes / 1e9:.1f} GB of text, too much to hold in memory; "
                         f"prepare token shards first: cem data prepare {data} --tokenizer {tokenizer_spec} --tokens {tokens}"
                         + (f" --data-dir {data_dir}" if data_dir else ""))
    return None


_HASHED: dict[tuple, str] = {}  # (path, device, inode, size, mtime) -> sha256 of the shard files this process has read


def shard_problem(folder: Path, shard: dict, dtype: str) -> str | None:
    """What is wrong with one shard of a manifest's (`shard`: its file, n_tokens and sha256) in `folder`, in
    words naming the file; None when it is whole and unchanged. A file is hashed once per process while
    its size and modification time stay the same (a shard rewritten or zeroed in place changes them)."""
    path = folder / shard["file"]
    if path.is_symlink() or not path.is_file():
        return f"{path}: missing, or not a plain file (its manifest lists a shard file there)"
    st = path.stat()
    if st.st_size != shard["n_tokens"] * np.dtype(dtype).itemsize:
        return f"{path}: {st.st_size:,} bytes, not the {shard['n_tokens'] * np.dtype(dtype).itemsize:,} its manifest records (truncated or altered)"
    key = (str(path.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _HASHED:
        _HASHED[key] = sha256_file(path)
    if _HASHED[key] != shard["sha256"]:
        return f"{path}: corrupted, its sha256 is not the one its manifest records (altered after it was prepared)"
    return None


def verify_shards(path: str | Path) -> list[tuple[Path, str | None]]:
    """Every shard file a token-shard folder's manifest lists, with what is wrong with it (None: intact)."""
    path = Path(path).expanduser()
    manifest = _read_manifest(path)
    if manifest is None:
        raise FileNotFoundError(f"{path} holds no token shards (no {MANIFEST})")
    return [(path / shard["file"], shard_problem(path, shard, manifest["settings"]["dtype"]))
            for state in manifest["splits"].values() for shard in state["shards"]]


def load_shards(path: str | Path) -> tuple[dict, Tokenizer, dict[str, TokenSplit]]:
    """The manifest, tokenizer and memory-mapped splits of a finished prepare in `path`; every shard is
    checked against its manifest (size and sha256, `shard_problem`) and refused, by name, unless intact."""
    path = Path(path).expanduser()
    manifest = _read_manifest(path)
    if manifest is None:
        raise FileNotFoundError(f"{path} holds no token shards (no {MANIFEST})")
    settings = manifest["settings"]
    if not manifest["complete"]:
        raise ValueError(f"{path}: the token shards are unfinished; run `cem data prepare {settings['source']} "
                         f"--tokenizer {settings['tokenizer_spec']}` again to finish them")
    splits = {}
    for split, state in manifest["splits"].items():
        paths = [path / s["file"] for s in state["shards"]]
        sizes = [s["n_tokens"] for s in state["shards"]]
        for shard in state["shards"]:
            problem = shard_problem(path, shard, settings["dtype"])
            if problem:
                raise ValueError(f"{problem}; prepare the shards again")
        tokens = ShardedTokens(paths, sizes, settings["dtype"])
        splits[split] = TokenSplit(f"{settings['source']}/{split}", tokens, state["n_bytes"])
    return manifest, load_tokenizer(path / TOKENIZER_DIR), splits


def token_split(data: str | CorpusSpec, tokenizer: Tokenizer, tokenizer_spec: str, split: str, data_dir: str | Path | None = None,
                encoding: str = "utf-8") -> TokenSplit:
    """One split of `data` in `tokenizer`'s ids (`tokenizer_spec` names it): from its token shards where
    there are some (`find_shards`), else the corpus tokenised (`build_split`)."""
    shards = find_shards(data, tokenizer_spec, data_dir)
    if shards is None:
        return build_split(load_corpus(data, data_dir, encoding=encoding), tokenizer, split)
    manifest, _, splits = load_shards(shards)
    if manifest["settings"]["tokenizer"] != tokenizer.name:
        raise ValueError(f"{shards} holds tokens of {manifest['settings']['tokenizer']}, not of {tokenizer.name}")
    return splits[split]


def fingerprint(manifest: dict) -> str:
    """sha256 (hex) of the settings and every shard's sha256: changes whenever the tokens do."""
    shards = {split: [s["sha256"] for s in state["shards"]] for split, state in manifest["splits"].items()}
    return hashlib.sha256(json.dumps([manifest["settings"], shards], sort_keys=True).encode()).hexdigest()
