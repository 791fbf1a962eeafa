//! What an optimizer is and what state it keeps per parameter, allocated
//! at the parameter's first step: PyTorch's (`torch.optim`: a momentum
//! buffer, or Adam's `exp_avg` and `exp_avg_sq`, each shaped and typed as
//! the parameter), or bitsandbytes' 8-bit optimizers (`bnb.optim.SGD8bit`,
//! `Adam8bit`, `AdamW8bit`). Those follow `Optimizer1State.init_state` and
//! `Optimizer2State.init_state`: a parameter of fewer than `min_8bit_size`
//! (4096) elements keeps float32 `state1`/`state2`; a larger one keeps each
//! state as one uint8 per element and a float32 `absmax` per block of 256
//! elements, and the optimizer moves its quantization maps (256 float32
//! values each, `create_dynamic_map`) to the device once, before the first
//! such state. bitsandbytes updates each parameter in place
//! (`optimizer_update_8bit_blockwise`): its step makes no temporaries.

use serde::Serialize;
use vramlab_core::error::Invalid;
use vramlab_core::types::Dtype;

/// bitsandbytes' `min_8bit_size`: smaller parameters keep float32 state.
pub const MIN_8BIT_SIZE: u64 = 4096;
/// Elements per quantization block (one float32 `absmax` each).
pub const BLOCKSIZE: u64 = 256;
/// Values in a quantization map.
pub const QMAP_VALUES: u64 = 256;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    Sgd,
    Momentum,
    Adam,
    Adamw,
}

vramlab_core::read_by_name!(OptimizerKind {
    Sgd = "sgd",
    Momentum = "momentum",
    Adam = "adam",
    Adamw = "adamw",
});

impl OptimizerKind {
    pub const ALL: [OptimizerKind; 4] = [
        OptimizerKind::Sgd,
        OptimizerKind::Momentum,
        OptimizerKind::Adam,
        OptimizerKind::Adamw,
    ];

    /// The optimizer as JAX (optax) or Keras names it, at `lr` (its
    /// default when none): `optax.adam(0.001)`,
    /// `tf.keras.optimizers.SGD(0.01, momentum=0.9)`.
    pub fn written_in(self, framework: vramlab_core::types::Framework, lr: Option<f32>) -> String {
        let lr = lr.unwrap_or(self.default_lr());
        let momentum = match self {
            OptimizerKind::Momentum => ", momentum=0.9",
            _ => "",
        };
        let (optax, keras) = match self {
            OptimizerKind::Sgd | OptimizerKind::Momentum => ("sgd", "SGD"),
            OptimizerKind::Adam => ("adam", "Adam"),
            OptimizerKind::Adamw => ("adamw", "AdamW"),
        };
        match framework {
            vramlab_core::types::Framework::Jax => format!("optax.{optax}({lr}{momentum})"),
            _ => format!("tf.keras.optimizers.{keras}({lr}{momentum})"),
        }
    }

    /// The name on the wire: `sgd`, `momentum`, `adam`, `adamw`.
    pub fn id(self) -> &'static str {
        match self {
            OptimizerKind::Sgd => "sgd",
            OptimizerKind::Momentum => "momentum",
            OptimizerKind::Adam => "adam",
            OptimizerKind::Adamw => "adamw",
        }
    }

    /// The optimizer a wire name stands for.
    pub fn from_id(id: &str) -> Option<OptimizerKind> {
        OptimizerKind::ALL.into_iter().find(|k| k.id() == id)
    }

    /// `torch.optim`'s state per parameter: none, a momentum buffer, or
    /// `exp_avg` and `exp_avg_sq`.
    pub fn state_names(self) -> &'static [&'static str] {
        match self {
            OptimizerKind::Sgd => &[],
            OptimizerKind::Momentum => &["momentum_buffer"],
            OptimizerKind::Adam | OptimizerKind::Adamw => &["exp_avg", "exp_avg_sq"],
        }
    }

    /// State tensors per parameter.
    pub fn state_per_param(self) -> u64 {
        self.state_names().len() as u64
    }

    pub fn default_lr(self) -> f32 {
        match self {
            OptimizerKind::Sgd => 0.1,
            OptimizerKind::Momentum => 0.05,
            OptimizerKind::Adam | OptimizerKind::Adamw => 1e-3,
        }
    }

    /// The Python that builds it.
    pub fn python(self) -> &'static str {
        match self {
            OptimizerKind::Sgd => "torch.optim.SGD",
            OptimizerKind::Momentum => "torch.optim.SGD",
            OptimizerKind::Adam => "torch.optim.Adam",
            OptimizerKind::Adamw => "torch.optim.AdamW",
        }
    }
}

