//! Hugging Face models in the kernel:
//! `model = AutoModelForCausalLM.from_config(config, dtype=...).to("cuda")`
//! (every parameter, then every buffer, in transformers' order) and
//! `out = model.generate(input_ids, max_new_tokens=N)`, played request by
//! request on the kernel's allocator as transformers 5.24 makes and drops
//! each tensor (`hf::generate`). An out-of-memory mid-way leaves
//! the call's tensors, the KV cache among them, on `last_exception`.

use super::generate_sink::{EngineSink, Played};
use super::{check_name, error, Engine, Outcome};
use crate::command::{Cache, GenerateArgs, LoraArgs, ModelArgs, ModelRef};
use crate::error::{CommandError, ErrorKind};
use crate::hf::generate::{self, Generation};
use crate::hf::params::parameters;
use crate::hf::plan::{kbit_prepare, load_model, lora_adapters, warmup_request, LoadStep};
use crate::hf::state::HfModelState;
use crate::hf::step::Quant4;
use crate::hf::{known, HfConfig};
use crate::process::AllocFailure;
use crate::runtime::{Class, ObjId, ObjectKind};
use crate::train::frame::PyFrame;
use crate::types::{Category, Dtype, Framework};
use crate::units::{format_size, TIB};
use serde_json::{json, Value};

impl Engine {
    /// `kind: "hf"`: the model from its config.json (or a shipped shape's
    /// name), loaded in `dtype` (the config's `torch_dtype` if none); with
    /// `quantization`, in bitsandbytes' 4 bits and readied for k-bit
    /// training (QLoRA's model); with `lora_rank`, peft's adapters.
    pub(super) fn hf_model(&mut self, a: &ModelArgs) -> Result<Outcome, CommandError> {
        let name = a.name.as_str();
        check_name(name)?;
        if self.settings.framework != Framework::Pytorch {
            return Err(invalid(
                "transformers' models here are PyTorch's: restart the kernel with PyTorch",
            ));
        }
        let (label, mut config) = read_config(a.config.as_ref())?;
        if let Some(dtype) = a.dtype {
            config.dtype = dtype;
        }
        let quant = quant_of(a, config.dtype)?;
        if a.lora_rank.is_some() {
            return Err(invalid("peft's adapters are a line of their own: {\"cmd\": \"lora\", \"model\": ..., \"rank\": 16} (get_peft_model)"));
        }
        let params = parameters(&config);
        let from_pretrained = a.from_pretrained.unwrap_or(false) || quant.is_some();
        let steps = load_model(&config, &params, quant, from_pretrained);
        let asked: u128 = steps
            .iter()
            .map(|s| match s {
                LoadStep::Alloc { bytes, .. } => u128::from(*bytes),
                _ => 0,
            })
            .sum();
        if asked >= u128::from(TIB) {
            return Err(invalid(format!("{asked} bytes of weights is absurd")));
        }
        let count: u64 = params.iter().map(|t| t.numel()).sum();
        let mut frame = PyFrame::default();
        let model = frame.instance(&mut self.process, Class::Model, name);
        let mut state = HfModelState {
            label: label.clone(),
            config,
            lora: None,
            quant,
            prepared: false,
            tensors: Vec::new(),
            grads: Vec::new(),
        };
        let loaded = self.load_steps(model, name, &mut state, &steps);
        frame.take(model);
        if let Err(f) = loaded {
            let e = self.alloc_error(&f);
            self.process.drop_local(model);
            return Err(e);
        }
        let bytes = self.hf_bytes(&state);
        self.hf.models.insert(model, state);
        self.process.bind_local(name, model);
        let mut note = format!(
            "`{name}` is {label} ({}): {} parameters in {}",
            config.arch.causal_lm(),
            thousands(count),
            config.dtype.torch_name()
        );
        if quant.is_some() {
            note.push_str(", the decoder's linear layers quantized to 4 bits (bitsandbytes) from their copies, which went");
        }
        note.push_str(&format!(": {} on the device.", format_size(bytes)));
        Ok(Outcome {
            note: Some(note),
            // What `model.config` and `num_parameters()` read in Python.
            value: Some(json!({
                "architecture": config.arch.causal_lm(),
                "vocab_size": config.vocab,
                "hidden_size": config.hidden,
                "num_hidden_layers": config.layers,
                "max_position_embeddings": config.max_positions,
                "dtype": config.dtype.torch_name(),
                "parameters": count,
                "bytes": bytes,
            })),
        })
    }

