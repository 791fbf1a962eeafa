//! Models, optimizers and datasets as shapes and bytes, and the memory
//! estimate of a training step computed from them before anything runs.

use super::kinds::step::Options;
use super::kinds::{self, estimate, CnnShape, MlpShape, TransformerShape};
use super::optim::OptimizerSpec;
use serde::{Deserialize, Serialize};
use vramlab_core::error::Invalid;
use vramlab_core::types::Dtype;

/// The most hidden layers a model may have.
pub const MAX_LAYERS: u32 = 1024;
/// The widest a hidden layer may be.
pub const MAX_WIDTH: u64 = 1 << 20;

/// A model trained with softmax cross-entropy. An MLP: `layers` hidden
/// linear layers of `width` with ReLU, then a linear layer to `classes`.
/// A CNN or a transformer: its [`Kind`]'s shape, with `input_dim` the
/// numbers in one sample (C·H·W, or the sequence's tokens) and `classes`
/// the labels (or the vocabulary).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelSpec {
    pub layers: u32,
    pub width: u64,
    pub input_dim: u64,
    pub classes: u64,
    pub dtype: Dtype,
    pub kind: Kind,
}

/// Which network a model is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Mlp,
    Cnn(CnnShape),
    Transformer(TransformerShape),
}

impl ModelSpec {
    /// The MLP of these sizes.
    pub fn mlp(layers: u32, width: u64, input_dim: u64, classes: u64, dtype: Dtype) -> Self {
        ModelSpec {
            layers,
            width,
            input_dim,
            classes,
            dtype,
            kind: Kind::Mlp,
        }
    }

    /// A CNN's or a transformer's spec (the sizes its data must have).
    pub fn of(kind: Kind, dtype: Dtype) -> Self {
        let (layers, width, input_dim, classes) = match kind {
            Kind::Cnn(c) => (
                c.blocks,
                c.width,
                c.channels * c.image_size * c.image_size,
                c.classes,
            ),
            Kind::Transformer(t) => (t.layers, t.width, t.seq_len, t.vocab),
            Kind::Mlp => unreachable!("an MLP is built by ModelSpec::mlp"),
        };
        ModelSpec {
            layers,
            width,
            input_dim,
            classes,
            dtype,
            kind,
        }
    }

    /// Every parameter (name, shape, type) as `named_parameters()` lists it.
    pub fn parameters(&self) -> Vec<kinds::NamedTensor> {
        match self.kind {
            Kind::Mlp => self
                .param_shapes()
                .into_iter()
                .map(|(name, shape)| kinds::NamedTensor::new(name, shape, self.dtype))
                .collect(),
            Kind::Cnn(c) => c.parameters(self.dtype),
            Kind::Transformer(t) => t.parameters(self.dtype),
        }
    }

    /// The parameters that get gradients and optimizer state (with LoRA the
    /// adapters alone).
    pub fn trained_parameters(&self) -> Vec<kinds::NamedTensor> {
        let mut params = self.parameters();
        params.retain(|t| !t.frozen);
        params
    }

    /// Every buffer (BatchNorm's running statistics).
    pub fn buffers(&self) -> Vec<kinds::NamedTensor> {
        match self.kind {
            Kind::Cnn(c) => c.buffers(),
            Kind::Mlp | Kind::Transformer(_) => Vec::new(),
        }
    }

    /// A batch of `b` samples on the device: its shape and type, then the
    /// targets' shape (int64): features, images or token ids.
    pub fn batch(&self, b: u64) -> (Vec<u64>, Dtype, Vec<u64>) {
        match self.kind {
            Kind::Mlp => (vec![b, self.input_dim], self.dtype, vec![b]),
            Kind::Cnn(c) => {
                let image = vec![b, c.channels, c.image_size, c.image_size];
                (image, Dtype::Float32, vec![b])
            }
            Kind::Transformer(t) => (vec![b, t.seq_len], Dtype::Int64, vec![b, t.seq_len]),
        }
    }

    /// An MLP's shape (its sizes and type).
    pub fn mlp_shape(&self) -> MlpShape {
        MlpShape {
            layers: self.layers,
            width: self.width,
            input_dim: self.input_dim,
            classes: self.classes,
            dtype: self.dtype,
        }
    }

    /// The step at micro-batch `batch`: forward and backward as a program.
    pub fn step_program(&self, batch: u64, options: Options) -> kinds::step::Program {
        match self.kind {
            Kind::Mlp => kinds::step::mlp_program(&self.mlp_shape(), batch, options),
            Kind::Transformer(t) => kinds::step::program(&t, batch, options),
            Kind::Cnn(c) => kinds::step::cnn_program(&c, batch, options),
        }
    }

