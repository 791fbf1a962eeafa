//! A training loop in the cell becomes one `train` command: the loop's
//! header gives the loader and the number of steps, its body the model, the
//! optimizer, and the techniques (autocast, gradient accumulation,
//! checkpointing, `zero_grad(set_to_none=...)`, how the running loss is kept).

use super::ast::{autocast, Arg, Expr, Stmt, StmtKind, Target};
use super::names::Names;
use super::scope::Eval;
use super::value::{Forward, Loader, Value};
use super::CellError;
use crate::command::{Amp, Command, LossHistory, TrainArgs};

/// What the loop's body was seen to do.
#[derive(Default)]
struct Facts {
    loss: Option<(String, Forward)>,
    backward: bool,
    optimizer: Option<String>,
    set_to_none: Option<bool>,
    amp: Amp,
    accumulate: Option<u64>,
    history: LossHistory,
}

const UNDERSTOOD: &str =
    "a training loop the cell runs: `for x, y in loader:` (or `zip(range(N), loader)`, \
`enumerate(loader)`, inside `for epoch in range(E):`) with `loss = criterion(model(x), y)`, \
`loss.backward()`, `opt.step()` and `opt.zero_grad()`";

pub fn training_loop(
    names: &Names,
    ev: &Eval,
    target: &Target,
    iter: &Expr,
    body: &[Stmt],
) -> Result<Vec<Command>, CellError> {
    if let Some((epochs, inner)) = epochs(ev, iter, body)? {
        let StmtKind::For(t, i, b) = &inner.kind else {
            unreachable!("epochs finds a for")
        };
        let inner_ev = Eval {
            line: inner.line,
            ..*ev
        };
        let mut cmds = training_loop(names, &inner_ev, t, i, b)?;
        if let Some(Command::Train(a)) = cmds.last_mut() {
            a.steps = a.steps.saturating_mul(epochs);
        }
        return Ok(cmds);
    }
    let (loader, steps) = header(ev, iter)?;
    let Some(&Loader { batch, samples, .. }) = names.loader(&loader) else {
        return Err(ev.err(format!(
            "the loop must read a DataLoader made in the cell: {UNDERSTOOD}"
        )));
    };
    let mut scope = names.clone();
    bind_batch(&mut scope, target, &loader);
    let mut facts = Facts::default();
    walk(&mut scope, ev, body, &mut facts)?;
    let (_, forward) = facts
        .loss
        .ok_or_else(|| ev.err(format!("this loop computes no loss: {UNDERSTOOD}")))?;
    if !facts.backward {
        return Err(ev.err(format!(
            "this loop never calls loss.backward(): {UNDERSTOOD}"
        )));
    }
    let optimizer = facts
        .optimizer
        .ok_or_else(|| ev.err(format!("this loop never calls opt.step(): {UNDERSTOOD}")))?;
    let set_to_none = facts.set_to_none.ok_or_else(|| {
        ev.err("this loop never calls opt.zero_grad(): gradients would add up forever")
    })?;
    if forward.loader != loader {
        return Err(ev.err(format!(
            "the model runs on a batch of `{}`, but the loop reads `{loader}`",
            forward.loader
        )));
    }
    // With `if (i + 1) % k == 0: opt.step()` the loop's count is of micro-batches.
    let accumulate = facts.accumulate.unwrap_or(1);
    let micro = steps.unwrap_or_else(|| samples.div_ceil(batch));
    Ok(vec![Command::Train(TrainArgs {
        model: forward.model,
        optimizer,
        data: loader,
        steps: micro.div_ceil(accumulate),
        batch_size: batch,
        accumulate,
        checkpointing: forward.checkpointing,
        amp: facts.amp,
        set_to_none,
        loss_history: facts.history,
        attention: Default::default(),
        donate: false,
        jit_compile: true,
    })])
}

