//! Python's tokens for the cell: names, numbers, strings, operators, and
//! the NEWLINE / INDENT / DEDENT that make blocks, with Python's implicit
//! line joining inside brackets and `\` continuation.

use super::CellError;

#[derive(Clone, Debug, PartialEq)]
pub enum Tok {
    Name(String),
    Int(u128),
    Float(f64),
    Str(String),
    /// An operator or delimiter: `(`, `**`, `+=`, `...`.
    Op(&'static str),
    Newline,
    Indent,
    Dedent,
    End,
}

/// A token and the 1-based line it starts on.
#[derive(Clone, Debug, PartialEq)]
pub struct Token {
    pub tok: Tok,
    pub line: usize,
}

/// Longest first, so `**=` wins over `**` and `*`.
const OPS: [&str; 36] = [
    "...", "**=", "//=", "**", "//", "==", "!=", "<=", ">=", "+=", "-=", "*=", "/=", "%=", "->",
    "(", ")", "[", "]", "{", "}", ",", ":", ".", ";", "=", "+", "-", "*", "/", "%", "<", ">", "@",
    "~", "&",
];

/// The tokens of `source`, ending with `End`.
pub fn tokens(source: &str) -> Result<Vec<Token>, CellError> {
    let mut lexer = Lexer::default();
    for (i, text) in source.lines().enumerate() {
        lexer.line(i + 1, text)?;
    }
    lexer.finish(source.lines().count() + 1)
}

#[derive(Default)]
struct Lexer {
    out: Vec<Token>,
    indents: Vec<usize>,
    depth: usize,
    continued: bool,
}

impl Lexer {
    fn push(&mut self, tok: Tok, line: usize) {
        self.out.push(Token { tok, line });
    }

    fn line(&mut self, line: usize, text: &str) -> Result<(), CellError> {
        let body = text.trim_start();
        let joined = self.depth > 0 || self.continued;
        if !joined && (body.is_empty() || body.starts_with('#')) {
            return Ok(());
        }
        if !joined {
            self.indent(line, text.len() - body.len(), text)?;
        }
        self.continued = false;
        let rest = self.scan(line, body)?;
        if rest {
            self.continued = true;
        } else if self.depth == 0 {
            self.push(Tok::Newline, line);
        }
        Ok(())
    }

    fn indent(&mut self, line: usize, width: usize, text: &str) -> Result<(), CellError> {
        if text.starts_with('\t') {
            return Err(CellError::new(line, "indent with spaces, not tabs"));
        }
        let current = self.indents.last().copied().unwrap_or(0);
        if width > current {
            self.indents.push(width);
            self.push(Tok::Indent, line);
        }
        while width < self.indents.last().copied().unwrap_or(0) {
            self.indents.pop();
            self.push(Tok::Dedent, line);
        }
        if width != self.indents.last().copied().unwrap_or(0) {
            return Err(CellError::new(
                line,
                "IndentationError: unindent does not match any outer indentation level",
            ));
        }
        Ok(())
    }

    /// Scans one line's tokens; true when it ends with `\`.
    fn scan(&mut self, line: usize, text: &str) -> Result<bool, CellError> {
        let mut rest = text;
        loop {
            rest = rest.trim_start();
            let Some(c) = rest.chars().next() else {
                return Ok(false);
            };
            if c == '#' {
                return Ok(false);
            }
            if rest == "\\" {
                return Ok(true);
            }
            let (tok, len) = self.one(line, rest, c)?;
            rest = &rest[len..];
            self.push(tok, line);
        }
    }

    fn one(&mut self, line: usize, rest: &str, c: char) -> Result<(Tok, usize), CellError> {
        if starts_name(c) {
            let len = rest
                .find(|c: char| !(starts_name(c) || c.is_ascii_digit()))
                .unwrap_or(rest.len());
            return prefixed_string(line, rest, len)
                .unwrap_or_else(|| Ok((Tok::Name(rest[..len].to_string()), len)));
        }
        if c.is_ascii_digit() || (c == '.' && rest[1..].starts_with(|d: char| d.is_ascii_digit())) {
            return number(line, rest);
        }
        if c == '"' || c == '\'' {
            return string(line, rest, 0);
        }
        let op = OPS
            .iter()
            .find(|op| rest.starts_with(**op))
            .ok_or_else(|| CellError::new(line, format!("SyntaxError: invalid character {c:?}")))?;
        match *op {
            "(" | "[" | "{" => self.depth += 1,
            ")" | "]" | "}" => {
                self.depth = self
                    .depth
                    .checked_sub(1)
                    .ok_or_else(|| CellError::new(line, format!("SyntaxError: unmatched '{op}'")))?
            }
            _ => {}
        }
        Ok((Tok::Op(op), op.len()))
    }

