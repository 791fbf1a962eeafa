"""transformers: `AutoConfig` and `AutoModelForCausalLM` for the model
families vramlab builds (GPT-2, Llama, Mistral, Qwen2, Qwen3, Gemma 2 and
3, Phi-3), from a published shape's name or a config's fields. Moved to
the GPU (`.to("cuda")`, `device_map="cuda"`), the engine loads every
parameter and buffer as transformers 5.24 does (random weights: the same
memory as the published ones; in bitsandbytes' 4 bits with a
`BitsAndBytesConfig`), and `model.generate(...)` runs as transformers' own
greedy `generate`: the prefill, one forward per new token, the
`DynamicCache` grown by `torch.cat` or the `StaticCache`.
`model(input_ids=ids, labels=ids).loss`, `loss.backward()` and an AdamW
over `model.parameters()` run transformers' own training step, a
statement at a time."""

import torch
import vramlab_shim as _vs
from torch._tensor import Tensor

__version__ = "5.24.0+vramlab"

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Models saved with `save_pretrained(path)`: their configs, by path.
_saved = {}


class PretrainedConfig:
    """A config: the published shape it names (`source`, a string) or its
    fields (a dict). Its numbers come from the engine once the model is
    on the GPU."""

    def __init__(self, source, **fields):
        self._source = source
        self._attn_implementation = fields.pop("attn_implementation", None) or "sdpa"
        for k, v in fields.items():
            setattr(self, k, v)

    def to_dict(self):
        if isinstance(self._source, dict):
            return dict(self._source)
        return {"_name_or_path": self._source}


class AutoConfig:
    @staticmethod
    def from_pretrained(name, **kwargs):
        return PretrainedConfig(str(name), **{k: v for k, v in kwargs.items() if k == "attn_implementation"})

    @staticmethod
    def for_model(model_type, **fields):
        attn = fields.pop("attn_implementation", None)
        config = dict(fields, model_type=model_type)
        return PretrainedConfig(config, attn_implementation=attn, **fields)


class BitsAndBytesConfig:
    """`load_in_4bit=True`: the decoder's linear layers in bitsandbytes' 4
    bits (`bnb_4bit_quant_type` nf4 or fp4, `bnb_4bit_use_double_quant`),
    computing in `bnb_4bit_compute_dtype` (the model's type here)."""

    def __init__(self, load_in_4bit=False, load_in_8bit=False, bnb_4bit_quant_type="fp4",
                 bnb_4bit_use_double_quant=False, bnb_4bit_compute_dtype=None, **kwargs):
        if load_in_8bit or not load_in_4bit:
            raise NotImplementedError("vramlab loads bitsandbytes' 4-bit weights (load_in_4bit=True)")
        self.quant_type = bnb_4bit_quant_type
        self.double_quant = bool(bnb_4bit_use_double_quant)
        self.compute_dtype = bnb_4bit_compute_dtype


class CausalLMOutput:
    def __init__(self, loss):
        self.loss = loss
        self.logits = None

    def __getitem__(self, i):
        return (self.loss,)[i]


