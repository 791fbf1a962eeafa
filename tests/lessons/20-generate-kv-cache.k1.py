# Start PyTorch on a T4 (15 GiB).
# vramlab python --settings '{"framework":"pytorch","gpu":"t4","expandable_segments":false}'
import torch
from torch import nn
from torch.utils.data import TensorDataset

# model =
# AutoModelForCausalLM.from_config(AutoConfig.from_pretrained("meta-llama/Llama-3.2-1B")).to("cuda")
from transformers import AutoConfig, AutoModelForCausalLM
model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained("meta-llama/Llama-3.2-1B")).to("cuda")  # the architecture with random weights: the memory of the real ones
# → 1.24 billion parameters in bfloat16, the type its config names: 2.30 GiB. Random
# weights take the same memory as the published ones.

# Generate 256 tokens for 320 prompts of 128
out = model.generate(torch.randint(0, model.config.vocab_size, (320, 128), device="cuda"), max_new_tokens=256, do_sample=False)
# → The prefill runs the 128 prompt tokens at once; then each new token is one forward
# over one position, reading every earlier position's keys and values from the cache. By
# the last token the cache holds 383 positions of 320 sequences: 3.7 GiB.

del out

# The same prompts, 1,024 new tokens
try:
    out = model.generate(torch.randint(0, model.config.vocab_size, (320, 128), device="cuda"), max_new_tokens=1024, do_sample=False)
except torch.cuda.OutOfMemoryError as e:
    print(type(e).__name__, e)
    last_exception = e
# → The cache grows by 10 MiB with every token (32 KiB a sequence: 16 layers x keys
# and values x 8 heads x 64 x 2 bytes). Each token, `torch.cat` makes every layer's keys
# and values anew, one position longer, while the old ones live: the blocks it frees are
# a little too small for the next request, so reserved memory runs ahead of allocated
# until a request finds no room.

# del last_exception # its frames held the cache
del last_exception
# → The exception's traceback keeps generate's frames, and they keep the cache: 10 GiB
# stayed allocated until this line.

# A StaticCache (cache_implementation="static")
try:
    out = model.generate(torch.randint(0, model.config.vocab_size, (320, 128), device="cuda"), max_new_tokens=1024, do_sample=False, cache_implementation="static", disable_compile=True)
except torch.cuda.OutOfMemoryError as e:
    print(type(e).__name__, e)
    last_exception = e
# → A static cache makes every layer's keys and values for the whole length (1,151
# positions) before the first token, and writes into them in place: no growth, no
# copies, and it fails at the prefill, in seconds, if the whole length does not fit.

del last_exception

torch.cuda.empty_cache()
# → The failed runs left their blocks cached, cut to the sizes they asked for: giving
# them back lets the next run start on clean segments.

# 256 prompts, 1,024 new tokens
out = model.generate(torch.randint(0, model.config.vocab_size, (256, 128), device="cuda"), max_new_tokens=1024, do_sample=False)
# → What fits is a batch whose cache fits for the whole length: 256 x 1,151 positions
# x 32 KiB = 9 GiB, with the weights and the copies `cat` makes along the way.
