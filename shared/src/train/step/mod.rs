//! A training step as a framework runs it, one allocation at a time.
//!
//! Forward: the batch is copied to the device; each linear layer allocates
//! its output (`addmm`), ReLU allocates its own and the pre-activation dies;
//! autograd saves each layer's input (for the weight gradient) and each
//! ReLU's output; log-softmax's output and the targets are saved for the
//! loss. Backward walks the layers in reverse, allocating gradient buffers,
//! accumulating into `.grad` (kept across steps unless `set_to_none`), and
//! releasing each node's saved tensors as it goes. The optimizer allocates
//! its state at its first step, and Adam's foreach update one temporary per
//! parameter. Checkpointing saves only segment inputs and recomputes each
//! segment in backward; `amp` saves activations in float16 and keeps fp16
//! copies of the weights for backward, with fp32 master weights.
//!
//! - [`frame`]: the Python frame a step runs in (its locals die with it).
//! - [`forward`]: `loss = criterion(model(x), y)` and what autograd saves.
//! - [`backward`]: `loss.backward()`, node by node.
//! - [`optimizer`]: `optimizer.step()` and `optimizer.zero_grad()`.

mod backward;
mod forward;
mod frame;
mod optimizer;

pub use crate::train::cublas::{clear_cublas_workspaces, BlasThread, CublasWorkspaces};
pub use backward::{backward, find_graph, grad_of, BackwardError, BACKWARD_TWICE, NO_GRAD_FN};
pub use forward::{forward, ForwardArgs, ForwardOut, SavedPlan};
pub use frame::Frame;
pub use optimizer::{optimizer_step, zero_grad};
