"""peft: LoRA adapters. `get_peft_model` on a vramlab GPT still on the host
puts rank-r adapters on every linear layer of its blocks and freezes the
rest; moved to the GPU, the engine builds it so (only the adapters have
gradients and optimizer state). On a Hugging Face model on the GPU it adds
them there (the model type's target modules, or `"all-linear"` on a 4-bit
model); `prepare_model_for_kbit_training` readies a 4-bit one."""

import vramlab_shim as _vs


class LoraConfig:
    def __init__(self, r=8, lora_alpha=8, target_modules=None, lora_dropout=0.0, bias="none", task_type=None, **_):
        self.r = r
        self.target_modules = target_modules
        self.lora_alpha = lora_alpha


def prepare_model_for_kbit_training(model, use_gradient_checkpointing=True, gradient_checkpointing_kwargs=None):
    """Every parameter frozen, the ones not in 4 bits upcast to float32,
    the cache emptied; checkpointing on (reentrant) unless asked not to."""
    if not getattr(model, "is_hf_model", False) or model._name is None:
        raise NotImplementedError("vramlab prepares a 4-bit Hugging Face model on the GPU (from_pretrained(..., quantization_config=...))")
    _vs.run(_vs.command("prepare_kbit", model=model._name))
    model._trainable = 0
    if use_gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs)
    return model


def get_peft_model(model, peft_config, *a, **k):
    if getattr(model, "is_hf_model", False):
        if model._name is None:
            raise NotImplementedError("vramlab adds LoRA to a Hugging Face model on the GPU: .to(\"cuda\") first")
        all_linear = peft_config.target_modules == "all-linear"
        cmd = _vs.command("lora", model=model._name, rank=int(peft_config.r))
        if all_linear:
            cmd["all_linear"] = True
        elif peft_config.target_modules is not None:
            raise NotImplementedError("vramlab puts LoRA on the model type's default target modules, or on every linear layer (\"all-linear\")")
        record = _vs.run(cmd)
        model._trainable = (record.get("value") or {}).get("trainable", 0)
        return model
    if not hasattr(model, "lora_rank"):
        raise NotImplementedError("vramlab puts LoRA adapters on its GPT (vramlab.models.GPT)")
    if model._engine is not None:
        raise NotImplementedError(
            "vramlab adds LoRA adapters to a model still on the host: call get_peft_model before .cuda()"
        )
    model.lora_rank = peft_config.r
    return model
