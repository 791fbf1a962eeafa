#!/usr/bin/env python3
"""What `accelerate estimate-memory` answers for the shipped shapes, by
accelerate's own functions: the model built on the meta device in full
precision as its `create_empty_model` builds it (here from the config.json
fields in hf_params.json, since the Hub is not reached), then
`calculate_maximum_sizes` and `estimate_training_usage`, the "float16" row
halved and the "int4" row divided by 8 as its `gather_data` does. Prints JSON.

    python3 tests/reference/hf_anchors.py > tests/reference/hf_anchors.json

Needs PyTorch, transformers and accelerate (CPU builds; versions written).
"""
import json
import os

import accelerate
import torch
import transformers
from accelerate import init_empty_weights
from accelerate.commands.estimate import estimate_training_usage
from accelerate.utils import calculate_maximum_sizes
from transformers import AutoConfig, AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    with open(os.path.join(HERE, "hf_params.json")) as f:
        shapes = json.load(f)["models"]
    rows = []
    for m in shapes:
        fields = {k: v for k, v in m["fields"].items() if k != "torch_dtype"}
        config = AutoConfig.for_model(**fields)
        with init_empty_weights():
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        total, largest = calculate_maximum_sizes(model)
        rows.append({
            "name": m["name"],
            "float32_total_bytes": total,
            "float16_total_bytes": total / 2,
            "float16_largest_layer_bytes": largest[0] / 2,
            # `gather_data`'s "int4" row: the total divided by 8; no
            # training estimate for it.
            "int4_total_bytes": total / 8,
            "float16_training_with_adam": estimate_training_usage(total, "float16"),
        })
    print(json.dumps({"torch": torch.__version__, "transformers": transformers.__version__,
                      "accelerate": accelerate.__version__, "models": rows}, indent=1))


if __name__ == "__main__":
    main()
