//! A recursive-descent parser from the cell's tokens to statements, with
//! Python's precedence: `or`, `and`, `not`, comparisons, `+ -`,
//! `* / // % @`, unary signs, `**`, then calls, attributes and indexing.

use super::ast::{target, Arg, Expr, Stmt, StmtKind, Target};
use super::lex::{tokens, Tok, Token};
use super::CellError;

/// The statements of `source`, top level first; blocks nest inside them.
pub fn parse(source: &str) -> Result<Vec<Stmt>, CellError> {
    let mut p = Parser {
        toks: tokens(source)?,
        pos: 0,
        depth: 0,
    };
    let mut out = Vec::new();
    while !p.at(&Tok::End) {
        out.extend(p.statement()?);
    }
    Ok(out)
}

/// Keywords that start a compound statement the cell does not run.
const UNSUPPORTED: [&str; 8] = [
    "def", "class", "while", "try", "lambda", "async", "return", "global",
];

/// How deep a statement may nest, counting brackets, operators in a chain,
/// unary signs and blocks: every reader of the tree (the evaluator, its
/// drop) recurses that deep, and the page's stack is small. Python's own
/// parser stops at 200 nested brackets and 100 indentation levels.
const MAX_DEPTH: usize = 100;

struct Parser {
    toks: Vec<Token>,
    pos: usize,
    /// How deep the tree being read nests here.
    depth: usize,
}

impl Parser {
    /// One level deeper; refused past [`MAX_DEPTH`]. (Each caller steps
    /// back out as it returns; an error ends the parse.)
    #[inline(never)]
    fn enter(&mut self) -> Result<(), CellError> {
        self.depth += 1;
        match self.depth > MAX_DEPTH {
            true => Err(self.error("this nests too deeply for the cell: at most 100 levels")),
            false => Ok(()),
        }
    }

    fn peek(&self) -> &Tok {
        &self.toks[self.pos].tok
    }

    fn line(&self) -> usize {
        self.toks[self.pos].line
    }

    fn prev_line(&self) -> usize {
        self.toks[self.pos.saturating_sub(1)].line
    }

    /// The line of the last token consumed that is not layout (a statement's end).
    fn end_line(&self) -> usize {
        self.toks[..self.pos]
            .iter()
            .rev()
            .find(|t| !matches!(t.tok, Tok::Newline | Tok::Indent | Tok::Dedent | Tok::End))
            .map_or(1, |t| t.line)
    }

    fn at(&self, tok: &Tok) -> bool {
        self.peek() == tok
    }

    fn at_op(&self, op: &str) -> bool {
        matches!(self.peek(), Tok::Op(o) if *o == op)
    }

    fn at_name(&self, name: &str) -> bool {
        matches!(self.peek(), Tok::Name(n) if n == name)
    }

    fn bump(&mut self) -> Tok {
        let t = self.peek().clone();
        if t != Tok::End {
            self.pos += 1;
        }
        t
    }

    fn eat_op(&mut self, op: &str) -> bool {
        let yes = self.at_op(op);
        if yes {
            self.pos += 1;
        }
        yes
    }

    fn eat_name(&mut self, name: &str) -> bool {
        let yes = self.at_name(name);
        if yes {
            self.pos += 1;
        }
        yes
    }

    fn error(&self, message: impl Into<String>) -> CellError {
        CellError::new(self.line(), message)
    }

    fn expect_op(&mut self, op: &str) -> Result<(), CellError> {
        if self.eat_op(op) {
            Ok(())
        } else {
            Err(self.error(format!("SyntaxError: expected '{op}'")))
        }
    }

    fn name(&mut self) -> Result<String, CellError> {
        match self.bump() {
            Tok::Name(n) => Ok(n),
            _ => Err(CellError::new(
                self.prev_line(),
                "SyntaxError: expected a name",
            )),
        }
    }

    // ---- statements ----

    fn statement(&mut self) -> Result<Vec<Stmt>, CellError> {
        let line = self.line();
        let kind = match self.peek() {
            Tok::Name(n) if n == "for" => self.for_stmt()?,
            Tok::Name(n) if n == "with" => self.with_stmt()?,
            Tok::Name(n) if n == "if" => self.if_stmt()?,
            Tok::Name(n) if UNSUPPORTED.contains(&n.as_str()) => self.skip_unsupported()?,
            Tok::Indent => return Err(self.error("IndentationError: unexpected indent")),
            _ => return self.simple_statements(),
        };
        Ok(vec![Stmt {
            kind,
            line,
            end_line: self.end_line(),
        }])
    }

