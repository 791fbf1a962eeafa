//! The forward pass, `loss = criterion(model(x), y)`: what each op allocates,
//! when each intermediate dies, and what autograd saves for backward.

use crate::process::{AllocFailure, Process};
use crate::runtime::{Class, ObjId};
use crate::train::cublas::{BlasThread, CublasWorkspaces};
use crate::train::data::Synthetic;
use crate::train::frame::PyFrame;
use crate::train::spec::checkpoint_segment;
use crate::train::{math, DatasetState, GraphState, ModelSpec, Saved, TrainState};
use crate::types::{Category, Dtype};

/// What one forward pass saved for backward, by role.
#[derive(Clone, Debug, Default)]
pub struct SavedPlan {
    pub batch: u64,
    /// The autocast type, if any.
    pub amp: Option<Dtype>,
    pub checkpointing: bool,
    pub targets: Option<ObjId>,
    pub total_weight: Option<ObjId>,
    pub log_probs: Option<ObjId>,
    /// Each linear layer's saved input (for its weight gradient): the batch
    /// (or its fp16 copy) for the first, the previous ReLU output after.
    /// `None` inside checkpointed segments.
    pub mat1: Vec<Option<ObjId>>,
    /// Each ReLU's saved output; `None` inside checkpointed segments.
    pub relu: Vec<Option<ObjId>>,
    /// Weight casts per linear layer (autocast).
    pub weight_casts: Vec<Option<ObjId>>,
    /// Checkpointed segments: first and one-past-last hidden layer, input.
    pub segments: Vec<(usize, usize, ObjId)>,
}

pub struct ForwardArgs<'a> {
    /// Prefix of the labels (the name the loss gets).
    pub tag: &'a str,
    pub model: ObjId,
    pub data: ObjId,
    pub batch: u64,
    pub no_grad: bool,
    /// `torch.autocast('cuda', dtype)` around the pass, if given.
    pub amp: Option<Dtype>,
    pub checkpointing: bool,
    /// Compute the numbers on the CPU.
    pub compute: bool,
    /// The batch already on the device (a training loop's `x, y`); `None`:
    /// this pass copies it in (`model(x.cuda())`), and it dies with the
    /// statement unless autograd saved it.
    pub input: Option<(ObjId, ObjId)>,
}

/// The result of a forward pass: the loss (a local of the caller's frame,
/// moved out) and its value when computed.
pub struct ForwardOut {
    pub loss: ObjId,
    pub value: Option<f32>,
}

/// One forward pass in progress: its labels, its graph and what it saved.
struct Pass<'a, 'b> {
    /// The main thread's cuBLAS workspace, made at the first matmul.
    blas: &'b mut CublasWorkspaces,
    tag: &'a str,
    spec: ModelSpec,
    /// Widths: the input, each hidden layer, the classes.
    dims: Vec<u64>,
    batch: u64,
    amp: Option<Dtype>,
    /// The dtype activations are computed in (the autocast type).
    adt: Dtype,
    graph: Option<ObjId>,
    plan: SavedPlan,
}

/// The forward pass: `loss = criterion(model(x), y)`.
pub fn forward(
    k: &mut Process,
    frame: &mut PyFrame,
    ts: &mut TrainState,
    a: &ForwardArgs,
) -> Result<ForwardOut, AllocFailure> {
    let mark = frame.mark();
    let spec = ts.models[&a.model].spec;
    let dataset = ts.datasets.get_mut(&a.data).expect("dataset exists");
    let start = dataset_cursor(dataset, a.batch);
    let (x, y) = load_batch(k, frame, dataset, &spec, a)?;
    let graph =
        (!a.no_grad).then(|| frame.instance(k, Class::Graph, &format!("{}.grad_fn", a.tag)));
    let mut pass = Pass::new(a, spec, graph, &mut ts.cublas);
    let logits = pass.layers(k, frame, x)?;
    let loss = pass.criterion(k, frame, logits, y)?;

    let (value, cache) = if a.compute {
        let d = &ts.datasets[&a.data];
        let synthetic = Synthetic {
            samples: d.spec.samples,
            features: d.spec.features,
            classes: d.spec.classes,
            seed: d.seed,
        };
        let (xv, yv) = synthetic.batch(start, a.batch);
        let state = ts.models.get_mut(&a.model).expect("model exists");
        let (l, c) = math::forward(state.values_mut(), &xv, &yv);
        (Some(l), Some(c))
    } else {
        (None, None)
    };
    if let Some(g) = graph {
        k.runtime.add_ref(loss, g);
        let state = GraphState {
            model: a.model,
            saved: Saved::Mlp {
                plan: pass.plan,
                cache,
            },
            consumed: false,
        };
        ts.graphs.insert(g, state);
    }
    let loss = frame.take(loss);
    // x, y and the graph go out of scope; what the graph saved lives on.
    frame.finish_from(k, mark);
    Ok(ForwardOut { loss, value })
}