    /// The bytes the model's tensors hold.
    fn hf_bytes(&self, state: &HfModelState) -> u64 {
        state
            .tensors
            .iter()
            .map(|(_, id)| self.process.block_size(*id))
            .sum()
    }

    /// Makes (and frees) the model's tensors as `steps` say, each held by
    /// `model`.
    fn load_steps(
        &mut self,
        model: ObjId,
        name: &str,
        state: &mut HfModelState,
        steps: &[LoadStep],
    ) -> Result<(), AllocFailure> {
        for s in steps {
            match s {
                LoadStep::Alloc { name: t, bytes } => {
                    let label = format!("{name}.{t}");
                    let id = self.process.alloc_tensor(
                        &label,
                        *bytes,
                        vec![*bytes],
                        Dtype::Uint8,
                        Category::Parameter,
                    )?;
                    self.process.attach_local(model, id);
                    state.tensors.push((t.clone(), id));
                }
                LoadStep::Free(t) => {
                    if let Some(i) = state.tensors.iter().rposition(|(n, _)| n == t) {
                        let (_, id) = state.tensors.remove(i);
                        self.process.detach(model, id);
                    }
                }
                LoadStep::EmptyCache => {
                    self.empty_cache();
                }
                LoadStep::Warmup(bytes) => self.warmup(*bytes)?,
            }
        }
        Ok(())
    }

    /// transformers' `caching_allocator_warmup` for a model of `bytes`: a
    /// float16 tensor as `warmup_request` sizes it, made and dropped.
    fn warmup(&mut self, bytes: u64) -> Result<(), AllocFailure> {
        let stats = self.process.allocator.stats();
        let (free, total) = self.process.device.mem_get_info();
        let ask = warmup_request(
            bytes,
            stats.reserved_bytes.current,
            stats.allocated_bytes.current,
            free,
            total,
        );
        if ask > 0 {
            let id = self.process.alloc_tensor(
                "caching_allocator_warmup",
                ask,
                vec![ask / 2],
                Dtype::Float16,
                Category::Temporary,
            )?;
            self.process.drop_local(id);
        }
        Ok(())
    }

    /// `model = prepare_model_for_kbit_training(model)`: a 4-bit model's
    /// other parameters upcast to float32, the cache emptied, gradient
    /// checkpointing on (reentrant, as peft asks for it).
    pub(super) fn prepare_kbit(&mut self, a: &ModelRef) -> Result<Outcome, CommandError> {
        let (id, mut state) = self.hf_entry(&a.model)?;
        if state.quant.is_none() || state.prepared {
            return Err(invalid(format!(
                "`{}` is not a 4-bit model waiting for prepare_model_for_kbit_training",
                a.model
            )));
        }
        let before = self.stats().allocated_bytes;
        let steps = kbit_prepare(&state.config, &parameters(&state.config));
        let done = self.load_steps(id, &a.model, &mut state, &steps);
        state.prepared = true;
        self.hf.models.insert(id, state);
        done.map_err(|f| self.alloc_error(&f))?;
        let after = self.stats().allocated_bytes;
        Ok(Outcome::note(format!(
            "prepare_model_for_kbit_training upcast every parameter that is not 4-bit to float32 (the embeddings and the output layer among them): allocated {} → {}, and it emptied the cache. Gradient checkpointing is on, reentrant.",
            format_size(before),
            format_size(after)
        )))
    }

