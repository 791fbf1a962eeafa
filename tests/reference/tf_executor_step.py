"""TensorFlow's executor running a Keras training step without XLA
(`model.compile(jit_compile=False)`): every allocation and free of one
step, as TensorFlow's own BFC allocator reports them to its profiler, for
vramlab's MLP (Dense + ReLU layers, a linear head; softmax cross-entropy)
with Keras 3's Adam, SGD and SGD with momentum.

It runs on the CPU: with `TF_CPU_ALLOCATOR_USE_BFC=true` the CPU's tensors
come from the same `BFCAllocator` class a GPU's do, and the executor, the
graph Grappler leaves and Keras's optimizer code are the ones a GPU runs.
One inter-op thread keeps the executor's order one order. oneDNN is off
(its kernels allocate scratch a GPU's do not).

    python3 tests/reference/tf_executor_step.py > tests/reference/tf_executor_step.json

For each step: `peak_requested` is the most requested bytes alive at once
over what lived before the step, `after_requested` what stays after it,
and `events` the step's allocations (+bytes) and frees (-bytes) with the
op that made each. Versions are written into the file (`versions`).
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"

import glob
import importlib.metadata
import json
import shutil
import sys
import tempfile

import numpy as np
import tensorflow as tf

tf.config.threading.set_inter_op_parallelism_threads(1)
tf.config.threading.set_intra_op_parallelism_threads(1)

import keras  # noqa: E402
from tensorflow.tsl.profiler.protobuf import xplane_pb2  # noqa: E402

OPTIMIZERS = {
    "adam": lambda: keras.optimizers.Adam(1e-3),
    "sgd": lambda: keras.optimizers.SGD(1e-2),
    "momentum": lambda: keras.optimizers.SGD(1e-2, momentum=0.9),
}

# (layers, width, inputs, batch), as tests/reference/xla_step.py's MLPs.
MLPS = [(2, 256, 784, 64), (4, 1024, 784, 256), (3, 512, 100, 32), (2, 512, 3072, 4096)]
CLASSES = 10


def memory_events(logdir):
    """The allocator's events of the profiled run, in time order."""
    path = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)[0]
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    events = []
    for plane in space.planes:
        names = {k: v.name for k, v in plane.event_metadata.items()}
        stats = {k: v.name for k, v in plane.stat_metadata.items()}
        for line in plane.lines:
            for e in line.events:
                name = names.get(e.metadata_id, "")
                if name not in ("MemoryAllocation", "MemoryDeallocation"):
                    continue
                s = {}
                for st in e.stats:
                    key = stats.get(st.metadata_id)
                    if st.HasField("str_value"):
                        s[key] = st.str_value
                    elif st.HasField("ref_value"):
                        s[key] = stats.get(st.ref_value)
                    elif st.HasField("uint64_value"):
                        s[key] = st.uint64_value
                    else:
                        s[key] = st.int64_value
                when = line.timestamp_ns * 1000 + e.offset_ps
                events.append((when, name == "MemoryAllocation", s))
    events.sort(key=lambda t: t[0])
    return events


def step(layers, width, inputs, batch, optimizer):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((inputs,))]
        + [keras.layers.Dense(width, activation="relu") for _ in range(layers)]
        + [keras.layers.Dense(CLASSES)]
    )
    model.compile(
        optimizer=OPTIMIZERS[optimizer](),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=False,
    )
    x = tf.constant(np.random.rand(batch, inputs).astype("float32"))
    y = tf.constant(np.random.randint(0, CLASSES, batch).astype("int64"))
    # Two steps first: the function is traced and the optimizer built.
    model.train_on_batch(x, y)
    model.train_on_batch(x, y)
    logdir = tempfile.mkdtemp()
    options = tf.profiler.experimental.ProfilerOptions(host_tracer_level=3)
    tf.profiler.experimental.start(logdir, options=options)
    model.train_on_batch(x, y)
    tf.profiler.experimental.stop()
    events = memory_events(logdir)
    shutil.rmtree(logdir)
    # Requested bytes alive over the start; a free names its address.
    live, now, peak, trace = {}, 0, 0, []
    for _, is_alloc, s in events:
        address, size = s.get("addr"), s.get("requested_bytes", 0)
        if is_alloc:
            live[address] = size
            now += size
            trace.append([s.get("tf_op") or "", size])
        else:
            size = live.pop(address, size)
            now -= size
            trace.append(["free", -size])
        peak = max(peak, now)
    return {
        "kind": "mlp",
        "layers": layers,
        "width": width,
        "input_dim": inputs,
        "classes": CLASSES,
        "batch": batch,
        "optimizer": optimizer,
        "parameters": sum(int(np.prod(w.shape)) for w in model.trainable_weights),
        "peak_requested": peak,
        "after_requested": now,
        "events": trace,
    }


def main():
    versions = {
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "python": sys.version.split()[0],
        "numpy": importlib.metadata.version("numpy"),
        "device": "CPU (BFC allocator)",
    }
    steps = [step(*m, o) for m in MLPS for o in OPTIMIZERS]
    # One step a line.
    print('{"versions": ' + json.dumps(versions) + ",")
    print(' "steps": [')
    print(",\n".join("  " + json.dumps(s) for s in steps))
    print(" ]}")


if __name__ == "__main__":
    main()
