//! The argument structs with the most fields, read by hand through
//! [`fields`](crate::fields) (serde's derived readers for them are a large
//! part of the page's download). As with the derived readers, a missing
//! field takes its default, an unknown one is refused with the list of
//! those the command knows.

use super::args::*;
use super::Amp;
use crate::fields::{self, Fields};
use crate::train::kinds::Attention;
use serde::{Deserialize, Deserializer};
use serde_json::Error;

macro_rules! read_by_hand {
    ($($cmd:literal: $t:ident => $read:ident, $fields:ident),* $(,)?) => {
        $(impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                fields::read(d, $read)
            }
        })*

        /// The fields of the commands read here, by command name (the
        /// others' readers are serde's derive, which names its fields to
        /// the deserializer).
        pub const FIELDS_BY_HAND: &[(&str, &[&str])] = &[$(($cmd, $fields)),*];
    };
}

read_by_hand! {
    "del": NameArgs => name, NAME,
    "hold": HoldArgs => hold, HOLD,
    "assign": AssignArgs => assign, ASSIGN,
    "append": AppendArgs => append, APPEND,
    "optimizer": OptimizerArgs => optimizer, OPTIMIZER,
    "backward": BackwardArgs => backward, BACKWARD,
    "step": StepArgs => step, STEP,
    "zero_grad": ZeroGradArgs => zero_grad, ZERO_GRAD,
    "find_batch_size": FindBatchSizeArgs => find_batch_size, FIND_BATCH_SIZE,
    "alloc": AllocArgs => alloc, ALLOC,
    "model": ModelArgs => model, MODEL,
    "data": DataArgs => data, DATA,
    "forward": ForwardArgs => forward, FORWARD,
    "train": TrainArgs => train, TRAIN,
    "estimate": EstimateArgs => estimate, ESTIMATE,
    "generate": GenerateArgs => generate, GENERATE,
    "prepare_kbit": ModelRef => model_ref, MODEL_REF,
    "lora": LoraArgs => lora, LORA,
    "serve": ServeArgs => serve, SERVE,
}

const NAME: &[&str] = &["name"];
const HOLD: &[&str] = &["name", "items", "cycle"];
const ASSIGN: &[&str] = &["name", "value"];
const APPEND: &[&str] = &["name", "item"];
const OPTIMIZER: &[&str] = &["name", "model", "kind", "lr", "bits"];
const BACKWARD: &[&str] = &["name", "retain_graph"];
const STEP: &[&str] = &["optimizer"];
const ZERO_GRAD: &[&str] = &["optimizer", "set_to_none"];
const FIND_BATCH_SIZE: &[&str] = &[
    "model",
    "optimizer",
    "data",
    "threshold",
    "amp",
    "checkpointing",
    "attention",
];
const ALLOC: &[&str] = &["name", "bytes", "shape", "dtype", "category"];

fn name(f: &mut Fields) -> Result<NameArgs, Error> {
    let a = NameArgs {
        name: f.take("name")?,
    };
    f.done(NAME)?;
    Ok(a)
}

fn hold(f: &mut Fields) -> Result<HoldArgs, Error> {
    let a = HoldArgs {
        name: f.take("name")?,
        items: f.take("items")?,
        cycle: f.take_or("cycle", false)?,
    };
    f.done(HOLD)?;
    Ok(a)
}

fn assign(f: &mut Fields) -> Result<AssignArgs, Error> {
    let a = AssignArgs {
        name: f.take("name")?,
        value: f.take("value")?,
    };
    f.done(ASSIGN)?;
    Ok(a)
}

fn append(f: &mut Fields) -> Result<AppendArgs, Error> {
    let a = AppendArgs {
        name: f.take("name")?,
        item: f.take("item")?,
    };
    f.done(APPEND)?;
    Ok(a)
}

fn optimizer(f: &mut Fields) -> Result<OptimizerArgs, Error> {
    let a = OptimizerArgs {
        name: f.take("name")?,
        model: f.take("model")?,
        kind: f.take("kind")?,
        lr: f.take("lr")?,
        bits: f.take_or("bits", STATE_BITS)?,
    };
    f.done(OPTIMIZER)?;
    Ok(a)
}

fn backward(f: &mut Fields) -> Result<BackwardArgs, Error> {
    let a = BackwardArgs {
        name: f.take("name")?,
        retain_graph: f.take_or("retain_graph", false)?,
    };
    f.done(BACKWARD)?;
    Ok(a)
}

fn step(f: &mut Fields) -> Result<StepArgs, Error> {
    let a = StepArgs {
        optimizer: f.take("optimizer")?,
    };
    f.done(STEP)?;
    Ok(a)
}

fn zero_grad(f: &mut Fields) -> Result<ZeroGradArgs, Error> {
    let a = ZeroGradArgs {
        optimizer: f.take("optimizer")?,
        set_to_none: f.take_or("set_to_none", true)?,
    };
    f.done(ZERO_GRAD)?;
    Ok(a)
}

