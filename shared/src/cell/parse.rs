//! A recursive-descent parser from the cell's tokens to statements (here)
//! and their expressions (`expr`), every nesting bounded.

use super::ast::{target, Stmt, StmtKind};
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
        let t = self.for_target()?;
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

mod expr;

#[cfg(test)]
#[path = "parse_tests.rs"]
mod tests;
