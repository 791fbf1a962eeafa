//! Training objects: models, optimizers and datasets, and looking up an
//! object of a given class by name.

use super::{check_name, error, Engine, Outcome};
use crate::command::{DataArgs, ModelArgs, OptimizerArgs};
use crate::error::{CommandError, ErrorKind};
use crate::process::{AllocFailure, Process};
use crate::runtime::{Class, Holder, ObjId, ObjectKind};
use crate::train::frame::PyFrame;
use crate::train::kinds;
use crate::train::spec::Kind;
use crate::train::{DataSpec, DatasetState, ModelSpec, ModelState, OptimizerSpec, OptimizerState};
use crate::types::{Category, Dtype, Framework};
use crate::units::{format_size, PIB, TIB};

impl Engine {
    /// The object bound to `name`, which must be of `class`.
    pub(super) fn instance(&self, name: &str, class: Class) -> Result<ObjId, CommandError> {
        let id = self.lookup(name)?;
        let o = self.process.runtime.get(id).expect("bound objects exist");
        if o.kind != ObjectKind::Instance(class) {
            return Err(error(
                ErrorKind::InvalidValue,
                format!(
                    "`{name}` is a {}, not a {}",
                    o.kind.type_name(),
                    class.name()
                ),
            ));
        }
        Ok(id)
    }

    pub(super) fn model_state(&self, name: &str) -> Result<(ObjId, &ModelState), CommandError> {
        let id = self.instance(name, Class::Model)?;
        let Some(state) = self.train.models.get(&id) else {
            return Err(error(
                ErrorKind::InvalidValue,
                format!("`{name}` is a Hugging Face model: the engine runs its `generate` and its training statements (forward, backward, step, zero_grad, train); estimates and batch-size searches for it are `vramlab plan MODEL --task train` (and the plan page)"),
            ));
        };
        if let Some(session) = state.session {
            if self.train.sessions.get(&session).is_none_or(|s| s.closed) {
                return Err(error(
                    ErrorKind::RuntimeError,
                    format!("Attempted to use a closed Session. (`{name}` was built in a tf.Session that was closed; its variables are gone.)"),
                ));
            }
        }
        Ok((id, state))
    }

    pub(super) fn model(&mut self, a: &ModelArgs) -> Result<Outcome, CommandError> {
        let name = a.name.as_str();
        check_name(name)?;
        let invalid = |m| error(ErrorKind::InvalidValue, m);
        let spec = a.spec()?;
        spec.validate()?;
        if spec.param_bytes() >= TIB {
            return Err(invalid(format!(
                "{} parameters is absurd",
                spec.param_count()
            )));
        }
        let keras = a.keras || self.settings.framework == Framework::Tensorflow;
        let session = self.build_model(name, spec, keras)?;
        let mut note = format!(
            "`{name}` has {} parameters: {} on the device.",
            spec.param_count(),
            format_size(spec.param_bytes())
        );
        if let Kind::Transformer(t) = spec.kind {
            if t.lora_rank > 0 {
                note.push_str(&format!(
                    " LoRA of rank {}: {} of them (the adapters) train; the rest is frozen, with no gradients and no optimizer state.",
                    t.lora_rank,
                    kinds::count(&spec.trained_parameters())
                ));
            }
        }
        if session.is_some() {
            note.push_str(
                " Its variables belong to the open tf.Session: closing the session frees them.",
            );
        } else if keras {
            note.push_str(" Keras's global state holds the model too: `del` alone will not free it; clear_session() will.");
        }
        Ok(Outcome::note(note))
    }