fn find_batch_size(f: &mut Fields) -> Result<FindBatchSizeArgs, Error> {
    let a = FindBatchSizeArgs {
        model: f.take("model")?,
        optimizer: f.take("optimizer")?,
        data: f.take("data")?,
        threshold: f.take_or("threshold", DEFAULT_THRESHOLD)?,
        amp: f.take_or("amp", Amp::Off)?,
        checkpointing: f.take_or("checkpointing", false)?,
        attention: f.take_or("attention", Default::default())?,
    };
    f.done(FIND_BATCH_SIZE)?;
    Ok(a)
}
const DATA: &[&str] = &["name", "samples", "features", "classes", "on_device"];

fn alloc(f: &mut Fields) -> Result<AllocArgs, Error> {
    let a = AllocArgs {
        name: f.take("name")?,
        bytes: f.take("bytes")?,
        shape: f.take("shape")?,
        dtype: f.take("dtype")?,
        category: f.take("category")?,
    };
    f.done(ALLOC)?;
    Ok(a)
}

const MODEL: &[&str] = &[
    "name",
    "kind",
    "layers",
    "width",
    "input_dim",
    "classes",
    "dtype",
    "keras",
    "heads",
    "seq_len",
    "vocab",
    "mlp_ratio",
    "norm",
    "tied",
    "lora_rank",
    "channels",
    "image_size",
    "blocks",
    "config",
    "quantization",
    "double_quant",
    "from_pretrained",
];

fn model(f: &mut Fields) -> Result<ModelArgs, Error> {
    let a = ModelArgs {
        name: f.take("name")?,
        kind: f.take_or("kind", ModelKind::Mlp)?,
        layers: f.take_or("layers", DEFAULT_LAYERS)?,
        width: f.take("width")?,
        input_dim: f.take_or("input_dim", DEFAULT_FEATURES)?,
        classes: f.take_or("classes", DEFAULT_CLASSES)?,
        dtype: f.take("dtype")?,
        keras: f.take_or("keras", false)?,
        heads: f.take("heads")?,
        seq_len: f.take("seq_len")?,
        vocab: f.take("vocab")?,
        mlp_ratio: f.take("mlp_ratio")?,
        norm: f.take("norm")?,
        tied: f.take("tied")?,
        lora_rank: f.take("lora_rank")?,
        channels: f.take("channels")?,
        image_size: f.take("image_size")?,
        blocks: f.take("blocks")?,
        config: f.take("config")?,
        quantization: f.take("quantization")?,
        double_quant: f.take("double_quant")?,
        from_pretrained: f.take("from_pretrained")?,
    };
    f.done(MODEL)?;
    Ok(a)
}

fn data(f: &mut Fields) -> Result<DataArgs, Error> {
    let a = DataArgs {
        name: f.take("name")?,
        samples: f.take_or("samples", DEFAULT_SAMPLES)?,
        features: f.take_or("features", DEFAULT_FEATURES)?,
        classes: f.take_or("classes", DEFAULT_CLASSES)?,
        on_device: f.take_or("on_device", false)?,
    };
    f.done(DATA)?;
    Ok(a)
}

const FORWARD: &[&str] = &[
    "name",
    "model",
    "data",
    "batch_size",
    "no_grad",
    "amp",
    "checkpointing",
    "attention",
    "batch",
];

fn forward(f: &mut Fields) -> Result<ForwardArgs, Error> {
    let a = ForwardArgs {
        name: f.take("name")?,
        model: f.take("model")?,
        data: f.take("data")?,
        batch_size: f.take_or("batch_size", DEFAULT_BATCH)?,
        no_grad: f.take_or("no_grad", false)?,
        amp: f.take_or("amp", Amp::Off)?,
        checkpointing: f.take_or("checkpointing", false)?,
        attention: f.take_or("attention", Default::default())?,
        // `model(x)` on tensors the code made.
        batch: f.take_or("batch", None)?,
    };
    f.done(FORWARD)?;
    Ok(a)
}

const TRAIN: &[&str] = &[
    "model",
    "optimizer",
    "data",
    "steps",
    "batch_size",
    "accumulate",
    "checkpointing",
    "amp",
    "set_to_none",
    "loss_history",
    "attention",
    "donate",
    "jit_compile",
];

fn train(f: &mut Fields) -> Result<TrainArgs, Error> {
    let a = TrainArgs {
        model: f.take("model")?,
        optimizer: f.take("optimizer")?,
        data: f.take("data")?,
        steps: f.take_or("steps", DEFAULT_STEPS)?,
        batch_size: f.take_or("batch_size", DEFAULT_BATCH)?,
        accumulate: f.take_or("accumulate", 1)?,
        checkpointing: f.take_or("checkpointing", false)?,
        amp: f.take_or("amp", Amp::Off)?,
        set_to_none: f.take_or("set_to_none", true)?,
        loss_history: f.take_or("loss_history", LossHistory::Item)?,
        attention: f.take_or("attention", Default::default())?,
        donate: f.take_or("donate", false)?,
        jit_compile: f.take_or("jit_compile", true)?,
    };
    f.done(TRAIN)?;
    Ok(a)
}