/// `for epoch in range(E):` around one loop over a loader.
fn epochs<'a>(
    ev: &Eval,
    iter: &Expr,
    body: &'a [Stmt],
) -> Result<Option<(u64, &'a Stmt)>, CellError> {
    let Expr::Call(f, args) = iter else {
        return Ok(None);
    };
    if f.path() != Some(vec!["range"]) {
        return Ok(None);
    }
    let mut loops = body.iter().filter(|s| matches!(s.kind, StmtKind::For(..)));
    let (Some(inner), None) = (loops.next(), loops.next()) else {
        return Err(ev.err(format!(
            "a loop over range(...) must hold one loop over a loader: {UNDERSTOOD}"
        )));
    };
    let epochs = match args.as_slice() {
        [Arg::Pos(e)] => ev.expr(e)?.count(),
        _ => None,
    };
    let epochs =
        epochs.ok_or_else(|| ev.err("range(E) takes a positive whole number of epochs"))?;
    Ok(Some((epochs, inner)))
}

/// The loader and, for `zip(range(N), loader)`, the steps.
fn header(ev: &Eval, iter: &Expr) -> Result<(String, Option<u64>), CellError> {
    let loader = |e: &Expr| match ev.expr(e)? {
        Value::Object(l) if ev.names.loader(&l).is_some() => Ok(l),
        _ => Err(ev.err(format!(
            "the loop must read a DataLoader made in the cell: {UNDERSTOOD}"
        ))),
    };
    match iter {
        Expr::Call(f, args) => match (f.path().as_deref(), args.as_slice()) {
            (Some(["enumerate"]), [Arg::Pos(l)]) => Ok((loader(l)?, None)),
            (Some(["zip"]), [Arg::Pos(r), Arg::Pos(l)]) => {
                Ok((loader(l)?, Some(range_steps(ev, r)?)))
            }
            _ => Err(ev.err(format!("the cell does not know this loop: {UNDERSTOOD}"))),
        },
        e => Ok((loader(e)?, None)),
    }
}

fn range_steps(ev: &Eval, r: &Expr) -> Result<u64, CellError> {
    match r {
        Expr::Call(f, args) if f.path() == Some(vec!["range"]) && args.len() == 1 => match &args[0]
        {
            Arg::Pos(n) => ev
                .expr(n)?
                .count()
                .ok_or_else(|| ev.err("range(N) takes a positive whole number of steps")),
            _ => Err(ev.err("range(N) takes the number of steps")),
        },
        _ => Err(ev.err("zip(range(N), loader) runs N steps")),
    }
}

/// The loop variables: every name in the target is a batch (or its index).
fn bind_batch(scope: &mut Names, target: &Target, loader: &str) {
    match target {
        Target::Name(n) => scope.keep(n, Value::Batch(loader.to_string())),
        Target::Tuple(items) => items.iter().for_each(|t| bind_batch(scope, t, loader)),
        Target::Other(_) => {}
    }
}

/// The body in order; `with` and `if` blocks share the loop's names (as
/// in Python, they make no scope).
fn walk(scope: &mut Names, ev: &Eval, body: &[Stmt], facts: &mut Facts) -> Result<(), CellError> {
    for stmt in body {
        match &stmt.kind {
            StmtKind::With(items, inner) => {
                if let Some(amp) = items.iter().find_map(|(e, _)| autocast(e)) {
                    facts.amp = amp;
                }
                walk(scope, ev, inner, facts)?;
            }
            StmtKind::If(cond, then, orelse) => {
                match modulo(cond) {
                    Some(0) => {
                        let ev = Eval {
                            names: scope,
                            line: stmt.line,
                            framework: ev.framework,
                        };
                        return Err(ev.err("ZeroDivisionError: integer modulo by zero"));
                    }
                    Some(k) => facts.accumulate = Some(k),
                    None => {}
                }
                walk(scope, ev, then, facts)?;
                walk(scope, ev, orelse, facts)?;
            }
            _ => {
                let ev = Eval {
                    names: scope,
                    line: stmt.line,
                    framework: ev.framework,
                };
                let kept = statement(&ev, stmt, facts)?;
                for (name, value) in kept {
                    scope.keep(&name, value);
                }
            }
        }
    }
    Ok(())
}

