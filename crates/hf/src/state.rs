//! What a process keeps of its Hugging Face models: each model's
//! config and tensors, the optimizers over them, the training steps
//! under way and vLLM's engine cores (`engine::generating`,
//! `engine::hf_training` and `engine::serving` act on them).

use crate::step::Quant4;
use crate::HfConfig;
use vramlab_core::collections::IdMap;
use vramlab_process::runtime::ObjId;
use vramlab_train::program::Program;

/// Everything a process knows about its Hugging Face objects, by object id.
#[derive(Clone, Debug, Default)]
pub struct HfObjects {
    /// The models (`generate` runs them).
    pub models: IdMap<HfModelState>,
    /// Optimizers over them.
    pub optimizers: IdMap<HfOptimizer>,
    /// Their steps under way, by the loss's graph.
    pub steps: IdMap<HfStep>,
    /// vLLM's engine cores (`LLM`), by the bytes their processes hold.
    pub llms: IdMap<u64>,
}

impl HfObjects {
    /// Forgets objects that were destroyed.
    pub fn forget(&mut self, dead: &[ObjId]) {
        for id in dead {
            self.models.remove(id);
            self.optimizers.remove(id);
            self.steps.remove(id);
        }
    }
}

/// A Hugging Face model on the device.
#[derive(Clone, Debug)]
pub struct HfModelState {
    /// The shipped shape's name, or the config's class.
    pub label: String,
    /// The config, its `dtype` the one the weights were loaded in.
    pub config: HfConfig,
    /// peft's LoRA of this rank.
    pub lora: Option<u64>,
    /// QLoRA: bitsandbytes' 4-bit weights.
    pub quant: Option<Quant4>,
    /// `prepare_model_for_kbit_training` ran on it.
    pub prepared: bool,
    /// Its tensors on the device, by name.
    pub tensors: Vec<(String, ObjId)>,
    /// The gradients its parameters hold (`.grad`).
    pub grads: Vec<ObjId>,
}

/// An optimizer over a Hugging Face model's trainable parameters.
#[derive(Clone, Debug)]
pub struct HfOptimizer {
    pub model: ObjId,
    /// bitsandbytes' `AdamW8bit`.
    pub adam8bit: bool,
    /// Its state, made at the first `step()`.
    pub state: bool,
}

/// A forward whose step is under way: the program, where it stands, and
/// who holds each live tensor.
#[derive(Clone, Debug)]
pub struct HfStep {
    pub model: ObjId,
    pub program: Program,
    /// The next step of the program to play.
    pub at: usize,
    pub slots: Vec<Option<(ObjId, ObjId)>>,
    /// `backward()` ran.
    pub backward: bool,
    /// The model's gradients existed at the forward: the backward adds
    /// into them.
    pub onto_grads: bool,
}
