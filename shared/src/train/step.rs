//! A training step as a framework runs it, one allocation at a time.
//!
//! Forward: the batch is copied to the device; each linear layer allocates
//! its output (`addmm`), ReLU allocates its own and the pre-activation dies;
//! autograd saves each layer's input (for the weight gradient) and each
//! ReLU's output; log-softmax's output and the targets are saved for the
//! loss. Backward walks the layers in reverse, allocating gradient buffers,
//! accumulating into `.grad` (kept across steps unless `set_to_none`), and
//! releasing each node's saved tensors as it goes. The optimizer allocates
//! its state at its first step, and Adam's foreach update one temporary per
//! parameter. Checkpointing saves only segment inputs and recomputes each
//! segment in backward; `amp` saves activations in float16 and keeps fp16
//! copies of the weights for backward, with fp32 master weights.

use super::math::{self, Params};
use super::spec::checkpoint_segment;
use super::{GraphState, ModelState, OptimizerKind, TrainState};
use crate::kernel::{AllocFailure, Kernel};
use crate::runtime::{Class, ObjId, ObjectKind};
use crate::types::{Category, Dtype};

/// The local variables of the frame a step runs in. If the step raises,
/// they become the exception's (`last_exception` keeps them alive).
#[derive(Debug, Default)]
pub struct Frame {
    pub locals: Vec<ObjId>,
}

impl Frame {
    pub fn alloc(
        &mut self,
        k: &mut Kernel,
        label: &str,
        shape: &[u64],
        dtype: Dtype,
        category: Category,
    ) -> Result<ObjId, AllocFailure> {
        let id = k.alloc_shaped(label, shape, dtype, category)?;
        self.locals.push(id);
        Ok(id)
    }

    /// Adds an existing object as a local (a new reference to it).
    pub fn hold(&mut self, k: &mut Kernel, id: ObjId) -> ObjId {
        k.runtime.take_local(id);
        self.locals.push(id);
        id
    }

    /// A new non-tensor object held by this frame.
    pub fn instance(&mut self, k: &mut Kernel, class: Class, label: &str) -> ObjId {
        let id = k.runtime.new_local(ObjectKind::Instance(class), label);
        self.locals.push(id);
        id
    }

    /// The local goes out of scope.
    pub fn drop(&mut self, k: &mut Kernel, id: ObjId) {
        self.take(id);
        k.drop_local(id);
    }

    /// Moves a local out of the frame (the caller now owns the reference).
    pub fn take(&mut self, id: ObjId) -> ObjId {
        if let Some(p) = self.locals.iter().rposition(|&x| x == id) {
            self.locals.remove(p);
        }
        id
    }

    /// The frame returns: its locals die, last first.
    pub fn finish(&mut self, k: &mut Kernel) {
        self.finish_from(k, 0);
    }

    /// A nested call returns: the locals it added (from `mark` on) die.
    pub fn finish_from(&mut self, k: &mut Kernel, mark: usize) {
        while self.locals.len() > mark {
            let id = self.locals.pop().expect("above the mark");
            k.drop_local(id);
        }
    }

    /// Where a nested call's locals will start.
    pub fn mark(&self) -> usize {
        self.locals.len()
    }
}

/// What one forward pass saved for backward, by role.
#[derive(Clone, Debug, Default)]
pub struct SavedPlan {
    pub batch: u64,
    pub amp: bool,
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
    /// fp16 weight copies per linear layer (amp).
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
    pub amp: bool,
    pub checkpointing: bool,
    /// Compute the numbers on the CPU.
    pub compute: bool,
}

/// The result of a forward pass: the loss (a local of the caller's frame,
/// moved out) and its value when computed.
pub struct ForwardOut {
    pub loss: ObjId,
    pub value: Option<f32>,
}

fn model_values(m: &mut ModelState) -> &mut Params {
    let spec = m.spec;
    let seed = m.seed;
    m.values.get_or_insert_with(|| init_params(&spec, seed))
}