class PreTrainedModel(_vs.Owner):
    """A causal language model: on the host until moved to the GPU, then
    the engine's model (its name freed when CPython frees this)."""

    is_hf_model = True

    def __init__(self, config, dtype=None, quantization=None):
        self.config = config
        self.dtype = dtype
        self.device = torch.device("cpu")
        self._name = None
        # `from_config` makes a module in training mode; `from_pretrained`
        # puts it in eval mode.
        self.training = True
        self.quantization = quantization
        self.optimizers = []
        self.gradient_checkpointing = False
        self._trainable = None

    # ----- where it lives
    def to(self, *args, **kwargs):
        for a in list(args) + [kwargs.get("device"), kwargs.get("dtype")]:
            if a is None:
                continue
            if isinstance(a, torch.dtype):
                if self._name is not None:
                    raise NotImplementedError("vramlab loads a Hugging Face model in one type: give dtype= to from_config or from_pretrained")
                self.dtype = a
            elif torch.device(a).type == "cuda":
                self._place()
        return self

    def cuda(self, device=None):
        return self.to("cuda")

    def _place(self):
        if self._name is not None:
            return
        name = _vs.fresh_name()
        config = self.config._source
        cmd = _vs.command("model", name=name, kind="hf", config=config)
        if self.dtype is not None:
            cmd["dtype"] = self.dtype.name
        if self.quantization is not None:
            cmd["quantization"] = self.quantization.quant_type
            cmd["double_quant"] = self.quantization.double_quant
        if getattr(self, "_from_pretrained", False):
            # transformers' caching_allocator_warmup, then the checkpoint's order
            cmd["from_pretrained"] = True
        record = _vs.make(cmd)
        self._name = name
        self.device = torch.device("cuda", 0)
        info = record.get("value") or {}
        for k in ("vocab_size", "hidden_size", "num_hidden_layers", "max_position_embeddings"):
            if k in info:
                setattr(self.config, k, info[k])
        self.dtype = _DTYPES.get(info.get("dtype"), self.dtype)
        self._info = info

    def save_pretrained(self, path, **kwargs):
        """Written to `path` on the host (random weights: what loading them
        back takes is the same)."""
        _saved[str(path)] = self.config

    def num_parameters(self, only_trainable=False):
        return self._on_gpu("num_parameters()")["parameters"]

    def get_memory_footprint(self, return_buffers=True):
        return self._on_gpu("get_memory_footprint()")["bytes"]

    def _on_gpu(self, what):
        if self._name is None:
            raise NotImplementedError("vramlab counts a Hugging Face model once it is on the GPU: %s after .to(\"cuda\")" % what)
        return self._info

    def eval(self):
        self.training = False
        return self

    def train(self, mode=True):
        self.training = mode
        return self

    def set_attn_implementation(self, name):
        if name not in ("eager", "sdpa"):
            raise ValueError('vramlab runs attn_implementation "eager" or "sdpa", not %r' % (name,))
        self.config._attn_implementation = name

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        self.gradient_checkpointing = True

    def gradient_checkpointing_disable(self):
        self.gradient_checkpointing = False

    def enable_input_require_grads(self):
        pass

    def __call__(self, input_ids=None, labels=None, attention_mask=None, **kwargs):
        """`model(input_ids=ids, labels=ids)`: the forward up to the loss
        (`ForCausalLMLoss`), its graph held by `.loss`."""
        from torch.nn.engine import Loss

        self._on_gpu("a forward")
        if labels is None:
            raise NotImplementedError("vramlab runs a Hugging Face model's forward with its loss: model(input_ids=ids, labels=ids)")
        for t in (input_ids, labels):
            if not isinstance(t, Tensor) or not t.is_cuda or t.dim() != 2:
                raise ValueError("input_ids and labels are token ids on the GPU, (batch, sequence length)")
        if not torch.is_grad_enabled():
            raise NotImplementedError("vramlab runs a Hugging Face model without gradients as generate()")
        from torch._amp import state as amp

        name = _vs.fresh_name("loss")
        cmd = _vs.command("forward", name=name, model=self._name, data="", batch_size=int(input_ids.shape[0]), batch=[input_ids._storage._name, labels._storage._name])
        if self.config._attn_implementation != "eager":
            cmd["attention"] = self.config._attn_implementation
        if self.gradient_checkpointing and self.training:
            cmd["checkpointing"] = True
        if amp["dtype"] is not None:
            cmd["amp"] = amp["dtype"].name
        record = _vs.make(cmd)
        return CausalLMOutput(Loss(name, record, [self]))

    forward = __call__

    def parameters(self):
        """The engine's tensors as two: the frozen and the trainable (their
        counts right, for `sum(p.numel() ...)` and the optimizer)."""
        info = self._on_gpu("parameters()")
        trainable = self._trainable if self._trainable is not None else (0 if self.quantization else info["parameters"])
        out = []
        for n, grad in ((info["parameters"] - trainable, False), (trainable, True)):
            if n > 0:
                t = Tensor((n,), torch.float32, "cuda", storage=self, requires_grad=grad)
                out.append(t)
        return iter(out)

    def print_trainable_parameters(self):
        info = self._on_gpu("print_trainable_parameters()")
        trainable = self._trainable or 0
        total = info["parameters"] + trainable
        print("trainable params: {:,} || all params: {:,} || trainable%: {:.4f}".format(trainable, total, 100 * trainable / total))

    # ----- generation
    def generate(self, inputs=None, attention_mask=None, max_new_tokens=None, do_sample=False,
                 cache_implementation=None, input_ids=None, **kwargs):
        ids = inputs if inputs is not None else input_ids
        if self._name is None:
            raise RuntimeError("the model is on the CPU: move it to the GPU first (model.to(\"cuda\"))")
        if not isinstance(ids, Tensor) or ids.dim() != 2:
            raise ValueError("generate takes input_ids of shape (batch, prompt length)")
        if not ids.is_cuda:
            raise RuntimeError("Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!")
        if do_sample or kwargs.get("num_beams", 1) != 1:
            raise NotImplementedError("vramlab runs greedy generate (do_sample=False, one beam)")
        name = _vs.fresh_name()
        cmd = _vs.command("generate", name=name, model=self._name, input_ids=ids._storage._name, new_tokens=int(max_new_tokens if max_new_tokens is not None else 20), attention=self.config._attn_implementation)
        if attention_mask is not None:
            cmd["attention_mask"] = attention_mask._storage._name
        if cache_implementation == "static":
            cmd["cache"] = "static"
        elif cache_implementation not in (None, "dynamic"):
            raise NotImplementedError("vramlab runs the dynamic and the static cache, not %r" % (cache_implementation,))
        _vs.make(cmd)
        out = Tensor((ids.shape[0], ids.shape[1] + cmd["new_tokens"]), torch.int64, "cuda", storage=_Named(name))
        return out