    /// The forward pass under `torch.no_grad()`.
    pub fn no_grad_program(&self, batch: u64, options: Options) -> kinds::step::Program {
        match self.kind {
            Kind::Mlp => kinds::step::mlp_no_grad_program(&self.mlp_shape(), batch, options),
            Kind::Transformer(t) => kinds::step::no_grad_program(&t, batch, options),
            Kind::Cnn(c) => kinds::step::cnn_no_grad_program(&c, batch, options),
        }
    }

    /// What the model is, in a few words.
    pub fn kind_name(&self) -> &'static str {
        match self.kind {
            Kind::Mlp => "MLP",
            Kind::Cnn(_) => "CNN",
            Kind::Transformer(_) => "transformer",
        }
    }

    /// Widths: input, hidden..., classes.
    pub fn dims(&self) -> Vec<u64> {
        let mut d = vec![self.input_dim];
        d.extend(std::iter::repeat_n(self.width, self.layers as usize));
        d.push(self.classes);
        d
    }

    /// (name, shape) of every parameter, as `nn.Sequential` names them.
    pub fn param_shapes(&self) -> Vec<(String, Vec<u64>)> {
        let d = self.dims();
        (0..d.len() - 1)
            .flat_map(|l| {
                // Linear layers sit at even indices of the Sequential (ReLU between).
                let i = 2 * l;
                [
                    (format!("{i}.weight"), vec![d[l + 1], d[l]]),
                    (format!("{i}.bias"), vec![d[l + 1]]),
                ]
            })
            .collect()
    }

    pub fn param_count(&self) -> u64 {
        match self.kind {
            Kind::Mlp => self.dims().windows(2).map(|w| w[0] * w[1] + w[1]).sum(),
            _ => kinds::count(&self.parameters()),
        }
    }

    pub fn param_bytes(&self) -> u64 {
        self.param_count() * self.dtype.size_bytes()
    }

    /// Checks sizes; the message names what is wrong.
    pub fn validate(&self) -> Result<(), Invalid> {
        match self.kind {
            Kind::Cnn(c) => return c.validate(),
            Kind::Transformer(t) => return t.validate(),
            Kind::Mlp => {}
        }
        if !(1..=MAX_LAYERS).contains(&self.layers) {
            return Err(Invalid(format!(
                "layers must be 1 to {MAX_LAYERS}, not {}",
                self.layers
            )));
        }
        for (name, v, max) in [
            ("width", self.width, MAX_WIDTH),
            ("input_dim", self.input_dim, 1 << 24),
            ("classes", self.classes, 1 << 20),
        ] {
            if v == 0 || v > max {
                return Err(Invalid(format!("{name} must be 1 to {max}, not {v}")));
            }
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataSpec {
    pub samples: u64,
    pub features: u64,
    pub classes: u64,
    pub on_device: bool,
}

impl DataSpec {
    /// Bytes of the whole set on the device: float32 features, int64 labels.
    pub fn device_bytes(&self) -> u64 {
        self.samples * self.features * 4 + self.samples * 8
    }
}

/// What a training step will hold, predicted from the shapes alone.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Estimate {
    pub parameter_bytes: u64,
    pub gradient_bytes: u64,
    pub optimizer_state_bytes: u64,
    /// Tensors saved for backward at the end of the forward pass.
    pub activation_bytes: u64,
    /// The batch copied to the device each step.
    pub input_bytes: u64,
    /// The dataset itself, when it lives on the device.
    pub dataset_bytes: u64,
    /// PyTorch's cuBLAS (and cuBLASLt) workspaces kept after the step: per
    /// thread (the main one's and autograd's) in 2.9 or with the cache; none
    /// in 2.15, whose per-call workspaces show in the peak alone.
    pub workspace_bytes: u64,
    /// The part of `activation_bytes` attention alone keeps (a
    /// transformer's): eager attention's probabilities and mask, or fused
    /// attention's log-sum-exp.
    #[serde(default)]
    pub attention_bytes: u64,
    /// Largest sum of the above plus temporaries during forward, backward
    /// and the optimizer step.
    pub peak_bytes: u64,
    /// Under JAX or TensorFlow: the compiled step's temp allocation (XLA's
    /// `temp_size_in_bytes`), and the peak when the parameters and state
    /// are donated (Keras: always).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xla_temp_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub donated_peak_bytes: Option<u64>,
}

/// Options of a step that change its memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepShape {
    pub batch_size: u64,
    pub set_to_none: bool,
    /// Where matrix products get their workspaces
    /// (`Settings::blas_workspaces`).
    pub blas: vramlab_device::framework::BlasWorkspaces,
    /// The step program's options: the techniques, the micro-batches
    /// (`accumulate`), the GPU's kernels.
    pub options: Options,
}

