#!/usr/bin/env bash
# The GPU check. On a machine with an NVIDIA GPU, its driver, and Python with
# PyTorch (and JAX):
#   scripts/gpu-check.sh [VRAMLAB_BINARY]
# 1. finds the vramlab binary (built here with cargo when there is one, or
#    given: a release build carried from the development machine);
# 2. prints what the CUDA backend finds;
# 3. plays every lesson on --device cuda and on --device sim and compares
#    allocated and reserved bytes step by step;
# 4. replays the PyTorch-side lessons and 200 random command files in real
#    PyTorch and JAX, and writes them with their outputs to tests/golden/
#    (NAME.commands.jsonl, NAME.pytorch.jsonl or NAME.jax.jsonl) with the
#    framework versions in tests/golden/VERSIONS;
# 5. checks that --device sim reproduces every golden number (the same check
#    CI runs: cargo test --test golden).
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
[[ -x "$BIN" ]] || { echo "gpu-check: no vramlab binary at $BIN" >&2; exit 2; }
WORK=$(mktemp -d)
GOLDEN=tests/golden
mkdir -p "$GOLDEN"
fail=0

echo "== backend"
echo '{"cmd":"gc"}' | "$BIN" run - --device cuda | head -c 400; echo
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

echo "== lessons: --device cuda vs --device sim (allocated, reserved)"
for f in tests/lessons/*.jsonl; do
  name=$(basename "$f" .jsonl)
  "$BIN" run "$f" --device cuda > "$WORK/$name.cuda.jsonl"
  "$BIN" run "$f" --device sim > "$WORK/$name.sim.jsonl"
  python3 tests/reference/compare.py "$WORK/$name.cuda.jsonl" "$WORK/$name.sim.jsonl" \
    allocated_bytes reserved_bytes || fail=1
done

echo "== golden files from real PyTorch and JAX"
python3 - <<'PY' > "$GOLDEN/VERSIONS"
import importlib
for m in ("torch", "jax", "jaxlib"):
    try:
        print(m, importlib.import_module(m).__version__)
    except Exception as e:
        print(m, "missing:", e)
PY
cat "$GOLDEN/VERSIONS"
python3 tests/reference/random_commands.py "$WORK/random" 200 7
for f in tests/lessons/01-*.jsonl tests/lessons/02-*.jsonl tests/lessons/05-*.jsonl "$WORK"/random/*-pytorch.jsonl; do
  name=$(basename "$f" .jsonl)
  grep -v '"cmd": *"\(model\|train\|forward\)' "$f" > "$GOLDEN/$name.commands.jsonl"
  python3 tests/reference/replay_pytorch.py "$GOLDEN/$name.commands.jsonl" > "$GOLDEN/$name.pytorch.jsonl" || fail=1
done
for f in tests/lessons/04-*.jsonl "$WORK"/random/*-jax.jsonl; do
  name=$(basename "$f" .jsonl)
  cp "$f" "$GOLDEN/$name.commands.jsonl"
  python3 tests/reference/replay_jax.py "$GOLDEN/$name.commands.jsonl" > "$GOLDEN/$name.jax.jsonl" || fail=1
done

echo "== the simulator against the golden files"
for g in "$GOLDEN"/*.pytorch.jsonl; do
  name=$(basename "$g" .pytorch.jsonl)
  "$BIN" run "$GOLDEN/$name.commands.jsonl" --device sim > "$WORK/$name.sim.jsonl"
  python3 tests/reference/compare.py "$g" "$WORK/$name.sim.jsonl" allocated_bytes reserved_bytes \
    active_bytes requested_bytes inactive_split_bytes segments num_alloc_retries num_ooms || fail=1
done
for g in "$GOLDEN"/*.jax.jsonl; do
  name=$(basename "$g" .jax.jsonl)
  "$BIN" run "$GOLDEN/$name.commands.jsonl" --device sim > "$WORK/$name.sim.jsonl"
  python3 tests/reference/compare.py "$g" "$WORK/$name.sim.jsonl" allocated_bytes reserved_bytes || fail=1
done
echo "gpu-check: $([[ $fail == 0 ]] && echo passed || echo 'found differences (see above)')"
exit $fail
