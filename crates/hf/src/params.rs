//! The parameters and buffers transformers builds for a config, named,
//! shaped and ordered as `named_parameters()` and `named_buffers()` give
//! them (tied embeddings once), in the type the weights load in.
//! `tests/reference/hf_params.py` builds the same models on the meta
//! device; the tests below hold every name, shape and type to it.

use super::config::{Arch, HfConfig};
use vramlab_core::types::Dtype;
use vramlab_train::kinds::NamedTensor;

struct Out<'a> {
    c: &'a HfConfig,
    tensors: Vec<NamedTensor>,
}

impl Out<'_> {
    fn push(&mut self, name: String, shape: Vec<u64>) {
        let dtype = self.c.dtype;
        self.tensors.push(NamedTensor::new(name, shape, dtype));
    }

    /// `nn.Linear(fan_in, fan_out, bias)`.
    fn linear(&mut self, name: String, (fan_in, fan_out): (u64, u64), bias: bool) {
        self.push(format!("{name}.weight"), vec![fan_out, fan_in]);
        if bias {
            self.push(format!("{name}.bias"), vec![fan_out]);
        }
    }

    /// GPT-2's `Conv1D(nf, nx)`: its weight is nx x nf.
    fn conv1d(&mut self, name: String, (nx, nf): (u64, u64)) {
        self.push(format!("{name}.weight"), vec![nx, nf]);
        self.push(format!("{name}.bias"), vec![nf]);
    }

    fn norm(&mut self, name: String, width: u64) {
        self.push(format!("{name}.weight"), vec![width]);
    }

    fn layer_norm(&mut self, name: String) {
        let d = self.c.hidden;
        self.push(format!("{name}.weight"), vec![d]);
        self.push(format!("{name}.bias"), vec![d]);
    }

    fn gpt2_block(&mut self, p: &str) {
        let (d, inner) = (self.c.hidden, self.c.intermediate);
        self.layer_norm(format!("{p}.ln_1"));
        self.conv1d(format!("{p}.attn.c_attn"), (d, 3 * d));
        self.conv1d(format!("{p}.attn.c_proj"), (d, d));
        self.layer_norm(format!("{p}.ln_2"));
        self.conv1d(format!("{p}.mlp.c_fc"), (d, inner));
        self.conv1d(format!("{p}.mlp.c_proj"), (inner, d));
    }

    fn attention(&mut self, p: &str) {
        let c = self.c;
        let (d, q, kv) = (c.hidden, c.heads * c.head_dim, c.kv_heads * c.head_dim);
        let a = format!("{p}.self_attn");
        if c.arch == Arch::Phi3 {
            self.linear(format!("{a}.o_proj"), (q, d), false);
            self.linear(format!("{a}.qkv_proj"), (d, q + 2 * kv), false);
            return;
        }
        self.linear(format!("{a}.q_proj"), (d, q), c.qkv_bias);
        self.linear(format!("{a}.k_proj"), (d, kv), c.qkv_bias);
        self.linear(format!("{a}.v_proj"), (d, kv), c.qkv_bias);
        self.linear(format!("{a}.o_proj"), (q, d), c.o_bias);
        if matches!(c.arch, Arch::Qwen3 | Arch::Gemma3) {
            self.norm(format!("{a}.q_norm"), c.head_dim);
            self.norm(format!("{a}.k_norm"), c.head_dim);
        }
    }

    fn mlp(&mut self, p: &str) {
        let c = self.c;
        let (d, i, bias) = (c.hidden, c.intermediate, c.mlp_bias);
        let m = format!("{p}.mlp");
        if c.arch == Arch::Phi3 {
            self.linear(format!("{m}.gate_up_proj"), (d, 2 * i), false);
        } else {
            self.linear(format!("{m}.gate_proj"), (d, i), bias);
            self.linear(format!("{m}.up_proj"), (d, i), bias);
        }
        self.linear(format!("{m}.down_proj"), (i, d), bias);
    }

    fn decoder_layer(&mut self, p: &str) {
        let d = self.c.hidden;
        self.attention(p);
        self.mlp(p);
        self.norm(format!("{p}.input_layernorm"), d);
        self.norm(format!("{p}.post_attention_layernorm"), d);
        if matches!(self.c.arch, Arch::Gemma2 | Arch::Gemma3) {
            self.norm(format!("{p}.pre_feedforward_layernorm"), d);
            self.norm(format!("{p}.post_feedforward_layernorm"), d);
        }
    }
}

/// `model.named_parameters()`.
pub fn parameters(c: &HfConfig) -> Vec<NamedTensor> {
    let mut out = Out {
        c,
        tensors: Vec::new(),
    };
    let (d, v) = (c.hidden, c.vocab);
    if c.arch == Arch::Gpt2 {
        out.push("transformer.wte.weight".into(), vec![v, d]);
        out.push("transformer.wpe.weight".into(), vec![c.max_positions, d]);
        for l in 0..c.layers {
            out.gpt2_block(&format!("transformer.h.{l}"));
        }
        out.layer_norm("transformer.ln_f".into());
    } else {
        out.push("model.embed_tokens.weight".into(), vec![v, d]);
        for l in 0..c.layers {
            out.decoder_layer(&format!("model.layers.{l}"));
        }
        out.norm("model.norm".into(), d);
    }
    if !c.tied {
        out.push("lm_head.weight".into(), vec![v, d]);
    }
    out.tensors
}

/// `model.named_buffers()`: Gemma's embedding scale, the rotary
/// embedding's inverse frequencies (float32) and their copy.
pub fn buffers(c: &HfConfig) -> Vec<NamedTensor> {
    let mut out = Vec::new();
    if matches!(c.arch, Arch::Gemma2 | Arch::Gemma3) {
        out.push(NamedTensor::new(
            "model.embed_tokens.embed_scale".into(),
            vec![],
            c.dtype,
        ));
    }
    let prefixes: &[&str] = match c.arch {
        Arch::Gpt2 => &[],
        Arch::Gemma3 => &["full_attention_", "sliding_attention_"],
        _ => &[""],
    };
    for p in prefixes {
        for name in ["inv_freq", "original_inv_freq"] {
            out.push(NamedTensor::new(
                format!("model.rotary_emb.{p}{name}"),
                vec![c.rotary],
                Dtype::Float32,
            ));
        }
    }
    out
}

#[cfg(test)]
#[path = "params_tests.rs"]
mod tests;
