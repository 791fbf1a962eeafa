//! A top-level statement becomes engine commands: assignments allocate,
//! alias, build or bind; `del` unbinds; calls free, step or train; a `with`
//! block runs its body under `no_grad`, `autocast` or a TF1 session.

use super::ast::{autocast, Expr, Stmt, StmtKind, Target};
use super::names::Names;
use super::scope::Eval;
use super::value::Value;
use super::CellError;
use crate::command::*;
use crate::types::Framework;

/// The `with` blocks a statement sits in.
#[derive(Clone, Copy, Default)]
pub struct Context {
    pub no_grad: bool,
    pub amp: Amp,
}

pub struct Translator {
    pub names: Names,
    pub framework: Framework,
}

impl Translator {
    fn eval(&self, line: usize) -> Eval<'_> {
        Eval {
            names: &self.names,
            framework: self.framework,
            line,
        }
    }

    pub fn statement(&mut self, stmt: &Stmt, cx: Context) -> Result<Vec<Command>, CellError> {
        let line = stmt.line;
        match &stmt.kind {
            StmtKind::Import(bound) => {
                for (name, module) in bound {
                    self.names.import(name, module);
                }
                Ok(Vec::new())
            }
            StmtKind::Pass => Ok(Vec::new()),
            StmtKind::Assign(targets, e) => {
                let v = self.eval(line).expr(e)?;
                self.assign(line, targets, v, cx)
            }
            StmtKind::Del(targets) => self.del(line, targets),
            StmtKind::Expr(e) => self.expression(line, e),
            StmtKind::For(target, iter, body) => {
                super::training::training_loop(&self.names, &self.eval(line), target, iter, body)
            }
            StmtKind::With(items, body) => self.with(line, items, body, cx),
            StmtKind::AugAssign(..) => Err(CellError::new(
                line,
                "`+=` is understood inside a training loop (`total_loss += loss.item()`), not on its own",
            )),
            StmtKind::If(..) => Err(CellError::new(line, "`if` is understood inside a training loop only")),
            StmtKind::Jump(k) => Err(CellError::new(line, format!("`{k}` outside a loop"))),
            StmtKind::Unsupported(k) => Err(CellError::new(
                line,
                format!("`{k}` is not in the cell's Python: it runs assignments, del, calls, with blocks and training loops"),
            )),
        }
    }

    fn expression(&mut self, line: usize, e: &Expr) -> Result<Vec<Command>, CellError> {
        match self.eval(line).expr(e)? {
            Value::Effect(cmds) => {
                self.after_effect(&cmds);
                Ok(cmds)
            }
            Value::Compile(cmds, jit_compile) => {
                self.after_effect(&cmds);
                if let Some(Command::Optimizer(a)) = cmds.first() {
                    self.names.set_jit_compile(&a.model, jit_compile);
                }
                Ok(cmds)
            }
            Value::Forward(_) => Err(CellError::new(
                line,
                "give the output a name (`out = model(x)`): the cell keeps what a name holds",
            )),
            Value::Tensor(t) if t.gpu => Err(CellError::new(
                line,
                "give the tensor a name (`x = ...`): an unnamed result is freed at once",
            )),
            _ => Ok(Vec::new()),
        }
    }

    /// What the cell learns from commands a call made.
    fn after_effect(&mut self, cmds: &[Command]) {
        for c in cmds {
            match c {
                Command::Optimizer(a) if self.names.keras(&a.model).is_some() => {
                    self.names.keep_keras(&a.model, Some(a.name.clone()));
                }
                Command::Data(a) => {
                    let loader = super::value::Loader {
                        samples: a.samples,
                        features: a.features,
                        batch: 1,
                        on_device: a.on_device,
                    };
                    self.names.keep_loader(&a.name, loader);
                }
                Command::Close(a) => self.names.forget(&a.name),
                _ => {}
            }
        }
    }

    fn del(&mut self, line: usize, targets: &[Expr]) -> Result<Vec<Command>, CellError> {
        let mut cmds = Vec::new();
        for t in targets {
            let Expr::Name(n) = t else {
                return Err(CellError::new(
                    line,
                    "the cell deletes names only: `del x, y`",
                ));
            };
            if !self.names.kept(n) {
                cmds.push(Command::Del(NameArgs { name: n.clone() }));
            }
            self.names.forget(n);
        }
        Ok(cmds)
    }

    fn assign(
        &mut self,
        line: usize,
        targets: &[Target],
        v: Value,
        cx: Context,
    ) -> Result<Vec<Command>, CellError> {
        let (first, rest) = targets.split_first().expect("an assignment has a target");
        let mut cmds = self.bind(line, first, v.clone(), cx)?;
        for t in rest {
            // `a = b = value`: `b` names what `a` holds.
            let v = match first {
                Target::Name(a) if !self.names.kept(a) => Value::Object(a.clone()),
                _ => v.clone(),
            };
            cmds.extend(self.bind(line, t, v, cx)?);
        }
        Ok(cmds)
    }

    fn bind(
        &mut self,
        line: usize,
        t: &Target,
        v: Value,
        cx: Context,
    ) -> Result<Vec<Command>, CellError> {
        match t {
            Target::Name(n) => self.bind_name(line, n, v, cx),
            Target::Tuple(ts) => {
                let items = match v {
                    Value::Tuple(vs) | Value::List(vs) if vs.len() == ts.len() => vs,
                    Value::Batch(l) => vec![Value::Batch(l); ts.len()],
                    other => {
                        return Err(CellError::new(
                            line,
                            format!("cannot unpack {} into {} names", other.describe(), ts.len()),
                        ))
                    }
                };
                let mut cmds = Vec::new();
                for (t, v) in ts.iter().zip(items) {
                    cmds.extend(self.bind(line, t, v, cx)?);
                }
                Ok(cmds)
            }
            Target::Other(_) => Err(CellError::new(line, "the cell assigns to names only")),
        }
    }

    fn bind_name(
        &mut self,
        line: usize,
        n: &str,
        v: Value,
        cx: Context,
    ) -> Result<Vec<Command>, CellError> {
        let name = n.to_string();
        let made = match v {
            Value::Tensor(t) if t.gpu => {
                let cmd = Command::Alloc(AllocArgs {
                    name: name.clone(),
                    bytes: None,
                    shape: Some(t.shape.clone()),
                    dtype: Some(t.dtype),
                    category: None,
                });
                self.names.keep_tensor(n, t);
                return Ok(vec![cmd]);
            }
            Value::Object(src) => return Ok(self.alias(n, &src)),
            Value::List(items) => Command::Hold(HoldArgs {
                name: name.clone(),
                items: list_items(line, items)?,
                cycle: false,
            }),
            Value::Model(a) => {
                if a.keras {
                    self.names.keep_keras(n, None);
                    return Ok(vec![Command::Model(ModelArgs { name, ..a })]);
                }
                Command::Model(ModelArgs {
                    name: name.clone(),
                    ..a
                })
            }
            Value::Optimizer(spec, lr, Some(model)) => Command::Optimizer(OptimizerArgs {
                name: name.clone(),
                model,
                kind: spec.kind,
                lr,
                bits: spec.bits,
            }),
            Value::Loader(l) => {
                let cmd = Command::Data(DataArgs {
                    name: name.clone(),
                    samples: l.samples,
                    features: l.features,
                    classes: DEFAULT_CLASSES,
                    on_device: l.on_device,
                });
                self.names.keep_loader(n, l);
                return Ok(vec![cmd]);
            }
            Value::Forward(f) => Command::Forward(ForwardArgs {
                name: name.clone(),
                model: f.model,
                batch_size: self
                    .names
                    .loader(&f.loader)
                    .map_or(DEFAULT_BATCH, |l| l.batch),
                data: f.loader,
                no_grad: cx.no_grad,
                amp: cx.amp,
                checkpointing: f.checkpointing,
                attention: Default::default(),
                #[cfg(feature = "given-batch")]
                batch: None,
            }),
            Value::Session => Command::TfSession(NameArgs { name: name.clone() }),
            Value::Effect(mut cmds) | Value::Compile(mut cmds, _) => {
                self.after_effect(&cmds);
                cmds.extend(self.keep(n, Value::Opaque));
                return Ok(cmds);
            }
            other => return Ok(self.keep(n, other)),
        };
        self.names.forget(n);
        Ok(vec![made])
    }

    /// `name = value` for a value the cell keeps; a name that held a kernel
    /// object drops its reference.
    fn keep(&mut self, n: &str, v: Value) -> Vec<Command> {
        let held = !self.names.kept(n) && self.names.bound.contains(n);
        self.names.keep(n, v);
        if held {
            vec![Command::Del(NameArgs {
                name: n.to_string(),
            })]
        } else {
            Vec::new()
        }
    }

    /// `y = x`: a second name for the same object.
    fn alias(&mut self, n: &str, src: &str) -> Vec<Command> {
        if n == src {
            return Vec::new();
        }
        self.names.alias(n, src);
        vec![Command::Assign(AssignArgs {
            name: n.to_string(),
            value: src.to_string(),
        })]
    }

    fn with(
        &mut self,
        line: usize,
        items: &[(Expr, Option<Target>)],
        body: &[Stmt],
        mut cx: Context,
    ) -> Result<Vec<Command>, CellError> {
        let mut cmds = Vec::new();
        let mut close = Vec::new();
        for (e, t) in items {
            if path_ends(e, &["no_grad", "inference_mode"]) {
                cx.no_grad = true;
                continue;
            }
            if let Some(amp) = autocast(e) {
                cx.amp = amp;
                continue;
            }
            match self.eval(line).expr(e)? {
                Value::Session => {
                    let Some(Target::Name(n)) = t else {
                        return Err(CellError::new(line, "name the session: `with tf.compat.v1.Session() as sess:`"));
                    };
                    cmds.extend(self.bind_name(line, n, Value::Session, cx)?);
                    close.push(Command::Close(NameArgs { name: n.clone() }));
                }
                _ => return Err(CellError::new(line, "the cell's `with` blocks are torch.no_grad(), torch.autocast(...) and tf.compat.v1.Session()")),
            }
        }
        for s in body {
            cmds.extend(self.statement(s, cx)?);
        }
        cmds.extend(close);
        Ok(cmds)
    }
}

fn path_ends(e: &Expr, names: &[&str]) -> bool {
    let Expr::Call(f, _) = e else { return false };
    f.path()
        .and_then(|p| p.last().copied())
        .is_some_and(|l| names.contains(&l))
}

/// `[x, y]`: every item a name in the kernel.
fn list_items(line: usize, items: Vec<Value>) -> Result<Vec<String>, CellError> {
    items
        .into_iter()
        .map(|v| match v {
            Value::Object(n) => Ok(n),
            other => Err(CellError::new(
                line,
                format!(
                    "a list in the cell holds names; give {} a name first",
                    other.describe()
                ),
            )),
        })
        .collect()
}
