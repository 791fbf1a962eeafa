//! Training: build a model, an optimizer and data, then run forward,
//! backward, the optimizer, or whole training loops.

use super::{
    busy_button, button, checkbox, checked_button, choice, hidden, pow2_slider, text_input,
};
use crate::playground::state::App;
use leptos::prelude::*;
use std::ops::RangeInclusive;
use vramlab_shared::command::{
    Amp, BackwardArgs, Command, DataArgs, EstimateArgs, FindBatchSizeArgs, ForwardArgs,
    LossHistory, ModelArgs, ModelKind, NameArgs, OptimizerArgs, StepArgs, TrainArgs, ZeroGradArgs,
    DEFAULT_CLASSES, DEFAULT_FEATURES, DEFAULT_SAMPLES, DEFAULT_THRESHOLD, STATE_BITS,
};
use vramlab_shared::engine::{MAX_BATCH_SIZE, MAX_TRAIN_STEPS};
use vramlab_shared::input;
use vramlab_shared::train::kinds::{Attention, Norm};
use vramlab_shared::train::{OptimizerKind, MAX_LAYERS, MAX_WIDTH};
use vramlab_shared::Invalid;

const PAGE_LAYERS: u64 = 8;
const PAGE_WIDTH: u64 = 512;
const PAGE_BATCH: u64 = 1024;

/// The training fields.
#[derive(Clone, Copy)]
struct Fields {
    kind: RwSignal<ModelKind>,
    /// A transformer's sequence length and vocabulary; a CNN's image side.
    seq_len: RwSignal<String>,
    vocab: RwSignal<String>,
    image_size: RwSignal<String>,
    /// A transformer's attention is the fused kernel (`sdpa`).
    fused: RwSignal<bool>,
    /// A transformer's LoRA rank (0: none).
    lora_rank: RwSignal<String>,
    /// A transformer's heads (empty: width / 64), MLP ratio, RMSNorm for
    /// LayerNorm, and head tied to the token embedding.
    heads: RwSignal<String>,
    mlp_ratio: RwSignal<String>,
    rms_norm: RwSignal<bool>,
    tied: RwSignal<bool>,
    /// A CNN's image channels.
    channels: RwSignal<String>,
    layers: RwSignal<String>,
    width: RwSignal<String>,
    batch: RwSignal<String>,
    steps: RwSignal<String>,
    optimizer: RwSignal<OptimizerKind>,
    /// The optimizer's state bits: 32, or bitsandbytes' 8.
    bits: RwSignal<u8>,
    accumulate: RwSignal<String>,
    amp: RwSignal<Amp>,
    checkpointing: RwSignal<bool>,
    set_to_none: RwSignal<bool>,
    loss_history: RwSignal<LossHistory>,
    on_device: RwSignal<bool>,
    no_grad: RwSignal<bool>,
    /// JAX: `jax.jit(..., donate_argnums=(0, 1))`.
    donate: RwSignal<bool>,
    /// The kind "Build" last built.
    built: RwSignal<Option<ModelKind>>,
}

/// The whole number in a field, or why it is not one in `range`.
fn number(s: RwSignal<String>, what: &str, range: RangeInclusive<u64>) -> Result<u64, Invalid> {
    input::whole(&s.get_untracked(), what, range)
}

impl Fields {
    fn new() -> Self {
        let text = |s: &str| RwSignal::new(s.to_string());
        let number = |n: u64| RwSignal::new(n.to_string());
        // The page's model: deep and wide enough, at a batch large enough,
        // that batch size, amp, checkpointing and accumulation each move the
        // step's peak by megabytes (on the command line's 4 x 1024 at batch
        // 64, Adam's step sets the peak and hides them).
        Fields {
            kind: RwSignal::new(ModelKind::Mlp),
            seq_len: text("512"),
            vocab: text("8000"),
            image_size: text("64"),
            fused: RwSignal::new(false),
            lora_rank: text("0"),
            heads: text(""),
            mlp_ratio: text("4"),
            rms_norm: RwSignal::new(false),
            tied: RwSignal::new(true),
            channels: text("3"),
            layers: number(PAGE_LAYERS),
            width: number(PAGE_WIDTH),
            batch: number(PAGE_BATCH),
            steps: text("100"),
            optimizer: RwSignal::new(OptimizerKind::Adam),
            bits: RwSignal::new(STATE_BITS),
            accumulate: text("1"),
            amp: RwSignal::new(Amp::Off),
            checkpointing: RwSignal::new(false),
            set_to_none: RwSignal::new(true),
            loss_history: RwSignal::new(LossHistory::Item),
            on_device: RwSignal::new(false),
            no_grad: RwSignal::new(false),
            donate: RwSignal::new(false),
            built: RwSignal::new(None),
        }
    }