const ESTIMATE: &[&str] = &[
    "model",
    "optimizer",
    "data",
    "batch_size",
    "accumulate",
    "amp",
    "checkpointing",
    "set_to_none",
    "attention",
];

fn estimate(f: &mut Fields) -> Result<EstimateArgs, Error> {
    let a = EstimateArgs {
        model: f.take("model")?,
        optimizer: f.take("optimizer")?,
        data: f.take("data")?,
        batch_size: f.take_or("batch_size", DEFAULT_BATCH)?,
        accumulate: f.take_or("accumulate", 1)?,
        amp: f.take_or("amp", Amp::Off)?,
        checkpointing: f.take_or("checkpointing", false)?,
        set_to_none: f.take_or("set_to_none", true)?,
        attention: f.take_or("attention", Default::default())?,
    };
    f.done(ESTIMATE)?;
    Ok(a)
}

const MODEL_REF: &[&str] = &["model"];

fn model_ref(f: &mut Fields) -> Result<ModelRef, Error> {
    let a = ModelRef {
        model: f.take("model")?,
    };
    f.done(MODEL_REF)?;
    Ok(a)
}

const LORA: &[&str] = &["model", "rank", "all_linear"];

fn lora(f: &mut Fields) -> Result<LoraArgs, Error> {
    let a = LoraArgs {
        model: f.take("model")?,
        rank: f.take_or("rank", 16)?,
        all_linear: f.take_or("all_linear", false)?,
    };
    f.done(LORA)?;
    Ok(a)
}

const GENERATE: &[&str] = &[
    "name",
    "model",
    "input_ids",
    "attention_mask",
    "batch_size",
    "prompt_len",
    "new_tokens",
    "cache",
    "attention",
];

fn generate(f: &mut Fields) -> Result<GenerateArgs, Error> {
    let a = GenerateArgs {
        name: f.take("name")?,
        model: f.take("model")?,
        input_ids: f.take("input_ids")?,
        attention_mask: f.take("attention_mask")?,
        batch_size: f.take("batch_size")?,
        prompt_len: f.take("prompt_len")?,
        new_tokens: f.take_or("new_tokens", DEFAULT_NEW_TOKENS)?,
        cache: f.take_or("cache", Cache::Dynamic)?,
        attention: f.take_or("attention", Attention::Sdpa)?,
    };
    f.done(GENERATE)?;
    Ok(a)
}

const SERVE: &[&str] = &[
    "name",
    "model",
    "gpu_memory_utilization",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "kv_cache_dtype",
    "enforce_eager",
    "dtype",
];

fn serve(f: &mut Fields) -> Result<ServeArgs, Error> {
    let a = ServeArgs {
        name: f.take("name")?,
        model: f.take("model")?,
        gpu_memory_utilization: f.take("gpu_memory_utilization")?,
        max_model_len: f.take("max_model_len")?,
        max_num_seqs: f.take("max_num_seqs")?,
        max_num_batched_tokens: f.take("max_num_batched_tokens")?,
        kv_cache_dtype: f.take("kv_cache_dtype")?,
        enforce_eager: f.take_or("enforce_eager", false)?,
        dtype: f.take("dtype")?,
    };
    f.done(SERVE)?;
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Left-out fields take the defaults the constants name; written
    /// fields read back as written; an unknown one is named with the list.
    #[test]
    fn hand_read_arguments_default_round_trip_and_refuse_unknown_fields() {
        let m: ModelArgs = serde_json::from_value(json!({"name":"m"})).unwrap();
        assert_eq!(
            m,
            ModelArgs {
                name: "m".into(),
                ..Default::default()
            }
        );
        let t: TrainArgs =
            serde_json::from_value(json!({"model":"m","optimizer":"o","data":"d"})).unwrap();
        assert_eq!(
            t,
            TrainArgs::plain("m", "o", "d", DEFAULT_STEPS, DEFAULT_BATCH)
        );
        let gpt = ModelArgs {
            kind: ModelKind::Transformer,
            heads: Some(4),
            seq_len: Some(256),
            tied: Some(false),
            lora_rank: Some(8),
            ..ModelArgs::mlp("gpt", 2, 128)
        };
        let back: ModelArgs = serde_json::from_value(serde_json::to_value(&gpt).unwrap()).unwrap();
        assert_eq!(back, gpt);
        let e = serde_json::from_value::<EstimateArgs>(json!({"model":"m","lora":8})).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("unknown field `lora`, expected one of `model`"),
            "{e}"
        );
        let e = serde_json::from_value::<DataArgs>(json!({})).unwrap_err();
        assert_eq!(e.to_string(), "missing field `name`");
    }
}
