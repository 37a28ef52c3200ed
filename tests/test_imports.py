"""Every public module imports on its own, in any order (no import cycles)."""

import subprocess
import sys

import pytest

MODULES = ["cem.kernels", "cem.layers", "cem.model", "cem.data", "cem.training", "cem.experiments", "cem.cli"]


@pytest.mark.parametrize("first", MODULES)
def test_imports_alone_first(first):
    code = f"import {first}; " + "; ".join(f"import {m}" for m in MODULES)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
