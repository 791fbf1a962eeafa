//! A model's first parameter values, drawn as PyTorch's modules draw them:
//! `nn.Linear`, `nn.Conv2d` and LoRA's `lora_A` uniform in ±1/sqrt(fan_in)
//! (their `kaiming_uniform_(a=sqrt(5))`), a bias in ±1/sqrt of its
//! layer's fan-in, `nn.Embedding` standard normal, norms' weights one and
//! biases zero, `lora_B` zero. The numbers come from the model's seed.

use super::data::gaussian;
use super::kinds::NamedTensor;
use super::update;

/// How one parameter starts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    Uniform(f32),
    Normal,
    Ones,
    Zeros,
}

/// Each parameter's rule, in `parameters()` order.
pub fn rules(params: &[NamedTensor]) -> Vec<Init> {
    let mut fan_in = 1u64;
    params
        .iter()
        .map(|t| {
            let embedding = t.name.starts_with("wte.") || t.name.starts_with("wpe.");
            if t.shape.len() >= 2 {
                fan_in = t.numel() / t.shape[0].max(1);
            }
            match () {
                _ if embedding => Init::Normal,
                _ if t.name.contains("lora_B") => Init::Zeros,
                _ if t.shape.len() >= 2 => Init::Uniform(1.0 / (fan_in as f32).sqrt()),
                // A norm's weight (no matrix before it in its layer) and
                // its bias.
                _ if t.name.ends_with(".weight") => {
                    fan_in = 0;
                    Init::Ones
                }
                _ if fan_in == 0 => Init::Zeros,
                _ => Init::Uniform(1.0 / (fan_in as f32).sqrt()),
            }
        })
        .collect()
}

/// The first values of `params` for a model seeded `seed`.
pub fn initial_values(params: &[NamedTensor], seed: u64) -> update::Params {
    rules(params)
        .into_iter()
        .zip(params)
        .enumerate()
        .map(|(i, (rule, t))| {
            (0..t.numel())
                .map(|j| match rule {
                    Init::Uniform(bound) => {
                        let u = (libm::tanhf(gaussian(seed, i as u64, j)) + 1.0) / 2.0;
                        (2.0 * u - 1.0) * bound
                    }
                    Init::Normal => gaussian(seed, i as u64, j),
                    Init::Ones => 1.0,
                    Init::Zeros => 0.0,
                })
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::{CnnShape, Norm, TransformerShape};
    use vramlab_core::types::Dtype;

    fn named(params: &[NamedTensor]) -> Vec<(&str, Init)> {
        params
            .iter()
            .map(|t| t.name.as_str())
            .zip(rules(params))
            .collect()
    }

    #[test]
    fn each_module_starts_as_pytorchs_does() {
        let t = TransformerShape {
            layers: 1,
            width: 16,
            heads: 2,
            seq_len: 8,
            vocab: 10,
            mlp_ratio: 4,
            norm: Norm::LayerNorm,
            tied: false,
            lora_rank: 4,
        };
        let params = t.parameters(Dtype::Float32);
        let rules = named(&params);
        let of = |name: &str| rules.iter().find(|(n, _)| *n == name).unwrap().1;
        assert_eq!(of("wte.weight"), Init::Normal);
        assert_eq!(of("h.0.ln_1.weight"), Init::Ones);
        assert_eq!(of("h.0.ln_1.bias"), Init::Zeros);
        assert_eq!(of("h.0.attn.c_attn.base_layer.weight"), Init::Uniform(0.25));
        assert_eq!(of("h.0.attn.c_attn.base_layer.bias"), Init::Uniform(0.25));
        assert_eq!(
            of("h.0.attn.c_attn.lora_A.default.weight"),
            Init::Uniform(0.25)
        );
        assert_eq!(of("h.0.attn.c_attn.lora_B.default.weight"), Init::Zeros);
        assert_eq!(of("h.0.mlp.c_proj.base_layer.bias"), Init::Uniform(0.125));
        assert_eq!(of("ln_f.weight"), Init::Ones);
        assert_eq!(of("lm_head.weight"), Init::Uniform(0.25));
        let c = CnnShape {
            channels: 3,
            image_size: 8,
            blocks: 1,
            width: 4,
            classes: 5,
        };
        let rules = super::rules(&c.parameters(Dtype::Float32));
        let conv = Init::Uniform(1.0 / 27f32.sqrt());
        let head = Init::Uniform(1.0 / 64f32.sqrt());
        assert_eq!(rules, [conv, conv, Init::Ones, Init::Zeros, head, head]);
    }

    #[test]
    fn values_are_within_their_bounds_and_seeded() {
        let c = CnnShape {
            channels: 1,
            image_size: 4,
            blocks: 1,
            width: 2,
            classes: 3,
        };
        let params = c.parameters(Dtype::Float32);
        let a = initial_values(&params, 1);
        assert_eq!(a, initial_values(&params, 1));
        assert_ne!(a, initial_values(&params, 2));
        assert!(a[0].iter().all(|v| v.abs() <= 1.0 / 3.0));
        assert_eq!(a[2], vec![1.0, 1.0]);
    }
}