/// The optimizer's state for the model's trained parameters.
fn state_bytes(model: &ModelSpec, optimizer: Option<OptimizerSpec>, round: fn(u64) -> u64) -> u64 {
    let trained = model.trained_parameters();
    let shapes = trained.iter().map(|t| (t.shape.as_slice(), t.dtype));
    optimizer.map_or(0, |o| o.state_bytes(shapes, round))
}

fn rounded(tensors: &[kinds::NamedTensor]) -> u64 {
    let bytes = |t: &kinds::NamedTensor| kinds::blocks(t.numel() * t.dtype.size_bytes());
    tensors.iter().map(bytes).sum()
}

/// The memory estimate of a training step, in steady state (the
/// optimizer's state exists), without running it: parameters and
/// buffers, their gradients and optimizer state, the activations in closed form, and the peak from the step's
/// program added up: the micro-batch's own (its gradients new, or added
/// into those kept), or the optimizer step's. A dataset on the device is
/// resident, and its batches are views (nothing is copied in).
pub fn estimate(
    model: &ModelSpec,
    optimizer: Option<OptimizerSpec>,
    data: Option<&DataSpec>,
    s: &StepShape,
) -> Estimate {
    let options = s.options;
    let b = s.batch_size / options.accumulate.max(1);
    let (saved, attention) = match model.kind {
        Kind::Transformer(t) => estimate::transformer_saved(&t, b, options),
        Kind::Cnn(c) => (estimate::cnn_saved(&c, b, options), 0),
        Kind::Mlp => (estimate::mlp_saved(&model.mlp_shape(), b, options), 0),
    };
    let program = model.step_program(b, options);
    let p = rounded(&model.parameters());
    // Gradients, and the optimizer's state, only for what trains.
    let g = rounded(&model.trained_parameters());
    let o = state_bytes(model, optimizer, kinds::blocks);
    let (x, x_dtype, y) = model.batch(b);
    let count = |shape: &[u64]| shape.iter().product::<u64>();
    let dataset = data
        .filter(|d| d.on_device)
        .map_or(0, DataSpec::device_bytes);
    let input = match dataset {
        0 => kinds::blocks(count(&x) * x_dtype.size_bytes()) + kinds::blocks(count(&y) * 8),
        _ => 0,
    };
    let workspaces = estimate::kept_workspaces(&program, &s.blas);
    // The loop's last loss lives until the new one is bound.
    let resident = dataset + p + rounded(&model.buffers()) + o + workspaces + 512;
    let fresh = estimate::walk(&program, false, &s.blas).peak;
    let kept = estimate::walk(&program, true, &s.blas).peak + g;
    let micro_batch = match (s.set_to_none, s.options.accumulate > 1) {
        (true, false) => fresh,
        (true, true) => fresh.max(kept),
        (false, _) => kept,
    };
    let optimizer_step = g + optimizer.map_or(0, |o| o.step_temporary_bytes(g));
    Estimate {
        parameter_bytes: p,
        gradient_bytes: g,
        optimizer_state_bytes: o,
        activation_bytes: saved,
        input_bytes: input,
        dataset_bytes: dataset,
        workspace_bytes: workspaces,
        attention_bytes: attention,
        peak_bytes: resident + input + micro_batch.max(optimizer_step),
        xla_temp_bytes: None,
        donated_peak_bytes: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::step::Attention;
    use crate::OptimizerKind;

    fn default_model() -> ModelSpec {
        ModelSpec::mlp(4, 1024, 784, 10, Dtype::Float32)
    }

    #[test]
    fn shapes_and_counts() {
        let m = default_model();
        assert_eq!(m.dims(), vec![784, 1024, 1024, 1024, 1024, 10]);
        let shapes = m.param_shapes();
        assert_eq!(shapes[0], ("0.weight".into(), vec![1024, 784]));
        assert_eq!(shapes[9], ("8.bias".into(), vec![10]));
        assert_eq!(
            m.param_count(),
            784 * 1024 + 1024 + 3 * (1024 * 1024 + 1024) + 1024 * 10 + 10
        );
    }

    #[test]
    fn adam_state_is_twice_the_parameters() {
        let m = default_model();
        let shape = StepShape {
            batch_size: 64,
            set_to_none: true,
            blas: Default::default(),
            options: Options {
                attention: Attention::Eager,
                checkpointing: false,
                amp: None,
                accumulate: 1,
                gpu: None,
                conv_workspace: 0,
            },
        };
        let adam = OptimizerSpec::torch(OptimizerKind::Adam);
        let e = estimate(&m, Some(adam), None, &shape);
        assert_eq!(e.optimizer_state_bytes, 2 * e.parameter_bytes);
        let momentum = OptimizerSpec::torch(OptimizerKind::Momentum);
        let e = estimate(&m, Some(momentum), None, &shape);
        assert_eq!(e.optimizer_state_bytes, e.parameter_bytes);
    }
}