    /// `model = get_peft_model(model, LoraConfig(r=rank, ...))`: peft's
    /// adapters beside the model type's targets (a 4-bit model's: every
    /// linear layer of the decoder), the rest frozen.
    pub(super) fn lora(&mut self, a: &LoraArgs) -> Result<Outcome, CommandError> {
        let (id, mut state) = self.hf_entry(&a.model)?;
        if state.lora.is_some() {
            return Err(invalid(format!("`{}` has LoRA adapters already", a.model)));
        }
        let quant = state.quant.is_some();
        if a.all_linear != quant {
            return Err(invalid(match quant {
                true => "vramlab's QLoRA puts adapters on every linear layer of the decoder: \"all_linear\": true (target_modules=\"all-linear\")",
                false => "vramlab's LoRA on a model in its own type takes peft's default target modules for its model type: leave out all_linear",
            }));
        }
        if a.rank == 0 || a.rank > state.config.hidden {
            return Err(invalid(format!(
                "rank is from 1 to the model's width ({})",
                state.config.hidden
            )));
        }
        let before = self.stats().allocated_bytes;
        let steps = lora_adapters(
            &state.config,
            &parameters(&state.config),
            a.rank,
            state.quant.is_some(),
        );
        let done = self.load_steps(id, &a.model, &mut state, &steps);
        state.lora = Some(a.rank);
        self.hf.models.insert(id, state);
        done.map_err(|f| self.alloc_error(&f))?;
        let after = self.stats().allocated_bytes;
        // The float32 adapters kept: their elements, as
        // `print_trainable_parameters` counts them.
        let kept: Vec<u64> = (steps.iter())
            .filter_map(|s| match s {
                LoadStep::Alloc { name, bytes } if name.ends_with(".weight") => Some(bytes / 4),
                _ => None,
            })
            .collect();
        let trainable: u64 = kept.iter().sum();
        Ok(Outcome {
            note: Some(format!(
                "peft added {} LoRA matrices of rank {} in float32 ({}); every other weight is frozen: no gradient, no optimizer state.",
                kept.len(),
                a.rank,
                format_size(after - before)
            )),
            value: Some(json!({ "trainable": trainable })),
        })
    }

    fn hf_entry(&self, name: &str) -> Result<(ObjId, HfModelState), CommandError> {
        let id = self.instance(name, Class::Model)?;
        let state = self.hf_state(name)?;
        Ok((id, state))
    }

    fn hf_state(&self, name: &str) -> Result<HfModelState, CommandError> {
        let id = self.instance(name, Class::Model)?;
        self.hf.models.get(&id).cloned().ok_or_else(|| {
            invalid(format!(
                "`{name}` is not a Hugging Face model: `generate` runs a model built with \"kind\": \"hf\""
            ))
        })
    }

