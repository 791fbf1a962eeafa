"""peft: LoRA adapters. `get_peft_model` on a vramlab GPT still on the host
puts rank-r adapters on every linear layer of its blocks and freezes the
rest; moved to the GPU, the engine builds it so (only the adapters have
gradients and optimizer state)."""


class LoraConfig:
    def __init__(self, r=8, lora_alpha=8, target_modules=None, lora_dropout=0.0, bias="none", task_type=None, **_):
        self.r = r
        self.target_modules = target_modules
        self.lora_alpha = lora_alpha


def get_peft_model(model, peft_config, *a, **k):
    if not hasattr(model, "lora_rank"):
        raise NotImplementedError("vramlab puts LoRA adapters on its GPT (vramlab.models.GPT)")
    if model._engine is not None:
        raise NotImplementedError(
            "vramlab adds LoRA adapters to a model still on the host: call get_peft_model before .cuda()"
        )
    model.lora_rank = peft_config.r
    return model