class _Named(_vs.Owner):
    def __init__(self, name):
        self._name = name


class AutoModelForCausalLM:
    @staticmethod
    def from_config(config, dtype=None, torch_dtype=None, attn_implementation=None, **kwargs):
        model = PreTrainedModel(config, _dtype(dtype if dtype is not None else torch_dtype))
        if attn_implementation:
            model.set_attn_implementation(attn_implementation)
        return model

    @staticmethod
    def from_pretrained(name, dtype=None, torch_dtype=None, device_map=None, attn_implementation=None,
                        quantization_config=None, **kwargs):
        if isinstance(name, PretrainedConfig):
            config = name
        elif str(name) in _saved:
            config = _saved[str(name)]
        else:
            config = AutoConfig.from_pretrained(name)
        model = AutoModelForCausalLM.from_config(config, dtype, torch_dtype, attn_implementation)
        model.quantization = quantization_config
        model.training = False
        if quantization_config is not None and device_map is None:
            raise NotImplementedError("vramlab loads a 4-bit model onto the GPU as bitsandbytes does: give device_map (\"cuda\", or {\"\": 0})")
        if device_map is not None and _to_gpu(device_map):
            model._from_pretrained = True
            model.to("cuda")
        return model


def _dtype(d):
    if d is None or d == "auto":
        return None
    if isinstance(d, str):
        return getattr(torch, d)
    return d


def _to_gpu(device_map):
    if isinstance(device_map, dict):
        return any(_to_gpu(v) for v in device_map.values())
    if isinstance(device_map, int):
        return True
    return str(device_map) in ("auto", "cuda", "cuda:0", "balanced", "sequential")
