"""XLA's own memory analysis of a jitted training step, for every model
kind vramlab trains under JAX: `jax.jit(step).lower(...).compile()
.memory_analysis()` on the CPU backend, with and without
`donate_argnums=(0, 1)`.

The models are vramlab's (`crates/train/src/kinds.rs`): the MLP (Linear +
ReLU layers), the CNN (3x3 convolution with bias, BatchNorm on the batch's
statistics, ReLU, 2x2 max pooling per block; a linear head), and the
GPT-2-like transformer (token and position embeddings, pre-norm blocks of
causal attention and a GELU MLP, a final LayerNorm, the head tied to the
token embedding); softmax cross-entropy; optax's Adam, SGD, or SGD with
momentum.

    python3 tests/reference/xla_step.py > tests/reference/xla_step.json

Versions written into the file (`versions`).
"""

import importlib.metadata
import json
import math
import sys

import jax
import jax.numpy as jnp
import optax


def linear(p, x):
    return x @ p["w"] + p["b"]


def mlp(layers, width, inputs, classes):
    dims = [inputs] + [width] * layers + [classes]
    params = [
        {"w": jnp.zeros((dims[i], dims[i + 1])), "b": jnp.zeros((dims[i + 1],))}
        for i in range(len(dims) - 1)
    ]

    def apply(p, x):
        for i, layer in enumerate(p):
            x = linear(layer, x)
            if i < len(p) - 1:
                x = jax.nn.relu(x)
        return x

    return params, apply, lambda b: jnp.zeros((b, inputs)), lambda b: jnp.zeros((b,), jnp.int32)


