//! Evaluating an expression of the cell: literals, names and attributes,
//! calls (into the library, or on a value), indexing, comprehensions, and
//! the operators.

use super::ast::{Arg, Expr, Target};
use super::scope::Eval;
use super::value::{Args, Value};
use super::{library, ops, CellError};

impl Eval<'_> {
    pub fn expr(&self, e: &Expr) -> Result<Value, CellError> {
        Ok(match e {
            Expr::Int(i) => {
                Value::Int(i128::try_from(*i).map_err(|_| self.err("that number is too large"))?)
            }
            Expr::Float(f) => Value::Float(*f),
            Expr::Str(s) => Value::Str(s.clone()),
            Expr::Bool(b) => Value::Bool(*b),
            Expr::None | Expr::Ellipsis => Value::None,
            Expr::Tuple(items) => Value::Tuple(self.all(items)?),
            Expr::List(items) => Value::List(self.all(items)?),
            Expr::Name(_) | Expr::Attr(..) => self.path_or_attr(e)?,
            Expr::Call(func, args) => self.call(func, args)?,
            Expr::Index(value, index) => self.index(value, index)?,
            Expr::ListComp(item, fors) => self.comprehension(item, fors)?,
            Expr::Unary(op, v) => ops::unary(self, op, self.expr(v)?)?,
            Expr::Binary(a, op, b) => ops::binary(self, self.expr(a)?, op, self.expr(b)?)?,
        })
    }

    fn all(&self, items: &[Expr]) -> Result<Vec<Value>, CellError> {
        items.iter().map(|e| self.expr(e)).collect()
    }

    pub fn args(&self, args: &[Arg]) -> Result<Args, CellError> {
        let mut out = Args {
            pos: Vec::new(),
            kw: Vec::new(),
        };
        for a in args {
            match a {
                Arg::Pos(e) => out.pos.push(self.expr(e)?),
                Arg::Keyword(k, e) => out.kw.push((k.clone(), self.expr(e)?)),
                Arg::Star(e) => match self.expr(e)? {
                    Value::List(items) | Value::Tuple(items) => out.pos.extend(items),
                    other => {
                        return Err(self.err(format!("cannot unpack {} with *", other.describe())))
                    }
                },
            }
        }
        Ok(out)
    }

    /// A name or `a.b.c`: a value the cell knows, a kernel object, a
    /// module path, or an attribute of an object.
    fn path_or_attr(&self, e: &Expr) -> Result<Value, CellError> {
        if let Some(path) = e.path() {
            if let Some(v) = self.names.resolve(&path) {
                return Ok(match &v {
                    Value::Func(p) => library::constant(p).unwrap_or(v),
                    _ => v,
                });
            }
        }
        match e {
            Expr::Attr(value, attr) => ops::attribute(self, self.expr(value)?, attr),
            Expr::Name(n) => Ok(Value::Object(n.clone())),
            _ => unreachable!("paths are names and attributes"),
        }
    }

    fn call(&self, func: &Expr, args: &[Arg]) -> Result<Value, CellError> {
        let args = self.args(args)?;
        match self.expr(func)? {
            Value::Func(path) => library::call(self, &path, &args),
            callee => ops::call_value(self, callee, &args),
        }
    }

    fn index(&self, value: &Expr, index: &Expr) -> Result<Value, CellError> {
        let (v, i) = (self.expr(value)?, self.expr(index)?);
        match (&v, i.int()) {
            (Value::Tuple(items) | Value::List(items), Some(i)) => usize::try_from(i)
                .ok()
                .and_then(|i| items.get(i).cloned())
                .ok_or_else(|| self.err("IndexError: index out of range")),
            _ => Ok(Value::Opaque),
        }
    }

    /// `[item for _ in range(n)]` and `[m for _ in range(n) for m in (a, b)]`.
    fn comprehension(&self, item: &Expr, fors: &[(Target, Expr)]) -> Result<Value, CellError> {
        let mut out = vec![Vec::<(String, Value)>::new()];
        for (target, iter) in fors {
            let items = match self.scoped(&out[0], |e| e.expr(iter))? {
                Value::List(items) | Value::Tuple(items) => items,
                other => {
                    return Err(self.err(format!(
                        "cannot loop over {} in a comprehension",
                        other.describe()
                    )))
                }
            };
            let name = match target {
                Target::Name(n) => n.clone(),
                _ => return Err(self.err("a comprehension's loop variable must be one name")),
            };
            out = out
                .into_iter()
                .flat_map(|b| {
                    let name = &name;
                    items
                        .iter()
                        .map(move |v| [b.clone(), vec![(name.clone(), v.clone())]].concat())
                })
                .collect();
            if out.len() > 10_000 {
                return Err(self.err("that comprehension makes more than 10,000 items"));
            }
        }
        let values = out
            .iter()
            .map(|b| self.scoped(b, |e| e.expr(item)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Value::List(values))
    }

    /// Runs `f` with the comprehension's variables bound, in a copy of the
    /// names (they shadow nothing the cell keeps).
    fn scoped<T>(&self, bindings: &[(String, Value)], f: impl FnOnce(&Eval) -> T) -> T {
        let names = self.names.with(bindings);
        f(&Eval {
            names: &names,
            framework: self.framework,
            line: self.line,
        })
    }
}