/// An optimizer: its rule and the bits of its state (32: `torch.optim`;
/// 8: bitsandbytes').
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptimizerSpec {
    pub kind: OptimizerKind,
    pub bits: u8,
}

/// One state tensor: its key in `optimizer.state[p]`, shape and type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateTensor {
    pub name: &'static str,
    pub shape: Vec<u64>,
    pub dtype: Dtype,
}

impl OptimizerSpec {
    /// `torch.optim`'s optimizer of this kind.
    pub fn torch(kind: OptimizerKind) -> Self {
        OptimizerSpec { kind, bits: 32 }
    }

    /// The optimizer, or why there is none with these bits.
    pub fn new(kind: OptimizerKind, bits: u8) -> Result<Self, Invalid> {
        match (bits, kind) {
            (32, _) => Ok(Self::torch(kind)),
            (8, OptimizerKind::Sgd) => Err(
                "plain SGD keeps no state to store in 8 bits: 8-bit state is for momentum, adam and adamw"
                    .into(),
            ),
            (8, _) => Ok(OptimizerSpec { kind, bits }),
            _ => Err(Invalid(format!(
                "bits must be 32 (torch.optim) or 8 (bitsandbytes), not {bits}"
            ))),
        }
    }

    pub fn is_8bit(&self) -> bool {
        self.bits == 8
    }

