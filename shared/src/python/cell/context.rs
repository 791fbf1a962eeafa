//! What a cell's code already has, read from its text: the networks it
//! built from `vramlab.models` (a token dataset is a GPT's, an image
//! dataset a CNN's) and the attention each GPT is set to, so the code
//! appended next fits them.

/// A network a line of the cell built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Net {
    Gpt {
        seq_len: u64,
        vocab: u64,
    },
    Cnn {
        channels: u64,
        image_size: u64,
    },
    /// A Hugging Face model (transformers' `AutoModelForCausalLM`).
    Hf,
}

#[derive(Debug, Default)]
pub(super) struct Context {
    /// By the name bound, the latest last.
    nets: Vec<(String, Net)>,
    /// `model.set_attn_implementation("sdpa")` lines, in order.
    attention: Vec<(String, String)>,
    /// `model.gradient_checkpointing_enable()` (`true`) and `_disable()`
    /// lines, in order.
    checkpointing: Vec<(String, bool)>,
    /// `model.train()` lines.
    training: Vec<String>,
}

/// The integer after `key=` in `line`.
fn arg(line: &str, key: &str) -> Option<u64> {
    let at = line.find(&format!("{key}="))? + key.len() + 1;
    let digits: String = line[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

impl Context {
    pub(super) fn read(source: &str) -> Self {
        let mut c = Context::default();
        for line in source.lines() {
            let code = line.split('#').next().unwrap_or("").trim();
            if let Some((model, call)) = code.split_once('.') {
                let model = model.to_string();
                if let Some(arg) = call.strip_prefix("set_attn_implementation(") {
                    let value = arg.trim_end_matches(')').trim_matches('"');
                    c.attention.push((model, value.to_string()));
                    continue;
                }
                if call == "train()" {
                    c.training.push(model.clone());
                }
                if let Some(on) = call.strip_prefix("gradient_checkpointing_") {
                    c.checkpointing.push((model, on == "enable()"));
                }
            }
            let Some((name, value)) = line.split_once(" = ") else {
                continue;
            };
            let name = name.trim();
            if value.contains("AutoModelForCausalLM.from_") && !value.contains("save_pretrained") {
                c.nets.push((name.into(), Net::Hf));
            } else if value.contains("prepare_model_for_kbit_training(") {
                // peft turns its checkpointing on.
                c.checkpointing.push((name.into(), true));
            } else if value.contains("GPT(") {
                let net = (arg(value, "seq_len"), arg(value, "vocab"));
                if let (Some(seq_len), Some(vocab)) = net {
                    c.nets.push((name.into(), Net::Gpt { seq_len, vocab }));
                }
            } else if value.contains("CNN(") {
                let net = (arg(value, "channels"), arg(value, "image_size"));
                if let (Some(channels), Some(image_size)) = net {
                    c.nets.push((
                        name.into(),
                        Net::Cnn {
                            channels,
                            image_size,
                        },
                    ));
                }
            }
        }
        c
    }

    /// The network bound to `name`, if the cell built one.
    pub(super) fn net(&self, name: &str) -> Option<Net> {
        (self.nets.iter().rev())
            .find(|(n, _)| n == name)
            .map(|&(_, net)| net)
    }

    /// The network a dataset of `features` and `classes` feeds.
    pub(super) fn fed(&self, features: u64, classes: u64) -> Option<Net> {
        self.nets
            .iter()
            .rev()
            .map(|&(_, net)| net)
            .find(|net| match *net {
                Net::Gpt { seq_len, vocab } => (seq_len, vocab) == (features, classes),
                Net::Cnn {
                    channels,
                    image_size,
                } => channels * image_size * image_size == features,
                // A language model's tokens: any length, its vocabulary.
                Net::Hf => classes > 1,
            })
    }

    /// Whether `model` checkpoints its blocks now (a line enabled it).
    pub(super) fn checkpointing(&self, model: &str) -> bool {
        (self.checkpointing.iter().rev())
            .find(|(m, _)| m == model)
            .is_some_and(|&(_, on)| on)
    }

    /// Whether a line put `model` in training mode (`model.train()`).
    pub(super) fn training(&self, model: &str) -> bool {
        self.training.iter().any(|m| m == model)
    }

    /// Whether `model` is a Hugging Face model.
    pub(super) fn hf(&self, model: &str) -> bool {
        self.net(model) == Some(Net::Hf)
    }

    /// The attention a Hugging Face model runs now ("sdpa", transformers'
    /// default, unless a line set it).
    pub(super) fn hf_attention(&self, model: &str) -> &str {
        (self.attention.iter().rev())
            .find(|(m, _)| m == model)
            .map_or("sdpa", |(_, a)| a)
    }

    /// The attention `model` runs now ("eager" unless a line set it).
    pub(super) fn attention(&self, model: &str) -> &str {
        (self.attention.iter().rev())
            .find(|(m, _)| m == model)
            .map_or("eager", |(_, a)| a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cell_says_which_networks_it_built_and_their_attention() {
        let source = "from vramlab.models import GPT\nmodel = GPT(layers=6, width=512, heads=8, seq_len=1024, vocab=8000, mlp_ratio=4, norm=nn.LayerNorm, tied=True).cuda()\nnet = CNN(channels=3, image_size=64, blocks=4, width=64, classes=100).cuda()  # per block\nmodel.set_attn_implementation(\"sdpa\")\nnet.set_attn_implementation(\"sdpa\")  # fused\nnet.gradient_checkpointing_enable()\nmodel.gradient_checkpointing_enable()\nmodel.gradient_checkpointing_disable()\n";
        let c = Context::read(source);
        let gpt = Net::Gpt {
            seq_len: 1024,
            vocab: 8000,
        };
        assert_eq!(c.net("model"), Some(gpt));
        assert_eq!(c.fed(1024, 8000), Some(gpt));
        let cnn = Net::Cnn {
            channels: 3,
            image_size: 64,
        };
        assert_eq!(c.fed(12288, 100), Some(cnn));
        assert_eq!(c.fed(784, 10), None);
        assert_eq!(c.attention("model"), "sdpa");
        assert_eq!(c.attention("net"), "sdpa");
        assert!(c.checkpointing("net"));
        assert!(!c.checkpointing("model"));
    }
}
