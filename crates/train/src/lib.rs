//! Training on the engine: models, optimizers, data, and the tensor
//! allocations of a training step in the order a framework makes them.
//!
//! - [`spec`]: what a model, an optimizer and a dataset are (shapes, bytes,
//!   FLOPs) and the memory estimate.
//! - [`kinds`]: the MLP, the CNN and the transformer as shapes, and their
//!   step as one program of allocations, each naming what it computes.
//! - [`frame`], [`autograd`], [`optimizer`]: what every kind's step shares:
//!   the Python frame, the autograd graph, `opt.step()` and `zero_grad`.
//! - [`cpu`]: a program's arithmetic on the CPU, for small steps;
//!   [`update`]: the optimizers' updates; [`kernels`]: the same ops as a
//!   GPU's kernels and cuBLAS products compute them.
//! - [`data`]: the synthetic, learnable classification set.

pub mod autograd;
pub mod cpu;
pub mod cublas;
pub mod data;
pub mod executor;
pub mod frame;
pub mod init;
#[cfg(feature = "device-values")]
pub mod kernels;
pub mod kinds;
pub mod kv_cache;
pub mod optim;
pub mod optimizer;
pub mod program;
pub mod spec;
pub mod update;
pub mod xla;

use vramlab_core::collections::IdMap;
use vramlab_process::runtime::ObjId;

pub use optim::{OptimizerKind, OptimizerSpec};
pub use spec::{DataSpec, Estimate, ModelSpec, MAX_LAYERS, MAX_WIDTH};

/// Steps above this many floating-point operations run shape-only (the
/// simulated GPU keeps every allocation exact but computes no numbers).
pub const ARITHMETIC_FLOP_LIMIT: u64 = 50_000_000;

/// Nor does a step whose arithmetic would need more host memory than this.
pub const ARITHMETIC_HOST_LIMIT: u64 = 256 * 1024 * 1024;

/// A model's parameters and, once a step computed them, their values.
#[derive(Clone, Debug)]
pub struct ModelState {
    pub spec: ModelSpec,
    /// Parameter tensors, in `parameters()` order.
    pub params: Vec<ObjId>,
    pub values: Option<update::Params>,
    /// CPU values of each parameter's `.grad`, when computed.
    pub grad_values: Vec<Option<Vec<f32>>>,
    /// The TF1 session that owns the variables, if built inside one.
    pub session: Option<ObjId>,
    /// A seed for the initial weights.
    pub seed: u64,
    /// Its values live on the device alone (a step too big for the CPU,
    /// on a GPU whose kernels run it all): drawn there at that step, and
    /// the host holds none.
    #[cfg(feature = "device-values")]
    pub device_resident: bool,
    /// Its `.grad`s on the device were computed by the last step there
    /// (not allocated by a step that ran shape-only): `opt.step()` may
    /// apply them.
    #[cfg(feature = "device-values")]
    pub device_grads: bool,
}

impl ModelState {
    /// The parameters' CPU values, initialized at first use.
    pub fn values_mut(&mut self) -> &mut update::Params {
        let (spec, seed) = (self.spec, self.seed);
        self.values
            .get_or_insert_with(|| init::initial_values(&spec.parameters(), seed))
    }
}

#[derive(Clone, Debug)]
pub struct OptimizerState {
    pub kind: OptimizerKind,
    /// 32 (`torch.optim`) or 8 (bitsandbytes).
    pub bits: u8,
    pub model: ObjId,
    /// The parameters it updates (`param_groups`): it holds them alive.
    pub params: Vec<ObjId>,
    pub lr: f32,
    /// State tensors, allocated at the first step.
    pub state: Vec<ObjId>,
    /// CPU values of the state, per tensor.
    pub state_values: Vec<Vec<f32>>,
    pub steps: u32,
    /// A later step's program (the state made), with the parameters it
    /// updates: the same every step, so built once.
    pub later_step: Option<(Vec<usize>, std::sync::Arc<crate::kinds::step::Program>)>,
}

impl OptimizerState {
    pub fn spec(&self) -> OptimizerSpec {
        OptimizerSpec {
            kind: self.kind,
            bits: self.bits,
        }
    }
}

#[derive(Clone, Debug)]
pub struct DatasetState {
    pub spec: DataSpec,
    /// The whole set on the device (features, labels), when `on_device`.
    pub on_device: Option<(ObjId, ObjId)>,
    /// Where the next batch starts.
    pub cursor: u64,
    pub seed: u64,
}

/// What backward needs from one forward pass.
#[derive(Clone, Debug)]
pub struct GraphState {
    pub model: ObjId,
    /// The step program's forward pass: backward plays the rest of it.
    pub saved: Box<ProgramGraph>,
    /// Backward ran without `retain_graph`: the saved tensors are gone.
    pub consumed: bool,
}

/// A step program stopped at [`kinds::step::Op::ForwardEnd`] by `forward`.
#[derive(Clone, Debug)]
pub struct ProgramGraph {
    pub program: kinds::step::Program,
    /// The tensor of each of the program's allocations that the graph
    /// saved (by allocation index).
    pub saved: Vec<Option<ObjId>>,
    /// The batch the graph saved: its inputs, its targets.
    pub batch: [Option<ObjId>; 2],
    /// The model's parameters, in `parameters()` order: the graph holds
    /// them (autograd's nodes do: `AccumulateGrad` its leaf, a matrix
    /// product its weight), so `del model` before `backward` frees none.
    pub params: Vec<ObjId>,
    /// The model's name when the graph was made (the labels' prefix).
    pub model_name: String,
    /// The forward pass's numbers, when its arithmetic ran.
    pub computed: Option<cpu::Computed>,
}

#[derive(Clone, Debug)]
pub struct SessionState {
    pub closed: bool,
}

/// Everything the engine knows about training objects, by object id.
#[derive(Clone, Debug, Default)]
pub struct TrainState {
    pub models: IdMap<ModelState>,
    pub optimizers: IdMap<OptimizerState>,
    pub datasets: IdMap<DatasetState>,
    pub graphs: IdMap<GraphState>,
    pub sessions: IdMap<SessionState>,
    /// The TF1 session new models are built in.
    pub open_session: Option<ObjId>,
    /// PyTorch's cuBLAS workspaces, per thread.
    pub cublas: cublas::CublasWorkspaces,
}

impl TrainState {
    /// A new process's state: its matrix products' workspaces follow
    /// `blas`.
    pub fn new(blas: vramlab_device::framework::BlasWorkspaces) -> Self {
        TrainState {
            cublas: cublas::CublasWorkspaces::new(blas),
            ..Default::default()
        }
    }
}

impl TrainState {
    /// Forgets objects that were destroyed.
    pub fn forget(&mut self, dead: &[ObjId]) {
        for id in dead {
            self.models.remove(id);
            self.optimizers.remove(id);
            self.datasets.remove(id);
            self.graphs.remove(id);
            self.sessions.remove(id);
            if self.open_session == Some(*id) {
                self.open_session = None;
            }
        }
    }
}
