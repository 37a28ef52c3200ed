"""Kernel tests run the Triton kernels on CPU tensors in Triton's interpreter.

On a machine without CUDA, TRITON_INTERPRET=1 is set here, before these tests import triton. The
kernels do not depend on it: `cem.kernels` runs an interpreted copy of its kernels for CPU tensors
whatever the variable says (also when triton was first imported without it, e.g. by torch.compile in
another test folder). It is not set where CUDA is available, so that there the CUDA cases of these
tests (and every other test of the session) run the compiled kernels.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