    /// Fused attention when ticked, for a transformer (the other kinds
    /// have none).
    fn attention(&self) -> Attention {
        if self.fused.get_untracked() && self.kind.get_untracked() == ModelKind::Transformer {
            Attention::Sdpa
        } else {
            Attention::Eager
        }
    }

    fn batch_size(&self) -> Result<u64, Invalid> {
        number(self.batch, "batch", 1..=MAX_BATCH_SIZE)
    }

    fn accumulate(&self) -> Result<u64, Invalid> {
        number(self.accumulate, "accumulate", 1..=MAX_BATCH_SIZE)
    }

    /// A new kind: sizes that fit it (a transformer at batch 1024 would
    /// not fit anywhere).
    fn set_kind(&self, kind: ModelKind) {
        let (layers, width, batch) = match kind {
            ModelKind::Mlp => (PAGE_LAYERS, PAGE_WIDTH, PAGE_BATCH),
            ModelKind::Cnn => (3, 32, 64),
            ModelKind::Transformer | ModelKind::Hf => (4, 256, 8),
        };
        self.kind.set(kind);
        for (field, n) in [
            (self.layers, layers),
            (self.width, width),
            (self.batch, batch),
        ] {
            field.set(n.to_string());
        }
    }

    /// The model, and the data's features and classes that fit it.
    fn model(&self) -> Result<(ModelArgs, u64, u64), Invalid> {
        let layers = number(self.layers, "layers", 1..=MAX_LAYERS.into())?;
        let mut m = ModelArgs::mlp(
            "model",
            u32::try_from(layers).unwrap_or(MAX_LAYERS),
            number(self.width, "width", 1..=MAX_WIDTH)?,
        );
        m.kind = self.kind.get_untracked();
        Ok(match m.kind {
            ModelKind::Hf => {
                return Err("a Hugging Face model is loaded in the Generate panel".into())
            }
            ModelKind::Mlp => (m, DEFAULT_FEATURES, DEFAULT_CLASSES),
            ModelKind::Cnn => {
                let side = number(self.image_size, "image size", 1..=8192)?;
                let channels = number(self.channels, "channels", 1..=4096)?;
                m.blocks = Some(m.layers);
                (m.image_size, m.channels) = (Some(side), Some(channels));
                (m, channels * side * side, DEFAULT_CLASSES)
            }
            ModelKind::Transformer => {
                let seq_len = number(self.seq_len, "sequence length", 1..=1 << 20)?;
                let vocab = number(self.vocab, "vocabulary", 1..=1 << 22)?;
                (m.seq_len, m.vocab) = (Some(seq_len), Some(vocab));
                let rank = number(self.lora_rank, "LoRA rank", 0..=m.width())?;
                m.lora_rank = (rank > 0).then_some(rank);
                if !self.heads.get_untracked().trim().is_empty() {
                    m.heads = Some(number(self.heads, "heads", 1..=1024)?);
                }
                m.mlp_ratio = Some(number(self.mlp_ratio, "MLP ratio", 1..=64)?);
                let rms = self.rms_norm.get_untracked();
                m.norm = Some(if rms { Norm::RmsNorm } else { Norm::LayerNorm });
                m.tied = Some(self.tied.get_untracked());
                (m, seq_len, vocab)
            }
        })
    }

    /// `model`, `opt` and `data`, in that order.
    fn build(&self) -> Result<Vec<Command>, Invalid> {
        let (model, features, classes) = self.model()?;
        self.built.set(Some(model.kind));
        let model = Command::Model(model);
        let optimizer = Command::Optimizer(OptimizerArgs {
            name: "opt".into(),
            model: "model".into(),
            kind: self.optimizer.get_untracked(),
            lr: None,
            bits: self.bits.get_untracked(),
        });
        let data = Command::Data(DataArgs {
            name: "data".into(),
            samples: DEFAULT_SAMPLES,
            features,
            classes,
            on_device: self.on_device.get_untracked(),
        });
        Ok(vec![model, optimizer, data])
    }

