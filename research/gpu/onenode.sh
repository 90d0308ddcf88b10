#!/usr/bin/env bash
# Device side of the one-node study (research/gpu/h100-onenode-qwen15.yaml), set up as a new user sets it up:
#   bash research/gpu/onenode.sh machine   after the bundle's parts are staged (.gpu/s/run.sh stage N): the lent machine
#        made a GPU image with vLLM (the bundle's wheels pip-installed into its own python3, no --target, no
#        PYTHONPATH), and a snapshot of the committed tree (repo.tgz, git archive HEAD) unpacked in /tmp/da-repo
#   bash research/gpu/onenode.sh setup     in /tmp/da-repo: `bash scripts/setup.sh` offline (PIP_NO_INDEX=1,
#        PIP_FIND_LINKS=/tmp/whl: the project's dependencies the image lacks), PYTHONPATH unset
#   bash research/gpu/onenode.sh tune      `.venv/bin/advisor tune` detached (setsid), followed until it ends or HARD_S
#   bash research/gpu/onenode.sh follow    follow it again; at its end `advisor best` and `advisor trials`, all -> $OUT
#   bash research/gpu/onenode.sh knee      after setup: benchmarks/knee_noise.py on vLLM's defaults of the same model,
#        bursts against steady levels of 2 x c prompts, 2 searches each (~8 min), its JSON and log -> $OUT
# The study runs from /tmp/da-repo, so a later call's copy of the working tree never changes its code under it.
set -uo pipefail
source .gpu/s/run.sh env   # NVLink multicast off, offline; its PYTHONPATH (the bundle's /tmp/site) is not used
unset PYTHONPATH
J=research/gpu/h100-onenode-qwen15.yaml; R=/tmp/da-repo; t0=$(date +%s); hard=${HARD_S:-540}
mkdir -p /tmp/da-gpu /tmp/whl
for d in .gpu/w*; do [ -d "$d" ] && cp "$d"/* /tmp/whl/ 2>/dev/null; done
follow() {
  while kill -0 "$(cat /tmp/da-gpu/tune.pid)" 2>/dev/null && [ $(( $(date +%s) - t0 )) -lt "$hard" ]; do sleep 10; done
  tail -n 30 /tmp/da-gpu/tune.log
  if kill -0 "$(cat /tmp/da-gpu/tune.pid)" 2>/dev/null; then echo "=== still running after $hard s"; return 1; fi
}
pack() {
  (cd $R && .venv/bin/advisor best $J > /tmp/da-gpu/best.log 2>&1; .venv/bin/advisor trials $J > /tmp/da-gpu/trials.log 2>&1)
  cp /tmp/da-gpu/*.log "$OUT/" 2>/dev/null
  tar -C /tmp -cJf "$OUT/raw.tar.xz" da-gpu da-runs 2>/dev/null
  ls -la "$OUT"
}
case "$1" in
  machine)
    cat /tmp/ch/part.* > /tmp/bundle.tar && (sha="$PWD/.gpu/s/bundle.sha"; cd /tmp && sha256sum -c "$sha") || { echo "bundle incomplete"; exit 3; }
    mkdir -p /tmp/x && tar -xf /tmp/bundle.tar -C /tmp/x && rm -f /tmp/bundle.tar /tmp/ch/part.*
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir /tmp/x/wh/*.whl 2>&1 | grep -v WARN | tail -5
    python3 -c 'import sys, torch, vllm; print(sys.executable, "vllm", vllm.__version__, "torch", torch.__version__)'
    rm -rf $R && mkdir -p $R && tar -xzf /tmp/whl/repo.tgz -C $R && rm /tmp/whl/repo.tgz && ls $R | head -30
    ls /tmp/whl | wc -l ;;
  setup)
    cp scripts/setup.sh $R/scripts/setup.sh  # the tree's setup.sh (newer than the snapshot's)
    cd $R || exit 1
    kind=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
    case "$kind" in *H200*) sed -i 's/gpu: H100,/gpu: H200,/' $J ;; esac
    echo "device GPU: $kind"
    time env PIP_NO_INDEX=1 PIP_FIND_LINKS=/tmp/whl bash scripts/setup.sh 2>&1 | tail -25
    tail -20 .venv/setup-logs/pip-install.log 2>/dev/null
    [ -e research/gpu/models/qwen15-moe-a27b/tokenizer.json ] || .venv/bin/python -c 'import json; from executors.vllm.model_folder import write_model_folder as w; p = "research/gpu/models/qwen15-moe-a27b"; w(json.load(open(p + "/config.json")), p)'
    .venv/bin/advisor validate $J 2>&1 | tail -3 ;;
  tune)
    cd $R || exit 1
    setsid .venv/bin/advisor tune $J > /tmp/da-gpu/tune.log 2>&1 < /dev/null &
    echo $! > /tmp/da-gpu/tune.pid
    follow || exit 0; pack ;;
  follow)
    follow || exit 0; pack ;;
  pack)
    pack ;;
  knee)
    cd $R || exit 1
    kind=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
    case "$kind" in *H200*) g=H200 ;; *) g=H100 ;; esac
    command -v vllm >/dev/null && unset ENGINE_CMD  # the GPU platform's default `vllm` script, as a user's job has it
    timeout "${HARD_S:-540}" .venv/bin/python benchmarks/knee_noise.py --model research/gpu/models/qwen15-moe-a27b \
      --gpu $g --metric p90_ttft_ms --bound 1000 --max-seqs 1024 --batched-tokens 8192 --isl 1024 --osl 128 \
      --max-load 512 --start 32 --repeats 2 --settings burst-2c,steady-2c --out "$OUT/knee_noise_gpu.json" \
      > "$OUT/knee_noise.log" 2>&1
    tail -n 30 "$OUT/knee_noise.log" ;;
esac
