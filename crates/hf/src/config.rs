//! A Hugging Face `config.json` read as transformers 5.24 reads it: the
//! `model_type` picks the configuration class, and each field the file
//! leaves out takes that class's default (`LlamaConfig`, `Qwen2Config`, …).

use serde_json::{Map, Value};
use vramlab_core::error::Invalid;
use vramlab_core::types::Dtype;

/// The model families vramlab builds, by their `model_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Gpt2,
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    Gemma2,
    Gemma3,
    Phi3,
}

impl Arch {
    pub const MODEL_TYPES: &'static [&'static str] = &[
        "gpt2",
        "llama",
        "mistral",
        "qwen2",
        "qwen3",
        "gemma2",
        "gemma3_text",
        "phi3",
    ];

    fn of(model_type: &str) -> Option<Arch> {
        Some(match model_type {
            "gpt2" => Arch::Gpt2,
            "llama" => Arch::Llama,
            "mistral" => Arch::Mistral,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            "gemma2" => Arch::Gemma2,
            "gemma3_text" | "gemma3" => Arch::Gemma3,
            "phi3" => Arch::Phi3,
            _ => return None,
        })
    }

    /// The class transformers builds for `AutoModelForCausalLM`.
    pub fn causal_lm(self) -> &'static str {
        match self {
            Arch::Gpt2 => "GPT2LMHeadModel",
            Arch::Llama => "LlamaForCausalLM",
            Arch::Mistral => "MistralForCausalLM",
            Arch::Qwen2 => "Qwen2ForCausalLM",
            Arch::Qwen3 => "Qwen3ForCausalLM",
            Arch::Gemma2 => "Gemma2ForCausalLM",
            Arch::Gemma3 => "Gemma3ForCausalLM",
            Arch::Phi3 => "Phi3ForCausalLM",
        }
    }
}

/// The numbers of a config.json that decide memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HfConfig {
    pub arch: Arch,
    pub vocab: u64,
    pub hidden: u64,
    /// The MLP's inner width.
    pub intermediate: u64,
    pub layers: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    /// The longest sequence (`max_position_embeddings`, GPT-2's
    /// `n_positions`).
    pub max_positions: u64,
    pub tied: bool,
    /// q, k and v projections with biases (Qwen2; Llama's
    /// `attention_bias`, which gives `o_proj` one too).
    pub qkv_bias: bool,
    pub o_bias: bool,
    pub mlp_bias: bool,
    /// The rotary embedding's frequencies (`inv_freq`'s length; 0: none).
    pub rotary: u64,
    /// The type the weights are loaded in (`torch_dtype`, or `dtype`).
    pub dtype: Dtype,
    /// Gemma's sliding-window layers: the window (0: none), and every
    /// how many layers one attends to everything (2 in Gemma 2, 6 in
    /// Gemma 3's `sliding_window_pattern`).
    pub sliding_window: u64,
    pub full_every: u64,
    /// Gemma 2's `attn_logit_softcapping` and `final_logit_softcapping`
    /// (`tanh` of the scores, of the logits).
    pub attn_softcap: bool,
    pub final_softcap: bool,
    /// Where training applies dropout (GPT-2's `embd_pdrop`, `resid_pdrop`,
    /// `attn_pdrop`, 0.1 by default; the others' are 0).
    pub dropout: Dropout,
}

/// Which of a model's dropouts are on (a probability above 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Dropout {
    pub embd: bool,
    pub resid: bool,
    pub attn: bool,
}

/// Whether the probability `key` (default `default`) is above 0.
fn dropout_on(c: &Map<String, Value>, key: &str, default: f64) -> Result<bool, Invalid> {
    match c.get(key) {
        None | Some(Value::Null) => Ok(default > 0.0),
        Some(v) => v
            .as_f64()
            .filter(|p| (0.0..1.0).contains(p))
            .map(|p| p > 0.0)
            .ok_or_else(|| {
                Invalid(format!(
                    "config.json's `{key}` is {v}: a probability below 1"
                ))
            }),
    }
}

/// A field read as an integer, or the default.
fn uint(c: &Map<String, Value>, key: &str, default: Option<u64>) -> Result<u64, Invalid> {
    match c.get(key) {
        None | Some(Value::Null) => {
            default.ok_or_else(|| Invalid(format!("config.json has no `{key}`")))
        }
        Some(v) => v.as_u64().filter(|&n| n > 0 && n < 1 << 40).ok_or_else(|| {
            Invalid(format!(
                "config.json's `{key}` is {v}: not a positive integer"
            ))
        }),
    }
}