/// `nn.Linear`'s default initialization: uniform in ±1/sqrt(fan_in).
fn init_params(spec: &super::ModelSpec, seed: u64) -> Params {
    spec.param_shapes()
        .iter()
        .enumerate()
        .map(|(i, (_, shape))| {
            let fan_in = if shape.len() == 2 {
                shape[1]
            } else {
                spec.dims()[i / 2]
            };
            let bound = 1.0 / (fan_in as f32).sqrt();
            let n: u64 = shape.iter().product();
            (0..n)
                .map(|j| {
                    let u = (super::data::gaussian(seed, i as u64, j).tanh() + 1.0) / 2.0;
                    (2.0 * u - 1.0) * bound
                })
                .collect()
        })
        .collect()
}

/// The forward pass: `loss = criterion(model(x), y)`.
pub fn forward(
    k: &mut Kernel,
    frame: &mut Frame,
    ts: &mut TrainState,
    a: &ForwardArgs,
) -> Result<ForwardOut, AllocFailure> {
    let mark = frame.mark();
    let m = ts.models[&a.model].clone();
    let spec = m.spec;
    let b = a.batch;
    let layers = spec.layers as usize;
    let adt = if a.amp { Dtype::Float16 } else { spec.dtype };
    let dims = spec.dims();
    let tag = a.tag;

    // The batch: a view of the on-device set, or a copy to the device.
    let dataset = ts.datasets.get_mut(&a.data).expect("dataset exists");
    let start = dataset_cursor(dataset, b);
    let data_spec = dataset.spec;
    let (x, y) = match dataset.on_device {
        Some((dx, dy)) => (frame.hold(k, dx), frame.hold(k, dy)),
        None => (
            frame.alloc(
                k,
                &format!("{tag}.x"),
                &[b, spec.input_dim],
                Dtype::Float32,
                Category::Input,
            )?,
            frame.alloc(k, &format!("{tag}.y"), &[b], Dtype::Int64, Category::Input)?,
        ),
    };
    let graph = (!a.no_grad).then(|| frame.instance(k, Class::Graph, &format!("{tag}.grad_fn")));
    let mut plan = SavedPlan {
        batch: b,
        amp: a.amp,
        checkpointing: a.checkpointing && graph.is_some(),
        mat1: vec![None; layers + 1],
        relu: vec![None; layers],
        weight_casts: vec![None; layers + 1],
        ..Default::default()
    };
    let save = |k: &mut Kernel, id: ObjId| {
        if let Some(g) = graph {
            k.runtime.add_ref(g, id);
        }
    };
    let seg = checkpoint_segment(spec.layers) as usize;

    let mut prev = x;
    if a.amp {
        // Autocast copies the input to float16 for the first matmul.
        prev = frame.alloc(
            k,
            &format!("{tag}.x_fp16"),
            &[b, spec.input_dim],
            Dtype::Float16,
            Category::Activation,
        )?;
    }
    for l in 0..=layers {
        let (inp, out) = (dims[l], dims[l + 1]);
        let output_layer = l == layers;
        let in_segment = plan.checkpointing && !output_layer;
        let grad_mode = graph.is_some() && !in_segment;
        if in_segment && l % seg == 0 {
            // A segment boundary: checkpoint saves the segment's input.
            save(k, prev);
            plan.segments.push((l, (l + seg).min(layers), prev));
        }
        let cast = if a.amp {
            let w = frame.alloc(
                k,
                &format!("{tag}.{}.weight_fp16", 2 * l),
                &[out, inp],
                Dtype::Float16,
                Category::Temporary,
            )?;
            let bias = frame.alloc(
                k,
                &format!("{tag}.{}.bias_fp16", 2 * l),
                &[out],
                Dtype::Float16,
                Category::Temporary,
            )?;
            Some((w, bias))
        } else {
            None
        };
        let label = if output_layer {
            format!("{tag}.logits")
        } else {
            format!("{tag}.{}.out", 2 * l)
        };
        let z = frame.alloc(k, &label, &[b, out], adt, Category::Activation)?;
        if let Some((w, bias)) = cast {
            frame.drop(k, bias);
            if grad_mode {
                save(k, w);
                plan.weight_casts[l] = Some(w);
            }
            frame.drop(k, w);
        }
        if grad_mode {
            // addmm saves its input for the weight gradient.
            save(k, prev);
            plan.mat1[l] = Some(prev);
        }
        if prev != x {
            frame.drop(k, prev);
        }
        if output_layer {
            prev = z;
            break;
        }
        let h = frame.alloc(
            k,
            &format!("{tag}.{}.relu", 2 * l + 1),
            &[b, out],
            adt,
            Category::Activation,
        )?;
        frame.drop(k, z);
        if grad_mode {
            save(k, h);
            plan.relu[l] = Some(h);
        }
        prev = h;
    }
    // Softmax cross-entropy: log_softmax (in float32 under autocast), then NLL.
    let logits = prev;
    let log_probs = frame.alloc(
        k,
        &format!("{tag}.log_softmax"),
        &[b, spec.classes],
        Dtype::Float32,
        Category::Activation,
    )?;
    frame.drop(k, logits);
    let loss = frame.alloc(k, tag, &[], Dtype::Float32, Category::Activation)?;
    let total_weight = frame.alloc(
        k,
        &format!("{tag}.total_weight"),
        &[],
        Dtype::Float32,
        Category::Activation,
    )?;
    if graph.is_some() {
        save(k, log_probs);
        save(k, y);
        save(k, total_weight);
        plan.log_probs = Some(log_probs);
        plan.targets = Some(y);
        plan.total_weight = Some(total_weight);
    }
    frame.drop(k, total_weight);
    frame.drop(k, log_probs);

    let mut value = None;
    let mut cache = None;
    if a.compute {
        let synthetic = super::data::Synthetic {
            samples: data_spec.samples,
            features: data_spec.features,
            classes: data_spec.classes,
            seed: ts.datasets[&a.data].seed,
        };
        let (xv, yv) = synthetic.batch(start, b);
        let state = ts.models.get_mut(&a.model).expect("model exists");
        let (l, c) = math::forward(model_values(state), &xv, &yv);
        value = Some(l);
        cache = Some(c);
    }
    if let Some(g) = graph {
        k.runtime.add_ref(loss, g);
        ts.graphs.insert(
            g,
            GraphState {
                model: a.model,
                plan,
                cache,
                consumed: false,
            },
        );
    }
    let loss = frame.take(loss);
    // x, y and the graph go out of scope; what the graph saved lives on.
    frame.finish_from(k, mark);
    Ok(ForwardOut { loss, value })
}

