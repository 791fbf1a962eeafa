#!/usr/bin/env python3
"""A Hugging Face hub cache with no network: the published config.json of
every shape vramlab ships (crates/hf/src/known.json, each under the
repo id of its `config_url`), and for the repos named after `--weights`
random weights in safetensors shards, as `save_pretrained` writes them. With

    export HF_HUB_CACHE=DIR HF_HUB_OFFLINE=1

`AutoConfig.from_pretrained("meta-llama/Llama-3.2-1B")` and
`AutoModelForCausalLM.from_pretrained(...)` (bitsandbytes' 4-bit loading
included) read them as they read a download: the memory of random weights is
the memory of the published ones. A GPU machine with no internet runs the
lessons and snippets that name a hub model this way.

    python3 tests/reference/offline_hub.py DIR [--weights REPO...]

Weights are drawn on the GPU where there is one (std 0.02, each tensor its
config's dtype), then written shard by shard (at most 5 GB a shard).
"""
import argparse
import json
import os
import sys

KNOWN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "src", "train", "hf",
                     "known.json")
REVISION = "0" * 40
SHARD_BYTES = 5 * 10**9


def repo_of(url):
    """https://huggingface.co/ORG/NAME/blob/main/config.json -> ORG/NAME."""
    parts = url.split("/")
    return "/".join(parts[3:5])


def snapshot(cache, repo):
    root = os.path.join(cache, "models--" + repo.replace("/", "--"))
    os.makedirs(os.path.join(root, "refs"), exist_ok=True)
    with open(os.path.join(root, "refs", "main"), "w") as f:
        f.write(REVISION)
    folder = os.path.join(root, "snapshots", REVISION)
    os.makedirs(folder, exist_ok=True)
    return folder


def write_weights(folder, config_dict):
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**{k: v for k, v in config_dict.items() if k != "torch_dtype"})
    dtype = getattr(torch, config_dict.get("torch_dtype") or "float32")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    state = model.state_dict()
    if getattr(config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    shards, shard, size = [], {}, 0
    for name, t in state.items():
        nbytes = t.numel() * t.element_size()
        if shard and size + nbytes > SHARD_BYTES:
            shards.append(shard)
            shard, size = {}, 0
        shard[name] = (t.shape, t.dtype)
        size += nbytes
    shards.append(shard)
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in state.values())},
             "weight_map": {}}
    for i, names in enumerate(shards, 1):
        file = "model-%05d-of-%05d.safetensors" % (i, len(shards))
        tensors = {n: torch.empty(shape, dtype=dt, device=device).normal_(0, 0.02).cpu()
                   for n, (shape, dt) in names.items()}
        save_file(tensors, os.path.join(folder, file), metadata={"format": "pt"})
        index["weight_map"].update((n, file) for n in names)
        del tensors
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=1)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("cache")
    p.add_argument("--weights", nargs="*", default=[])
    args = p.parse_args()
    with open(KNOWN) as f:
        known = {repo_of(m["config_url"]): m["config"] for m in json.load(f)}
    unknown = [r for r in args.weights if r not in known]
    if unknown:
        sys.exit("no shipped config for %s" % ", ".join(unknown))
    for repo, config in known.items():
        folder = snapshot(args.cache, repo)
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(config, f, indent=1)
    for repo in args.weights:
        write_weights(snapshot(args.cache, repo), known[repo])
        print("weights:", repo, file=sys.stderr)


if __name__ == "__main__":
    main()
