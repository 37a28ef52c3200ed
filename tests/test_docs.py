"""Docs that run: every ```bash and ```python block of README.md and docs/*.md says, in an HTML comment on the
line(s) just above it, how it is kept true:

- `<!-- docs: run -->` (Python): executed here, the blocks of one file in order in one namespace, in an empty
  folder, after the file's prelude below (which makes the runs, exports and tokenizers the text assumes, at a
  tiny size) and with the file's size substitutions (the 134M preset becomes `tiny`); (shell) run as written, line
  by line in one bash in an empty folder with no data and no network (`cem` is this interpreter's `python -m cem`);
- `<!-- docs: covered by PATH::TEST -->`: a test that runs the same commands at a tiny size (checked to exist);
- `<!-- docs: not run: REASON -->`: network, a GPU, an install or hours of training;
- `<!-- ci:main -->` / `<!-- ci:test -->`: the two set-up commands (.ci/run runs the test command).

A new block without a mark fails `test_every_block_says_how_it_is_checked`.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARK = re.compile(r"<!-- (docs: (run|covered by \S+|not run: .+)|ci:(main|test)) -->")
# what a tiny run needs instead of the paper's sizes (the text stays as users would type it)
SUBSTITUTE = {name: {'"134M"': '"tiny"', "32000": "512"} for name in ("README.md", "layers.md")}


def blocks(path: Path) -> list[tuple[int, str, str, str]]:
    """(line, language, mark, code) of each fenced bash/python block."""
    lines = path.read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        m = re.match(r"^```(bash|python)\s*$", line)
        if not m:
            continue
        marks, j = [], i - 1
        while j >= 0 and lines[j].strip().startswith("<!--"):
            marks.append(lines[j].strip())
            j -= 1
        end = next(k for k in range(i + 1, len(lines)) if lines[k].startswith("```"))
        mark = next((MARK.fullmatch(x).group(1) for x in marks if MARK.fullmatch(x)), "")
        out.append((i + 1, m.group(1), mark, "\n".join(lines[i + 1 : end])))
    return out


ALL = [(p, *b) for p in DOCS for b in blocks(p)]


@pytest.mark.parametrize("path,line,lang,mark,code", ALL, ids=[f"{p.name}:{b[0]}" for p, *b in [(p, *b) for p in DOCS for b in blocks(p)]])
def test_every_block_says_how_it_is_checked(path, line, lang, mark, code):
    assert mark, f"{path.name}:{line}: a ```{lang} block without a <!-- docs: ... --> mark (see tests/test_docs.py)"
    if mark.startswith("docs: covered by "):
        target = mark.removeprefix("docs: covered by ")
        file, _, test = target.partition("::")
        assert (ROOT / file).is_file(), f"{path.name}:{line}: {file} does not exist"
        assert not test or f"def {test}(" in (ROOT / file).read_text(), f"{path.name}:{line}: no test {test} in {file}"
    if mark == "docs: run" and lang == "bash":
        assert all(c.split()[0] == "cem" for c in commands(code)), f"{path.name}:{line}: a shell block run here holds cem commands only"


def _huggingface_prelude(ns: dict) -> None:
    """What docs/huggingface.md assumes, made by its own commands (its bash block covered by `test_run_blocks`)
    at a tiny size: the run runs/134M-cem by `cem train`, its export hf/134M-cem by `cem export`; then the
    export's tokenizer `tok`, token ids `ids` and a Llama `llama_model`."""
    pytest.importorskip("lm_eval")  # its last block scores with lm-eval's HFLM
    pytest.importorskip("accelerate")
    import shlex

    import cem.hf  # noqa: F401 - the "cem" model type, for AutoTokenizer
    from transformers import AutoTokenizer

    from cem.cli import main
    from cem.model import LanguageModel, model_config

    code = next(c for _, lang, mark, c in blocks(ROOT / "docs" / "huggingface.md") if lang == "bash" and mark.endswith("::test_run_blocks"))
    commands = [shlex.split(line, comments=True) for line in code.splitlines()]
    assert [c[:2] for c in commands] == [["cem", "train"], ["cem", "export"]]
    tiny = ["--preset", "tiny", "--max-steps", "2", "--batch-size", "2", "context=64", "tensorboard=false"]
    for command in commands:
        assert main(command[1:] + (tiny if command[1] == "train" else [])) == 0, command
    tok = AutoTokenizer.from_pretrained("hf/134M-cem")
    ns.update(tok=tok, llama_model=LanguageModel(model_config("tiny", "llama", vocab_size=len(tok))).eval(),
              ids=torch.tensor([tok("The energy").input_ids]))  # fmt: skip


PRELUDES = {"huggingface.md": _huggingface_prelude}


def commands(code: str) -> list[str]:
    """The commands of a shell block: its lines without comments, a line ending in a backslash joined to the next."""
    return [c for c in (x.split("  #")[0].strip() for x in code.replace("\\\n", " ").splitlines()) if c and not c.startswith("#")]


SHELL_RUN = [(p, b[0], b[3]) for p in DOCS for b in blocks(p) if b[2] == "docs: run" and b[1] == "bash"]