    pub(super) fn generate(&mut self, a: &GenerateArgs) -> Result<Outcome, CommandError> {
        if let Some(name) = &a.name {
            check_name(name)?;
        }
        let model = self.hf_state(&a.model)?;
        let c = model.config;
        let mut frame = PyFrame::default();
        let (batch, prompt) = match &a.input_ids {
            Some(ids) => self.prompt_of(ids, a)?,
            None => (
                a.batch_size.unwrap_or(1),
                a.prompt_len.ok_or_else(|| {
                    invalid("give the prompt: `input_ids` (a tensor's name), or `prompt_len`")
                })?,
            ),
        };
        let g = Generation {
            batch,
            prompt,
            new_tokens: a.new_tokens,
            cache: a.cache,
            attention: a.attention,
        };
        generate::check(&c, g)?;
        // The prompt made for the call (unless named) and, unless the
        // caller passes one, the mask `generate` makes
        // (`_prepare_attention_mask_for_generation`), held by the call.
        if let Some(mask) = &a.attention_mask {
            if self.tensor_shape(mask)? != [batch, prompt] {
                return Err(invalid(format!(
                    "`{mask}` is not a {batch} x {prompt} attention mask for the prompt"
                )));
            }
        }
        let shape = [batch, prompt];
        let made = [
            a.input_ids.is_none().then_some("input_ids"),
            a.attention_mask.is_none().then_some("attention_mask"),
        ];
        for label in made.into_iter().flatten() {
            if let Err(f) = frame.alloc(
                &mut self.process,
                label,
                &shape,
                Dtype::Int64,
                Category::Input,
            ) {
                let e = self.alloc_error(&f);
                frame.finish(&mut self.process);
                return Err(e);
            }
        }
        let mut run = generate::Run::new(&c, c.dtype, g)?;
        let mut state = Played::default();
        let mut stopped = false;
        while !run.finished() && state.failure.is_none() {
            run.token(&mut self.sink(&mut frame, &mut state));
            let progress = super::Progress {
                done: run.done(),
                total: g.new_tokens,
                loss: None,
            };
            if state.failure.is_none() && !run.finished() && !self.report_progress(&progress) {
                stopped = true;
                break;
            }
        }
        if state.failure.is_none() {
            run.returns(&mut self.sink(&mut frame, &mut state));
        }
        let Played {
            failure,
            by_forward,
            kv_peak,
            slots,
            stack,
            ..
        } = state;
        if let Some(f) = failure {
            // The values waiting on the frames' stacks go as the exception
            // leaves them; their variables stay with the traceback.
            for &h in &stack {
                if let Some(Some((_, id))) = slots.get(h) {
                    frame.drop(&mut self.process, *id);
                }
            }
            let mut e = self.raise_in_frame(frame, &f);
            let made = by_forward.len();
            let when = match made {
                0 => "in the prefill (the forward over the prompt)".to_string(),
                n => format!("after {n} of its {} new tokens", g.new_tokens),
            };
            e.message.push_str(&format!(
                "\n(generate ran out {when}: the KV cache had grown to {}.)",
                format_size(kv_peak)
            ));
            return Err(e);
        }
        // What lives on is the sequences `generate` returns (the last
        // tensor made that lives).
        let out = slots.into_iter().flatten().max_by_key(|&(made, _)| made);
        if let (Some((_, out)), Some(name)) = (out, &a.name) {
            frame.take(out);
            self.process.bind_local(name, out);
        }
        frame.finish(&mut self.process);
        let peak = self.process.command_peak_allocated();
        let mut outcome = generated(a, g, &model, (&by_forward, peak), kv_peak);
        if stopped {
            outcome.note = outcome.note.map(|n| {
                format!(
                    "Stopped after {} of {} new tokens, as a stopping criterion stops it: the cache went and the sequences so far live on. {n}",
                    run.done(),
                    g.new_tokens
                )
            });
            if let Some(v) = outcome.value.as_mut().and_then(|v| v.as_object_mut()) {
                v.insert("stopped".into(), true.into());
                v.insert("new_tokens_made".into(), run.done().into());
            }
        }
        Ok(outcome)
    }

    /// The kernel as the sink of one token of `generate`.
    fn sink<'a>(&'a mut self, frame: &'a mut PyFrame, state: &'a mut Played) -> EngineSink<'a> {
        EngineSink {
            process: &mut self.process,
            cublas: &mut self.train.cublas,
            frame,
            state,
        }
    }

    /// The batch and prompt length of the tensor `ids` names.
    fn prompt_of(&self, ids: &str, a: &GenerateArgs) -> Result<(u64, u64), CommandError> {
        let [batch, prompt] = self.tensor_shape(ids)?[..] else {
            return Err(invalid(format!(
                "input_ids is (batch, prompt length): `{ids}` is not"
            )));
        };
        if a.batch_size.is_some_and(|b| b != batch) || a.prompt_len.is_some_and(|p| p != prompt) {
            return Err(invalid(format!(
                "`{ids}` is {batch} x {prompt}: leave out batch_size and prompt_len, or give its own"
            )));
        }
        Ok((batch, prompt))
    }

    /// The shape of the GPU tensor of token ids (or mask) `name` names.
    fn tensor_shape(&self, name: &str) -> Result<Vec<u64>, CommandError> {
        let id = self.lookup(name)?;
        let o = self.process.runtime.get(id).expect("bound objects exist");
        let ObjectKind::Tensor(t) = &o.kind else {
            return Err(invalid(format!(
                "`{name}` is a {}, not a tensor of token ids",
                o.kind.type_name()
            )));
        };
        if !matches!(t.dtype, Dtype::Int64 | Dtype::Int32) || t.block.is_none() {
            return Err(invalid(format!(
                "`{name}` is not token ids on the GPU (a CUDA tensor of torch.int64)"
            )));
        }
        Ok(t.shape.clone())
    }
}

