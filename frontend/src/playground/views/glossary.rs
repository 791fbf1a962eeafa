//! The words the page uses, each said once in plain language.

use leptos::prelude::*;

/// Each term and what it means here.
pub const TERMS: &[(&str, &str)] = &[
    ("allocated", "bytes in tensors that are alive now: what the framework's own counter reports (memory_allocated() in PyTorch, bytes_in_use in TensorFlow and JAX)."),
    ("reserved", "bytes the framework's allocator holds from the driver: the live tensors plus its cache of free blocks. Only the allocator can give them back."),
    ("nvidia-smi", "what the GPU's driver counts for the process: reserved plus the CUDA context and anything allocated outside the allocator."),
    ("CUDA context", "the driver's own memory for a process that uses the GPU (a few hundred MiB). It goes only when the process exits."),
    ("segment", "one piece of memory the allocator got from the driver (cudaMalloc). PyTorch cuts it into blocks; empty_cache() returns only segments with no live block."),
    ("block", "a part of a segment that holds one tensor, or lies free in the cache."),
    ("small pool", "PyTorch's blocks of 1 MiB or less, cut from 2 MiB segments; larger requests use the large pool."),
    ("inactive split", "a free block inside a segment that still holds a live tensor: cached memory that empty_cache() cannot return, the mark of fragmentation."),
    ("BFC", "best-fit with coalescing: TensorFlow's and JAX's allocator. It takes memory from the driver in regions and keeps them until the process exits."),
    ("region", "one piece of memory the BFC allocator got from the driver: the pool grows by regions and never shrinks."),
    ("expandable segments", "PyTorch's option to map 2 or 20 MiB pages into one large address range, so free pages can be unmapped from its middle."),
    ("cuBLAS workspace", "scratch memory the matrix-product library takes through PyTorch's allocator at the first matmul on each thread."),
    ("activations", "what a forward pass saves for backward: they grow with the batch size and die when backward has used them."),
    ("optimizer state", "what the optimizer keeps per parameter: none for SGD, one buffer for momentum, two for Adam."),
    ("peak of the last command", "the most memory allocated at any moment while the last command ran (torch.cuda.max_memory_allocated() after reset_peak_memory_stats())."),
    ("shape-only", "a training step too large to compute on this machine: every allocation is made as the real step makes it, but no arithmetic is done, so there is no loss."),
];

#[component]
pub fn Glossary() -> impl IntoView {
    view! {
        <details class="glossary" id="glossary">
            <summary>"The words used here"</summary>
            <dl>
                {TERMS.iter().map(|(term, meaning)| view! {
                    <dt id=format!("term-{}", term.replace(' ', "-"))>{*term}</dt>
                    <dd>{*meaning}</dd>
                }).collect::<Vec<_>>()}
            </dl>
        </details>
    }
}