    fn finish(mut self, line: usize) -> Result<Vec<Token>, CellError> {
        if self.depth > 0 {
            return Err(CellError::new(
                line - 1,
                "SyntaxError: a bracket is never closed",
            ));
        }
        for _ in self.indents.drain(..) {
            self.out.push(Token {
                tok: Tok::Dedent,
                line,
            });
        }
        self.out.push(Token {
            tok: Tok::End,
            line,
        });
        Ok(self.out)
    }
}

/// `f"..."`, `r'...'`, `b"..."`: a string with a prefix of `len` letters.
fn prefixed_string(line: usize, rest: &str, len: usize) -> Option<Result<(Tok, usize), CellError>> {
    let prefix = rest[..len].to_ascii_lowercase();
    let quoted = rest[len..].starts_with(['"', '\'']);
    let known = ["f", "r", "b", "u", "rb", "br", "fr", "rf"].contains(&prefix.as_str());
    (quoted && known).then(|| string(line, rest, len))
}

fn string(line: usize, rest: &str, prefix: usize) -> Result<(Tok, usize), CellError> {
    let quote = &rest[prefix..prefix + 1];
    if rest[prefix..].starts_with(&quote.repeat(3)) {
        return Err(CellError::new(
            line,
            "triple-quoted strings are not supported in the cell",
        ));
    }
    let body = &rest[prefix + 1..];
    let mut escaped = false;
    for (i, c) in body.char_indices() {
        match c {
            '\\' if !escaped => escaped = true,
            c if c.to_string() == quote && !escaped => {
                return Ok((Tok::Str(body[..i].to_string()), prefix + 1 + i + 1));
            }
            _ => escaped = false,
        }
    }
    Err(CellError::new(
        line,
        "SyntaxError: unterminated string literal",
    ))
}

fn number(line: usize, rest: &str) -> Result<(Tok, usize), CellError> {
    let mut len = 0;
    let bytes = rest.as_bytes();
    while len < bytes.len() {
        let c = bytes[len];
        let exponent_sign =
            (c == b'+' || c == b'-') && len > 0 && matches!(bytes[len - 1], b'e' | b'E');
        if c.is_ascii_alphanumeric() || c == b'_' || c == b'.' || exponent_sign {
            len += 1;
        } else {
            break;
        }
    }
    let text = rest[..len].replace('_', "");
    let bad = || {
        CellError::new(
            line,
            format!("SyntaxError: invalid number {:?}", &rest[..len]),
        )
    };
    let tok = if let Some(hex) = text.strip_prefix("0x") {
        Tok::Int(u128::from_str_radix(hex, 16).map_err(|_| bad())?)
    } else if text.contains(['.', 'e', 'E']) {
        Tok::Float(crate::input::decimal(&text).ok_or_else(bad)?)
    } else {
        Tok::Int(text.parse().map_err(|_| bad())?)
    };
    Ok((tok, len))
}

/// Whether `c` may begin a name: a letter, `_`, or any character beyond
/// ASCII (Python's names are Unicode; telling its letters from its symbols
/// would carry Unicode's tables into the page for names no lesson uses).
fn starts_name(c: char) -> bool {
    c == '_' || c.is_ascii_alphabetic() || !c.is_ascii()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(s: &str) -> Vec<Tok> {
        tokens(s).unwrap().into_iter().map(|t| t.tok).collect()
    }

    /// Python's names are Unicode (PEP 3131), digits after the first
    /// character.
    #[test]
    fn names_beyond_ascii_are_names() {
        assert_eq!(
            toks("größe_2 = 1"),
            vec![
                Tok::Name("größe_2".into()),
                Tok::Op("="),
                Tok::Int(1),
                Tok::Newline,
                Tok::End,
            ]
        );
    }

    #[test]
    fn a_line_of_python() {
        assert_eq!(
            toks("x = torch.randn(1024, 2**20, device=\"cuda\")  # a comment"),
            vec![
                Tok::Name("x".into()),
                Tok::Op("="),
                Tok::Name("torch".into()),
                Tok::Op("."),
                Tok::Name("randn".into()),
                Tok::Op("("),
                Tok::Int(1024),
                Tok::Op(","),
                Tok::Int(2),
                Tok::Op("**"),
                Tok::Int(20),
                Tok::Op(","),
                Tok::Name("device".into()),
                Tok::Op("="),
                Tok::Str("cuda".into()),
                Tok::Op(")"),
                Tok::Newline,
                Tok::End,
            ]
        );
    }

    #[test]
    fn blocks_and_joined_lines() {
        let t = toks("for x in y:\n    a(1,\n  2)\n    b()\nc()\n");
        let kinds: Vec<String> = t
            .iter()
            .map(|t| match t {
                Tok::Name(n) => n.clone(),
                Tok::Op(o) => o.to_string(),
                Tok::Int(i) => i.to_string(),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(
            kinds.join(" "),
            "for x in y : Newline Indent a ( 1 , 2 ) Newline b ( ) Newline Dedent c ( ) Newline End"
        );
    }

    #[test]
    fn numbers_and_strings() {
        assert_eq!(
            toks("1e-3 0.9 1_000 0x10 'a\\'b' f\"{x}\""),
            vec![
                Tok::Float(1e-3),
                Tok::Float(0.9),
                Tok::Int(1000),
                Tok::Int(16),
                Tok::Str("a\\'b".into()),
                Tok::Str("{x}".into()),
                Tok::Newline,
                Tok::End
            ]
        );
    }

    #[test]
    fn errors_name_the_line() {
        let e = tokens("a = 1\nb = 'open").unwrap_err();
        assert_eq!(
            (e.line, e.message.as_str()),
            (2, "SyntaxError: unterminated string literal")
        );
        let e = tokens("if a:\n    b\n  c").unwrap_err();
        assert_eq!(e.line, 3);
        assert!(tokens("a = (1,\n").is_err());
        assert!(tokens("a = 1)").is_err());
        assert!(tokens("a = $").is_err());
    }
}
