//! A Hugging Face model and its `generate()`: a published shape loaded on
//! the GPU, then greedy generation with transformers' dynamic or static
//! cache; or loaded for fine-tuning (LoRA, or QLoRA on 4-bit weights) and
//! trained a step at a time (PyTorch only).

use super::{checked_button, hidden, text_input};
use crate::playground::state::App;
use leptos::prelude::*;
use vramlab_shared::command::{
    Cache, Command, DataArgs, GenerateArgs, LoraArgs, ModelArgs, ModelKind, ModelRef,
    OptimizerArgs, TrainArgs, STATE_BITS,
};
use vramlab_shared::hf::known;
use vramlab_shared::train::kinds::Attention;
use vramlab_shared::train::OptimizerKind;
use vramlab_shared::types::{Dtype, Framework};
use vramlab_shared::Invalid;

#[derive(Clone, Copy)]
struct Fields {
    shape: RwSignal<String>,
    /// Empty: the config's own type.
    dtype: RwSignal<String>,
    batch: RwSignal<String>,
    prompt: RwSignal<String>,
    new_tokens: RwSignal<String>,
    cache: RwSignal<String>,
    attention: RwSignal<String>,
    /// Fine-tuning: LoRA's rank, QLoRA's 4-bit weights, the sequence.
    rank: RwSignal<String>,
    four_bit: RwSignal<bool>,
    seq: RwSignal<String>,
}

fn number(value: RwSignal<String>, what: &str) -> Result<u64, Invalid> {
    let text = value.get_untracked();
    match text.trim().parse::<u64>() {
        Ok(n) if (1..=1 << 24).contains(&n) => Ok(n),
        _ => Err(Invalid(format!(
            "{what}: a whole number from 1, not {text:?}"
        ))),
    }
}

impl Fields {
    fn load(&self) -> Result<Vec<Command>, Invalid> {
        let dtype = match self.dtype.get_untracked().as_str() {
            "float32" => Some(Dtype::Float32),
            "bfloat16" => Some(Dtype::Bfloat16),
            "float16" => Some(Dtype::Float16),
            _ => None,
        };
        Ok(vec![Command::Model(ModelArgs {
            name: "model".into(),
            kind: ModelKind::Hf,
            dtype,
            config: Some(self.shape.get_untracked().into()),
            ..ModelArgs::default()
        })])
    }

    /// LoRA (or QLoRA: 4-bit weights readied by
    /// `prepare_model_for_kbit_training`, adapters on every linear layer),
    /// AdamW, and sequences of the vocabulary's tokens.
    fn load_to_train(&self) -> Result<Vec<Command>, Invalid> {
        let rank = number(self.rank, "LoRA rank")?;
        let seq = number(self.seq, "sequence")?;
        let shape = self.shape.get_untracked();
        let vocab = known::find(&shape).map_or(0, |k| k.config.vocab);
        let four = self.four_bit.get_untracked();
        let mut cmds = self.load()?;
        if let Some(Command::Model(m)) = cmds.first_mut() {
            if four {
                m.quantization = Some("nf4".into());
                m.dtype = m.dtype.or(Some(Dtype::Bfloat16));
            }
        }
        let model = || "model".to_string();
        if four {
            cmds.push(Command::PrepareKbit(ModelRef { model: model() }));
        }
        cmds.push(Command::Lora(LoraArgs {
            model: model(),
            rank,
            all_linear: four,
        }));
        cmds.push(Command::Optimizer(OptimizerArgs {
            name: "opt".into(),
            model: model(),
            kind: OptimizerKind::Adamw,
            lr: None,
            bits: STATE_BITS,
        }));
        cmds.push(Command::Data(DataArgs {
            name: "data".into(),
            samples: 64,
            features: seq,
            classes: vocab,
            on_device: false,
        }));
        Ok(cmds)
    }

    /// One step of the loop, checkpointing each layer.
    fn train(&self) -> Result<Vec<Command>, Invalid> {
        let mut t = TrainArgs::plain("model", "opt", "data", 1, number(self.batch, "batch")?);
        t.checkpointing = true;
        t.attention = match self.attention.get_untracked().as_str() {
            "eager" => Attention::Eager,
            _ => Attention::Sdpa,
        };
        Ok(vec![Command::Train(t)])
    }

