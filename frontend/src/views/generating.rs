//! A Hugging Face model and its `generate()`: a published shape loaded on
//! the GPU, then greedy generation with transformers' dynamic or static
//! cache (PyTorch only).

use super::{checked_button, hidden, text_input};
use crate::state::App;
use leptos::prelude::*;
use vramlab_shared::command::{Cache, Command, GenerateArgs, ModelArgs, ModelKind};
use vramlab_shared::train::hf::known;
use vramlab_shared::train::kinds::Attention;
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
        </fieldset>
    }
}