fn flag(c: &Map<String, Value>, key: &str, default: bool) -> Result<bool, Invalid> {
    match c.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(Invalid(format!(
            "config.json's `{key}` is {v}: not true or false"
        ))),
    }
}

fn dtype(c: &Map<String, Value>) -> Result<Dtype, Invalid> {
    let Some(v) = c.get("torch_dtype").or_else(|| c.get("dtype")) else {
        return Ok(Dtype::Float32);
    };
    let name = v.as_str().unwrap_or_default();
    match name.trim_start_matches("torch.") {
        "float32" | "float" => Ok(Dtype::Float32),
        "bfloat16" => Ok(Dtype::Bfloat16),
        "float16" | "half" => Ok(Dtype::Float16),
        _ => Err(Invalid(format!(
            "config.json's `torch_dtype` is {v}: float32, bfloat16 or float16"
        ))),
    }
}

/// Per family: vocabulary, width, MLP width, layers, heads, key/value
/// heads (`None`: as many as heads), longest sequence, tied embeddings;
/// transformers 5.24's configuration classes' defaults.
type Defaults = (u64, u64, u64, u64, u64, Option<u64>, u64, bool);

fn defaults(arch: Arch) -> Defaults {
    match arch {
        Arch::Gpt2 => (50257, 768, 3072, 12, 12, None, 1024, true),
        Arch::Llama => (32000, 4096, 11008, 32, 32, None, 2048, false),
        Arch::Mistral => (32000, 4096, 14336, 32, 32, Some(8), 131072, false),
        Arch::Qwen2 | Arch::Qwen3 => (151936, 4096, 22016, 32, 32, Some(32), 32768, false),
        Arch::Gemma2 => (256000, 2304, 9216, 26, 8, Some(4), 8192, true),
        Arch::Gemma3 => (262208, 2304, 9216, 26, 8, Some(4), 131072, true),
        Arch::Phi3 => (32064, 3072, 8192, 32, 32, None, 4096, false),
    }
}

impl HfConfig {
    /// Reads a config.json's object.
    pub fn read(config: &Value) -> Result<HfConfig, Invalid> {
        let c = config
            .as_object()
            .ok_or_else(|| Invalid::from("a config.json is a JSON object"))?;
        let model_type = c.get("model_type").and_then(Value::as_str).ok_or_else(|| {
            Invalid::from("config.json has no `model_type` (\"llama\", \"gpt2\", …)")
        })?;
        let arch = Arch::of(model_type).ok_or_else(|| {
            Invalid(format!(
                "model_type \"{model_type}\" is not one vramlab builds: {}",
                Arch::MODEL_TYPES.join(", ")
            ))
        })?;
        let (vocab, hidden, inter, layers, heads, kv, positions, tied) = defaults(arch);
        let gpt2 = arch == Arch::Gpt2;
        let key = |hf: &'static str, gpt: &'static str| if gpt2 { gpt } else { hf };
        let hidden = uint(c, key("hidden_size", "n_embd"), Some(hidden))?;
        let heads = uint(c, key("num_attention_heads", "n_head"), Some(heads))?;
        let intermediate = if gpt2 {
            uint(c, "n_inner", Some(4 * hidden))?
        } else {
            uint(c, "intermediate_size", Some(inter))?
        };
        let kv_heads = if gpt2 {
            heads
        } else {
            uint(c, "num_key_value_heads", Some(kv.unwrap_or(heads)))?
        };
        let head_dim = match arch {
            Arch::Gpt2 | Arch::Qwen2 | Arch::Phi3 => hidden / heads,
            _ => uint(c, "head_dim", Some(hidden / heads))?,
        };
        if head_dim == 0 || heads % kv_heads != 0 {
            return Err(Invalid(format!(
                "{heads} attention heads cannot share {kv_heads} key/value heads of width {head_dim}"
            )));
        }
        let attention_bias = flag(c, "attention_bias", false)?;
        let partial = c
            .get("partial_rotary_factor")
            .and_then(Value::as_f64)
            .unwrap_or(1.0);
        let config = HfConfig {
            arch,
            vocab: uint(c, "vocab_size", Some(vocab))?,
            hidden,
            intermediate,
            layers: uint(c, key("num_hidden_layers", "n_layer"), Some(layers))?,
            heads,
            kv_heads,
            head_dim,
            max_positions: uint(
                c,
                key("max_position_embeddings", "n_positions"),
                Some(positions),
            )?,
            tied: flag(c, "tie_word_embeddings", tied)?,
            qkv_bias: arch == Arch::Qwen2 || (arch == Arch::Llama && attention_bias),
            o_bias: arch == Arch::Llama && attention_bias,
            mlp_bias: arch == Arch::Llama && flag(c, "mlp_bias", false)?,
            rotary: if gpt2 {
                0
            } else {
                ((head_dim as f64 * partial) as u64) / 2
            },
            dtype: dtype(c)?,
            sliding_window: 0,
            full_every: 0,
            attn_softcap: false,
            final_softcap: false,
            dropout: if gpt2 {
                Dropout {
                    embd: dropout_on(c, "embd_pdrop", 0.1)?,
                    resid: dropout_on(c, "resid_pdrop", 0.1)?,
                    attn: dropout_on(c, "attn_pdrop", 0.1)?,
                }
            } else {
                Dropout::default()
            },
        };
        let config = gemma(c, config)?;
        config.check()?;
        Ok(config)
    }

