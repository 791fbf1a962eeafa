//! A step one statement at a time, for every kind: `forward`
//! plays its program up to the loss and leaves the saved tensors (and the
//! batch parts they include) on an autograd graph the loss holds;
//! `backward` plays the rest over that graph, as a training loop's step
//! plays it whole. `opt.step()` and `zero_grad` are the same for every kind.

use super::placement::Placement;
use super::program::{Player, Target};
use super::training::{check_attention, check_batch};
use super::{check_name, error, Engine, Outcome};
use crate::command::{BackwardArgs, ForwardArgs, StepArgs, ZeroGradArgs};
use crate::error::{CommandError, ErrorKind};
use crate::process::AllocFailure;
use crate::runtime::{Class, ObjId};
use crate::train::autograd::{find_graph, BACKWARD_TWICE, NO_GRAD_FN};
use crate::train::cpu::{Computed, Values};
use crate::train::frame::PyFrame;
use crate::train::kinds::step::Program;
use crate::train::optimizer;
use crate::train::{GraphState, ProgramGraph};
use crate::types::{Category, Dtype};
use crate::units::format_size;
use serde_json::json;

/// A `forward` of a program: the loss's name, the model, the data, the
/// micro-batch.
pub(super) struct Statement<'a> {
    pub name: &'a str,
    pub model: ObjId,
    pub data: ObjId,
    pub batch: u64,
    /// Autograd records (not under `torch.no_grad()`, whose program ends
    /// with the forward pass and leaves no graph).
    pub grad: bool,
    /// The inputs and targets the code made, read where they are.
    pub given: Option<[ObjId; 2]>,
}

use super::step_words;

impl Engine {
    pub(super) fn forward(&mut self, a: &ForwardArgs) -> Result<Outcome, CommandError> {
        #[cfg(feature = "hf-models")]
        if let Some(m) = self.hf_model_id(&a.model) {
            return self.hf_forward(a, m);
        }
        let (name, model, data, batch) = (
            a.name.as_str(),
            a.model.as_str(),
            a.data.as_str(),
            a.batch_size,
        );
        check_name(name)?;
        let (model_id, state) = self.model_state(model)?;
        let spec = state.spec;
        let data_id = self.instance(data, Class::Dataset)?;
        check_batch(batch, &self.train.datasets[&data_id].spec, &spec)?;
        check_attention(a.attention, &spec)?;
        let options = self.step_options(a.attention, a.checkpointing, a.amp, 1);
        let given = match &a.batch {
            Some(names) => Some(self.given_batch(names, &spec, batch)?),
            None => None,
        };
        let program = match a.no_grad {
            true => spec.no_grad_program(batch, options),
            false => spec.step_program(batch, options),
        };
        let s = Statement {
            name,
            model: model_id,
            data: data_id,
            batch,
            grad: !a.no_grad,
            given,
        };
        let value = self.forward_program(&s, program)?;
        Ok(self.forward_outcome(name, a.no_grad, value))
    }

    /// `model(x)` and `criterion(out, y)` on tensors the code made: each
    /// has the shape and type the model reads, or is the base of a view
    /// that does (its first rows).
    fn given_batch(
        &self,
        names: &[String],
        spec: &crate::train::spec::ModelSpec,
        batch: u64,
    ) -> Result<[ObjId; 2], CommandError> {
        let (x_shape, x_dtype, y_shape) = spec.batch(batch);
        if names.len() != 2 {
            return Err(error(
                ErrorKind::InvalidValue,
                "`batch` names two tensors: the inputs and the targets",
            ));
        }
        let mut ids: [ObjId; 2] = [0; 2];
        for (i, (name, shape)) in names.iter().zip([&x_shape, &y_shape]).enumerate() {
            let id = self.lookup(name)?;
            let Some(t) = self.process.runtime.tensor(id) else {
                return Err(error(
                    ErrorKind::InvalidValue,
                    format!("`{name}` is not a tensor"),
                ));
            };
            // A view of a larger tensor (rows of a set on the GPU) reads
            // its first rows; the view holds the whole base.
            let fits = t.shape.len() == shape.len()
                && t.shape.first() >= shape.first()
                && t.shape[1..] == shape[1..];
            if !fits || (i == 0 && t.dtype != x_dtype) {
                return Err(error(
                    ErrorKind::RuntimeError,
                    format!(
                        "`{name}` is {:?} torch.{}, but the model reads {:?} torch.{} here",
                        t.shape,
                        t.dtype.torch_name(),
                        shape,
                        if i == 0 {
                            x_dtype.torch_name()
                        } else {
                            "int64"
                        },
                    ),
                ));
            }
            ids[i] = id;
        }
        Ok(ids)
    }