    /// `name = Model(...).cuda()`: its parameters (and buffers) moved to
    /// the device in registration order. Returns the tf.Session that owns
    /// its variables, if one is open.
    pub(super) fn build_model(
        &mut self,
        name: &str,
        spec: ModelSpec,
        keras: bool,
    ) -> Result<Option<ObjId>, CommandError> {
        let session = self
            .train
            .open_session
            .filter(|_| self.settings.framework == Framework::Tensorflow);
        let mut frame = PyFrame::default();
        let model = frame.instance(&mut self.process, Class::Model, name);
        let owner = session.unwrap_or(model);
        let params = match self.move_to_device(&mut frame, name, owner, &spec) {
            Ok(params) => params,
            Err(f) => {
                let e = self.alloc_error(&f);
                frame.finish(&mut self.process);
                return Err(e);
            }
        };
        if keras && session.is_none() {
            self.process.runtime.hold(Holder::FrameworkState, model);
        }
        self.train.models.insert(
            model,
            ModelState {
                spec,
                params,
                values: None,
                grad_values: Vec::new(),
                session,
                seed: model ^ 0x6d6f_64656c,
                #[cfg(feature = "device-values")]
                device_resident: false,
                #[cfg(feature = "device-values")]
                device_grads: false,
            },
        );
        frame.take(model);
        self.process.bind_local(name, model);
        Ok(session)
    }

    /// Allocates every parameter, then every buffer, held by `owner`;
    /// returns the parameters.
    fn move_to_device(
        &mut self,
        frame: &mut PyFrame,
        name: &str,
        owner: ObjId,
        spec: &ModelSpec,
    ) -> Result<Vec<ObjId>, AllocFailure> {
        let parameters = spec.parameters();
        // With LoRA, peft makes the adapters on the device after
        // `model.cuda()` moved the (frozen) rest.
        let lora = parameters.iter().any(|t| t.frozen);
        let (adapters, base): (Vec<_>, Vec<_>) = parameters
            .iter()
            .enumerate()
            .partition(|(_, t)| lora && !t.frozen);
        let buffers = spec.buffers().into_iter().map(|t| (None, t));
        let order: Vec<(Option<usize>, kinds::NamedTensor)> = base
            .into_iter()
            .map(|(i, t)| (Some(i), t.clone()))
            .chain(buffers)
            .chain(adapters.into_iter().map(|(i, t)| (Some(i), t.clone())))
            .collect();
        let mut params = vec![None; parameters.len()];
        for (i, t) in order {
            let label = param_label(self.settings.framework, name, spec, &t.name);
            let k = &mut self.process;
            let p = frame.alloc(k, &label, &t.shape, t.dtype, Category::Parameter)?;
            frame.take(p);
            k.attach_local(owner, p);
            if let Some(i) = i {
                params[i] = Some(p);
            }
        }
        Ok(params.into_iter().flatten().collect())
    }

    pub(super) fn optimizer(&mut self, a: &OptimizerArgs) -> Result<Outcome, CommandError> {
        #[cfg(feature = "hf-models")]
        if let Some(m) = self.hf_model_id(&a.model) {
            return self.hf_optimizer(a, m);
        }
        let (name, model, kind) = (a.name.as_str(), a.model.as_str(), a.kind);
        check_name(name)?;
        let lr = a.lr.unwrap_or(kind.default_lr());
        if !(lr.is_finite() && lr > 0.0) {
            return Err(error(
                ErrorKind::InvalidValue,
                format!("lr must be a positive number, not {lr}"),
            ));
        }
        let spec = OptimizerSpec::new(kind, a.bits)?;
        if spec.is_8bit() && self.settings.framework != Framework::Pytorch {
            return Err(error(
                ErrorKind::InvalidValue,
                "8-bit optimizer state is bitsandbytes', a PyTorch library",
            ));
        }
        let (model_id, state) = self.model_state(model)?;
        let params = state.params.clone();
        let opt = self
            .process
            .runtime
            .new_local(ObjectKind::Instance(Class::Optimizer), name);
        for &p in &params {
            self.process.runtime.add_ref(opt, p);
        }
        self.train.optimizers.insert(
            opt,
            OptimizerState {
                kind,
                bits: spec.bits,
                model: model_id,
                params,
                lr,
                state: Vec::new(),
                state_values: Vec::new(),
                steps: 0,
                later_step: None,
            },
        );
        self.process.bind_local(name, opt);
        let framework = self.settings.framework;
        let class = match framework {
            Framework::Pytorch => format!(
                "{}{}",
                spec.python(),
                if kind == crate::train::OptimizerKind::Momentum {
                    "(momentum=0.9)"
                } else {
                    ""
                }
            ),
            _ => kind.written_in(framework, a.lr),
        };
        Ok(Outcome::note(format!(
            "`{name}` = {class}: it holds references to the parameters; its state ({}) is allocated at the first step.",
            state_words(spec)
        )))
    }