    /// `a; b; c` up to the end of the line.
    fn simple_statements(&mut self) -> Result<Vec<Stmt>, CellError> {
        let mut out = Vec::new();
        loop {
            let line = self.line();
            let kind = self.simple()?;
            out.push(Stmt {
                kind,
                line,
                end_line: self.end_line(),
            });
            if !self.eat_op(";") || self.at(&Tok::Newline) {
                break;
            }
        }
        match self.bump() {
            Tok::Newline | Tok::End => Ok(out),
            other => Err(CellError::new(
                self.prev_line(),
                format!("SyntaxError: unexpected {}", describe(&other)),
            )),
        }
    }

    fn simple(&mut self) -> Result<StmtKind, CellError> {
        if self.eat_name("import") {
            return self.import();
        }
        if self.eat_name("from") {
            return self.import_from();
        }
        if self.eat_name("del") {
            return Ok(StmtKind::Del(self.expr_list_items()?));
        }
        if self.eat_name("pass") {
            return Ok(StmtKind::Pass);
        }
        for jump in ["break", "continue"] {
            if self.eat_name(jump) {
                return Ok(StmtKind::Jump(jump));
            }
        }
        self.expression_statement()
    }

    fn expression_statement(&mut self) -> Result<StmtKind, CellError> {
        let first = self.expr_list()?;
        for op in ["+=", "-=", "*=", "/=", "//=", "%=", "**="] {
            if self.eat_op(op) {
                let value = self.expr_list()?;
                return Ok(StmtKind::AugAssign(target(first), op, value));
            }
        }
        if !self.at_op("=") {
            return Ok(StmtKind::Expr(first));
        }
        let mut targets = vec![target(first)];
        let mut value = None;
        while self.eat_op("=") {
            if let Some(v) = value.take() {
                targets.push(target(v));
            }
            value = Some(self.expr_list()?);
        }
        Ok(StmtKind::Assign(targets, value.expect("at least one '='")))
    }

    /// `import a.b as c, d`
    fn import(&mut self) -> Result<StmtKind, CellError> {
        let mut bound = Vec::new();
        loop {
            let module = self.dotted()?;
            let name = if self.eat_name("as") {
                self.name()?
            } else {
                module.split('.').next().unwrap_or_default().to_string()
            };
            bound.push((name, module));
            if !self.eat_op(",") {
                return Ok(StmtKind::Import(bound));
            }
        }
    }

    /// `from a.b import c as d, e`
    fn import_from(&mut self) -> Result<StmtKind, CellError> {
        let module = self.dotted()?;
        if !self.eat_name("import") {
            return Err(self.error("SyntaxError: expected 'import'"));
        }
        let parens = self.eat_op("(");
        let mut bound = Vec::new();
        loop {
            let item = self.name()?;
            let name = if self.eat_name("as") {
                self.name()?
            } else {
                item.clone()
            };
            bound.push((name, format!("{module}.{item}")));
            if !self.eat_op(",") || (parens && self.at_op(")")) {
                break;
            }
        }
        if parens {
            self.expect_op(")")?;
        }
        Ok(StmtKind::Import(bound))
    }

    fn dotted(&mut self) -> Result<String, CellError> {
        let mut s = self.name()?;
        while self.eat_op(".") {
            s.push('.');
            s.push_str(&self.name()?);
        }
        Ok(s)
    }

    fn for_stmt(&mut self) -> Result<StmtKind, CellError> {
        self.bump();
        let mut items = vec![self.postfix()?];
        while self.eat_op(",") {
            items.push(self.postfix()?);
        }
        let t = if items.len() == 1 {
            target(items.remove(0))
        } else {
            Target::Tuple(items.into_iter().map(target).collect())
        };
        if !self.eat_name("in") {
            return Err(self.error("SyntaxError: expected 'in'"));
        }
        let iter = self.expr_list()?;
        Ok(StmtKind::For(t, iter, self.block()?))
    }

    fn with_stmt(&mut self) -> Result<StmtKind, CellError> {
        self.bump();
        let mut items = Vec::new();
        loop {
            let e = self.expr()?;
            let t = if self.eat_name("as") {
                Some(target(self.postfix()?))
            } else {
                None
            };
            items.push((e, t));
            if !self.eat_op(",") {
                break;
            }
        }
        Ok(StmtKind::With(items, self.block()?))
    }

    fn if_stmt(&mut self) -> Result<StmtKind, CellError> {
        self.bump();
        let cond = self.expr()?;
        let body = self.block()?;
        let orelse = if self.at_name("elif") {
            let line = self.line();
            // An `elif` is an `if` in the `else`: one level deeper.
            self.enter()?;
            let kind = self.if_stmt()?;
            self.depth -= 1;
            vec![Stmt {
                kind,
                line,
                end_line: self.end_line(),
            }]
        } else if self.eat_name("else") {
            self.block()?
        } else {
            Vec::new()
        };
        Ok(StmtKind::If(cond, body, orelse))
    }

    /// `: simple` on the same line, or `:` NEWLINE INDENT statements DEDENT.
    fn block(&mut self) -> Result<Vec<Stmt>, CellError> {
        self.enter()?;
        let body = self.plain_block();
        self.depth -= 1;
        body
    }