/// bitsandbytes' 4-bit loading the `model` line asks for, computing in
/// the loading type (`bnb_4bit_compute_dtype`).
fn quant_of(a: &ModelArgs, compute: Dtype) -> Result<Option<Quant4>, CommandError> {
    let nf4 = match a.quantization.as_deref() {
        None => {
            if a.double_quant.is_some() {
                return Err(invalid(
                    "double_quant is for a model with \"quantization\": \"nf4\" or \"fp4\"",
                ));
            }
            return Ok(None);
        }
        Some("nf4") => true,
        Some("fp4") => false,
        Some(other) => {
            return Err(invalid(format!(
                "quantization is {other:?}: \"nf4\" or \"fp4\" (bnb_4bit_quant_type)"
            )))
        }
    };
    if a.dtype.is_none() {
        return Err(invalid("a 4-bit model names its compute type: give \"dtype\" (bnb_4bit_compute_dtype, and the type of what is not quantized)"));
    }
    Ok(Some(Quant4 {
        nf4,
        double_quant: a.double_quant.unwrap_or(true),
        compute,
    }))
}

/// The config a `model` line names: a shipped shape's, or its own.
fn read_config(config: Option<&Value>) -> Result<(String, HfConfig), CommandError> {
    match config {
        Some(Value::String(name)) => known::find(name)
            .map(|k| (k.name, k.config))
            .ok_or_else(|| {
                let names: Vec<String> = known::all().into_iter().map(|k| k.name).collect();
                invalid(format!("no shipped shape is called {name:?}: give its config.json, or one of {}", names.join(", ")))
            }),
        Some(v @ Value::Object(_)) => {
            let c = HfConfig::read(v)?;
            Ok((format!("a {}", c.arch.causal_lm()), c))
        }
        _ => Err(invalid(
            "a Hugging Face model needs \"config\": its config.json (an object) or a shipped shape's name",
        )),
    }
}

/// What `generate` did, in words and numbers.
fn generated(
    a: &GenerateArgs,
    g: Generation,
    model: &HfModelState,
    (by_forward, peak): (&[u64], u64),
    kv_peak: u64,
) -> Outcome {
    let top = by_forward.iter().copied().max().unwrap_or(0);
    let at = by_forward.iter().position(|&p| p == top).unwrap_or(0);
    let at = if at == 0 {
        "the prefill".to_string()
    } else {
        format!("new token {at}'s")
    };
    let held = match &a.name {
        Some(n) => format!(
            " `{n}` holds the {} x {} sequences.",
            g.batch,
            g.prompt + g.new_tokens
        ),
        None => String::new(),
    };
    let note = format!(
        "{} generated {} tokens for {} prompt(s) of {}: peak allocated {} (the largest forward: {at}, {}); the {} cache grew to {}, and generate freed it as it returned.{held}",
        model.label,
        g.new_tokens,
        g.batch,
        g.prompt,
        format_size(peak),
        format_size(top),
        match a.cache {
            Cache::Dynamic => "dynamic",
            Cache::Static => "static",
        },
        format_size(kv_peak),
    );
    Outcome {
        note: Some(note),
        value: Some(json!({
            "peak_allocated_bytes": peak,
            "peak_allocated_by_forward": by_forward,
            "kv_cache_peak_bytes": kv_peak,
        })),
    }
}

pub(super) fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn invalid(message: impl Into<String>) -> CommandError {
    error(ErrorKind::InvalidValue, message)
}
