//! One argument struct per command, with the defaults a field takes when it
//! is left out. Validation, execution and the Python pane take them whole.

use super::Amp;
use crate::error::Invalid;
use crate::train::kinds::{Attention, CnnShape, Norm, TransformerShape};
pub use crate::train::kv_cache::Cache;
use crate::train::spec::{Kind, ModelSpec};
use crate::train::OptimizerKind;
use crate::types::{Category, Dtype};
use serde::Serialize;

/// `x = torch.empty(...)` on the GPU: `bytes`, or `shape` and `dtype`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AllocArgs {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shape: Option<Vec<u64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dtype: Option<Dtype>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub category: Option<Category>,
}

/// `del x`, `sess = tf.compat.v1.Session()`, `sess.close()`: one name.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NameArgs {
    pub name: String,
}

/// `h = [x, y]` and, with `cycle`, `h.append(h)`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HoldArgs {
    pub name: String,
    pub items: Vec<String>,
    pub cycle: bool,
}

/// `y = x`: a second name for the object `value` names.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AssignArgs {
    pub name: String,
    pub value: String,
}

/// `h.append(x)`: the list `name` takes a reference to `item` (itself: a cycle).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AppendArgs {
    pub name: String,
    pub item: String,
}

/// `model = MLP(...).cuda()`: `layers` hidden layers of `width`; or a CNN
/// (`blocks` of convolutions, the first `width` channels wide, on images of
/// `channels` x `image_size` x `image_size`, into `classes`); or a
/// transformer (`layers` blocks `width` wide with `heads`, over `seq_len`
/// tokens of a `vocab`, the MLP `mlp_ratio` times wider). With `keras`
/// (always under TensorFlow) Keras's global state holds it too.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModelArgs {
    pub name: String,
    #[serde(skip_serializing_if = "ModelKind::is_mlp")]
    pub kind: ModelKind,
    pub layers: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub width: Option<u64>,
    pub input_dim: u64,
    pub classes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dtype: Option<Dtype>,
    pub keras: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heads: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq_len: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vocab: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mlp_ratio: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub norm: Option<Norm>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tied: Option<bool>,
    /// peft's LoRA adapters of this rank on every linear layer of the
    /// blocks, the rest frozen (a transformer's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lora_rank: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub channels: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_size: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocks: Option<u32>,
    /// A Hugging Face model (`kind: "hf"`): its config.json, or the name of
    /// a shipped shape (`"Llama-3.2-1B"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config: Option<serde_json::Value>,
    /// A Hugging Face model loaded in bitsandbytes' 4 bits, `"nf4"` or
    /// `"fp4"` (`BitsAndBytesConfig(load_in_4bit=True, ...)`), then readied
    /// by peft's `prepare_model_for_kbit_training`: QLoRA's model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quantization: Option<String>,
    /// `bnb_4bit_use_double_quant` (true when left out).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub double_quant: Option<bool>,
    /// A Hugging Face model loaded by `from_pretrained(...,
    /// device_map=...)` straight onto the GPU (always so with
    /// `quantization`): transformers' allocator warmup first, the
    /// checkpoint's tensors in its order. Otherwise `from_config(...)
    /// .to("cuda")`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from_pretrained: Option<bool>,
}

/// Which network `model` builds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    #[default]
    Mlp,
    Cnn,
    Transformer,
    /// A Hugging Face transformers model from its config.json
    /// (`AutoModelForCausalLM.from_config`).
    Hf,
}

vramlab_core::read_by_name!(ModelKind {
    Mlp = "mlp",
    Cnn = "cnn",
    Transformer = "transformer",
    Hf = "hf",
});

impl ModelKind {
    fn is_mlp(&self) -> bool {
        *self == ModelKind::Mlp
    }
}