    /// What a forward pass left: the bytes its graph saved, the loss when
    /// computed.
    fn forward_outcome(
        &self,
        name: &str,
        no_grad: bool,
        value: Result<f32, Option<u64>>,
    ) -> Outcome {
        let graph = self
            .process
            .runtime
            .lookup(name)
            .and_then(|loss| find_graph(&self.process, loss));
        // What the graph saved; it holds the parameters too.
        let params = graph
            .and_then(|g| self.train.graphs.get(&g))
            .map(|g| g.saved.params.as_slice())
            .unwrap_or_default();
        let saved: u64 = graph
            .and_then(|g| self.process.runtime.get(g))
            .map(|g| {
                (g.refs.iter().filter(|t| !params.contains(t)))
                    .map(|&t| self.process.block_size(t))
                    .sum()
            })
            .unwrap_or(0);
        let mut note = step_words::forward(self.framework(), name, !no_grad, saved);
        note.push_str(&loss_note(value));
        Outcome {
            note: Some(note),
            value: Some(json!({"loss": value.ok(), "loss_computed": value.is_ok()})),
        }
    }

    pub(super) fn backward(&mut self, a: &BackwardArgs) -> Result<Outcome, CommandError> {
        #[cfg(feature = "hf-models")]
        if let Some(graph) = self.hf_graph(&a.name) {
            return self.hf_backward(graph);
        }
        let (name, retain) = (a.name.as_str(), a.retain_graph);
        let loss = self.lookup(name)?;
        let before = self.process.stats().allocated_bytes;
        match find_graph(&self.process, loss) {
            Some(graph) if self.train.graphs.get(&graph).is_some() => {
                self.backward_program(graph, retain)?
            }
            _ => return Err(error(ErrorKind::RuntimeError, NO_GRAD_FN)),
        }
        let after = self.process.stats().allocated_bytes;
        Ok(Outcome::note(step_words::backward(
            self.framework(),
            retain,
            before,
            after,
        )))
    }

    pub(super) fn optimizer_step(&mut self, a: &StepArgs) -> Result<Outcome, CommandError> {
        let opt = self.instance(&a.optimizer, Class::Optimizer)?;
        #[cfg(feature = "hf-models")]
        if self.hf.optimizers.contains_key(&opt) {
            return self.hf_step(opt);
        }
        let first = self.train.optimizers[&opt].state.is_empty();
        let mut frame = PyFrame::default();
        let before = self.process.stats().allocated_bytes;
        if let Err(f) = self.optimizer_step_in(&mut frame, opt) {
            return Err(self.raise_in_frame(frame, &f));
        }
        let grown = self.process.stats().allocated_bytes.saturating_sub(before);
        Ok(Outcome::note(if first && grown > 0 {
            format!(
                "The first step allocated the optimizer's state: {}.",
                format_size(grown)
            )
        } else {
            "The parameters were updated in place.".to_string()
        }))
    }

    pub(super) fn zero_grad(&mut self, a: &ZeroGradArgs) -> Result<Outcome, CommandError> {
        let (opt, set_to_none) = (
            self.instance(&a.optimizer, Class::Optimizer)?,
            a.set_to_none,
        );
        #[cfg(feature = "hf-models")]
        if self.hf.optimizers.contains_key(&opt) {
            return self.hf_zero_grad(opt, set_to_none);
        }
        let freed = optimizer::zero_grad(&mut self.process, &mut self.train, opt, set_to_none);
        Ok(Outcome::note(step_words::zero_grad(
            self.framework(),
            set_to_none,
            freed,
        )))
    }

