//! Expressions, with Python's precedence: `or`, `and`, `not`,
//! comparisons, `+ -`, `* / // % @`, unary signs, `**`, then calls,
//! attributes and indexing; lists, tuples and comprehensions.

use super::super::ast::{target, Arg, Expr, Target};
use super::super::lex::Tok;
use super::super::CellError;
use super::{describe, Parser};

impl Parser {
    /// `a, b` (a tuple) or one expression.
    pub(super) fn expr_list(&mut self) -> Result<Expr, CellError> {
        let mut items = self.expr_list_items()?;
        Ok(
            if items.len() == 1 && !self.toks[self.pos - 1].tok.eq(&Tok::Op(",")) {
                items.remove(0)
            } else {
                Expr::Tuple(items)
            },
        )
    }

    pub(super) fn expr_list_items(&mut self) -> Result<Vec<Expr>, CellError> {
        let mut items = vec![self.expr()?];
        while self.eat_op(",") {
            if self.ends_list() {
                break;
            }
            items.push(self.expr()?);
        }
        Ok(items)
    }

    pub(super) fn ends_list(&self) -> bool {
        matches!(self.peek(), Tok::Newline | Tok::End)
            || [")", "]", "=", ";", ":"].iter().any(|o| self.at_op(o))
    }

    pub(super) fn expr(&mut self) -> Result<Expr, CellError> {
        self.enter()?;
        let e = self.plain_expr();
        self.depth -= 1;
        e
    }

    pub(super) fn plain_expr(&mut self) -> Result<Expr, CellError> {
        if self.at_name("lambda") {
            return Err(self.error("lambda is not supported in the cell"));
        }
        let e = self.binary(0)?;
        if self.at_name("if") {
            return Err(self
                .error("conditional expressions (`a if c else b`) are not supported in the cell"));
        }
        Ok(e)
    }

    /// Binary operators by precedence level (0 = `or` … 5 = `* /`).
    pub(super) fn binary(&mut self, level: usize) -> Result<Expr, CellError> {
        const LEVELS: [&[&str]; 5] = [
            &["or"],
            &["and"],
            &["==", "!=", "<", ">", "<=", ">=", "in", "is"],
            &["+", "-"],
            &["*", "/", "//", "%", "@"],
        ];
        if level == LEVELS.len() {
            return self.unary();
        }
        if level == 2 && self.eat_name("not") {
            return Ok(Expr::Unary("not", Box::new(self.binary(level)?)));
        }
        let mut left = self.binary(level + 1)?;
        let depth = self.depth;
        loop {
            let Some(op) = LEVELS[level]
                .iter()
                .copied()
                .find(|op| self.at_op(op) || self.at_name(op))
            else {
                self.depth = depth;
                return Ok(left);
            };
            self.bump();
            // `a + b + c` nests to the left: each operator one level.
            self.enter()?;
            let right = self.binary(level + 1)?;
            left = Expr::Binary(Box::new(left), op, Box::new(right));
        }
    }

    pub(super) fn unary(&mut self) -> Result<Expr, CellError> {
        for op in ["-", "+", "~"] {
            if self.eat_op(op) {
                self.enter()?;
                let x = self.unary()?;
                self.depth -= 1;
                return Ok(Expr::Unary(op, Box::new(x)));
            }
        }
        let base = self.postfix()?;
        if self.eat_op("**") {
            self.enter()?;
            let power = self.unary()?;
            self.depth -= 1;
            return Ok(Expr::Binary(Box::new(base), "**", Box::new(power)));
        }
        Ok(base)
    }

    pub(super) fn postfix(&mut self) -> Result<Expr, CellError> {
        let mut e = self.atom()?;
        let depth = self.depth;
        loop {
            // `a.b(c)[d]` nests to the left: each step one level.
            if self.at_op(".") || self.at_op("(") || self.at_op("[") {
                self.enter()?;
            }
            if self.eat_op(".") {
                e = Expr::Attr(Box::new(e), self.name()?);
            } else if self.eat_op("(") {
                e = Expr::Call(Box::new(e), self.args()?);
            } else if self.eat_op("[") {
                let index = self.expr_list()?;
                self.expect_op("]")?;
                e = Expr::Index(Box::new(e), Box::new(index));
            } else {
                self.depth = depth;
                return Ok(e);
            }
        }
    }