/// The defaults a line that leaves every field out gets.
impl Default for ModelArgs {
    fn default() -> Self {
        ModelArgs {
            name: String::new(),
            kind: ModelKind::Mlp,
            layers: DEFAULT_LAYERS,
            width: None,
            input_dim: DEFAULT_FEATURES,
            classes: DEFAULT_CLASSES,
            dtype: None,
            keras: false,
            heads: None,
            seq_len: None,
            vocab: None,
            mlp_ratio: None,
            norm: None,
            tied: None,
            lora_rank: None,
            channels: None,
            image_size: None,
            blocks: None,
            config: None,
            quantization: None,
            double_quant: None,
            from_pretrained: None,
        }
    }
}

impl ModelArgs {
    /// An MLP of these sizes, the rest left to their defaults.
    pub fn mlp(name: &str, layers: u32, width: u64) -> Self {
        ModelArgs {
            name: name.into(),
            layers,
            width: Some(width),
            ..Default::default()
        }
    }

    /// The model these arguments build (its sizes unchecked), or what is
    /// wrong with them.
    pub fn spec(&self) -> Result<ModelSpec, Invalid> {
        let width = self.width();
        let dtype = self.dtype.unwrap_or(Dtype::Float32);
        if self.lora_rank.is_some() && self.kind != ModelKind::Transformer {
            return Err(
                "`lora_rank` wraps a transformer's linear layers: add \"kind\": \"transformer\""
                    .into(),
            );
        }
        let kind = match self.kind {
            ModelKind::Mlp => {
                let only = [
                    ("heads", self.heads),
                    ("seq_len", self.seq_len),
                    ("vocab", self.vocab),
                ];
                if let Some((field, _)) = only.iter().find(|(_, v)| v.is_some()) {
                    return Err(Invalid(format!(
                        "`{field}` is a transformer's: add \"kind\": \"transformer\""
                    )));
                }
                return Ok(ModelSpec::mlp(
                    self.layers,
                    width,
                    self.input_dim,
                    self.classes,
                    dtype,
                ));
            }
            ModelKind::Hf => {
                return Err(
                    "a Hugging Face model (kind \"hf\") runs on a server (`vramlab serve`) or in `vramlab run`: this build leaves it out".into(),
                )
            }
            ModelKind::Cnn => Kind::Cnn(CnnShape {
                channels: self.channels.unwrap_or(3),
                image_size: self.image_size.unwrap_or(32),
                blocks: self.blocks.unwrap_or(3),
                width,
                classes: self.classes,
            }),
            ModelKind::Transformer => Kind::Transformer(TransformerShape {
                layers: self.layers,
                width,
                heads: self.heads.unwrap_or((width / 64).max(1)),
                seq_len: self.seq_len.unwrap_or(1024),
                vocab: self.vocab.unwrap_or(50257),
                mlp_ratio: self.mlp_ratio.unwrap_or(4),
                norm: self.norm.unwrap_or_default(),
                tied: self.tied.unwrap_or(true),
                lora_rank: self.lora_rank.unwrap_or(0),
            }),
        };
        Ok(ModelSpec::of(kind, dtype))
    }

    /// The width given, or the kind's default: the MLP's hidden layers
    /// 1024, the transformer 768 (GPT-2 small), the CNN's first block 32.
    pub fn width(&self) -> u64 {
        self.width.unwrap_or(match self.kind {
            ModelKind::Mlp => DEFAULT_WIDTH,
            ModelKind::Transformer => 768,
            ModelKind::Cnn => 32,
            ModelKind::Hf => 0,
        })
    }
}

/// `opt = torch.optim.Adam(model.parameters())`, or with `bits: 8`
/// bitsandbytes' `bnb.optim.Adam8bit(...)`; state comes at the first step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OptimizerArgs {
    pub name: String,
    pub model: String,
    pub kind: OptimizerKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lr: Option<f32>,
    /// The state's bits: 32 (`torch.optim`) or 8 (bitsandbytes).
    #[serde(skip_serializing_if = "is_state_bits")]
    pub bits: u8,
}

