//! How each framework words an out-of-memory error: the exception class
//! and the message, as each release prints them.

use super::{Settings, TorchVersion};
use crate::alloc::OutOfMemory;
use crate::device::OTHER_PROCESS_PID;
use vramlab_core::types::{Dtype, Framework};
use vramlab_core::units::format_size;

/// The tensor an allocation was for, as the error names it.
#[derive(Clone, Debug)]
pub struct TensorDesc<'a> {
    pub shape: &'a [u64],
    pub dtype: Dtype,
    /// The eager op that allocated it, when known (`Fill` for `tf.zeros`):
    /// eager TensorFlow frames its OOM with it.
    pub op: Option<&'a str>,
}

/// The hint PyTorch 2.9 appends to every caching-allocator OOM.
pub const PYTORCH_2_9_OOM_HINT: &str = " If reserved but unallocated memory is large try setting PYTORCH_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)";

/// PyTorch 2.15's (the text in the 2.15 wheel's `libc10_cuda.so`), and
/// 2.11's (its out-of-memory error on an H100, `tests/golden/`).
pub const PYTORCH_OOM_HINT: &str = " If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)";

/// The exception class the framework raises when memory runs out, as
/// Python names it in a traceback.
pub fn oom_exception(framework: Framework) -> &'static str {
    match framework {
        Framework::Pytorch => "torch.OutOfMemoryError",
        Framework::Tensorflow => "tensorflow.python.framework.errors_impl.ResourceExhaustedError",
        Framework::Jax => "jaxlib.xla_extension.XlaRuntimeError",
    }
}

/// The error text the framework raises for this failed allocation.
pub fn oom_message(settings: &Settings, oom: &OutOfMemory, tensor: &TensorDesc) -> String {
    match settings.framework {
        Framework::Pytorch if settings.no_caching => "CUDA error: out of memory\n\
             CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.\n\
             For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n\
             Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions."
            .to_string(),
        Framework::Pytorch => {
            let mut proc_info = format!(
                "Including non-PyTorch memory, this process has {} memory in use. ",
                format_size(oom.process_used)
            );
            if oom.other_processes > 0 {
                proc_info.push_str(&format!(
                    "Process {OTHER_PROCESS_PID} has {} memory in use. ",
                    format_size(oom.other_processes)
                ));
            }
            let allowed = oom
                .allowed
                .map(|a| format!("{} allowed; ", format_size(a)))
                .unwrap_or_default();
            let hint = match settings.torch_version {
                TorchVersion::V2_9 => PYTORCH_2_9_OOM_HINT,
                TorchVersion::V2_11 | TorchVersion::V2_15 => PYTORCH_OOM_HINT,
            };
            format!(
                "CUDA out of memory. Tried to allocate {}. GPU 0 has a total capacity of {} of which {} is free. {proc_info}{allowed}Of the allocated memory {} is allocated by PyTorch, and {} is reserved by PyTorch but unallocated.{hint}",
                format_size(oom.alloc_size),
                format_size(oom.device_total),
                format_size(oom.device_free),
                format_size(oom.allocated),
                format_size(oom.reserved - oom.allocated),
            )
        }
        Framework::Tensorflow => {
            let dims: Vec<String> = tensor.shape.iter().map(u64::to_string).collect();
            let device = "/job:localhost/replica:0/task:0/device:GPU:0";
            let oom = format!(
                "OOM when allocating tensor with shape[{}] and type {} on {device} by allocator GPU_0_bfc",
                dims.join(","),
                tensor.dtype.tf_name()
            );
            match tensor.op {
                // An eager op runs as a wrapped function (TensorFlow 2.11+).
                Some(op) => format!(
                    "{{{{function_node __wrapped__{op}_device_{device}}}}} {oom} [Op:{op}] name: "
                ),
                None => oom,
            }
        }
        Framework::Jax => format!(
            "RESOURCE_EXHAUSTED: Out of memory while trying to allocate {} bytes.",
            oom.requested
        ),
    }
}