/// Where the next batch starts, and moves the cursor past it.
fn dataset_cursor(d: &mut super::DatasetState, batch: u64) -> u64 {
    let start = d.cursor;
    d.cursor = (d.cursor + batch) % d.spec.samples.max(1);
    start
}

/// The autograd graph a tensor's history leads to, if any.
pub fn find_graph(k: &Kernel, tensor: ObjId) -> Option<ObjId> {
    let mut stack = vec![tensor];
    let mut seen = 0;
    while let Some(id) = stack.pop() {
        seen += 1;
        if seen > 64 {
            return None;
        }
        let o = k.runtime.get(id)?;
        if o.kind == ObjectKind::Instance(Class::Graph) {
            return Some(id);
        }
        if matches!(o.kind, ObjectKind::Tensor(_)) {
            stack.extend(o.refs.iter().rev());
        }
    }
    None
}

/// Why backward could not run (not an OOM).
#[derive(Debug)]
pub enum BackwardError {
    NoGraph,
    Consumed,
    Oom(AllocFailure),
}

impl From<AllocFailure> for BackwardError {
    fn from(e: AllocFailure) -> Self {
        BackwardError::Oom(e)
    }
}

/// PyTorch's message for a second backward through a freed graph.
pub const BACKWARD_TWICE: &str = "Trying to backward through the graph a second time (or directly access saved tensors after they have already been freed). Saved intermediate values of the graph are freed when you call .backward() or autograd.grad(). Specify retain_graph=True if you need to backward through the graph a second time or if you need to access saved tensors after calling backward.";
/// PyTorch's message for backward on a tensor without history.
pub const NO_GRAD_FN: &str =
    "element 0 of tensors does not require grad and does not have a grad_fn";

