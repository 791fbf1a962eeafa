#!/usr/bin/env bash
# The GPU check. On a machine with an NVIDIA GPU, its driver, and Python with
# PyTorch, JAX, transformers, peft and nvidia-ml-py:
#   scripts/gpu-check.sh [VRAMLAB_BINARY]
# writes tests/golden/ from the frameworks themselves, in one run of a few
# minutes (the parts that measure nothing but per-process allocator counters
# run side by side; the context and speed parts run alone):
#   - NAME.commands.jsonl + NAME.pytorch.jsonl / NAME.jax.jsonl: the
#     tensor-level lessons and 200 random command files replayed in real
#     PyTorch and JAX (tests/reference/replay_*.py);
#   - workspaces*.json: what matrix products, attention and convolutions
#     allocate beside their outputs, under each workspace setting;
#   - gpu_step.json: step_trace.py's training steps run on the GPU (and
#     gpu_step-detail.json: three of them with each event's C++ frames);
#   - hf_steps.json: transformers' models trained and generating, and
#     hf_steps-families.json: the same for Qwen3, Gemma 2 and 3, Phi-3,
#     Mistral and Llama-3.1-8B (the planner's shapes);
#   - playground-cuda.json and playground-{cuda,sim}.png: the playground
#     served by `vramlab serve --device cuda`, trained from the page in
#     headless Chromium (CHROMIUM=path, scripts/portable-chromium makes one
#     for a machine with no browser; DIST=the built web app, default
#     dist), and the same clicks on --device sim;
#   - qlora.json: QLoRA as people run it (bitsandbytes' 4-bit weights,
#     peft's k-bit preparation and LoRA, AdamW), the bytes at each stage;
#   - xla_step.json: XLA's memory_analysis() of the jitted steps on the GPU;
#   - snapshot*.pickle: PyTorch's own snapshots of a run ending in an
#     out-of-memory, with and without expandable segments, and of CUDA
#     graphs' private pools (a captured step, kept or freed, and
#     torch.compile's reduce-overhead);
#   - gpu-kernels.txt: the step's kernels compiled for this GPU and the
#     server's GPU tests (each kind's step computed by them, its losses
#     against the CPU's);
#   - lessons-cuda-vs-sim.txt: every lesson on --device cuda (the GPU standing
#     in for the lesson's smaller one) and --device sim, step by step, with
#     the GPU's records in lessons-cuda/;
#   - context-*.jsonl: the CUDA context and its growth, per framework;
#   - speed-pytorch.json: PyTorch eager's step times and the bf16 ceiling,
#     and speed-vramlab.txt: the same steps on vramlab's kernels;
#     kernel-times.jsonl: those steps again, each kernel's and product's
#     GPU time (VRAMLAB_KERNEL_TIMES), one line a case;
#   - jax-alloc.jsonl, jax-alloc-repeat.jsonl: XLA's allocator stats around
#     each way to make an array, and around the same one made again;
#   - python-snippets.json: tests/python/*.py run by CPython with the real
#     frameworks on the GPU (what each printed, beside the shims' .out);
#   - lessons-python.json: the lessons as Python (tests/lessons/*.kN.py) run
#     by CPython with the real frameworks, the bytes after every statement;
#   - PROVENANCE.md: the command, GPU, driver, CUDA and every version, and
#     each part's exit status and seconds.
# The machine needs no internet: the hub part writes a Hugging Face cache
# of the shipped configs (and random weights for the repos in HUB_WEIGHTS,
# which snippets and lessons load with from_pretrained) for the parts after
# it, offline (tests/reference/offline_hub.py), in HUB (default a temporary
# folder; /dev/shm/hub is quicker where memory allows).
# PARTS="replays gpu_step" runs only those parts (their files are rewritten,
# the others kept). SNIPPETS="44- 45-" and LESSONS="20- 21-" run only the
# snippets and lessons whose names start so, kept beside the earlier run's.
# CI then checks the simulator against them: cargo test --test golden.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-}
if [[ -z "$BIN" ]]; then
  if command -v cargo >/dev/null; then
    cargo build --release -p vramlab-server && BIN=target/release/vramlab
  else
    BIN=target/release/vramlab
  fi
