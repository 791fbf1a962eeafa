//! What a step does to memory besides its shapes: the attention kernel,
//! checkpointing, autocast, gradient accumulation and the GPU it runs on.

use vramlab_core::types::Dtype;

/// How attention is computed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Attention {
    /// `softmax(q @ k.T * scale, masked) @ v`: B x H x S x S tensors.
    #[default]
    Eager,
    /// `F.scaled_dot_product_attention` with a fused (flash) kernel.
    Sdpa,
}

vramlab_core::read_by_name!(Attention {
    Eager = "eager",
    Sdpa = "sdpa",
});

impl Attention {
    pub fn is_eager(&self) -> bool {
        *self == Attention::Eager
    }
}

/// What a step does to memory besides its shapes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    pub attention: Attention,
    /// Each block under `torch.utils.checkpoint` (non-reentrant).
    pub checkpointing: bool,
    /// The forward pass and the loss under `torch.autocast('cuda', dtype)`
    /// (float16 or bfloat16).
    pub amp: Option<Dtype>,
    /// `loss = criterion(...) / accumulate` when above 1 (gradient
    /// accumulation): a `div` in forward and in backward.
    pub accumulate: u64,
    /// The GPU's compute capability where PyTorch picks a CUDA kernel
    /// for `scaled_dot_product_attention` (`sdp`); `None`: the CPU's, as
    /// PyTorch's own traces here ran.
    pub gpu: Option<(u32, u32)>,
    /// The workspace each cuDNN convolution call takes on a GPU
    /// (`Settings::cudnn_workspace_bytes`; 0: not counted).
    pub conv_workspace: u64,
}

impl Options {
    /// The loss is divided (gradient accumulation).
    pub(in crate::kinds) fn divided(&self) -> Option<f32> {
        (self.accumulate > 1).then(|| 1.0 / self.accumulate as f32)
    }
}
