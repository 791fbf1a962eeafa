//! The MLP's training step as a framework runs it, one allocation at a
//! time (the CNN's and the transformer's are programs: `kinds::step`).
//!
//! Forward: the batch is copied to the device; each linear layer allocates
//! its output (`addmm`), ReLU allocates its own and the pre-activation dies;
//! autograd saves each layer's input (for the weight gradient) and each
//! ReLU's output; log-softmax's output and the targets are saved for the
//! loss. Backward walks the layers in reverse, allocating gradient buffers,
//! accumulating into `.grad` (kept across steps unless `set_to_none`), and
//! releasing each node's saved tensors as it goes. Checkpointing saves only segment inputs and recomputes each
//! segment in backward; `amp` saves activations in float16 and keeps fp16
//! copies of the weights for backward, with fp32 master weights.
//!
//! - [`forward`]: `loss = criterion(model(x), y)` and what autograd saves.
//! - [`backward`]: `loss.backward()`, node by node.

mod backward;
mod forward;

pub use backward::{backward, BackwardError};
pub use forward::{forward, ForwardArgs, ForwardOut, SavedPlan};
