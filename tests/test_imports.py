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