    fn generate(&self) -> Result<Vec<Command>, Invalid> {
        Ok(vec![Command::Generate(GenerateArgs {
            name: Some("out".into()),
            model: "model".into(),
            input_ids: None,
            attention_mask: None,
            batch_size: Some(number(self.batch, "batch")?),
            prompt_len: Some(number(self.prompt, "prompt")?),
            new_tokens: number(self.new_tokens, "new tokens")?,
            cache: match self.cache.get_untracked().as_str() {
                "static" => Cache::Static,
                _ => Cache::Dynamic,
            },
            attention: match self.attention.get_untracked().as_str() {
                "eager" => Attention::Eager,
                _ => Attention::Sdpa,
            },
        })])
    }
}

fn select(
    id: &'static str,
    value: RwSignal<String>,
    options: Vec<(String, String)>,
) -> impl IntoView {
    view! {
        <select id=id prop:value=value on:change=move |e| value.set(event_target_value(&e))>
            {options.into_iter().map(|(v, label)| view! { <option value=v>{label}</option> }).collect_view()}
        </select>
    }
}

fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items.iter().map(|&(v, l)| (v.into(), l.into())).collect()
}

#[component]
pub fn Generating(app: App) -> impl IntoView {
    let s = |v: &str| RwSignal::new(v.to_string());
    let f = Fields {
        shape: s("Llama-3.2-1B"),
        dtype: s(""),
        batch: s("4"),
        prompt: s("512"),
        new_tokens: s("64"),
        cache: s("dynamic"),
        attention: s("sdpa"),
        rank: s("16"),
        four_bit: RwSignal::new(true),
        seq: s("512"),
    };
    let shapes: Vec<(String, String)> = known::all()
        .into_iter()
        .map(|k| (k.name.clone(), k.name))
        .collect();
    let group = hidden(app, "generate");
    view! {
        <fieldset id="generating" hidden=move || group() || app.framework_now() != Framework::Pytorch>
            <legend>"Generate (Hugging Face transformers)"</legend>
            <label>"Model " {select("hf-shape", f.shape, shapes)}</label>
            <label>"dtype " {select("hf-dtype", f.dtype, pairs(&[("", "the config's"), ("float32", "float32"), ("bfloat16", "bfloat16"), ("float16", "float16")]))}</label>
            {checked_button(app, "btn-hf-load", "Load model", "model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(...)).to(\"cuda\")", move || f.load())}
            <br />
            <label>"Batch " {text_input("hf-batch", "4", "", f.batch)}</label>
            <label>"Prompt " {text_input("hf-prompt", "5", "", f.prompt)}</label>
            <label>"New tokens " {text_input("hf-new-tokens", "5", "", f.new_tokens)}</label>
            <label>"Cache " {select("hf-cache", f.cache, pairs(&[("dynamic", "DynamicCache"), ("static", "StaticCache")]))}</label>
            <label>"Attention " {select("hf-attention", f.attention, pairs(&[("sdpa", "sdpa"), ("eager", "eager")]))}</label>
            {checked_button(app, "btn-generate", "generate", "out = model.generate(ids, max_new_tokens=N)", move || f.generate())}
            <br />
            <label>"LoRA rank " {text_input("hf-rank", "3", "", f.rank)}</label>
            <label><input type="checkbox" id="hf-4bit" prop:checked=f.four_bit on:change=move |e| f.four_bit.set(event_target_checked(&e)) />" 4-bit (QLoRA)"</label>
            <label>"Sequence " {text_input("hf-seq", "5", "", f.seq)}</label>
            {checked_button(app, "btn-hf-finetune", "Load for fine-tuning", "the model (in 4 bits, prepared), LoRA, AdamW, token sequences", move || f.load_to_train())}
            {checked_button(app, "btn-hf-train", "train 1 step", "loss = model(input_ids=ids, labels=ids).loss; loss.backward(); opt.step(); opt.zero_grad()", move || f.train())}
        </fieldset>
    }
}
