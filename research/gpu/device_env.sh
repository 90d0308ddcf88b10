# Sourced by the device-side scripts (run_h200.sh, profile_h200.sh) on the lent GPU machine, after
# ../shared/gpu's bundle is staged and installed (`bash .gpu/s/run.sh stage K install`): vLLM's environment,
# the checkout on PYTHONPATH, and the project's own Python dependencies that the device image lacks (wheels in
# .whl/: optuna, SQLAlchemy, Alembic, Mako, colorlog, greenlet, Typer, Click) installed into /tmp/site once.
source .gpu/s/run.sh env
export PYTHONPATH="$PWD:$PYTHONPATH"  # Ray's workers import executors.* from the checkout
# FlashInfer's sampler JIT-compiles for ~100 s on a fresh machine (../shared/gpu/README.md); the PyTorch
# sampler serves these models as well and keeps every deployment's start-up comparable.
export VLLM_USE_FLASHINFER_SAMPLER=0
if [ ! -e /tmp/site/optuna ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    2>&1 | grep -v WARN | tail -3
fi
# scipy (advisor.calibrate's least_squares: profiles and the guided sampler's refits) is in the device image per
# KINDS.md; .whl2/ (scipy 1.16.3, carried on the install call when wanted) is only a fallback for an image without it.
if ls .whl2/*.whl >/dev/null 2>&1 && ! python3 -c 'import scipy.optimize' 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl2/*.whl \
    2>&1 | grep -v WARN | tail -3
fi
mkdir -p /tmp/da-gpu
# The jobs here say `cluster.gpu: H200`, and the lent machine is not always one: a call that names no kind may get an
# H100 (5 Dec). The local executor refuses a job whose kind is not the card's (executors/vllm/gpu_kind.py), so on any other
# Hopper card the jobs of this device copy of the tree are rewritten to the card's kind, and results say which card
# made them (DA_GPU_KIND, printed here and in steps.log).
DA_GPU_KIND=$(python3 -c 'from executors.vllm.gpu_kind import kind_of, local_gpu_names; n = local_gpu_names() or [""]; print(kind_of(n[0]) or "")')
export DA_GPU_KIND
echo "device GPU kind: ${DA_GPU_KIND:-unknown} ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1))"
if [ -n "$DA_GPU_KIND" ] && [ "$DA_GPU_KIND" != H200 ]; then
  sed -i "s/gpu: H200/gpu: $DA_GPU_KIND/" research/gpu/h200-*.yaml
fi