    /// The Python class.
    pub fn python(&self) -> &'static str {
        match (self.is_8bit(), self.kind) {
            (false, k) => k.python(),
            (true, OptimizerKind::Adamw) => "bnb.optim.AdamW8bit",
            (true, OptimizerKind::Adam) => "bnb.optim.Adam8bit",
            (true, _) => "bnb.optim.SGD8bit",
        }
    }

    /// Whether a parameter of `numel` elements keeps 8-bit state.
    pub fn quantizes(&self, numel: u64) -> bool {
        self.is_8bit() && self.kind.state_per_param() > 0 && numel >= MIN_8BIT_SIZE
    }

    /// The quantization maps the optimizer moves to the device before the
    /// first quantized state (`name2qmap`): one per state.
    pub fn qmaps(&self) -> &'static [&'static str] {
        match self.kind.state_per_param() {
            2 => &["dynamic", "udynamic"],
            1 => &["dynamic"],
            _ => &[],
        }
    }

    /// One parameter's state, in the order it is allocated.
    pub fn state(&self, shape: &[u64], dtype: Dtype) -> Vec<StateTensor> {
        let numel = shape.iter().product::<u64>();
        let tensor = |name, shape: &[u64], dtype| StateTensor {
            name,
            shape: shape.to_vec(),
            dtype,
        };
        let states = self.kind.state_per_param() as usize;
        if !self.is_8bit() {
            let names = self.kind.state_names();
            return names.iter().map(|&n| tensor(n, shape, dtype)).collect();
        }
        let f32 = Dtype::Float32;
        let (names, absmax) = (["state1", "state2"], ["absmax1", "absmax2"]);
        if !self.quantizes(numel) {
            return names[..states]
                .iter()
                .map(|&n| tensor(n, shape, f32))
                .collect();
        }
        let blocks = [numel.div_ceil(BLOCKSIZE)];
        let quantized = names[..states]
            .iter()
            .map(|&n| tensor(n, shape, Dtype::Uint8));
        let maxima = absmax[..states].iter().map(|&n| tensor(n, &blocks, f32));
        quantized.chain(maxima).collect()
    }

    /// The state's bytes for these parameters (shape, type), each tensor's
    /// bytes through `round`, the quantization maps included.
    pub fn state_bytes<'a>(
        &self,
        params: impl IntoIterator<Item = (&'a [u64], Dtype)>,
        round: impl Fn(u64) -> u64,
    ) -> u64 {
        let mut quantized = false;
        let mut bytes = 0;
        for (shape, dtype) in params {
            quantized |= self.quantizes(shape.iter().product());
            for t in self.state(shape, dtype) {
                bytes += round(t.shape.iter().product::<u64>() * t.dtype.size_bytes());
            }
        }
        if quantized {
            bytes += self.qmaps().len() as u64 * round(QMAP_VALUES * 4);
        }
        bytes
    }

    /// The temporaries of one step over `param_bytes` of parameters:
    /// `torch.optim.Adam`'s foreach `exp_avg_sq.sqrt()`, one per parameter.
    pub fn step_temporary_bytes(&self, param_bytes: u64) -> u64 {
        let adam = matches!(self.kind, OptimizerKind::Adam | OptimizerKind::Adamw);
        if adam && !self.is_8bit() {
            param_bytes
        } else {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(spec: OptimizerSpec, shapes: &[&[u64]]) -> u64 {
        spec.state_bytes(shapes.iter().map(|&s| (s, Dtype::Float32)), |b| b)
    }

    #[test]
    fn torch_state_is_the_parameters_once_per_slot() {
        let adam = OptimizerSpec::torch(OptimizerKind::Adam);
        assert_eq!(
            bytes(adam, &[&[1024, 784], &[1024]]),
            2 * 4 * (1024 * 784 + 1024)
        );
        let names: Vec<_> = adam
            .state(&[3], Dtype::Float32)
            .iter()
            .map(|t| t.name)
            .collect();
        assert_eq!(names, ["exp_avg", "exp_avg_sq"]);
        let sgd = OptimizerSpec::torch(OptimizerKind::Sgd);
        assert_eq!(bytes(sgd, &[&[1024, 784]]), 0);
    }

    #[test]
    fn adam8bit_state_follows_init_state() {
        let adam8 = OptimizerSpec::new(OptimizerKind::Adam, 8).unwrap();
        // 1024 x 784: two uint8 states and ceil(802816 / 256) = 3136 blocks
        // of float32 absmax each; the two 256-value maps once.
        let big = 2 * 1024 * 784 + 2 * 3136 * 4;
        assert_eq!(bytes(adam8, &[&[1024, 784]]), big + 2 * 1024);
        // A bias of 1024 elements (under 4096) keeps float32 state.
        assert_eq!(
            bytes(adam8, &[&[1024, 784], &[1024]]),
            big + 2 * 1024 + 2 * 4096
        );
        // Without a quantized parameter the maps never reach the device.
        assert_eq!(bytes(adam8, &[&[4095]]), 2 * 4095 * 4);
        // 4097 elements: 17 blocks.
        assert_eq!(bytes(adam8, &[&[4097]]), 2 * 4097 + 2 * 17 * 4 + 2 * 1024);
        let state = adam8.state(&[4096], Dtype::Float32);
        let names: Vec<_> = state.iter().map(|t| (t.name, t.dtype)).collect();
        assert_eq!(
            names,
            [
                ("state1", Dtype::Uint8),
                ("state2", Dtype::Uint8),
                ("absmax1", Dtype::Float32),
                ("absmax2", Dtype::Float32)
            ]
        );
    }

    #[test]
    fn sgd8bit_keeps_one_state_and_one_map() {
        let sgd8 = OptimizerSpec::new(OptimizerKind::Momentum, 8).unwrap();
        assert_eq!(sgd8.python(), "bnb.optim.SGD8bit");
        assert_eq!(bytes(sgd8, &[&[512, 512]]), 512 * 512 + 1024 * 4 + 1024);
        assert_eq!(sgd8.step_temporary_bytes(1 << 20), 0);
    }

    #[test]
    fn bits_other_than_8_and_32_and_8bit_sgd_are_refused() {
        assert!(OptimizerSpec::new(OptimizerKind::Sgd, 8)
            .unwrap_err()
            .0
            .contains("no state"));
        assert!(OptimizerSpec::new(OptimizerKind::Adam, 16)
            .unwrap_err()
            .0
            .contains("not 16"));
        let adam = OptimizerSpec::new(OptimizerKind::Adam, 32).unwrap();
        assert_eq!(adam.step_temporary_bytes(100), 100);
    }
}