    pub(super) fn args(&mut self) -> Result<Vec<Arg>, CellError> {
        let mut args = Vec::new();
        while !self.eat_op(")") {
            if self.eat_op("**") {
                return Err(self.error("`**kwargs` is not supported in the cell"));
            }
            let arg = if self.eat_op("*") {
                Arg::Star(self.expr()?)
            } else {
                let e = self.expr()?;
                match e {
                    Expr::Name(n) if self.eat_op("=") => Arg::Keyword(n, self.expr()?),
                    e => Arg::Pos(e),
                }
            };
            args.push(arg);
            if !self.eat_op(",") {
                self.expect_op(")")?;
                break;
            }
        }
        Ok(args)
    }

    pub(super) fn atom(&mut self) -> Result<Expr, CellError> {
        let line = self.line();
        Ok(match self.bump() {
            Tok::Name(n) => match n.as_str() {
                "True" => Expr::Bool(true),
                "False" => Expr::Bool(false),
                "None" => Expr::None,
                _ => Expr::Name(n),
            },
            Tok::Int(i) => Expr::Int(i),
            Tok::Float(f) => Expr::Float(f),
            Tok::Str(s) => self.more_strings(s),
            Tok::Op("...") => Expr::Ellipsis,
            Tok::Op("(") => self.parenthesised()?,
            Tok::Op("[") => self.list()?,
            Tok::Op("{") => {
                return Err(CellError::new(
                    line,
                    "dicts and sets are not supported in the cell",
                ))
            }
            other => {
                return Err(CellError::new(
                    line,
                    format!("SyntaxError: unexpected {}", describe(&other)),
                ))
            }
        })
    }

    /// `"a" "b"`: adjacent strings join.
    pub(super) fn more_strings(&mut self, mut s: String) -> Expr {
        while let Tok::Str(more) = self.peek().clone() {
            self.bump();
            s.push_str(&more);
        }
        Expr::Str(s)
    }

    pub(super) fn parenthesised(&mut self) -> Result<Expr, CellError> {
        if self.eat_op(")") {
            return Ok(Expr::Tuple(Vec::new()));
        }
        let e = self.expr_list()?;
        self.expect_op(")")?;
        Ok(e)
    }

    pub(super) fn list(&mut self) -> Result<Expr, CellError> {
        if self.eat_op("]") {
            return Ok(Expr::List(Vec::new()));
        }
        let first = self.expr()?;
        if self.at_name("for") {
            return self.comprehension(first);
        }
        let mut items = vec![first];
        while self.eat_op(",") && !self.at_op("]") {
            items.push(self.expr()?);
        }
        self.expect_op("]")?;
        Ok(Expr::List(items))
    }

    /// A `for` loop's (or a comprehension's) target, up to its `in`.
    pub(super) fn for_target(&mut self) -> Result<Target, CellError> {
        let mut targets = vec![self.postfix()?];
        while self.eat_op(",") {
            targets.push(self.postfix()?);
        }
        let t = if targets.len() == 1 {
            target(targets.remove(0))
        } else {
            Target::Tuple(targets.into_iter().map(target).collect())
        };
        if !self.eat_name("in") {
            return Err(self.error("SyntaxError: expected 'in'"));
        }
        Ok(t)
    }

    pub(super) fn comprehension(&mut self, item: Expr) -> Result<Expr, CellError> {
        let mut fors = Vec::new();
        while self.eat_name("for") {
            let t = self.for_target()?;
            fors.push((t, self.binary(0)?));
        }
        if self.at_name("if") {
            return Err(self.error("`if` in a list comprehension is not supported in the cell"));
        }
        self.expect_op("]")?;
        Ok(Expr::ListComp(Box::new(item), fors))
    }
}