    fn train(&self, steps: u64) -> Result<Vec<Command>, Invalid> {
        Ok(vec![Command::Train(TrainArgs {
            model: "model".into(),
            optimizer: "opt".into(),
            data: "data".into(),
            steps,
            batch_size: self.batch_size()?,
            accumulate: self.accumulate()?,
            checkpointing: self.checkpointing.get_untracked(),
            amp: self.amp.get_untracked(),
            set_to_none: self.set_to_none.get_untracked(),
            loss_history: self.loss_history.get_untracked(),
            attention: self.attention(),
            donate: self.donate.get_untracked(),
            jit_compile: true,
        })])
    }

    fn forward(&self) -> Result<Vec<Command>, Invalid> {
        Ok(vec![Command::Forward(ForwardArgs {
            name: "loss".into(),
            model: "model".into(),
            data: "data".into(),
            batch_size: self.batch_size()?,
            no_grad: self.no_grad.get_untracked(),
            amp: self.amp.get_untracked(),
            checkpointing: self.checkpointing.get_untracked(),
            attention: self.attention(),
            ..Default::default()
        })])
    }

    fn estimate(&self) -> Result<Vec<Command>, Invalid> {
        Ok(vec![Command::Estimate(EstimateArgs {
            model: "model".into(),
            optimizer: Some("opt".into()),
            data: Some("data".into()),
            batch_size: self.batch_size()?,
            accumulate: self.accumulate()?,
            amp: self.amp.get_untracked(),
            checkpointing: self.checkpointing.get_untracked(),
            set_to_none: self.set_to_none.get_untracked(),
            attention: self.attention(),
        })])
    }
}

/// The largest batch with the techniques ticked.
fn find_batch_size(f: Fields) -> Command {
    Command::FindBatchSize(FindBatchSizeArgs {
        model: "model".into(),
        optimizer: "opt".into(),
        data: "data".into(),
        threshold: DEFAULT_THRESHOLD,
        amp: f.amp.get_untracked(),
        checkpointing: f.checkpointing.get_untracked(),
        attention: f.attention(),
    })
}

