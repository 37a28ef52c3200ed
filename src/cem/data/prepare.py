"""`cem data prepare NAME`: fetch a named corpus into the data directory, in the layout its loader reads.

    wikitext-2       Hugging Face `Salesforce/wikitext` (wikitext-2-v1): the rows of each split, joined,
                     are the tokenized `wiki.{train,valid,test}.tokens` -> wikitext-2/{train,valid,test}.txt
    tinyshakespeare  karpathy/char-rnn's input.txt (checked against its sha256) -> tinyshakespeare/input.txt
    tinystories      Hugging Face `roneneldan/TinyStories`: the first 1,000 train stories, each followed by one
                     newline, and the leading validation stories (about 0.8 MB), each stripped and followed by
                     a blank line -> the two files `load_tinystories` reads (docs/data.md, 'Data directory')
    enwik8           http://mattmahoney.net/dc/enwik8.zip -> enwik8/enwik8.zip

`source` (`--from DIR`) copies the corpus's files from a local folder of the same layout instead (a shared
copy, an offline machine). The data directory is held by one prepare at a time (`cem.io.lock_folder`),
which removes the temp files a killed prepare left beside the corpus's files. Every prepared corpus is
loaded once to check it. The two network functions, `download` and `hf_rows`, are module attributes so
that tests replace them.
"""

from __future__ import annotations

import itertools
import re
import shutil
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from cem.data.named import TINYSHAKESPEARE_SHA256  # the download's sha256, which the embedded copy shares
from cem.io import atomic_write, atomic_write_text, lock_folder, remove_stale_temp_files, sha256_file

TINYSHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
ENWIK8_URL = "http://mattmahoney.net/dc/enwik8.zip"
TINYSTORIES_TRAIN_STORIES = 1000
TINYSTORIES_VALID_BYTES = 800_000  # the validation head: stories until this many bytes (about 0.8 MB)

# the files of each corpus, relative to the data directory (the first of several alternatives is written)
FILES = {
    "wikitext-2": ("wikitext-2/train.txt", "wikitext-2/valid.txt", "wikitext-2/test.txt"),
    "tinyshakespeare": ("tinyshakespeare/input.txt",),
    "tinystories": ("tinystories/TinyStories-train-first1000.txt", "tinystories/TinyStories-validation-head.txt"),
    "enwik8": ("enwik8/enwik8.zip",),
}
_ENWIK8_ALTERNATIVES = ("enwik8/enwik8", "enwik8/enwik8.zip", "enwik8/enwik8.gz")
PREPARABLE = tuple(FILES)


def download(url: str, dest: Path) -> None:  # pragma: no cover - network
    """Fetch `url` into `dest` (atomically)."""
    with urllib.request.urlopen(url, timeout=60) as response, atomic_write(dest) as f:
        shutil.copyfileobj(response, f)


def hf_rows(name: str, config: str | None, split: str) -> Iterator[dict]:  # pragma: no cover - network
    """Rows of a Hugging Face dataset split, streamed."""
    try:
        import datasets
    except ImportError:
        raise ValueError("preparing this corpus needs Hugging Face datasets: pip install -e '.[data]' in the cem clone") from None
    return iter(datasets.load_dataset(name, config, split=split, streaming=True))


def _wikitext2(root: Path) -> None:
    for split, hf_split in (("train", "train"), ("valid", "validation"), ("test", "test")):
        rows = hf_rows("Salesforce/wikitext", "wikitext-2-v1", hf_split)
        atomic_write_text(root / f"wikitext-2/{split}.txt", "".join(row["text"] for row in rows))


def _tinyshakespeare(root: Path) -> None:
    dest = root / "tinyshakespeare/input.txt"
    download(TINYSHAKESPEARE_URL, dest)
    if sha256_file(dest) != TINYSHAKESPEARE_SHA256:
        dest.unlink()
        raise ValueError(f"{TINYSHAKESPEARE_URL}: the file differs from char-rnn's input.txt (sha256 mismatch); removed")


