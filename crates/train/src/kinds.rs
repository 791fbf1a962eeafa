//! The convolutional network and the transformer as shapes: their
//! parameters and buffers named and ordered as PyTorch's `nn.Module`s of the
//! same shapes register them (the order `model.cuda()` moves them in), and
//! what a shape must satisfy. `tests/reference/param_counts.py` builds the
//! same modules in PyTorch; the tests below check every name, shape and
//! count against its output.

use vramlab_core::error::Invalid;
use vramlab_core::types::Dtype;

/// A parameter or buffer: its name in `named_parameters()` /
/// `named_buffers()`, its shape and its element type; a frozen parameter
/// (`requires_grad=False`) gets no gradient and no optimizer state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamedTensor {
    pub name: String,
    pub shape: Vec<u64>,
    pub dtype: Dtype,
    pub frozen: bool,
}

impl NamedTensor {
    pub fn new(name: String, shape: Vec<u64>, dtype: Dtype) -> Self {
        Self {
            name,
            shape,
            dtype,
            frozen: false,
        }
    }

    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }
}

pub use crate::program::blocks;

/// The elements of all of `tensors`.
pub fn count(tensors: &[NamedTensor]) -> u64 {
    tensors.iter().map(NamedTensor::numel).sum()
}

/// An MLP: `layers` hidden `Linear(width)` + `ReLU`, then a `Linear` to
/// `classes`, as one `nn.Sequential`, its parameters of type `dtype`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MlpShape {
    pub layers: u32,
    pub width: u64,
    pub input_dim: u64,
    pub classes: u64,
    pub dtype: Dtype,
}

/// `blocks` of Conv2d (3x3, padding 1) → BatchNorm2d → ReLU → MaxPool2d(2)
/// on images of `channels` x `image_size` x `image_size`, the channels
/// doubling from `width`, then Flatten and a Linear head to `classes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CnnShape {
    pub channels: u64,
    pub image_size: u64,
    pub blocks: u32,
    pub width: u64,
    pub classes: u64,
}

impl CnnShape {
    /// (input channels, output channels) of each block's convolution.
    fn convs(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        (0..self.blocks).map(|b| {
            let c_in = if b == 0 {
                self.channels
            } else {
                self.width << (b - 1)
            };
            (c_in, self.width << b)
        })
    }

    /// Channels and side of what reaches the head.
    fn head_input(&self) -> (u64, u64) {
        let channels = self.width << (self.blocks - 1);
        (channels, self.image_size >> self.blocks)
    }

    /// `named_parameters()`: each block's conv (index 4b) and BatchNorm
    /// (4b + 1) weight and bias, then the head (index 4 · blocks + 1).
    pub fn parameters(&self, dtype: Dtype) -> Vec<NamedTensor> {
        let mut out = Vec::new();
        for (b, (c_in, c_out)) in self.convs().enumerate() {
            let (conv, norm) = (4 * b, 4 * b + 1);
            out.push(NamedTensor::new(
                format!("{conv}.weight"),
                vec![c_out, c_in, 3, 3],
                dtype,
            ));
            out.push(NamedTensor::new(format!("{conv}.bias"), vec![c_out], dtype));
            out.push(NamedTensor::new(
                format!("{norm}.weight"),
                vec![c_out],
                dtype,
            ));
            out.push(NamedTensor::new(format!("{norm}.bias"), vec![c_out], dtype));
        }
        let (c, side) = self.head_input();
        let head = 4 * self.blocks as usize + 1;
        out.push(NamedTensor::new(
            format!("{head}.weight"),
            vec![self.classes, c * side * side],
            dtype,
        ));
        out.push(NamedTensor::new(
            format!("{head}.bias"),
            vec![self.classes],
            dtype,
        ));
        out
    }

    /// `named_buffers()`: each BatchNorm's running statistics (in float32
    /// whatever the parameters' type) and its step counter.
    pub fn buffers(&self) -> Vec<NamedTensor> {
        self.convs()
            .enumerate()
            .flat_map(|(b, (_, c))| {
                let norm = 4 * b + 1;
                [
                    NamedTensor::new(format!("{norm}.running_mean"), vec![c], Dtype::Float32),
                    NamedTensor::new(format!("{norm}.running_var"), vec![c], Dtype::Float32),
                    NamedTensor::new(format!("{norm}.num_batches_tracked"), vec![], Dtype::Int64),
                ]
            })
            .collect()
    }

    /// Checks sizes; the message names what is wrong.
    pub fn validate(&self) -> Result<(), Invalid> {
        in_range("channels", self.channels, 1, 4096)?;
        in_range("image_size", self.image_size, 1, 8192)?;
        in_range("blocks", u64::from(self.blocks), 1, 12)?;
        in_range("width", self.width, 1, 8192)?;
        in_range("classes", self.classes, 1, 1 << 20)?;
        if self.image_size >> self.blocks == 0 {
            return Err(Invalid(format!(
                "{} blocks halve a {}-pixel image to nothing: use fewer blocks or larger images",
                self.blocks, self.image_size
            )));
        }
        Ok(())
    }
}

/// The normalization before attention, before the MLP and at the end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Norm {
    #[default]
    /// `nn.LayerNorm`: a weight and a bias.
    LayerNorm,
    /// `nn.RMSNorm`: a weight only.
    RmsNorm,
}

vramlab_core::read_by_name!(Norm {
    LayerNorm = "layernorm",
    RmsNorm = "rmsnorm",
});

