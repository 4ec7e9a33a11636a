#!/usr/bin/env bash
# The device check for a session lent a GPU: partir.jit against jax.jit on the transformer
# example's training step, sized to fill the GPU (benchmarks/jit_vs_jax.py --gpu): time to
# first result, step time, memory (compiled and the allocator's peak), and the simulator's
# estimate for that GPU against the measured step. Run from the repository root on the
# device machine, whose python3 has jax with CUDA; the log goes to $OUT when set.
#
#   scripts/gpu_check.sh [--schedule BP+MP+Z3] [--fill 0.6] [--config layers=8,...]
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# partir reads its version from the installed metadata; the machine has no registry, and
# its image has jax, numpy and optax: partir itself, without its dependencies.
python3 -c 'import importlib.metadata as m; m.version("partir")' 2>/dev/null ||
    python3 -m pip install -q --no-deps --no-build-isolation --no-index -e .
log="${OUT:-/tmp}/gpu_check.log"
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c 'import jax, numpy, optax; print("jax", jax.__version__, "numpy",
        numpy.__version__, "optax", optax.__version__, jax.devices())'
    python3 benchmarks/jit_vs_jax.py --gpu --steps 20 --repeat 1 "$@"
} 2>&1 | tee "$log"