/// The batch: a view of the on-device set, or a copy to the device.
fn load_batch(
    k: &mut Process,
    frame: &mut PyFrame,
    dataset: &DatasetState,
    spec: &ModelSpec,
    a: &ForwardArgs,
) -> Result<(ObjId, ObjId), AllocFailure> {
    if let Some((dx, dy)) = a.input.or(dataset.on_device) {
        return Ok((frame.hold(k, dx), frame.hold(k, dy)));
    }
    let (tag, b) = (a.tag, a.batch);
    let x = frame.alloc(
        k,
        &format!("{tag}.x"),
        &[b, spec.input_dim],
        Dtype::Float32,
        Category::Input,
    )?;
    let y = frame.alloc(k, &format!("{tag}.y"), &[b], Dtype::Int64, Category::Input)?;
    Ok((x, y))
}

impl<'a, 'b> Pass<'a, 'b> {
    fn new(
        a: &ForwardArgs<'a>,
        spec: ModelSpec,
        graph: Option<ObjId>,
        blas: &'b mut CublasWorkspaces,
    ) -> Self {
        let layers = spec.layers as usize;
        let plan = SavedPlan {
            batch: a.batch,
            amp: a.amp,
            checkpointing: a.checkpointing && graph.is_some(),
            mat1: vec![None; layers + 1],
            relu: vec![None; layers],
            weight_casts: vec![None; layers + 1],
            ..Default::default()
        };
        Pass {
            blas,
            tag: a.tag,
            spec,
            dims: spec.dims(),
            batch: a.batch,
            amp: a.amp,
            adt: a.amp.unwrap_or(spec.dtype),
            graph,
            plan,
        }
    }

    /// Autograd saves a tensor: the graph holds a reference to it.
    fn save(&self, k: &mut Process, id: ObjId) {
        if let Some(g) = self.graph {
            k.runtime.add_ref(g, id);
        }
    }

    /// The linear layers with ReLU between them; returns the logits.
    fn layers(
        &mut self,
        k: &mut Process,
        frame: &mut PyFrame,
        x: ObjId,
    ) -> Result<ObjId, AllocFailure> {
        let layers = self.spec.layers as usize;
        let seg = checkpoint_segment(self.spec.layers) as usize;
        let mut prev = x;
        if let Some(low) = self.amp {
            // Autocast casts the input for the first matmul.
            prev = frame.alloc(
                k,
                &format!("{}.x_{}", self.tag, short(low)),
                &[self.batch, self.spec.input_dim],
                low,
                Category::Activation,
            )?;
        }
        for l in 0..layers {
            let in_segment = self.plan.checkpointing;
            if in_segment && l % seg == 0 {
                // A segment boundary: checkpoint saves the segment's input.
                self.save(k, prev);
                self.plan.segments.push((l, (l + seg).min(layers), prev));
            }
            let label = format!("{}.{}.out", self.tag, 2 * l);
            let z = self.linear(k, frame, l, &label, prev, x, !in_segment)?;
            prev = self.relu(k, frame, l, z, !in_segment)?;
        }
        let label = format!("{}.logits", self.tag);
        self.linear(k, frame, layers, &label, prev, x, true)
    }

