"""Compile every verifier kernel for an NVIDIA GPU, with or without one.

The Triton interpreter runs kernels as Python, so it accepts code that the GPU compiler
rejects (``break``, ``return`` in a loop, a loop variable that changes type, ...). Compiling
for a target architecture needs no device: ``triton.compile`` lowers the kernel through
Triton IR, LLVM and PTX down to a cubin (``ptxas`` ships with triton). The default target is
sm_90 (H100/H200) with 32-thread warps.

Triton decides once per process whether it interprets or compiles (see the package
docstring), and a process that interprets cannot compile. So the compilation runs in a child
Python process with the interpreter off; it takes a few seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = [
    "compile_for_gpu",
    "compile_kernel_for_gpu",
    "compile_source_for_gpu",
    "compile_source_variants",
    "KERNEL_VARIANTS",
]

_PROBS = [(prob, no_q) for prob in ("fp32", "fp16", "bf16") for no_q in (False, True)]
# Pointer element types of each kernel argument; the probabilities' type varies per variant.
_VERIFY_SIG = {
    "token_ids_ptr": "*i64",
    "num_accepted_ptr": "*i64",
    "draft_ids_ptr": "*i64",
    "draft_probs_ptr": "{prob}",
    "target_probs_ptr": "{prob}",
    "uniforms_ptr": "*fp64",
    "B": "i32",
    "K": "i32",
    "V": "i32",
    "NO_DRAFT_PROBS": "constexpr",
    "BLOCK_R": "constexpr",
}
_RACE_SIG = {
    "token_ids_ptr": "*i64",
    "num_accepted_ptr": "*i64",
    "draft_ids_ptr": "*i64",
    "draft_probs_ptr": "{prob}",
    "target_probs_ptr": "{prob}",
    "exp_noise_ptr": "*fp32",
    "part_score_ptr": "*fp32",
    "part_index_ptr": "*i32",
    "B": "i32",
    "K": "i32",
    "V": "i32",
    "CHUNK": "i32",
    "NO_DRAFT_PROBS": "constexpr",
    "BLOCK_R": "constexpr",
    "BLOCK_V": "constexpr",
    "SPLIT": "constexpr",
}
_COMBINE_SIG = {
    "token_ids_ptr": "*i64",
    "num_accepted_ptr": "*i64",
    "part_score_ptr": "*fp32",
    "part_index_ptr": "*i32",
    "B": "i32",
    "K": "i32",
    "V": "i32",
    "S": "i32",
    "BLOCK_R": "constexpr",
    "BLOCK_S": "constexpr",
}
# (kernel name, probability dtype, NO_DRAFT_PROBS, SPLIT): every branch of every kernel, in
# the dtypes people feed it (fp16/bf16 straight from a model, fp32 after softmax). The split
# race differs only in what it stores, not in how it reads, so fp32 covers that branch; the
# combine step reads no probabilities, so it has one variant.
KERNEL_VARIANTS = (
    [("verify_kernel", prob, no_q, False) for prob, no_q in _PROBS]
    + [("race_kernel", prob, no_q, False) for prob, no_q in _PROBS]
    + [("race_kernel", "fp32", no_q, True) for no_q in (False, True)]
    + [("race_combine_kernel", None, False, True)]
)


def _variant_name(name: str, prob: str | None, no_q: bool, split: bool) -> str:
    if prob is None:
        return name
    return (
        f"{name}[{prob}{', one-hot drafts' if no_q else ''}"
        f"{', split vocabulary' if split and name == 'race_kernel' else ''}]"
    )


def _compile_jobs(arch: int, warp_size: int, jobs_file: str, out_dir: str) -> None:
    """Child-process side: compile each job (a kernel, a signature, constexprs) and write its
    PTX and a JSON summary into ``out_dir``."""
    import importlib
    import importlib.util

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend

    target = GPUTarget("cuda", arch, warp_size)
    backend = make_backend(target)
    summary = {}
    for i, job in enumerate(json.loads(Path(jobs_file).read_text())):
        if job.get("file"):
            spec = importlib.util.spec_from_file_location(f"_kernel_src_{i}", job["file"])
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(job["module"])
        kernel = getattr(module, job["name"])
        # Attributes as Triton's launcher sets them: [argument index, "D"] (divisible by 16).
        attrs = {(int(i),): backend.parse_attr(a) for i, a in job.get("attrs", [])}
        # Which job failed, for the parent (the compiler's message names the kernel only).
        print(f"compiling: {job['key']}", file=sys.stderr, flush=True)
        compiled = triton.compile(
            ASTSource(
                fn=kernel, signature=job["signature"], constexprs=job["constexprs"], attrs=attrs
            ),
            target=target,
        )
        ptx_path = Path(out_dir) / f"kernel_{i}.ptx"
        ptx_path.write_text(compiled.asm["ptx"])
        summary[job["key"]] = {"ptx_file": str(ptx_path), "cubin_bytes": len(compiled.asm["cubin"])}
    (Path(out_dir) / "summary.json").write_text(json.dumps(summary))


def _run_child(
    jobs: list[dict], arch: int, warp_size: int, timeout: float, tmp: str
) -> dict[str, dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # This copy of the package, even where it is not the installed one (a checkout).
    here = str(Path(__file__).resolve().parents[2])
    # And what this process imports from (a sandboxed kernel may find its site-packages
    # through sys.path only, which a child Python does not inherit).
    seen = [p for p in sys.path if p and os.path.isdir(p)]
    env["PYTHONPATH"] = os.pathsep.join(
        dict.fromkeys(p for p in (here, *seen, env.get("PYTHONPATH")) if p)
    )
    env["SPECDEC_TRITON_COMPILE_ONLY"] = "1"
    # Keep the (otherwise repeated) fp-fusion deprecation notice out of the child's output.
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    jobs_file = Path(tmp) / "jobs.json"
    jobs_file.write_text(json.dumps(jobs))
    code = (
        "from specdec_course.kernels.compile import _compile_jobs; "
        f"_compile_jobs({int(arch)}, {int(warp_size)}, {str(jobs_file)!r}, {tmp!r})"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout
    )
    if proc.returncode != 0:
        # The compiler's own message (kernel source with a caret, then the error) comes last;
        # the traceback above it is about this module, not the kernel.
        err = proc.stderr
        at = err.rfind("triton.compiler.errors.")
        which = [line for line in err.splitlines() if line.startswith("compiling: ")]
        named = which and any(j.get("named") for j in jobs)
        what = which[-1][len("compiling: ") :] if named else "a kernel"
        raise RuntimeError(
            f"{what} failed to compile for sm_{arch}:\n"
            f"{err[at:] if at >= 0 else err[-4000:]}".rstrip()
        )
    summary = json.loads((Path(tmp) / "summary.json").read_text())
    return {
        k: {"ptx": Path(v["ptx_file"]).read_text(), "cubin_bytes": v["cubin_bytes"]}
        for k, v in summary.items()
    }


def compile_for_gpu(
    arch: int = 90, warp_size: int = 32, block_vocab: int = 4096, timeout: float = 300.0
) -> dict[str, dict]:
    """Compile every verifier kernel variant for ``cuda`` sm_``arch``; works without a GPU.

    Returns ``{variant: {"ptx": str, "cubin_bytes": int}}`` for the variants in
    ``KERNEL_VARIANTS`` (the three kernels; fp32/fp16/bf16 probabilities, with and without
    draft probabilities, the race with its vocabulary whole and split). Raises
    ``RuntimeError`` carrying the compiler's message when a kernel does not compile (code
    that only the interpreter accepts fails here), ``ValueError`` for a ``block_vocab`` that
    is not a power of two.
    """
    if block_vocab < 1 or block_vocab & (block_vocab - 1):
        raise ValueError(f"block_vocab must be a power of two; got {block_vocab}")
    jobs = []
    for name, prob, no_q, split in KERNEL_VARIANTS:
        if name == "race_combine_kernel":
            sig, constexprs = _COMBINE_SIG, {"BLOCK_R": 1, "BLOCK_S": 128}
        elif name == "race_kernel":
            sig = _RACE_SIG
            constexprs = {"NO_DRAFT_PROBS": no_q, "BLOCK_R": 1, "BLOCK_V": block_vocab}
            constexprs["SPLIT"] = split
        else:
            sig, constexprs = _VERIFY_SIG, {"NO_DRAFT_PROBS": no_q, "BLOCK_R": 1}
        jobs.append(
            {
                "key": _variant_name(name, prob, no_q, split),
                "module": "specdec_course.kernels.rejection",
                "name": name,
                "signature": {k: v.format(prob=f"*{prob}") for k, v in sig.items()},
                "constexprs": constexprs,
            }
        )
    with tempfile.TemporaryDirectory() as tmp:
        return _run_child(jobs, arch, warp_size, timeout, tmp)


def compile_kernel_for_gpu(
    kernel,
    signature: dict[str, str],
    constexprs: dict | None = None,
    *,
    arch: int = 90,
    warp_size: int = 32,
    timeout: float = 300.0,
) -> dict:
    """Compile one ``@triton.jit`` kernel written anywhere (a notebook cell too) for a GPU.

    ``signature`` maps every argument to its type (``"*fp32"``, ``"*i64"``, ``"i32"``,
    ``"constexpr"``); ``constexprs`` gives the ``constexpr`` values. The kernel's source is
    taken with ``inspect`` and compiled in a child process beside ``import triton`` and
    ``import triton.language as tl`` only: helpers it calls must be triton's. Returns
    ``{"ptx": str, "cubin_bytes": int}``; raises ``RuntimeError`` with the compiler's message
    when it does not compile, ``ValueError`` when the source cannot be found.
    """
    import inspect
    import textwrap

    fn = getattr(kernel, "fn", kernel)
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as e:
        raise ValueError(
            f"cannot find the source of {fn!r} ({e}); define it in a file or a notebook cell"
        ) from None
    source = "import triton\nimport triton.language as tl\n\n\n" + source
    return compile_source_for_gpu(
        source, fn.__name__, signature, constexprs, arch=arch, warp_size=warp_size, timeout=timeout
    )


def compile_source_for_gpu(
    source: str,
    name: str,
    signature: dict[str, str],
    constexprs: dict | None = None,
    *,
    arch: int = 90,
    warp_size: int = 32,
    timeout: float = 300.0,
) -> dict:
    """Compile the ``@triton.jit`` function ``name`` defined by ``source`` (Python source that
    imports what it uses: ``triton``, ``triton.language as tl``, and defines its jit helpers)
    for a GPU, as :func:`compile_kernel_for_gpu` does. Returns ``{"ptx", "cubin_bytes"}``;
    raises ``RuntimeError`` with the compiler's message when it does not compile."""
    with tempfile.TemporaryDirectory() as tmp:
        src_file = Path(tmp) / "kernel_source.py"
        src_file.write_text(source)
        job = {
            "key": name,
            "file": str(src_file),
            "name": name,
            "signature": signature,
            "constexprs": constexprs or {},
        }
        return _run_child([job], arch, warp_size, timeout, tmp)[name]


def compile_source_variants(
    source: str,
    name: str,
    variants: list,
    *,
    arch: int = 90,
    warp_size: int = 32,
    timeout: float = 300.0,
) -> dict[str, dict]:
    """Compile ``name`` from ``source`` (as :func:`compile_source_for_gpu`) once per variant,
    in one child process. ``variants``: ``(label, signature, constexprs, attrs)`` each, with
    ``attrs`` a list of ``[argument index, "D"]`` (divisible by 16, as Triton's launcher
    specialises an argument). Returns ``{label: {"ptx", "cubin_bytes"}}``; raises
    ``RuntimeError`` that names the first variant that does not compile, with the
    compiler's message."""
    with tempfile.TemporaryDirectory() as tmp:
        src_file = Path(tmp) / "kernel_source.py"
        src_file.write_text(source)
        jobs = [
            {
                "key": str(label),
                "file": str(src_file),
                "name": name,
                "signature": dict(signature),
                "constexprs": dict(constexprs or {}),
                "attrs": [list(a) for a in attrs or ()],
                "named": True,
            }
            for label, signature, constexprs, attrs in variants
        ]
        if not jobs:
            return {}
        return _run_child(jobs, arch, warp_size, timeout, tmp)