struct Backward<'a> {
    graph: ObjId,
    retain: bool,
    params: &'a [ObjId],
    param_dtype: Dtype,
    adt: Dtype,
    amp: bool,
}

impl Backward<'_> {
    /// A node ran: it lets go of one saved tensor.
    fn release(&self, k: &mut Kernel, saved: Option<ObjId>) {
        if let (false, Some(id)) = (self.retain, saved) {
            k.detach(self.graph, id);
        }
    }

    /// The gradient of one parameter: it becomes `.grad`, or is added into
    /// the existing one and dies (`AccumulateGrad`).
    fn grad_param(
        &self,
        k: &mut Kernel,
        frame: &mut Frame,
        index: usize,
    ) -> Result<(), AllocFailure> {
        let param = self.params[index];
        let (shape, label) = {
            let t = k.runtime.tensor(param).expect("parameter tensor");
            (
                t.shape.clone(),
                k.runtime.get(param).expect("parameter").label.clone(),
            )
        };
        let existing = grad_of(k, param);
        let half = if self.amp {
            Some(frame.alloc(
                k,
                &format!("{label}.grad_fp16"),
                &shape,
                Dtype::Float16,
                Category::Temporary,
            )?)
        } else {
            None
        };
        if existing.is_some() {
            let g = frame.alloc(
                k,
                &format!("{label}.grad (new)"),
                &shape,
                self.param_dtype,
                Category::Temporary,
            )?;
            frame.drop(k, g);
        } else {
            let g = frame.alloc(
                k,
                &format!("{label}.grad"),
                &shape,
                self.param_dtype,
                Category::Gradient,
            )?;
            frame.take(g);
            k.attach_local(param, g);
        }
        if let Some(h) = half {
            frame.drop(k, h);
        }
        Ok(())
    }
}

/// A parameter's `.grad`, if set.
pub fn grad_of(k: &Kernel, param: ObjId) -> Option<ObjId> {
    k.runtime
        .get(param)?
        .refs
        .iter()
        .copied()
        .find(|&r| k.runtime.tensor(r).is_some())
}