    /// Whether layer `l` attends to a sliding window (Gemma's
    /// `layer_types`).
    pub fn sliding(&self, l: u64) -> bool {
        self.sliding_window > 0 && (l + 1) % self.full_every != 0
    }

    /// Sizes that no GPU holds are refused before anything is built.
    fn check(&self) -> Result<(), Invalid> {
        let widest = [self.hidden, self.intermediate, self.heads * self.head_dim];
        if widest.iter().any(|&w| w > 1 << 20) || self.vocab > 1 << 24 || self.layers > 1024 {
            return Err(Invalid(format!(
                "a model of width {}, {} layers and a vocabulary of {} is beyond any GPU",
                self.hidden, self.layers, self.vocab
            )));
        }
        Ok(())
    }

    /// The key/value heads each attention head shares (grouped-query
    /// attention's `num_key_value_groups`).
    pub fn groups(&self) -> u64 {
        self.heads / self.kv_heads
    }

    /// The bytes one token's keys and values take in one layer's cache.
    pub fn kv_bytes_per_token(&self, dtype: Dtype) -> u64 {
        2 * self.kv_heads * self.head_dim * dtype.size_bytes()
    }
}

/// Gemma's sliding windows and soft caps, with each class's defaults.
fn gemma(c: &Map<String, Value>, config: HfConfig) -> Result<HfConfig, Invalid> {
    let cap = |key: &str, default: bool| match c.get(key) {
        None => default,
        Some(v) => !v.is_null(),
    };
    Ok(match config.arch {
        Arch::Gemma2 => HfConfig {
            sliding_window: uint(c, "sliding_window", Some(4096))?,
            full_every: 2,
            attn_softcap: cap("attn_logit_softcapping", true),
            final_softcap: cap("final_logit_softcapping", true),
            ..config
        },
        Arch::Gemma3 => HfConfig {
            sliding_window: uint(c, "sliding_window", Some(4096))?,
            full_every: uint(c, "sliding_window_pattern", Some(6))?,
            attn_softcap: cap("attn_logit_softcapping", false),
            final_softcap: cap("final_logit_softcapping", false),
            ..config
        },
        _ => config,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_llama_config_takes_the_fields_it_names_and_the_class_defaults() {
        let c = HfConfig::read(&json!({
            "model_type": "llama", "hidden_size": 2048, "num_attention_heads": 32,
            "num_key_value_heads": 8, "torch_dtype": "bfloat16"
        }))
        .unwrap();
        assert_eq!((c.vocab, c.intermediate, c.layers), (32000, 11008, 32));
        assert_eq!((c.head_dim, c.groups(), c.rotary), (64, 4, 32));
        assert_eq!(c.dtype, Dtype::Bfloat16);
        assert_eq!(c.kv_bytes_per_token(Dtype::Bfloat16), 2 * 8 * 64 * 2);
        assert!(!c.tied && !c.qkv_bias);
    }

    #[test]
    fn what_transformers_would_refuse_is_refused_with_the_field_named() {
        let e = |v| HfConfig::read(&v).unwrap_err().0;
        assert_eq!(e(json!([])), "a config.json is a JSON object");
        assert!(e(json!({})).contains("no `model_type`"));
        assert!(e(json!({"model_type": "bert"})).contains("\"bert\" is not one vramlab builds"));
        assert!(
            e(json!({"model_type": "llama", "hidden_size": -1})).contains("`hidden_size` is -1")
        );
        assert!(
            e(json!({"model_type": "llama", "num_key_value_heads": 5})).contains("cannot share")
        );
        assert!(e(json!({"model_type": "qwen2", "torch_dtype": "int8"})).contains("torch_dtype"));
        assert!(e(json!({"model_type": "gpt2", "n_embd": 1_u64 << 30})).contains("beyond any GPU"));
    }
}