    /// `loss = criterion(model(x.cuda()), y.cuda())`: the batch is copied
    /// in, the forward pass runs, and the graph keeps what autograd saved
    /// (the batch too, where a node saved it); the rest dies with the
    /// statement. The loss is bound to the statement's name; returns its
    /// value when the arithmetic ran.
    pub(super) fn forward_program(
        &mut self,
        s: &Statement,
        program: Program,
    ) -> Result<Result<f32, Option<u64>>, CommandError> {
        let mut frame = PyFrame::default();
        let spec = &self.train.models[&s.model].spec;
        let arithmetic = self.program_arithmetic(spec, &program);
        let (loss, placement) = match self.forward_in(&mut frame, s, &program) {
            Ok(made) => made,
            Err(f) => return Err(self.raise_in_frame(frame, &f)),
        };
        frame.finish(&mut self.process);
        self.process.bind_local(s.name, loss);
        let computed = arithmetic
            .is_ok()
            .then(|| self.forward_arithmetic(s, &program, &placement))
            .flatten();
        let value = match (computed.as_ref().and_then(|c| c.values.loss), arithmetic) {
            (Some(v), _) => Ok(v),
            (None, Err(why)) => Err(why),
            // A program whose arithmetic is faulty runs shape-only.
            (None, Ok(())) => Err(Some(0)),
        };
        let graph = find_graph(&self.process, loss);
        if let Some(g) = graph.and_then(|g| self.train.graphs.get_mut(&g)) {
            g.saved.program = program;
            g.saved.computed = computed;
        }
        Ok(value)
    }

    /// The forward pass's numbers on the next batch.
    fn forward_arithmetic(
        &mut self,
        s: &Statement,
        program: &Program,
        placement: &Placement,
    ) -> Option<Computed> {
        let spec = self.train.models[&s.model].spec;
        let mut computed = Computed {
            values: Values::default(),
            batch: self.next_batch(s.data, &spec, s.batch),
            #[cfg(feature = "device-values")]
            batch_at: placement.batch(),
        };
        let end = program.forward_end();
        self.run_arithmetic((s.model, placement), program, 0..end, &mut computed)?;
        Some(computed)
    }

    fn forward_in(
        &mut self,
        frame: &mut PyFrame,
        s: &Statement,
        program: &Program,
    ) -> Result<(ObjId, Placement), AllocFailure> {
        let spec = self.train.models[&s.model].spec;
        let (params, model) = self.model_target(s.model);
        let on_device = self.train.datasets[&s.data].on_device;
        let k = &mut self.process;
        // Tensors the code made are read where they are, as a view of the
        // set on the device is.
        let on_device = s.given.map(|[x, y]| (x, y)).or(on_device);
        let target = Target {
            name: &model,
            params: &params,
            loss: s.name,
            holder: None,
        };
        let mut player = Player::statement(program);
        let end = program.forward_end();
        let cublas = &mut self.train.cublas;
        let (x, y) = match on_device {
            // A view of the set on the device: nothing is copied.
            Some((x, y)) => {
                let (x, y) = (frame.hold(k, x), frame.hold(k, y));
                player.play(k, frame, cublas, 0..end, &target)?;
                (x, y)
            }
            // `criterion(model(x.cuda()), y.cuda())`: Python moves the
            // labels after the model's forward, as the loss needs them.
            None => {
                let (x_shape, x_dtype, y_shape) = spec.batch(s.batch);
                let x = frame.alloc(
                    k,
                    &format!("{}.x", s.name),
                    &x_shape,
                    x_dtype,
                    Category::Input,
                )?;
                let loss_starts = program.criterion_starts();
                player.play(k, frame, cublas, 0..loss_starts, &target)?;
                let y_name = format!("{}.y", s.name);
                let y = frame.alloc(k, &y_name, &y_shape, Dtype::Int64, Category::Input)?;
                player.play(k, frame, cublas, loss_starts..end, &target)?;
                (x, y)
            }
        };
        let loss = player.loss.expect("a forward pass makes its loss");
        // Placed before the graph takes the batch: the next batch's rows.
        let mut placement = std::mem::take(&mut player.placement);
        placement.place_batch(self, (s.data, &spec), || [Some(x), Some(y)]);
        let k = &mut self.process;
        if !s.grad {
            return Ok((frame.take(loss), placement));
        }
        let graph = frame.instance(k, Class::Graph, &format!("{}.grad_fn", s.name));
        let (saved, batch) = player.save_into(k, frame, graph, [x, y]);
        k.runtime.add_ref(loss, graph);
        for &p in &params {
            k.runtime.add_ref(graph, p);
        }
        let state = GraphState {
            model: s.model,
            saved: Box::new(ProgramGraph {
                // The program itself is moved in once the statement ran.
                program: Program::default(),
                saved,
                batch,
                params,
                model_name: model,
                computed: None,
            }),
            consumed: false,
        };
        self.train.graphs.insert(graph, state);
        Ok((frame.take(loss), placement))
    }