/// `loss.backward(retain_graph=...)`.
pub fn backward(
    k: &mut Kernel,
    frame: &mut Frame,
    ts: &mut TrainState,
    loss: ObjId,
    retain: bool,
) -> Result<(), BackwardError> {
    let graph = find_graph(k, loss).ok_or(BackwardError::NoGraph)?;
    let g = ts.graphs.get(&graph).ok_or(BackwardError::NoGraph)?.clone();
    if g.consumed {
        return Err(BackwardError::Consumed);
    }
    let model = ts
        .models
        .get(&g.model)
        .cloned()
        .ok_or(BackwardError::NoGraph)?;
    let spec = model.spec;
    let plan = &g.plan;
    let b = plan.batch;
    let layers = spec.layers as usize;
    let dims = spec.dims();
    let bw = Backward {
        graph,
        retain,
        params: &model.params,
        param_dtype: spec.dtype,
        adt: if plan.amp { Dtype::Float16 } else { spec.dtype },
        amp: plan.amp,
    };
    let adt = bw.adt;
    let mark = frame.mark();
    let tag = k
        .runtime
        .get(loss)
        .map(|o| o.label.clone())
        .unwrap_or_default();

    let seed = frame.alloc(
        k,
        &format!("{tag}.grad"),
        &[],
        Dtype::Float32,
        Category::Temporary,
    )?;
    let g_nll = frame.alloc(
        k,
        "grad log_softmax",
        &[b, spec.classes],
        Dtype::Float32,
        Category::Temporary,
    )?;
    frame.drop(k, seed);
    bw.release(k, plan.targets);
    bw.release(k, plan.total_weight);
    let mut grad = frame.alloc(
        k,
        "grad logits",
        &[b, spec.classes],
        adt,
        Category::Temporary,
    )?;
    frame.drop(k, g_nll);
    bw.release(k, plan.log_probs);

    // Output layer, then hidden layers in reverse.
    let mut recomputed: Vec<Option<ObjId>> = vec![None; layers];
    for l in (0..=layers).rev() {
        let output_layer = l == layers;
        if !output_layer {
            if let Some(&(start, end, input)) = plan.segments.iter().find(|s| s.1 == l + 1) {
                // Recompute this checkpointed segment, saving as forward would.
                let _ = input;
                for j in start..end {
                    let z = frame.alloc(
                        k,
                        &format!("recompute {}.out", 2 * j),
                        &[b, dims[j + 1]],
                        adt,
                        Category::Activation,
                    )?;
                    let h = frame.alloc(
                        k,
                        &format!("recompute {}.relu", 2 * j + 1),
                        &[b, dims[j + 1]],
                        adt,
                        Category::Activation,
                    )?;
                    frame.drop(k, z);
                    recomputed[j] = Some(h);
                }
            }
            // ReLU backward.
            let g_pre = frame.alloc(
                k,
                &format!("grad {}.out", 2 * l),
                &[b, dims[l + 1]],
                adt,
                Category::Temporary,
            )?;
            frame.drop(k, grad);
            grad = g_pre;
            match recomputed[l].take() {
                Some(h) => frame.drop(k, h),
                None => bw.release(k, plan.relu[l]),
            }
        }
        // addmm backward: the input's gradient (not for the batch itself),
        // then the weight's and the bias's.
        let g_in = if l > 0 {
            Some(frame.alloc(
                k,
                &format!("grad {}.relu", 2 * l - 1),
                &[b, dims[l]],
                adt,
                Category::Temporary,
            )?)
        } else {
            None
        };
        bw.grad_param(k, frame, 2 * l)?;
        bw.grad_param(k, frame, 2 * l + 1)?;
        bw.release(k, plan.weight_casts[l]);
        frame.drop(k, grad);
        // The layer's saved input goes (the previous ReLU output, or the
        // batch); at a segment's first layer, the segment's input.
        bw.release(k, plan.mat1[l]);
        if let Some(&(_, _, input)) = plan.segments.iter().find(|s| s.0 == l) {
            bw.release(k, Some(input));
        }
        match g_in {
            Some(gi) => grad = gi,
            None => break,
        }
    }
    frame.finish_from(k, mark);

    // The numbers.
    if let Some(cache) = &g.cache {
        if let Some(state) = ts.models.get_mut(&g.model) {
            let grads = math::backward(model_values(state), cache);
            state.grad_values.resize(grads.len(), None);
            for (slot, new) in state.grad_values.iter_mut().zip(grads) {
                match slot {
                    Some(old) => old.iter_mut().zip(&new).for_each(|(o, n)| *o += n),
                    None => *slot = Some(new),
                }
            }
        }
    }
    if !retain {
        k.clear_refs(graph);
        if let Some(state) = ts.graphs.get_mut(&graph) {
            state.consumed = true;
            state.cache = None;
        }
    }
    Ok(())
}