/// One statement of the body; returns the names it binds.
fn statement(ev: &Eval, stmt: &Stmt, facts: &mut Facts) -> Result<Vec<(String, Value)>, CellError> {
    match &stmt.kind {
        StmtKind::Assign(targets, e) => {
            let v = ev.expr(e)?;
            if let (Value::Forward(f), [Target::Name(n)]) = (&v, targets.as_slice()) {
                if f.loss {
                    facts.loss = Some((n.clone(), f.clone()));
                }
            }
            Ok(targets.iter().flat_map(|t| names_of(t, &v)).collect())
        }
        StmtKind::AugAssign(_, "+=", e) => {
            if matches!(ev.expr(e)?, Value::Forward(_)) {
                facts.history = LossHistory::Tensor;
            }
            Ok(Vec::new())
        }
        StmtKind::Expr(e) => call(ev, e, facts).map(|()| Vec::new()),
        StmtKind::Pass | StmtKind::Import(_) => Ok(Vec::new()),
        _ => Err(ev.err(format!(
            "the cell cannot run this inside a loop: {UNDERSTOOD}"
        ))),
    }
}

fn names_of(t: &Target, v: &Value) -> Vec<(String, Value)> {
    match (t, v) {
        (Target::Name(n), v) => vec![(n.clone(), v.clone())],
        (Target::Tuple(ts), Value::Tuple(vs)) if ts.len() == vs.len() => ts
            .iter()
            .zip(vs)
            .flat_map(|(t, v)| names_of(t, v))
            .collect(),
        (Target::Tuple(ts), v) => ts.iter().flat_map(|t| names_of(t, v)).collect(),
        (Target::Other(_), _) => Vec::new(),
    }
}

/// `loss.backward()`, `opt.step()`, `opt.zero_grad(...)`, the AMP
/// scaler's `scale(loss).backward()` / `step(opt)` / `update()`,
/// `losses.append(...)`, `print(...)`.
fn call(ev: &Eval, e: &Expr, facts: &mut Facts) -> Result<(), CellError> {
    let Expr::Call(f, args) = e else {
        return Ok(());
    };
    let named = |a: Option<&Arg>| match a {
        Some(Arg::Pos(Expr::Name(n))) => Some(n.clone()),
        _ => None,
    };
    match f.as_ref() {
        Expr::Attr(_, m) if m == "backward" => facts.backward = true,
        Expr::Attr(recv, m) if m == "step" => {
            facts.optimizer = named(args.first()).or_else(|| recv.path().map(|p| p.join(".")));
            if !args.is_empty() && !facts.amp.is_on() {
                // `scaler.step(opt)`: a GradScaler means float16 autocast.
                facts.amp = Amp::Float16;
            }
        }
        Expr::Attr(recv, m) if m == "zero_grad" => {
            facts
                .optimizer
                .get_or_insert_with(|| recv.path().map(|p| p.join(".")).unwrap_or_default());
            let none = args.iter().find_map(|a| match a {
                Arg::Keyword(k, v) if k == "set_to_none" => Some(v),
                Arg::Pos(v) => Some(v),
                _ => None,
            });
            facts.set_to_none = Some(none.is_none_or(|v| *v != Expr::Bool(false)));
        }
        Expr::Attr(_, m) if m == "append" => {
            if let Some(Arg::Pos(a)) = args.first() {
                if matches!(ev.expr(a)?, Value::Forward(_)) {
                    facts.history = LossHistory::List;
                }
            }
        }
        Expr::Attr(_, m) if m == "update" => {}
        Expr::Name(n) if n == "print" => {}
        _ => {
            return Err(ev.err(format!(
                "the cell cannot run this inside a loop: {UNDERSTOOD}"
            )))
        }
    }
    Ok(())
}

/// `k` in `if (i + 1) % k == 0:`.
fn modulo(e: &Expr) -> Option<u64> {
    match e {
        Expr::Binary(_, "%", k) => match k.as_ref() {
            Expr::Int(k) => u64::try_from(*k).ok(),
            _ => None,
        },
        Expr::Binary(a, _, b) => modulo(a).or_else(|| modulo(b)),
        _ => None,
    }
}