fi
GOLDEN=tests/golden
REF=tests/reference
mkdir -p "$GOLDEN/logs"
WORK=$(mktemp -d)
ROOT=$(pwd)
# cuBLAS and NVRTC for the step's kernels: the CUDA wheels PyTorch
# installed (nvidia/cu13/lib), unless the machine's own are on the path.
NVIDIA_LIB=$(python3 -c 'import os, nvidia; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH="${NVIDIA_LIB:+$NVIDIA_LIB:}${LD_LIBRARY_PATH:-}"
# The server's GPU tests, built here with
# `cargo test --release -p vramlab-backend --test gpu --no-run`.
GPU_TEST=${GPU_TEST:-$(ls target/release/deps/gpu-* 2>/dev/null | grep -v '\.d$' | head -1)}
export PYTHONUNBUFFERED=1 BIN GOLDEN REF WORK ROOT GPU_TEST

# part NAME SECONDS COMMAND...: runs it with a time limit, its output in
# logs/NAME.log, and notes its exit status and seconds.
PARTS_GIVEN=${PARTS:-}
PARTS=${PARTS:-hub replays workspaces gpu_step xla_step hf_steps hf_families qlora snapshots graph_snapshots lessons jax_alloc screenshot python_snippets lessons_python kernels contexts speed speed_vramlab kernel_times}
part() {
  local name=$1 limit=$2 start rc
  shift 2
  [[ " $PARTS " == *" $name "* ]] || return 0
  start=$(date +%s)
  timeout "$limit" "$@" > "$GOLDEN/logs/$name.log" 2>&1
  rc=$?
  echo "| $name | $rc | $(( $(date +%s) - start )) |" >> "$WORK/parts"
  echo "== $name: exit $rc in $(( $(date +%s) - start )) s"
}

# One command file replayed in real PyTorch or JAX.
replay_one() {
  local f=$1 name
  name=$(basename "$f" .jsonl)
  case "$name" in
    *-jax|04-*)
      cp "$f" "$GOLDEN/$name.commands.jsonl"
      python3 "$REF/replay_jax.py" "$GOLDEN/$name.commands.jsonl" > "$GOLDEN/$name.jax.jsonl" \
        2> "$WORK/$name.err" || { echo "$name failed"; tail -5 "$WORK/$name.err"; } ;;
    *)
      grep -v '"cmd": *"\(model\|train\|forward\)' "$f" > "$GOLDEN/$name.commands.jsonl"
      python3 "$REF/replay_pytorch.py" "$GOLDEN/$name.commands.jsonl" > "$GOLDEN/$name.pytorch.jsonl" \
        2> "$WORK/$name.err" || { echo "$name failed"; tail -5 "$WORK/$name.err"; } ;;
  esac
}
export -f replay_one