/// `optimizer.step()`. Returns whether the update was computed.
pub fn optimizer_step(
    k: &mut Kernel,
    frame: &mut Frame,
    ts: &mut TrainState,
    optimizer: ObjId,
) -> Result<bool, AllocFailure> {
    let mark = frame.mark();
    let opt = ts.optimizers[&optimizer].clone();
    let label = k
        .runtime
        .get(optimizer)
        .map(|o| o.label.clone())
        .unwrap_or_default();
    let with_grad: Vec<(usize, ObjId)> = opt
        .params
        .iter()
        .copied()
        .enumerate()
        .filter(|&(_, p)| grad_of(k, p).is_some())
        .collect();
    let shape_of = |k: &Kernel, p: ObjId| {
        let t = k.runtime.tensor(p).expect("parameter tensor");
        (t.shape.clone(), t.dtype)
    };
    let slots: &[&str] = match opt.kind {
        OptimizerKind::Sgd => &[],
        OptimizerKind::Momentum => &["momentum_buffer"],
        OptimizerKind::Adam | OptimizerKind::Adamw => &["exp_avg", "exp_avg_sq"],
    };
    let first = opt.state.is_empty() && !slots.is_empty() && !with_grad.is_empty();
    if first {
        // Lazy state, per parameter in order.
        let mut state = Vec::new();
        for &(i, p) in &with_grad {
            let (shape, dtype) = shape_of(k, p);
            for slot in slots {
                let t = frame.alloc(
                    k,
                    &format!("{label}.state[{i}].{slot}"),
                    &shape,
                    dtype,
                    Category::OptimizerState,
                )?;
                frame.take(t);
                k.attach_local(optimizer, t);
                state.push(t);
            }
        }
        if let Some(o) = ts.optimizers.get_mut(&optimizer) {
            o.state = state;
        }
    }
    if matches!(opt.kind, OptimizerKind::Adam | OptimizerKind::Adamw) {
        // _multi_tensor_adam: exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs).
        let mut temps = Vec::new();
        for &(i, p) in &with_grad {
            let (shape, dtype) = shape_of(k, p);
            temps.push(frame.alloc(
                k,
                &format!("{label}.exp_avg_sq_sqrt[{i}]"),
                &shape,
                dtype,
                Category::Temporary,
            )?);
        }
        // The list dies at the end of the update: its items last first.
        for t in temps.into_iter().rev() {
            frame.drop(k, t);
        }
    }
    frame.finish_from(k, mark);

    // The numbers, when every gradient was computed.
    let Some(model) = ts.models.get_mut(&opt.model) else {
        return Ok(false);
    };
    let grads: Option<Params> = model.grad_values.iter().cloned().collect();
    let (Some(grads), Some(values)) = (grads, model.values.as_mut()) else {
        return Ok(false);
    };
    if grads.len() != values.len() {
        return Ok(false);
    }
    let o = ts.optimizers.get_mut(&optimizer).expect("optimizer exists");
    if o.state_values.len() != o.state.len() {
        o.state_values = values
            .iter()
            .flat_map(|p| std::iter::repeat_n(vec![0f32; p.len()], slots.len()))
            .collect();
    }
    o.steps += 1;
    match o.kind {
        OptimizerKind::Sgd => math::sgd(values, &grads, o.lr),
        OptimizerKind::Momentum => {
            math::momentum(values, &grads, &mut o.state_values, o.steps == 1, o.lr)
        }
        OptimizerKind::Adam | OptimizerKind::Adamw => {
            let (mut m, mut v): (Params, Params) = (Vec::new(), Vec::new());
            for (i, s) in o.state_values.drain(..).enumerate() {
                if i % 2 == 0 {
                    m.push(s);
                } else {
                    v.push(s);
                }
            }
            math::adam(
                values,
                &grads,
                &mut m,
                &mut v,
                o.steps as i32,
                o.lr,
                o.kind == OptimizerKind::Adamw,
            );
            o.state_values = m.into_iter().zip(v).flat_map(|(a, b)| [a, b]).collect();
        }
    }
    Ok(true)
}

/// `optimizer.zero_grad(set_to_none=...)`; returns the bytes freed.
pub fn zero_grad(k: &mut Kernel, ts: &mut TrainState, optimizer: ObjId, set_to_none: bool) -> u64 {
    let opt = ts.optimizers[&optimizer].clone();
    let mut freed = 0;
    for &p in &opt.params {
        if let Some(g) = grad_of(k, p) {
            if set_to_none {
                freed += k.detach(p, g);
            }
        }
    }
    if let Some(model) = ts.models.get_mut(&opt.model) {
        if set_to_none {
            model.grad_values.iter_mut().for_each(|g| *g = None);
        } else {
            model
                .grad_values
                .iter_mut()
                .flatten()
                .for_each(|g| g.iter_mut().for_each(|v| *v = 0.0));
        }
    }
    freed
}