@pytest.mark.slow
@pytest.mark.parametrize("path,line,code", SHELL_RUN, ids=[f"{p.name}:{line}" for p, line, _ in SHELL_RUN])
def test_run_shell_blocks(path, line, code, tmp_path):
    """A shell block marked to run runs as written, from an empty folder, offline, each command exiting 0 (as a user
    who has only installed cem would type it)."""
    import subprocess
    import sys

    env = {**os.environ, "CEM_CACHE_DIR": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env.pop("CEM_DATA_DIR", None)
    (tmp_path / "work").mkdir()
    for command in commands(code):
        argv = [sys.executable, "-m", "cem", *shlex.split(command)[1:]]
        run = subprocess.run(argv, cwd=tmp_path / "work", env=env, capture_output=True, text=True, timeout=1800)
        assert run.returncode == 0, f"{path.name}:{line}: `{command}` exited {run.returncode}: {run.stderr[-2000:]}"


@pytest.mark.slow
@pytest.mark.parametrize("path", [p for p in DOCS if any(b[2] == "docs: run" and b[1] == "python" for b in blocks(p))], ids=lambda p: p.name)
def test_run_blocks(path, tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CEM_CACHE_DIR", str(tmp_path / "cache"))
    ns: dict = {"__name__": "__docs__"}
    if path.name in PRELUDES:
        PRELUDES[path.name](ns)
    for line, lang, mark, code in blocks(path):
        if mark != "docs: run" or lang != "python":
            continue
        for old, new in SUBSTITUTE.get(path.name, {}).items():
            code = code.replace(old, new)
        try:
            exec(compile(code, f"{path.name}:{line}", "exec"), ns)
        except Exception as e:  # noqa: BLE001 - name the block that failed
            raise AssertionError(f"{path.name}:{line}: the block fails: {type(e).__name__}: {e}") from e


def test_the_log_cites_only_paths_that_exist():
    """docs/LOG.md is a record of decisions that stand: every file or folder it names exists today (its links
    relative to docs/, bare paths relative to the repository)."""
    text = (ROOT / "docs" / "LOG.md").read_text()
    links = re.findall(r"\]\(([^)#]+)\)", text)
    bare = re.findall(r"(?<![\w/.])((?:docs|src|benchmarks|tests)/[\w./-]*[\w/])", text)
    assert links and bare
    links = [p for p in links if not p.startswith("../study/")]  # the study's tests check the links into it (the library's read none of it)
    missing = [p for p in links if not (ROOT / "docs" / p).exists()] + [p for p in bare if not (ROOT / p).exists()]
    assert not missing, f"docs/LOG.md names paths that do not exist: {missing}"


def test_the_readme_is_read_in_two_minutes_and_every_command_block_is_checked():
    """Issue 61: at most 200 lines; every shell block runs here unless it needs the network, an install or hours."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    marks = [mark for _, lang, mark, _ in blocks(ROOT / "README.md") if lang == "bash"]
    assert "docs: run" in marks and all(m in ("docs: run", "ci:main", "ci:test") or m.startswith("docs: not run: ") for m in marks), marks
    for m in marks:
        if m.startswith("docs: not run: "):
            assert any(w in m for w in ("network", "install", "hours", "minutes", "GPU")), m


def test_the_readme_names_the_paper_first():
    text = (ROOT / "README.md").read_text()
    first_screen = text[: text.index("## Install and first run")]
    assert "arxiv.org/abs/2605.07588" in first_screen and "Causal Energy Minimization" in first_screen
    assert "pip install cem-transformers" not in text  # not on the package index


def test_the_readme_test_command_runs_both_tiers_with_durations():
    """Issue 60: CI (`.ci/run`) runs the README's `ci:test` command; it runs the fast tier (`-m "not slow"`) first,
    then the slow tier (`-m slow`) of the same tests, every pytest run recording `--durations`."""
    import shlex

    assert "<!-- ci:test -->" in (ROOT / ".ci" / "run").read_text()
    (code,) = [c for _, lang, mark, c in blocks(ROOT / "README.md") if mark == "ci:test"]
    runs = [shlex.split(part)[shlex.split(part).index("pytest") + 1 :] for part in code.split("&&") if "pytest" in shlex.split(part)]
    tiers = [(run[run.index("-m") + 1] if "-m" in run else None, [a for a in run if not a.startswith("-") and a not in ("slow", "not slow")])
             for run in runs]  # fmt: skip
    assert tiers and tiers[0][0] == "not slow" and ("slow", tiers[0][1]) in tiers[1:], code
    assert all(any(a.startswith("--durations=") for a in run) for run in runs), code


def test_every_relative_link_of_the_docs_exists():
    """README.md and docs/*.md link only to files that exist (links into study/ are the study's tests' to check)."""
    missing = [f"{doc.name} -> {link}" for doc in DOCS for link in re.findall(r"\]\(([^)#\s]+)\)", doc.read_text())
               if not link.startswith(("http://", "https://", "mailto:")) and "study/" not in link and not (doc.parent / link).exists()]
    assert not missing, missing
