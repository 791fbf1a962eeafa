# Start PyTorch on an RTX 4090 (24 GiB): the notebook's process, with only its CUDA
# context.
# vramlab python --settings '{"framework":"pytorch","gpu":"rtx-4090","expandable_segments":false}'
import torch
from torch import nn
from torch.utils.data import TensorDataset

# llm = LLM(model="meta-llama/Llama-3.1-8B")
try:
    from vllm import LLM
    llm = LLM(model="meta-llama/Llama-3.1-8B")  # vLLM's engine core starts in a process of its own
except ValueError as e:
    print(type(e).__name__, e)
    last_exception = e
# → vLLM's engine core starts in a process of its own, loads 14.99 GiB of weights,
# profiles, and gives the KV cache what is left of 90% of the card: 5.02 GiB. One
# request of the model's 131,072 positions needs 16 GiB of keys and values, so vLLM
# refuses to start, and says how long a request the cache would take.

# llm = LLM(model="meta-llama/Llama-3.1-8B", max_model_len=32768)
from vllm import LLM
llm = LLM(model="meta-llama/Llama-3.1-8B", max_model_len=32768)  # vLLM's engine core starts in a process of its own
# → It starts. nvidia-smi shows another process holding 21.58 GiB, 90% of the card and
# its own context, whatever the model's size: what the weights, the profile and the CUDA
# graphs leave goes to the KV cache, 5.02 GiB in 2,572 blocks of 16 tokens. That is
# 41,152 tokens: 1.26 requests of 32,768 at once. This process's allocator holds
# nothing.

# chat = LLM(model="Qwen/Qwen2.5-0.5B", gpu_memory_utilization=0.2)
try:
    from vllm import LLM
    chat = LLM(model="Qwen/Qwen2.5-0.5B", gpu_memory_utilization=0.2)  # vLLM's engine core starts in a process of its own
except ValueError as e:
    print(type(e).__name__, e)
    last_exception = e
# → A second, small model asks for 20% of the card, but the first engine holds 90% of
# it: vLLM checks the free memory before it loads anything and refuses.

del llm
# → The last reference goes: the client's finalizer shuts the engine core down, and
# its process's exit gives the driver all 21.58 GiB back. No empty_cache() is involved:
# the memory was never this process's.

# llm = LLM(model="meta-llama/Llama-3.1-8B", max_model_len=8192, kv_cache_dtype="fp8")
from vllm import LLM
llm = LLM(model="meta-llama/Llama-3.1-8B", max_model_len=8192, kv_cache_dtype="fp8")  # vLLM's engine core starts in a process of its own
# → The same 5 GiB for the cache, each key and value in one byte instead of two:
# 82,640 tokens, 10.09 requests of 8,192 at once. The card holds the same 21.58 GiB.

del llm

# llm = LLM(model="Qwen/Qwen2.5-7B", max_model_len=32768)
from vllm import LLM
llm = LLM(model="Qwen/Qwen2.5-7B", max_model_len=32768)  # vLLM's engine core starts in a process of its own
# → A model of the same size with 4 key-value heads in 28 layers, where Llama has 8 in
# 32: 56 KiB a token against 128 KiB. 104,608 tokens fit, 3.19 requests of 32,768.

del llm