#[component]
pub fn Training(app: App) -> impl IntoView {
    let f = Fields::new();
    // ▶ play: each step goes out when the run says it is due.
    Effect::new(move |_| {
        app.play.due.track();
        if let Some(line) = app.play.next_line() {
            app.play.sent(app.submit_quietly(line));
        }
    });
    // `adam8` is bitsandbytes' `Adam8bit`.
    let on_optimizer = move |e| {
        let value = event_target_value(&e);
        let (id, bits) = value
            .strip_suffix('8')
            .map_or((value.as_str(), STATE_BITS), |id| (id, 8));
        if let Some(k) = OptimizerKind::from_id(id) {
            f.optimizer.set(k);
            f.bits.set(bits);
        }
    };
    let optimizer_value = move || {
        let eight = if f.bits.get() == 8 { "8" } else { "" };
        format!("{}{eight}", f.optimizer.get().id())
    };
    let backward = || {
        Command::Backward(BackwardArgs {
            name: "loss".into(),
            retain_graph: false,
        })
    };
    let step = || {
        Command::Step(StepArgs {
            optimizer: "opt".into(),
        })
    };
    let zero_grad = move || {
        Command::ZeroGrad(ZeroGradArgs {
            optimizer: "opt".into(),
            set_to_none: f.set_to_none.get_untracked(),
        })
    };
    let session = |name: &str| NameArgs { name: name.into() };
    view! {
        <fieldset hidden=hidden(app, "training")>
            <legend>"Training"</legend>
            <ModelKindControls app=app f=f />
            <label>"Layers " {text_input("layers", "3", "", f.layers)}</label>
            <label>"Width " {text_input("width", "5", "", f.width)}</label>
            <label>"Optimizer "
                <select id="optimizer" prop:value=optimizer_value on:change=on_optimizer>
                    <option value="sgd">"SGD"</option><option value="momentum">"SGD + momentum"</option>
                    <option value="adam">"Adam"</option><option value="adamw">"AdamW"</option>
                    <option value="adam8">"Adam 8-bit (bitsandbytes)"</option><option value="adamw8">"AdamW 8-bit (bitsandbytes)"</option>
                </select>
            </label>
            <label>{checkbox(f.on_device)}" data on the GPU"</label>
            {checked_button(app, "btn-build", "Build model, optimizer, data", "model = MLP(...); opt = ...; data on the host or the GPU", move || f.build())}
            <br />
            <label>"Batch " {text_input("batch", "5", "", f.batch)}</label>
            {pow2_slider("batch-slider", "batch size", (0, 14), f.batch)}
            <label>"Accumulate " {text_input("accumulate", "2", "", f.accumulate)}</label>
            <label>"amp " {choice("amp", "torch.autocast('cuda', dtype=...) around the forward pass", f.amp, &Amp::ALL, (Amp::id, Amp::id))}</label>
            <label>{checkbox(f.checkpointing)}" checkpointing"</label>
            <label>{checkbox(f.set_to_none)}" set_to_none"</label>
            <label>{checkbox(f.donate)}" donate (JAX)"</label>
            <label>"loss " {choice("loss-history", "What the loop keeps of each step's loss", f.loss_history, &LossHistory::ALL, (LossHistory::id, LossHistory::code))}</label>
            <label>{checkbox(f.no_grad)}" no_grad (forward)"</label>
            <br />
            {checked_button(app, "btn-forward", "forward", "loss = criterion(model(x), y)", move || f.forward())}
            {button(app, "btn-backward", "backward", "loss.backward()", backward)}
            {button(app, "btn-step", "step", "opt.step()", step)}
            {button(app, "btn-zero-grad", "zero_grad", "opt.zero_grad()", zero_grad)}
            {checked_button(app, "btn-train-1", "1 step", "One training step", move || f.train(1))}
            <label>"Steps " {text_input("steps", "5", "", f.steps)}</label>
            <PlayControls app=app f=f />
            <br />
            {checked_button(app, "btn-estimate", "estimate", "Predict the step's memory before running it", move || f.estimate())}
            {button(app, "btn-find-batch", "find batch size", "The largest batch whose step stays under 80% of the memory limit, with the techniques ticked", move || find_batch_size(f))}
            {button(app, "btn-tf-session", "tf.Session()", "TensorFlow 1: models built now belong to the session", move || Command::TfSession(session("sess")))}
            {button(app, "btn-close-session", "sess.close()", "Close the TF1 session", move || Command::Close(session("sess")))}
            <button id="btn-pause" disabled=move || app.read_only() on:click=move |_| crate::playground::stopping::stop(app)>"❚❚ pause"</button>
        </fieldset>
    }
}

/// The model's kind and the sizes only a CNN or a transformer has.
#[component]
fn ModelKindControls(app: App, f: Fields) -> impl IntoView {
    // A transformer's positions are its model's (the position embedding
    // has one row each): a new sequence length builds it again, as a
    // notebook runs its model's cell again.
    let sequence_moved = move |_| {
        let ready = app
            .link
            .status
            .with_untracked(crate::playground::state::Status::is_ready);
        if ready && f.built.get_untracked() == Some(ModelKind::Transformer) {
            if let Ok(cmds) = f.build() {
                cmds.into_iter().for_each(|c| app.run(c));
            }
        }
    };
    let on_kind = move |e| {
        let kind = match event_target_value(&e).as_str() {
            "cnn" => ModelKind::Cnn,
            "transformer" => ModelKind::Transformer,
            _ => ModelKind::Mlp,
        };
        f.set_kind(kind);
    };
    let is = move |k| f.kind.get() == k;
    view! {
            <label>"Model "
                <select id="model-kind" on:change=on_kind>
                    <option value="mlp">"MLP"</option><option value="cnn">"CNN"</option>
                    <option value="transformer">"transformer"</option>
                </select>
            </label>
            <span hidden=move || !is(ModelKind::Cnn)>
                <label>"Image " {text_input("image-size", "4", "", f.image_size)}</label>
                <label>"Channels " {text_input("channels", "3", "", f.channels)}</label>
            </span>
            <span hidden=move || !is(ModelKind::Transformer)>
                <label>"Sequence " {text_input("seq-len", "5", "", f.seq_len)}</label>
                <span on:change=sequence_moved>{pow2_slider("seq-slider", "sequence length", (4, 15), f.seq_len)}</span>
                <label>"Vocabulary " {text_input("vocab", "6", "", f.vocab)}</label>
                <label>"Heads " {text_input("heads", "3", "auto", f.heads)}</label>
                <label>"MLP ratio " {text_input("mlp-ratio", "2", "", f.mlp_ratio)}</label>
                <label>{checkbox(f.rms_norm)}" RMSNorm"</label>
                <label>{checkbox(f.tied)}" tied head"</label>
                <label>{checkbox(f.fused)}" fused attention (sdpa)"</label>
                <label title="peft's LoRA adapters of this rank on every block's linear layers, the rest frozen; 0 for none">"LoRA rank " {text_input("lora-rank", "3", "", f.lora_rank)}</label>
            </span>
    }
}

