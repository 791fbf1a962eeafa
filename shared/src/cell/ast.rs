//! The cell's syntax tree: the part of Python's grammar the cell reads.

/// An expression.
#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    Name(String),
    Int(u128),
    Float(f64),
    Str(String),
    /// `True`, `False`.
    Bool(bool),
    None,
    Ellipsis,
    /// `value.attr`
    Attr(Box<Expr>, String),
    /// `func(args)`
    Call(Box<Expr>, Vec<Arg>),
    /// `value[index]`
    Index(Box<Expr>, Box<Expr>),
    Tuple(Vec<Expr>),
    List(Vec<Expr>),
    /// `[item for target in iter ...]`, the `for` clauses in order.
    ListComp(Box<Expr>, Vec<(Target, Expr)>),
    /// `-x`, `not x`.
    Unary(&'static str, Box<Expr>),
    /// `a + b`, `a ** b`, `a % b == 0`.
    Binary(Box<Expr>, &'static str, Box<Expr>),
}

/// A call's argument.
#[derive(Clone, Debug, PartialEq)]
pub enum Arg {
    Pos(Expr),
    Keyword(String, Expr),
    /// `*items`
    Star(Expr),
}

/// What an assignment or a `for` binds.
#[derive(Clone, Debug, PartialEq)]
pub enum Target {
    Name(String),
    Tuple(Vec<Target>),
    /// `obj.attr = ...` or `d[k] = ...`: read, never bound by the cell.
    Other(Expr),
}

/// A statement and the lines it spans (1-based, inclusive).
#[derive(Clone, Debug, PartialEq)]
pub struct Stmt {
    pub kind: StmtKind,
    pub line: usize,
    pub end_line: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub enum StmtKind {
    /// `import a.b as c`, `from a import b`: the names bound, to what.
    Import(Vec<(String, String)>),
    /// `a = b = value`
    Assign(Vec<Target>, Expr),
    /// `a += value`
    AugAssign(Target, &'static str, Expr),
    Del(Vec<Expr>),
    Expr(Expr),
    For(Target, Expr, Vec<Stmt>),
    With(Vec<(Expr, Option<Target>)>, Vec<Stmt>),
    If(Expr, Vec<Stmt>, Vec<Stmt>),
    Pass,
    /// `break` or `continue`.
    Jump(&'static str),
    /// A statement the cell does not run (`def`, `class`, `while`, ...): its keyword.
    Unsupported(String),
}

impl Expr {
    /// `a.b.c` as `["a", "b", "c"]`; `None` for anything else.
    pub fn path(&self) -> Option<Vec<&str>> {
        match self {
            Expr::Name(n) => Some(vec![n.as_str()]),
            Expr::Attr(value, attr) => {
                let mut p = value.path()?;
                p.push(attr.as_str());
                Some(p)
            }
            _ => None,
        }
    }
}

/// `torch.autocast('cuda', dtype=...)` (or `torch.cuda.amp.autocast()`):
/// the type it casts to, float16 unless `dtype` names bfloat16.
pub fn autocast(e: &Expr) -> Option<crate::command::Amp> {
    use crate::command::Amp;
    let Expr::Call(f, args) = e else { return None };
    f.path().filter(|p| p.last() == Some(&"autocast"))?;
    let bf16 = args.iter().any(|a| match a {
        Arg::Keyword(k, v) => {
            k == "dtype" && v.path().is_some_and(|p| p.last() == Some(&"bfloat16"))
        }
        _ => false,
    });
    Some(if bf16 { Amp::Bfloat16 } else { Amp::Float16 })
}

/// What an expression binds when it is assigned to.
pub fn target(e: Expr) -> Target {
    match e {
        Expr::Name(n) => Target::Name(n),
        Expr::Tuple(items) | Expr::List(items) => {
            Target::Tuple(items.into_iter().map(target).collect())
        }
        other => Target::Other(other),
    }
}
