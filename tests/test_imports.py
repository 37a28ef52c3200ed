"""Every public module imports on its own, in any order, and the packages form no import cycle."""

import subprocess
import sys

import pytest

MODULES = ["cem.kernels", "cem.layers", "cem.model", "cem.data", "cem.training", "cem.cli"]


@pytest.mark.slow
@pytest.mark.parametrize("first", MODULES)
def test_imports_alone_first(first):
    code = f"import {first}; " + "; ".join(f"import {m}" for m in MODULES)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.slow
def test_kernels_import_nothing_from_the_layers():
    """`cem.kernels` (the Triton code) sits below `cem.layers`, which uses it: no loop between them."""
    code = "import sys, cem.kernels; print(sorted(m for m in sys.modules if m.startswith('cem.')))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=120).stdout
    loaded = eval(out)
    assert not [m for m in loaded if m.startswith(("cem.layers", "cem.model", "cem.training"))], loaded


def test_the_kernels_are_imported_through_their_face():
    """Issue 60: outside `cem.kernels` (and its own tests), code imports the kernels from `cem.kernels` itself,
    never a module behind it (`from cem.kernels.cpu_decode import ...`, `from ..kernels import cpu_decode`)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    modules = {p.stem for p in (root / "src" / "cem" / "kernels").glob("*.py")} - {"__init__"}
    files = [p for folder in ("src", "benchmarks", "tests") for p in (root / folder).rglob("*.py") if "kernels" not in p.relative_to(root).parts[:3]]
    behind = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            else:
                continue
            behind += [f"{path.relative_to(root)}: {n}" for n in names if any(f"kernels.{m}" in n for m in modules)]
    assert modules and files and not behind, behind