def _tinystories(root: Path) -> None:
    train = itertools.islice(hf_rows("roneneldan/TinyStories", None, "train"), TINYSTORIES_TRAIN_STORIES)
    atomic_write_text(root / FILES["tinystories"][0], "".join(row["text"].strip() + "\n" for row in train))
    held_out, size = [], 0
    for row in hf_rows("roneneldan/TinyStories", None, "validation"):
        story = row["text"].strip() + "\n\n"
        held_out.append(story)
        size += len(story.encode("utf-8"))
        if size >= TINYSTORIES_VALID_BYTES:
            break
    atomic_write_text(root / FILES["tinystories"][1], "".join(held_out))


def _enwik8(root: Path) -> None:
    download(ENWIK8_URL, root / "enwik8/enwik8.zip")


_FETCH = {"wikitext-2": _wikitext2, "tinyshakespeare": _tinyshakespeare, "tinystories": _tinystories, "enwik8": _enwik8}


def _source_files(source: Path, name: str) -> list[str]:
    """The files of corpus `name` to copy from the local folder `source` (the data-directory layout)."""
    rels = [next((r for r in _ENWIK8_ALTERNATIVES if (source / r).is_file()), FILES[name][0])] if name == "enwik8" else FILES[name]
    for rel in rels:
        if not (source / rel).is_file():
            raise FileNotFoundError(f"--from {source}: no {rel} there (expected the data-directory layout, docs/data.md, 'Data directory')")
    return list(rels)


def _present(root: Path, name: str, source: Path | None) -> bool:
    """Whether the corpus is in `root` already; copied from `source`, whole (the size of the source's file:
    a copy cut short by an older cem is copied again)."""
    if source is not None:
        return all((root / rel).is_file() and (root / rel).stat().st_size == (source / rel).stat().st_size for rel in _source_files(source, name))
    if name == "enwik8":
        return any((root / rel).is_file() for rel in _ENWIK8_ALTERNATIVES)
    return all((root / rel).is_file() for rel in FILES[name])


def _copy(source: Path, root: Path, name: str) -> None:
    """Copy the corpus's files from `source`, each atomically (a kill leaves the old file or none, never a
    part of it; a symbolic link in the data directory is replaced, not written through)."""
    for rel in _source_files(source, name):
        with open(source / rel, "rb") as src, atomic_write(root / rel) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)


def prepare(name: str, data_dir: str | Path | None = None, source: str | Path | None = None, force: bool = False) -> Path:
    """Put corpus `name` into the data directory (default: `prepared_data_dir()`, or $CEM_DATA_DIR), from
    its canonical source or a local folder `source`; check that it loads; return the data directory.
    A corpus already there is kept unless `force`."""
    from cem.data.corpora import load_corpus, prepare_target

    if name not in FILES:
        raise ValueError(f"cannot prepare {name!r}: choose one of {', '.join(PREPARABLE)} (shakespeare and python-stdlib are embedded), or give --tokenizer to write the token shards of hf:NAME[:CONFIG] or a local folder")
    root = prepare_target(data_dir)
    source = None if source is None else Path(source).expanduser()
    if _present(root, name, source) and not force:
        print(f"{name} is already in {root} (--force to fetch it again)", file=sys.stderr)
    else:
        where = f"copying from {source}" if source is not None else "downloading"
        print(f"preparing {name} in {root} ({where})", file=sys.stderr)
        for rel in FILES[name]:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
        with lock_folder(root, f"data directory {root}"):  # one prepare at a time: a second would take the first's temp files for stale
            if source is not None:
                _copy(source, root, name)
            else:
                try:
                    _FETCH[name](root)
                except OSError as e:  # no network (URLError is an OSError), a refused connection, a full disk
                    raise OSError(f"could not download {name} into {root} ({e}); offline, copy it from a local folder of the "
                                  f"data-directory layout with `cem data prepare {name} --from DIR`") from None
            rels = {*FILES[name], *(_ENWIK8_ALTERNATIVES if name == "enwik8" else ())}  # all in one folder
            remove_stale_temp_files(root / Path(FILES[name][0]).parent, "|".join(re.escape(Path(rel).name) for rel in sorted(rels)))
    corpus = load_corpus(name, root)
    sizes = ", ".join(f"{s} {corpus.n_bytes(s):,} bytes" for s in ("train", "valid", "test"))
    print(f"{name} ready in {root}: {sizes}", file=sys.stderr)
    return root