    /// `addmm`: allocates the layer's output; under autocast, casts of the
    /// weight and bias first. Saves its input (and the weight's cast) when
    /// recording; the input dies unless it is the batch itself.
    #[allow(clippy::too_many_arguments)]
    fn linear(
        &mut self,
        k: &mut Process,
        frame: &mut PyFrame,
        l: usize,
        label: &str,
        input: ObjId,
        batch: ObjId,
        recorded: bool,
    ) -> Result<ObjId, AllocFailure> {
        let (inp, out) = (self.dims[l], self.dims[l + 1]);
        let grad_mode = self.graph.is_some() && recorded;
        let cast = if let Some(low) = self.amp {
            let w = frame.alloc(
                k,
                &format!("{}.{}.weight_{}", self.tag, 2 * l, short(low)),
                &[out, inp],
                low,
                Category::Temporary,
            )?;
            let bias = frame.alloc(
                k,
                &format!("{}.{}.bias_{}", self.tag, 2 * l, short(low)),
                &[out],
                low,
                Category::Temporary,
            )?;
            Some((w, bias))
        } else {
            None
        };
        let z = frame.alloc(k, label, &[self.batch, out], self.adt, Category::Activation)?;
        self.blas.call(k, BlasThread::Main)?;
        if let Some((w, bias)) = cast {
            frame.drop(k, bias);
            if grad_mode {
                self.save(k, w);
                self.plan.weight_casts[l] = Some(w);
            }
            frame.drop(k, w);
        }
        if grad_mode {
            // addmm saves its input for the weight gradient.
            self.save(k, input);
            self.plan.mat1[l] = Some(input);
        }
        if input != batch {
            frame.drop(k, input);
        }
        Ok(z)
    }

    /// ReLU: a new output; the pre-activation dies; the output is saved.
    fn relu(
        &mut self,
        k: &mut Process,
        frame: &mut PyFrame,
        l: usize,
        z: ObjId,
        recorded: bool,
    ) -> Result<ObjId, AllocFailure> {
        let h = frame.alloc(
            k,
            &format!("{}.{}.relu", self.tag, 2 * l + 1),
            &[self.batch, self.dims[l + 1]],
            self.adt,
            Category::Activation,
        )?;
        frame.drop(k, z);
        if self.graph.is_some() && recorded {
            self.save(k, h);
            self.plan.relu[l] = Some(h);
        }
        Ok(h)
    }

    /// Softmax cross-entropy: log_softmax (in float32 under autocast), then
    /// NLL's loss and `total_weight`; NLL returns (`total_weight`'s
    /// reference goes), `cross_entropy` returns (log-softmax's output goes),
    /// and the statement ends (the logits go). Returns the loss, still a
    /// local of the frame.
    fn criterion(
        &mut self,
        k: &mut Process,
        frame: &mut PyFrame,
        logits: ObjId,
        y: ObjId,
    ) -> Result<ObjId, AllocFailure> {
        let tag = self.tag;
        let log_probs = frame.alloc(
            k,
            &format!("{tag}.log_softmax"),
            &[self.batch, self.spec.classes],
            Dtype::Float32,
            Category::Activation,
        )?;
        let loss = frame.alloc(k, tag, &[], Dtype::Float32, Category::Activation)?;
        let total_weight = frame.alloc(
            k,
            &format!("{tag}.total_weight"),
            &[],
            Dtype::Float32,
            Category::Activation,
        )?;
        if self.graph.is_some() {
            self.save(k, log_probs);
            self.save(k, y);
            self.save(k, total_weight);
            self.plan.log_probs = Some(log_probs);
            self.plan.targets = Some(y);
            self.plan.total_weight = Some(total_weight);
        }
        frame.drop(k, total_weight);
        frame.drop(k, log_probs);
        frame.drop(k, logits);
        Ok(loss)
    }
}

/// Where the next batch starts, and moves the cursor past it.
fn dataset_cursor(d: &mut DatasetState, batch: u64) -> u64 {
    let start = d.cursor;
    d.cursor = (d.cursor + batch) % d.spec.samples.max(1);
    start
}

/// A cast's label suffix: `fp16`, `bf16`.
pub(super) fn short(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::Bfloat16 => "bf16",
        Dtype::Float16 => "fp16",
        other => other.torch_name(),
    }
}