replays() {
  rm -f "$GOLDEN"/*.commands.jsonl "$GOLDEN"/*.pytorch.jsonl "$GOLDEN"/*.jax.jsonl
  python3 "$REF/random_commands.py" "$WORK/random" 200 7
  ls tests/lessons/0{1,2,4,5}-*.jsonl "$WORK"/random/*.jsonl | xargs -P 8 -I{} bash -c 'replay_one {}'
}

workspaces() {
  python3 "$REF/gpu_workspaces.py" > "$GOLDEN/workspaces.json" &&
    TORCH_CUBLAS_WORKSPACE_CACHE=1 python3 "$REF/gpu_workspaces.py" > "$GOLDEN/workspaces-cache.json" &&
    CUBLAS_WORKSPACE_CONFIG=:0:0 python3 "$REF/gpu_workspaces.py" > "$GOLDEN/workspaces-config-0.json"
}

snapshots() {
  python3 "$REF/gpu_snapshot.py" "$GOLDEN/snapshot-oom.pickle" &&
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 "$REF/gpu_snapshot.py" "$GOLDEN/snapshot-oom-expandable.pickle"
}

# CUDA graphs' private pools: a captured step, the same with the graph
# freed, and torch.compile's reduce-overhead.
graph_snapshots() {
  local mode fail=0
  for mode in graph graph-freed reduce-overhead; do
    python3 "$REF/gpu_graph_snapshot.py" "$mode" "$GOLDEN/snapshot-$mode.pickle" || fail=1
  done
  return $fail
}

lessons() {
  local f name fail=0 out="$GOLDEN/lessons-cuda-vs-sim.txt"
  : > "$out"
  mkdir -p "$GOLDEN/lessons-cuda"
  for f in tests/lessons/*.jsonl; do
    name=$(basename "$f" .jsonl)
    "$BIN" run "$f" --device cuda > "$WORK/$name.cuda.jsonl" 2>&1
    cp "$WORK/$name.cuda.jsonl" "$GOLDEN/lessons-cuda/$name.jsonl"
    "$BIN" run "$f" --device sim > "$WORK/$name.sim.jsonl" 2>&1
    (cd "$WORK" && python3 "$ROOT/$REF/compare.py" "$name.cuda.jsonl" "$name.sim.jsonl" \
      allocated_bytes reserved_bytes) >> "$out" || fail=1
  done
  head -c 600 "$WORK/01-del-vs-empty-cache.cuda.jsonl"
  return $fail
}

contexts() {
  python3 "$REF/gpu_context.py" torch > "$GOLDEN/context-torch.jsonl" &&
    CUDA_MODULE_LOADING=EAGER python3 "$REF/gpu_context.py" torch > "$GOLDEN/context-torch-eager-loading.jsonl"
  XLA_PYTHON_CLIENT_PREALLOCATE=false python3 "$REF/gpu_context.py" jax > "$GOLDEN/context-jax.jsonl" &&
    python3 "$REF/gpu_context.py" jax > "$GOLDEN/context-jax-preallocate.jsonl"
}

# The step's kernels: compiled by this machine's NVRTC for its GPU, and
# every kind's step computed by them, its losses held to the CPU's.
kernels() {
  if [[ ! -x "$GPU_TEST" ]]; then
    echo "no GPU tests to run: build them with cargo test --release -p vramlab-backend --test gpu --no-run, or name them in GPU_TEST"
    return 1
  fi
  "$BIN" kernels --arch "$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1)" &&
    "$GPU_TEST" --ignored --nocapture --test-threads 1 --skip the_speed
}

# The Hugging Face hub, offline: every part after the first group reads it.
export HF_HUB_CACHE="${HUB:-$WORK/hub}" HF_HUB_OFFLINE=1
HUB_WEIGHTS=${HUB_WEIGHTS-meta-llama/Llama-3.2-1B meta-llama/Llama-3.1-8B}
export HUB_WEIGHTS

# python_snippets and lessons_python: all of them, or those SNIPPETS and
# LESSONS name beside the earlier run's.
python_snippets() {
  XLA_PYTHON_CLIENT_PREALLOCATE=true python3 "$REF/python_snippets.py" tests/python ${SNIPPETS:-} \
    ${SNIPPETS:+--merge "$GOLDEN/python-snippets.json"} > "$WORK/python-snippets.json" &&
    mv "$WORK/python-snippets.json" "$GOLDEN/python-snippets.json"
}
lessons_python() {
  python3 "$REF/lesson_python_gpu.py" tests/lessons ${LESSONS:-} \
    ${LESSONS:+--merge "$GOLDEN/lessons-python.json"} > "$WORK/lessons-python.json" &&
    mv "$WORK/lessons-python.json" "$GOLDEN/lessons-python.json"
}

export -f workspaces snapshots graph_snapshots lessons contexts replays kernels python_snippets lessons_python
started=$(date -u +%FT%TZ)
# Side by side: each measures its own process's allocator.
part hub 240 bash -c 'python3 "$REF/offline_hub.py" "$HF_HUB_CACHE" --weights $HUB_WEIGHTS' &
part replays 240 bash -c replays &
part workspaces 240 bash -c workspaces &
part gpu_step 240 bash -c 'python3 "$REF/gpu_step.py" > "$GOLDEN/gpu_step.json" &&
  python3 "$REF/gpu_step.py" 4 5 8 > "$GOLDEN/gpu_step-detail.json"' &
part xla_step 240 bash -c 'XLA_PYTHON_CLIENT_PREALLOCATE=false python3 "$REF/xla_step.py" > "$GOLDEN/xla_step.json"' &
part hf_steps 240 bash -c 'python3 "$REF/hf_steps.py" > "$GOLDEN/hf_steps.json"' &
part hf_families 420 bash -c 'python3 "$REF/hf_steps.py" --families > "$GOLDEN/hf_steps-families.json"' &
part qlora 240 bash -c 'python3 "$REF/gpu_qlora.py" > "$GOLDEN/qlora.json"' &
part snapshots 120 bash -c snapshots &
part graph_snapshots 180 bash -c graph_snapshots &
part lessons 180 bash -c lessons &
part jax_alloc 60 bash -c 'export XLA_PYTHON_CLIENT_PREALLOCATE=false;
  python3 "$REF/gpu_jax_alloc.py" > "$GOLDEN/jax-alloc.jsonl" &&
  python3 "$REF/gpu_jax_alloc.py" repeat > "$GOLDEN/jax-alloc-repeat.jsonl"' &
part screenshot 150 bash -c 'python3 "$REF/gpu_screenshot.py" "$BIN" "${DIST:-dist}" "${CHROMIUM:-chromium}" "$GOLDEN" > "$GOLDEN/playground-cuda.json"' &
wait
# Alone: the device's used memory and the clock are shared by every process.
part python_snippets 300 bash -c python_snippets
part lessons_python 420 bash -c lessons_python
part kernels 180 bash -c 'kernels > "$GOLDEN/gpu-kernels.txt" 2>&1'
part contexts 90 bash -c contexts
part speed 90 bash -c 'python3 "$REF/gpu_speed.py" > "$GOLDEN/speed-pytorch.json"'
part speed_vramlab 120 bash -c '[[ -x "$GPU_TEST" ]] && "$GPU_TEST" --ignored --nocapture --exact the_speed_of_a_step_on_the_gpu > "$GOLDEN/speed-vramlab.txt" 2>&1'
part kernel_times 120 bash -c '[[ -x "$GPU_TEST" ]] && rm -f "$GOLDEN/kernel-times.jsonl" &&
  VRAMLAB_KERNEL_TIMES="$ROOT/$GOLDEN/kernel-times.jsonl" "$GPU_TEST" --ignored --nocapture --exact the_speed_of_a_step_on_the_gpu > "$WORK/kernel-times.txt" 2>&1'

{
  echo "# Golden files from a real GPU"
  echo
  echo "Written by \`scripts/gpu-check.sh\`, started $started, finished $(date -u +%FT%TZ)."
  echo
  echo '```'
  nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv 2>&1
  nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9.]*'
  python3 - <<'PY'
import importlib, platform
print("python", platform.python_version())
for m in ("torch", "jax", "jaxlib", "transformers", "peft", "bitsandbytes", "optax", "vllm", "tensorflow"):
    try:
        print(m, importlib.import_module(m).__version__)
    except Exception as e:
        print(m, "missing:", e)
import torch
print("torch.version.cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())
PY
  echo '```'
  echo
  echo "| part | exit | seconds |"
  echo "|---|---|---|"
  cat "$WORK/parts"
} > "$WORK/provenance"
# A run of some parts adds its table to the last full run's.
if [[ -n "${PARTS_GIVEN:-}" && -f "$GOLDEN/PROVENANCE.md" ]]; then
  { echo; echo "## Parts rerun: $PARTS"; echo; tail -n +2 "$WORK/provenance"; } >> "$GOLDEN/PROVENANCE.md"
else
  mv "$WORK/provenance" "$GOLDEN/PROVENANCE.md"
fi
cat "$GOLDEN/PROVENANCE.md"