/// A decoder-only language model laid out as GPT-2: token and position
/// embeddings, `layers` blocks (norm, attention with a fused q/k/v
/// projection and an output projection, norm, an MLP `mlp_ratio` times as
/// wide), a final norm and a head over `vocab` without bias, tied to the
/// token embedding or not. With `lora_rank` r > 0 it is what peft's
/// `get_peft_model(model, LoraConfig(r=r, target_modules="all-linear"))`
/// makes of it: every linear layer of the blocks (not the head) gets
/// adapters `lora_A` (r x in) and `lora_B` (out x r), and every other
/// parameter is frozen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransformerShape {
    pub layers: u32,
    pub width: u64,
    pub heads: u64,
    pub seq_len: u64,
    pub vocab: u64,
    pub mlp_ratio: u64,
    pub norm: Norm,
    pub tied: bool,
    /// LoRA adapters' rank; 0 for none.
    pub lora_rank: u64,
}

impl TransformerShape {
    fn norm(&self, name: &str, dtype: Dtype, out: &mut Vec<NamedTensor>) {
        out.push(NamedTensor::new(
            format!("{name}.weight"),
            vec![self.width],
            dtype,
        ));
        if self.norm == Norm::LayerNorm {
            out.push(NamedTensor::new(
                format!("{name}.bias"),
                vec![self.width],
                dtype,
            ));
        }
    }

    /// A linear layer's weight and bias; with LoRA, peft's names: the
    /// wrapped `base_layer`'s, then the "default" adapter's `lora_A` and
    /// `lora_B`.
    fn linear(
        &self,
        name: &str,
        (fan_in, fan_out): (u64, u64),
        dtype: Dtype,
        out: &mut Vec<NamedTensor>,
    ) {
        let r = self.lora_rank;
        let base = if r > 0 { ".base_layer" } else { "" };
        let weight = format!("{name}{base}.weight");
        out.push(NamedTensor::new(weight, vec![fan_out, fan_in], dtype));
        out.push(NamedTensor::new(
            format!("{name}{base}.bias"),
            vec![fan_out],
            dtype,
        ));
        if r > 0 {
            let a = format!("{name}.lora_A.default.weight");
            out.push(NamedTensor::new(a, vec![r, fan_in], dtype));
            let b = format!("{name}.lora_B.default.weight");
            out.push(NamedTensor::new(b, vec![fan_out, r], dtype));
        }
    }

    /// LoRA's `scaling`: peft's default `lora_alpha` (8) over the rank.
    pub fn lora_scaling(&self) -> f32 {
        8.0 / self.lora_rank.max(1) as f32
    }

    /// Parameters per linear layer: weight, bias and any adapters.
    pub fn linear_params(&self) -> usize {
        if self.lora_rank > 0 {
            4
        } else {
            2
        }
    }

    /// `named_parameters()`; a tied head is the token embedding's weight,
    /// which `parameters()` yields once. With LoRA all but the adapters
    /// are frozen.
    pub fn parameters(&self, dtype: Dtype) -> Vec<NamedTensor> {
        let mut out = self.base_parameters(dtype);
        if self.lora_rank > 0 {
            for t in &mut out {
                t.frozen = !t.name.contains(".lora_");
            }
        }
        out
    }

    fn base_parameters(&self, dtype: Dtype) -> Vec<NamedTensor> {
        let d = self.width;
        let mut out = vec![
            NamedTensor::new("wte.weight".into(), vec![self.vocab, d], dtype),
            NamedTensor::new("wpe.weight".into(), vec![self.seq_len, d], dtype),
        ];
        for l in 0..self.layers {
            let h = format!("h.{l}");
            self.norm(&format!("{h}.ln_1"), dtype, &mut out);
            self.linear(&format!("{h}.attn.c_attn"), (d, 3 * d), dtype, &mut out);
            self.linear(&format!("{h}.attn.c_proj"), (d, d), dtype, &mut out);
            self.norm(&format!("{h}.ln_2"), dtype, &mut out);
            let inner = self.mlp_ratio * d;
            self.linear(&format!("{h}.mlp.c_fc"), (d, inner), dtype, &mut out);
            self.linear(&format!("{h}.mlp.c_proj"), (inner, d), dtype, &mut out);
        }
        self.norm("ln_f", dtype, &mut out);
        if !self.tied {
            out.push(NamedTensor::new(
                "lm_head.weight".into(),
                vec![self.vocab, d],
                dtype,
            ));
        }
        out
    }

    /// Checks sizes; the message names what is wrong.
    pub fn validate(&self) -> Result<(), Invalid> {
        in_range("layers", u64::from(self.layers), 1, 1024)?;
        in_range("width", self.width, 1, 1 << 16)?;
        in_range("heads", self.heads, 1, 1024)?;
        in_range("seq_len", self.seq_len, 1, 1 << 20)?;
        in_range("vocab", self.vocab, 1, 1 << 22)?;
        in_range("mlp_ratio", self.mlp_ratio, 1, 64)?;
        if self.lora_rank > self.width {
            return Err(Invalid(format!(
                "lora_rank must be 0 (no adapters) to the width {}, not {}",
                self.width, self.lora_rank
            )));
        }
        if self.width % self.heads != 0 {
            return Err(Invalid(format!(
                "heads must divide width: {} heads cannot share {} dimensions",
                self.heads, self.width
            )));
        }
        Ok(())
    }
}

fn in_range(name: &str, v: u64, low: u64, high: u64) -> Result<(), Invalid> {
    if (low..=high).contains(&v) {
        Ok(())
    } else {
        Err(Invalid(format!("{name} must be {low} to {high}, not {v}")))
    }
}

pub mod estimate;
pub mod step;

pub use step::Attention;

#[cfg(test)]
mod tests;