def cnn(channels, image, blocks, width, classes):
    params, c_in = [], channels
    for b in range(blocks):
        c_out = width << b
        params.append({
            "w": jnp.zeros((3, 3, c_in, c_out)), "b": jnp.zeros((c_out,)),
            "g": jnp.ones((c_out,)), "beta": jnp.zeros((c_out,)),
        })
        c_in = c_out
    side = image >> blocks
    params.append({"w": jnp.zeros((c_in * side * side, classes)), "b": jnp.zeros((classes,))})

    def apply(p, x):
        for blk in p[:-1]:
            x = jax.lax.conv_general_dilated(
                x, blk["w"], (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
            ) + blk["b"]
            mean = x.mean(axis=(0, 1, 2))
            var = x.var(axis=(0, 1, 2))
            x = (x - mean) * jax.lax.rsqrt(var + 1e-5) * blk["g"] + blk["beta"]
            x = jax.nn.relu(x)
            x = jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
        return linear(p[-1], x.reshape(x.shape[0], -1))

    return (
        params,
        apply,
        lambda b: jnp.zeros((b, image, image, channels)),
        lambda b: jnp.zeros((b,), jnp.int32),
    )


def layer_norm(p, x):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * p["g"] + p["b"]


def transformer(layers, width, heads, seq, vocab, ratio=4):
    d = width
    norm = lambda: {"g": jnp.ones((d,)), "b": jnp.zeros((d,))}
    lin = lambda i, o: {"w": jnp.zeros((i, o)), "b": jnp.zeros((o,))}
    params = {
        "wte": jnp.zeros((vocab, d)),
        "wpe": jnp.zeros((seq, d)),
        "h": [
            {"ln_1": norm(), "c_attn": lin(d, 3 * d), "attn_proj": lin(d, d),
             "ln_2": norm(), "c_fc": lin(d, ratio * d), "mlp_proj": lin(ratio * d, d)}
            for _ in range(layers)
        ],
        "ln_f": norm(),
    }
    mask = jnp.tril(jnp.ones((seq, seq), bool))

    def apply(p, ids):
        b = ids.shape[0]
        x = p["wte"][ids] + p["wpe"]
        for blk in p["h"]:
            q, k, v = jnp.split(linear(blk["c_attn"], layer_norm(blk["ln_1"], x)), 3, -1)
            split = lambda t: t.reshape(b, seq, heads, d // heads).transpose(0, 2, 1, 3)
            q, k, v = split(q), split(k), split(v)
            s = (q @ k.transpose(0, 1, 3, 2)) / math.sqrt(d // heads)
            a = jax.nn.softmax(jnp.where(mask, s, -jnp.inf), -1) @ v
            a = a.transpose(0, 2, 1, 3).reshape(b, seq, d)
            x = x + linear(blk["attn_proj"], a)
            h = jax.nn.gelu(linear(blk["c_fc"], layer_norm(blk["ln_2"], x)))
            x = x + linear(blk["mlp_proj"], h)
        return layer_norm(p["ln_f"], x) @ p["wte"].T

    return (
        params,
        apply,
        lambda b: jnp.zeros((b, seq), jnp.int32),
        lambda b: jnp.zeros((b, seq), jnp.int32),
    )


OPTIMIZERS = {
    "adam": lambda: optax.adam(1e-3),
    "sgd": lambda: optax.sgd(1e-2),
    "momentum": lambda: optax.sgd(1e-2, momentum=0.9),
}


def analyse(model, batch, optimizer, donate):
    params, apply, xs, ys = model
    opt = OPTIMIZERS[optimizer]()
    state = opt.init(params)

    def loss_fn(p, x, y):
        logits = apply(p, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    def step(p, s, x, y):
        loss, g = jax.value_and_grad(loss_fn)(p, x, y)
        updates, s = opt.update(g, s, p)
        return optax.apply_updates(p, updates), s, loss

    jitted = jax.jit(step, donate_argnums=(0, 1) if donate else ())
    m = jitted.lower(params, state, xs(batch), ys(batch)).compile().memory_analysis()
    return {
        "arguments": m.argument_size_in_bytes,
        "outputs": m.output_size_in_bytes,
        "aliases": m.alias_size_in_bytes,
        "temp": m.temp_size_in_bytes,
    }


CASES = [
    ("mlp", {"layers": 2, "width": 256, "input_dim": 784, "classes": 10}, 64),
    ("mlp", {"layers": 4, "width": 1024, "input_dim": 784, "classes": 10}, 256),
    ("mlp", {"layers": 3, "width": 512, "input_dim": 100, "classes": 10}, 32),
    ("mlp", {"layers": 2, "width": 512, "input_dim": 3072, "classes": 100}, 4096),
    ("cnn", {"channels": 3, "image_size": 32, "blocks": 2, "width": 16, "classes": 10}, 32),
    ("cnn", {"channels": 3, "image_size": 64, "blocks": 3, "width": 32, "classes": 100}, 64),
    ("transformer", {"layers": 2, "width": 128, "heads": 4, "seq_len": 64, "vocab": 1000}, 8),
    ("transformer", {"layers": 4, "width": 256, "heads": 8, "seq_len": 256, "vocab": 5000}, 16),
]


def build(kind, s):
    if kind == "mlp":
        return mlp(s["layers"], s["width"], s["input_dim"], s["classes"])
    if kind == "cnn":
        return cnn(s["channels"], s["image_size"], s["blocks"], s["width"], s["classes"])
    return transformer(s["layers"], s["width"], s["heads"], s["seq_len"], s["vocab"])


def main():
    rows = []
    for kind, sizes, batch in CASES:
        model = build(kind, sizes)
        for optimizer in OPTIMIZERS:
            for donate in (False, True):
                row = {"kind": kind, **sizes, "batch": batch, "optimizer": optimizer, "donate": donate}
                row.update(analyse(model, batch, optimizer, donate))
                rows.append(row)
                print(row, file=sys.stderr)
    versions = {"jax": jax.__version__, "jaxlib": importlib.metadata.version("jaxlib"), "optax": optax.__version__,
                "backend": jax.default_backend()}
    json.dump({"versions": versions, "steps": rows}, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