/// `torch.optim`'s float32 state.
pub const STATE_BITS: u8 = 32;

fn is_state_bits(bits: &u8) -> bool {
    *bits == STATE_BITS
}

/// A synthetic, learnable classification set; `on_device` puts all of it on the GPU.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DataArgs {
    pub name: String,
    pub samples: u64,
    pub features: u64,
    pub classes: u64,
    pub on_device: bool,
}

/// `loss = criterion(model(x), y)`: the loss keeps the graph alive.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ForwardArgs {
    pub name: String,
    pub model: String,
    pub data: String,
    pub batch_size: u64,
    pub no_grad: bool,
    pub amp: Amp,
    pub checkpointing: bool,
    #[serde(skip_serializing_if = "Attention::is_eager")]
    pub attention: Attention,
    /// `model(x)` on tensors the code made (inputs, targets): the pass
    /// reads them where they are; without it the batch is copied in
    /// from `data`, as `model(x.cuda())` does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch: Option<Vec<String>>,
}

/// `loss.backward(retain_graph=...)`
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BackwardArgs {
    pub name: String,
    pub retain_graph: bool,
}

/// `opt.step()`
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepArgs {
    pub optimizer: String,
}

/// `opt.zero_grad(set_to_none=...)`
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ZeroGradArgs {
    pub optimizer: String,
    pub set_to_none: bool,
}

/// How the loop keeps its running loss.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LossHistory {
    /// `total_loss += loss.item()`: a Python float.
    #[default]
    Item,
    /// `total_loss += loss`: a tensor, one scalar on the GPU (its history
    /// is autograd's nodes, in host memory).
    Tensor,
    /// `losses.append(loss)`: every step's loss stays alive in the list.
    List,
}

vramlab_core::read_by_name!(LossHistory {
    Item = "item",
    Tensor = "tensor",
    List = "list",
});

impl LossHistory {
    pub const ALL: [LossHistory; 3] = [LossHistory::Item, LossHistory::Tensor, LossHistory::List];

    /// Its name in a command: `item`, `tensor`, `list`.
    pub fn id(self) -> &'static str {
        match self {
            LossHistory::Item => "item",
            LossHistory::Tensor => "tensor",
            LossHistory::List => "list",
        }
    }

    /// The line of the loop it stands for.
    pub fn code(self) -> &'static str {
        match self {
            LossHistory::Item => "total_loss += loss.item()",
            LossHistory::Tensor => "total_loss += loss",
            LossHistory::List => "losses.append(loss)",
        }
    }
}

/// The training loop.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TrainArgs {
    pub model: String,
    pub optimizer: String,
    pub data: String,
    pub steps: u64,
    pub batch_size: u64,
    pub accumulate: u64,
    pub checkpointing: bool,
    pub amp: Amp,
    pub set_to_none: bool,
    pub loss_history: LossHistory,
    #[serde(skip_serializing_if = "Attention::is_eager")]
    pub attention: Attention,
    /// JAX: `jax.jit(train_step, donate_argnums=(0, 1))`: the new
    /// parameters and state are written over the old.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub donate: bool,
    /// TensorFlow: Keras's `model.compile(jit_compile=...)`. On (Keras's
    /// `"auto"` on a GPU), XLA compiles the step; off, TensorFlow's
    /// executor runs its graph op by op.
    #[serde(skip_serializing_if = "is_true")]
    pub jit_compile: bool,
}

impl TrainArgs {
    /// A loop with no technique turned on: one micro-batch a step, no
    /// checkpointing or autocast, `zero_grad(set_to_none=True)`, `loss.item()`.
    pub fn plain(model: &str, optimizer: &str, data: &str, steps: u64, batch_size: u64) -> Self {
        TrainArgs {
            model: model.into(),
            optimizer: optimizer.into(),
            data: data.into(),
            steps,
            batch_size,
            accumulate: 1,
            checkpointing: false,
            amp: Amp::Off,
            set_to_none: true,
            loss_history: LossHistory::Item,
            attention: Attention::Eager,
            donate: false,
            jit_compile: true,
        }
    }
}