/// ▶ play, its pace, and the loss curve.
#[component]
fn PlayControls(app: App, f: Fields) -> impl IntoView {
    view! {
            {busy_button(app, "btn-play", ("▶ play", "▶ playing…"), Signal::derive(move || app.play.left.get() > 0), "Train step by step, each step's numbers on screen", move || {
                let steps = number(f.steps, "steps", 1..=MAX_TRAIN_STEPS)?;
                if let Some(Command::Train(args)) = f.train(steps)?.pop() {
                    let train = Command::Train(args.clone());
                    app.cell.record_command(&train, app.framework());
                    app.outbox.code.update(|c| { let code = vramlab_shared::python::code_after(&c.join("\n"), &train, app.framework()); c.push(code) });
                    app.play.begin(args);
                }
                Ok(Vec::new())
            })}
            <label>"pace "
                <select id="play-speed" on:change=move |e| app.play.every_ms.set(event_target_value(&e).parse().unwrap_or(100))>
                    <option value="500">"2 steps/s"</option>
                    <option value="100" selected>"10 steps/s"</option>
                    <option value="20">"50 steps/s"</option>
                    <option value="0">"as fast as it answers"</option>
                </select>
            </label>
            <LossCurve app=app kind=f.kind />
    }
}

/// The loss of each step played, or why there is none.
#[component]
fn LossCurve(app: App, kind: RwSignal<ModelKind>) -> impl IntoView {
    const W: f64 = 240.0;
    const H: f64 = 60.0;
    let play = app.play;
    let points = move || {
        play.losses.with(|ls| {
            let (low, high) = ls
                .iter()
                .fold((f64::MAX, f64::MIN), |(a, b), &l| (a.min(l), b.max(l)));
            let span = (high - low).max(1e-9);
            let n = (ls.len().max(2) - 1) as f64;
            ls.iter()
                .enumerate()
                .map(|(i, l)| {
                    format!(
                        "{:.1},{:.1}",
                        i as f64 / n * W,
                        H - 4.0 - (l - low) / span * (H - 8.0)
                    )
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
    };
    let words = move || {
        let done = play.done.get();
        let losses = play.losses.get();
        if let Some(why) = play.refused.get() {
            return format!("stopped after {done} of {} steps: {why}", play.total.get());
        }
        match (losses.first(), losses.last()) {
            (Some(a), Some(b)) => format!("step {done} of {}: loss {a:.4} → {b:.4}", play.total.get()),
            _ if play.shape_only.get() => format!(
                "step {done} of {}: shape-only (this model's step is too big to compute here), so there is no loss to plot; {} compute it.",
                play.total.get(),
                match kind.get() {
                    ModelKind::Mlp => "2 layers of 128 at batch 32",
                    ModelKind::Transformer | ModelKind::Hf => "1 layer of width 32, sequence 16 and vocabulary 64 at batch 8",
                    ModelKind::Cnn => "2 blocks of width 8 on 16x16 images at batch 8",
                }
            ),
            _ => String::new(),
        }
    };
    view! {
        <div class="loss" hidden=move || play.total.get() == 0>
            <p id="play-status" aria-live="polite">{words}</p>
            <svg id="loss-curve" viewBox=format!("0 0 {W} {H}") role="img" aria-label="the loss of each step played"
                hidden=move || play.losses.with(Vec::is_empty)>
                <polyline points=points fill="none" stroke="#d55e00" stroke-width="2" />
            </svg>
        </div>
    }
}
