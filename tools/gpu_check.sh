#!/usr/bin/env bash
# The GPU check, one command on a machine with one CUDA GPU (about 5 minutes; the time limits
# below, 2 minutes for FlashInfer's install, 3 for the tests, 5 for the benchmarks, bound it):
#   1. installs the package (and FlashInfer, if PyPI has a build for this torch: optional);
#   2. runs the tests marked `gpu` (native kernels against the reference, chi-square per
#      position on the GPU, CUDA-graph decoding against eager decoding);
#   3. runs `specdec-course bench gpu --record`: the verifier sweep and the speedups on the
#      GPU, written to data/results/{verifier,speedup,gpu_check}-<gpu>-<date>.{json,png}.
# Commit data/results/ afterwards: lessons 04, 05 and 07 show those records on any machine.
#
#   bash tools/gpu_check.sh          # on a GPU
#   bash tools/gpu_check.sh --dry    # on a CPU: the same steps under the Triton interpreter
#                                    # at tiny sizes, records to a temporary folder (CI runs it)
# SKIP_INSTALL=1 uses the environment as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
mode="--record"  # on a GPU the records are the point: they go to data/results/
if [[ "${1:-}" == "--dry" ]]; then mode="--dry"; fi
start=$(date +%s)
PY=${PYTHON:-python}

if [[ "$mode" != "--dry" ]]; then
  if [[ "${SKIP_INSTALL:-0}" != 1 ]]; then
    # A CUDA build of torch must be there first (README); this keeps it. Offline, an
    # environment that already has everything goes on as it is.
    "$PY" -m pip install --quiet -e '.[test]' \
      || echo "pip install failed; going on with the environment as it is"
    # FlashInfer is a point of reference, not a dependency: pinned to the installed torch so
    # that it can never replace it, given two minutes, and its failure is only reported.
    torch_pin="torch==$("$PY" -c 'import torch; print(torch.__version__)')"
    timeout 120 "$PY" -m pip install --quiet flashinfer-python -c <(echo "$torch_pin") \
      || echo "FlashInfer did not install; the verifier is timed without it"
  fi
  "$PY" -c "import torch, sys; torch.cuda.is_available() or sys.exit(
      'no CUDA GPU that torch can use: run bash tools/gpu_check.sh --dry on a CPU')"
fi
"$PY" -c "import specdec_course, torch, triton; print('torch', torch.__version__, '| triton', triton.__version__,
      '|', torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"

t0=$(date +%s)
timeout 180 "$PY" -m pytest -n 0 -m gpu tests/test_gpu.py -q -rs
echo "gpu tests finished in $(( $(date +%s) - t0 ))s"

t0=$(date +%s)
timeout 300 "$PY" -c "import sys; from specdec_course.cli import main; sys.exit(main())" \
  bench gpu $mode
echo "bench gpu finished in $(( $(date +%s) - t0 ))s"
echo "GPU check finished in $(( $(date +%s) - start ))s"