/// The largest batch whose step peak stays under `threshold` of the memory
/// limit, with the techniques a `train` would use.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FindBatchSizeArgs {
    pub model: String,
    pub optimizer: String,
    pub data: String,
    pub threshold: f64,
    #[serde(default, skip_serializing_if = "is_default")]
    pub amp: Amp,
    #[serde(default, skip_serializing_if = "is_default")]
    pub checkpointing: bool,
    #[serde(default, skip_serializing_if = "is_default")]
    pub attention: Attention,
}

fn is_true(b: &bool) -> bool {
    *b
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

/// `name = model.generate(input_ids, max_new_tokens=new_tokens)` under
/// `no_grad`, greedy: a Hugging Face model's prefill over the prompt, then
/// one forward per new token. The prompt is the tensor `input_ids` names
/// (batch x prompt length, int64), or `torch.randint(...)` of
/// `batch_size` x `prompt_len` made for the call.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GenerateArgs {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub model: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_ids: Option<String>,
    /// The mask the caller passes (a tensor's name); without one,
    /// `generate` makes its own ones for the call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attention_mask: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_size: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_len: Option<u64>,
    pub new_tokens: u64,
    pub cache: Cache,
    pub attention: Attention,
}

/// A command on one model: `prepare_model_for_kbit_training(model)`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModelRef {
    pub model: String,
}

/// `model = get_peft_model(model, LoraConfig(r=rank, ...))` on a Hugging
/// Face model.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LoraArgs {
    pub model: String,
    pub rank: u64,
    /// `target_modules="all-linear"` (QLoRA's recipe); else peft's
    /// defaults for the model type.
    pub all_linear: bool,
}

/// transformers' `max_new_tokens` when none is given (its generation
/// config's `max_length` of 20, counted as new tokens here).
pub const DEFAULT_NEW_TOKENS: u64 = 20;

/// Predicts a training step's memory from the shapes, before running it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EstimateArgs {
    pub model: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub optimizer: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    pub batch_size: u64,
    pub accumulate: u64,
    pub amp: Amp,
    pub checkpointing: bool,
    pub set_to_none: bool,
    #[serde(skip_serializing_if = "Attention::is_eager")]
    pub attention: Attention,
}

/// Hidden layers of a model when `layers` is left out.
pub const DEFAULT_LAYERS: u32 = 4;
/// Hidden width when `width` is left out.
pub const DEFAULT_WIDTH: u64 = 1024;
/// Input features (MNIST's 784) when `input_dim`/`features` is left out.
pub const DEFAULT_FEATURES: u64 = 784;
/// Classes when `classes` is left out.
pub const DEFAULT_CLASSES: u64 = 10;
/// Dataset size when `samples` is left out.
pub const DEFAULT_SAMPLES: u64 = 60_000;
/// Batch size when `batch_size` is left out.
pub const DEFAULT_BATCH: u64 = 64;
/// Training steps when `steps` is left out.
pub const DEFAULT_STEPS: u64 = 10;
/// `find_batch_size`'s share of the memory limit when `threshold` is left out.
pub const DEFAULT_THRESHOLD: f64 = 0.8;

/// `llm = LLM(model=..., gpu_memory_utilization=..., ...)`: vLLM 0.33.0's
/// engine started in a process of its own on this GPU
/// (`hf::serve`); unset settings take `vllm serve`'s defaults on
/// the kernel's card.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ServeArgs {
    pub name: String,
    /// A shipped shape's name or its Hugging Face repository, or a
    /// config.json's object.
    pub model: serde_json::Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_memory_utilization: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_model_len: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_num_seqs: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_num_batched_tokens: Option<u64>,
    /// `auto` (the weights' type) or `fp8`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_cache_dtype: Option<String>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub enforce_eager: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dtype: Option<Dtype>,
}