    fn plain_block(&mut self) -> Result<Vec<Stmt>, CellError> {
        self.expect_op(":")?;
        if !self.at(&Tok::Newline) {
            return self.simple_statements();
        }
        self.bump();
        if self.bump() != Tok::Indent {
            return Err(CellError::new(
                self.prev_line(),
                "IndentationError: expected an indented block",
            ));
        }
        let mut body = Vec::new();
        while !self.at(&Tok::Dedent) && !self.at(&Tok::End) {
            body.extend(self.statement()?);
        }
        self.bump();
        Ok(body)
    }

    /// Skips a statement the cell does not run, with its block and any
    /// `elif`/`else`/`except`/`finally` clauses.
    fn skip_unsupported(&mut self) -> Result<StmtKind, CellError> {
        let Tok::Name(keyword) = self.bump() else {
            unreachable!("called at a name")
        };
        loop {
            let mut depth = 0usize;
            while !(self.at(&Tok::End) || self.at(&Tok::Newline) && depth == 0) {
                match self.bump() {
                    Tok::Indent => depth += 1,
                    Tok::Dedent => depth = depth.saturating_sub(1),
                    _ => {}
                }
            }
            self.bump();
            if self.at(&Tok::Indent) {
                self.skip_block();
            }
            let clause = ["elif", "else", "except", "finally"]
                .iter()
                .any(|k| self.at_name(k));
            if !clause {
                return Ok(StmtKind::Unsupported(keyword));
            }
        }
    }

    fn skip_block(&mut self) {
        let mut depth = 0usize;
        loop {
            match self.bump() {
                Tok::Indent => depth += 1,
                Tok::Dedent if depth <= 1 => return,
                Tok::Dedent => depth -= 1,
                Tok::End => return,
                _ => {}
            }
        }
    }

    // ---- expressions ----

    /// `a, b` (a tuple) or one expression.
    fn expr_list(&mut self) -> Result<Expr, CellError> {
        let mut items = self.expr_list_items()?;
        Ok(
            if items.len() == 1 && !self.toks[self.pos - 1].tok.eq(&Tok::Op(",")) {
                items.remove(0)
            } else {
                Expr::Tuple(items)
            },
        )
    }

    fn expr_list_items(&mut self) -> Result<Vec<Expr>, CellError> {
        let mut items = vec![self.expr()?];
        while self.eat_op(",") {
            if self.ends_list() {
                break;
            }
            items.push(self.expr()?);
        }
        Ok(items)
    }

    fn ends_list(&self) -> bool {
        matches!(self.peek(), Tok::Newline | Tok::End)
            || [")", "]", "=", ";", ":"].iter().any(|o| self.at_op(o))
    }

    fn expr(&mut self) -> Result<Expr, CellError> {
        self.enter()?;
        let e = self.plain_expr();
        self.depth -= 1;
        e
    }

    fn plain_expr(&mut self) -> Result<Expr, CellError> {
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
    fn binary(&mut self, level: usize) -> Result<Expr, CellError> {
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

    fn unary(&mut self) -> Result<Expr, CellError> {
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

    fn postfix(&mut self) -> Result<Expr, CellError> {
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

    fn args(&mut self) -> Result<Vec<Arg>, CellError> {
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

    fn atom(&mut self) -> Result<Expr, CellError> {
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
    fn more_strings(&mut self, mut s: String) -> Expr {
        while let Tok::Str(more) = self.peek().clone() {
            self.bump();
            s.push_str(&more);
        }
        Expr::Str(s)
    }

    fn parenthesised(&mut self) -> Result<Expr, CellError> {
        if self.eat_op(")") {
            return Ok(Expr::Tuple(Vec::new()));
        }
        let e = self.expr_list()?;
        self.expect_op(")")?;
        Ok(e)
    }

    fn list(&mut self) -> Result<Expr, CellError> {
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

    fn comprehension(&mut self, item: Expr) -> Result<Expr, CellError> {
        let mut fors = Vec::new();
        while self.eat_name("for") {
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
            fors.push((t, self.binary(0)?));
        }
        if self.at_name("if") {
            return Err(self.error("`if` in a list comprehension is not supported in the cell"));
        }
        self.expect_op("]")?;
        Ok(Expr::ListComp(Box::new(item), fors))
    }
}

fn describe(t: &Tok) -> String {
    match t {
        Tok::Name(n) => format!("'{n}'"),
        Tok::Op(o) => format!("'{o}'"),
        Tok::Int(_) | Tok::Float(_) => "number".into(),
        Tok::Str(_) => "string".into(),
        Tok::Newline => "end of line".into(),
        Tok::Indent => "indent".into(),
        Tok::Dedent => "dedent".into(),
        Tok::End => "end of the cell".into(),
    }
}

#[cfg(test)]
#[path = "parse_tests.rs"]
mod tests;
