"""Triton versions of the batched verifier (lesson 05).

``rejection_sample_triton`` has the signature and result of
``specdec_course.verifier.rejection_sample``. On CUDA tensors its kernels run natively; on
CPU tensors they run under the Triton interpreter, which executes each program in Python with
numpy.

Triton picks interpreter or compiler once per process: ``@triton.jit`` reads the
``TRITON_INTERPRET`` switch when it decorates a function, and triton's own helpers
(``tl.zeros``, the ``tl.max`` combiners) are decorated when triton is first imported. So this
package switches the interpreter on here, before anything imports triton, when no CUDA device
exists. On a machine with a GPU the kernels are compiled, and CPU tensors are refused with a
clear error (start Python with ``TRITON_INTERPRET=1`` to interpret there too).

``compile_for_gpu`` compiles every kernel for an NVIDIA target without needing a GPU (in a
child process with the interpreter off), which catches code that the interpreter tolerates
but the compiler rejects.
"""

from __future__ import annotations

import os

import torch

# The child process of compile_for_gpu sets SPECDEC_TRITON_COMPILE_ONLY to keep compiling on.
if not torch.cuda.is_available() and os.environ.get("SPECDEC_TRITON_COMPILE_ONLY") != "1":
    os.environ["TRITON_INTERPRET"] = "1"

from .compile import compile_for_gpu, compile_kernel_for_gpu  # noqa: E402
from .rejection import (  # noqa: E402
    launch,
    launch_config,
    race_combine_kernel,
    race_kernel,
    rejection_sample_triton,
    verify_kernel,
)

__all__ = [
    "rejection_sample_triton",
    "launch",
    "launch_config",
    "verify_kernel",
    "race_kernel",
    "race_combine_kernel",
    "compile_for_gpu",
    "compile_kernel_for_gpu",
]