    /// The model's parameters and its name (the labels' prefix).
    fn model_target(&self, model: ObjId) -> (Vec<ObjId>, String) {
        let params = self.train.models[&model].params.clone();
        let name = self.process.runtime.get(model).map(|m| m.label.clone());
        (params, name.unwrap_or_else(|| "model".into()))
    }

    /// `loss.backward(retain_graph=...)` over a program's graph: the rest
    /// of the program, each saved tensor let go of where its node is done
    /// (kept for another backward when retained).
    pub(super) fn backward_program(
        &mut self,
        graph: ObjId,
        retain: bool,
    ) -> Result<(), CommandError> {
        let Some(state) = self.train.graphs.get_mut(&graph) else {
            return Ok(());
        };
        if state.consumed {
            return Err(error(ErrorKind::RuntimeError, BACKWARD_TWICE));
        }
        // Nodes that ran let go of what they saved, even if a later one
        // raises: without `retain_graph` there is no second backward.
        state.consumed = !retain;
        let mut frame = PyFrame::default();
        let train = &mut self.train;
        let Some(pg) = train.graphs.get(&graph).map(|g| &g.saved) else {
            return Ok(());
        };
        let target = Target {
            name: &pg.model_name,
            params: &pg.params,
            loss: "loss",
            holder: None,
        };
        let ops = pg.program.forward_end()..pg.program.ops.len();
        let k = &self.process;
        let mut player = Player::over_graph((k, &pg.program), graph, &pg.saved, pg.batch, retain);
        let played = player.play(
            &mut self.process,
            &mut frame,
            &mut train.cublas,
            ops,
            &target,
        );
        let placement = player.placement;
        if let Err(f) = played {
            return Err(self.raise_in_frame(frame, &f));
        }
        frame.finish(&mut self.process);
        if !retain {
            self.release_saved(graph);
        }
        self.backward_arithmetic(graph, retain, &placement);
        Ok(())
    }

    /// The rest of the program's arithmetic over what `forward` computed
    /// (a copy of it when the graph is retained): the gradients go into
    /// `.grad`.
    fn backward_arithmetic(&mut self, graph: ObjId, retain: bool, placement: &Placement) {
        let Some(g) = self.train.graphs.get_mut(&graph) else {
            return;
        };
        let model = g.model;
        let pg = &mut g.saved;
        let computed = match retain {
            true => pg.computed.clone(),
            false => pg.computed.take(),
        };
        let Some(mut computed) = computed else {
            return;
        };
        let program = std::mem::take(&mut pg.program);
        let rest = program.forward_end()..program.ops.len();
        if self
            .run_arithmetic((model, placement), &program, rest, &mut computed)
            .is_some()
        {
            self.add_grads(model, &mut computed.values);
        }
        if let Some(g) = self.train.graphs.get_mut(&graph) {
            g.saved.program = program;
        }
    }

    /// The graph lets go of whatever it still saved; it keeps the
    /// parameters (its nodes hold them while the loss lives).
    fn release_saved(&mut self, graph: ObjId) {
        let Some(g) = self.train.graphs.get(&graph) else {
            return;
        };
        let params = g.saved.params.clone();
        let held = self.process.runtime.get(graph).map(|g| g.refs.clone());
        for id in held.unwrap_or_default() {
            if !params.contains(&id) {
                self.process.detach(graph, id);
            }
        }
    }
}

/// What the note says of the loss: its value, or why it has none (the
/// step is too large to compute here).
fn loss_note(value: Result<f32, Option<u64>>) -> String {
    match value {
        Ok(v) => format!(" Loss {v:.4} (computed on the CPU)."),
        Err(Some(_)) => {
            " The step is too large to compute here: shape-only, loss not computed.".into()
        }
        Err(None) => format!(
            " Shape-only: {}, so no loss was computed.",
            crate::train::cpu::NOT_IN_THIS_BUILD
        ),
    }
}