    pub(super) fn data(&mut self, a: &DataArgs) -> Result<Outcome, CommandError> {
        let name = a.name.as_str();
        check_name(name)?;
        let spec = DataSpec {
            samples: a.samples,
            features: a.features,
            classes: a.classes,
            on_device: a.on_device,
        };
        if spec.samples == 0 || spec.features == 0 || spec.classes < 2 {
            return Err(error(
                ErrorKind::InvalidValue,
                "a dataset needs at least 1 sample, 1 feature and 2 classes",
            ));
        }
        if spec
            .samples
            .checked_mul(spec.features)
            .is_none_or(|n| n >= PIB / 8)
        {
            return Err(error(
                ErrorKind::InvalidValue,
                "that dataset is absurdly large",
            ));
        }
        let mut frame = PyFrame::default();
        let ds = frame.instance(&mut self.process, Class::Dataset, name);
        let on_device = if spec.on_device {
            match upload_dataset(&mut self.process, &mut frame, ds, name, &spec) {
                Ok(tensors) => Some(tensors),
                Err(f) => {
                    frame.finish(&mut self.process);
                    return Err(self.alloc_error(&f));
                }
            }
        } else {
            None
        };
        self.train.datasets.insert(
            ds,
            DatasetState {
                spec,
                on_device,
                cursor: 0,
                seed: ds ^ 0xda7a,
            },
        );
        frame.take(ds);
        self.process.bind_local(name, ds);
        Ok(Outcome::note(if spec.on_device {
            format!(
                "All of `{name}` is on the device: {} held for as long as the dataset lives.",
                format_size(spec.device_bytes())
            )
        } else {
            format!("`{name}` stays in host memory; each batch is copied to the device when used.")
        }))
    }
}

/// The whole set on the device: features then labels, held by the dataset.
fn upload_dataset(
    k: &mut Process,
    frame: &mut PyFrame,
    ds: ObjId,
    name: &str,
    spec: &DataSpec,
) -> Result<(ObjId, ObjId), AllocFailure> {
    let shape = [spec.samples, spec.features];
    let x = frame.alloc(
        k,
        &format!("{name}.x"),
        &shape,
        Dtype::Float32,
        Category::Input,
    )?;
    let y = frame.alloc(
        k,
        &format!("{name}.y"),
        &[spec.samples],
        Dtype::Int64,
        Category::Input,
    )?;
    for t in [x, y] {
        frame.take(t);
        k.attach_local(ds, t);
    }
    Ok((x, y))
}

/// What an optimizer's state will be, in words.
fn state_words(spec: OptimizerSpec) -> String {
    match (spec.kind.state_per_param(), spec.is_8bit()) {
        (0, _) => "none".into(),
        (n, false) => format!("{n}x the parameters that get gradients"),
        (n, true) => format!(
            "{n} uint8 per element and {n} float32 absmax per 256 elements for tensors of 4096 elements or more, float32 for smaller ones"
        ),
    }
}

/// A parameter's name as the framework's code reaches it: PyTorch's
/// `model.0.weight`; JAX's pytree of an MLP, `params[0][0]` (a layer's
/// weight, then bias), or of another module, `params['0.weight']`;
/// Keras's `model.layers[0].kernel`.
fn param_label(framework: Framework, model: &str, spec: &ModelSpec, name: &str) -> String {
    let mlp_layer = (spec.kind == Kind::Mlp)
        .then(|| name.split_once('.'))
        .flatten()
        .and_then(|(index, what)| Some((index.parse::<usize>().ok()? / 2, what == "bias")));
    match (framework, mlp_layer) {
        (Framework::Jax, Some((layer, bias))) => format!("{model}[{layer}][{}]", u8::from(bias)),
        (Framework::Jax, None) => format!("{model}['{name}']"),
        (Framework::Tensorflow, Some((layer, bias))) => {
            format!(
                "{model}.layers[{layer}].{}",
                if bias { "bias" } else { "kernel" }
            )
        }
        _ => format!("{model}.{name}"),
    }
}
