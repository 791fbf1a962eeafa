//! The parser: precedence, blocks, lines and errors.

use super::*;
use crate::cell::ast::{Arg, Expr, Target};

fn one(src: &str) -> StmtKind {
    let mut s = parse(src).unwrap();
    assert_eq!(s.len(), 1, "{s:?}");
    s.remove(0).kind
}

fn name(n: &str) -> Expr {
    Expr::Name(n.into())
}

#[test]
fn assignments_and_tuples() {
    assert_eq!(
        one("x, y = a, b"),
        StmtKind::Assign(
            vec![Target::Tuple(vec![
                Target::Name("x".into()),
                Target::Name("y".into())
            ])],
            Expr::Tuple(vec![name("a"), name("b")])
        )
    );
    assert_eq!(
        one("a = b = c"),
        StmtKind::Assign(
            vec![Target::Name("a".into()), Target::Name("b".into())],
            name("c")
        )
    );
    assert_eq!(
        one("t += loss.item()"),
        StmtKind::AugAssign(
            Target::Name("t".into()),
            "+=",
            Expr::Call(
                Box::new(Expr::Attr(Box::new(name("loss")), "item".into())),
                vec![]
            )
        )
    );
}

#[test]
fn precedence() {
    let StmtKind::Expr(e) = one("1 + 2 * 3 ** 2 % 4 == 0") else {
        panic!()
    };
    let Expr::Binary(left, "==", _) = e else {
        panic!("{e:?}")
    };
    let Expr::Binary(_, "+", right) = *left else {
        panic!()
    };
    assert!(matches!(*right, Expr::Binary(_, "%", _)));
    let StmtKind::Expr(e) = one("-2 ** 2") else {
        panic!()
    };
    assert!(matches!(e, Expr::Unary("-", _)));
}

#[test]
fn calls_keywords_stars_and_comprehensions() {
    let StmtKind::Expr(Expr::Call(_, args)) = one(
        "nn.Sequential(nn.Linear(1, 2), *[m for _ in range(3) for m in (a, b)], dtype=torch.half)",
    ) else {
        panic!()
    };
    assert_eq!(args.len(), 3);
    assert!(matches!(&args[1], Arg::Star(Expr::ListComp(_, fors)) if fors.len() == 2));
    assert!(matches!(&args[2], Arg::Keyword(k, _) if k == "dtype"));
}

#[test]
fn blocks_with_lines() {
    let s = parse(
        "import torch\nfor x, y in loader:\n    loss = f(x)\n\n    loss.backward()\nopt.step()\n",
    )
    .unwrap();
    assert_eq!(s.len(), 3);
    assert_eq!((s[1].line, s[1].end_line), (2, 5));
    let StmtKind::For(_, _, body) = &s[1].kind else {
        panic!()
    };
    assert_eq!(body.len(), 2);
    assert_eq!(s[2].line, 6);
    assert_eq!(
        s[0].kind,
        StmtKind::Import(vec![("torch".into(), "torch".into())])
    );
}

#[test]
fn imports_bind_names() {
    assert_eq!(
        one("import jax.numpy as jnp, gc"),
        StmtKind::Import(vec![
            ("jnp".into(), "jax.numpy".into()),
            ("gc".into(), "gc".into())
        ])
    );
    assert_eq!(
        one("from torch import nn, optim as o"),
        StmtKind::Import(vec![
            ("nn".into(), "torch.nn".into()),
            ("o".into(), "torch.optim".into())
        ])
    );
}

#[test]
fn semicolons_and_one_line_blocks() {
    assert_eq!(parse("h = [x, y]; h.append(h)").unwrap().len(), 2);
    let s = parse("with torch.no_grad(): out = model(x)").unwrap();
    assert!(
        matches!(&s[0].kind, StmtKind::With(items, body) if items.len() == 1 && body.len() == 1)
    );
}

#[test]
fn unsupported_statements_are_skipped_whole() {
    let s = parse("def f(x):\n    return x\nwhile True:\n    pass\nelse:\n    pass\ntry:\n    a()\nexcept E as e:\n    b()\ngc.collect()").unwrap();
    let kinds: Vec<_> = s.iter().map(|s| s.kind.clone()).collect();
    assert_eq!(kinds.len(), 4, "{kinds:?}");
    assert_eq!(kinds[0], StmtKind::Unsupported("def".into()));
    assert_eq!(kinds[1], StmtKind::Unsupported("while".into()));
    assert_eq!(kinds[2], StmtKind::Unsupported("try".into()));
    assert_eq!(s[3].line, 11);
}

#[test]
fn errors_say_what_and_where() {
    let e = parse("x = torch.randn(3\ny = 1").unwrap_err();
    assert!(e.message.contains("SyntaxError"), "{e:?}");
    let e = parse("x = \n").unwrap_err();
    assert_eq!(e.line, 1);
    let e = parse("for x in y:\nz()").unwrap_err();
    assert!(e.message.contains("expected an indented block"));
    assert!(parse("x = {'a': 1}").unwrap_err().message.contains("dicts"));
    assert!(parse("x = a if b else c")
        .unwrap_err()
        .message
        .contains("conditional"));
}

/// However deeply a line nests (brackets, a chain of operators or
/// attributes, signs, blocks), the parser refuses it past its depth,
/// never overflowing the stack (10,000 brackets did natively; 2,000 in the
/// page); what real code writes still reads.
#[test]
fn nesting_is_refused_past_its_depth_not_overflowed() {
    let deep = |open: &str, inner: &str, close: &str, n: usize| {
        format!("x = {}{inner}{}", open.repeat(n), close.repeat(n))
    };
    let refused = [
        deep("(", "1", ")", 100_000),
        deep("[", "1", "]", 100_000),
        deep("f(", "1", ")", 100_000),
        format!("x = {}1", "1 + ".repeat(2_000_000)),
        format!("x = {}1", "-".repeat(100_000)),
        format!("x = 2{}", " ** 2".repeat(100_000)),
        format!("x = a{}", ".b".repeat(100_000)),
        format!("x = a{}", "[0]".repeat(100_000)),
        (0..150)
            .map(|i| format!("{}if x:\n", "    ".repeat(i)))
            .collect::<String>()
            + &"    ".repeat(150)
            + "y = 1\n",
        format!("if a:\n    pass\n{}", "elif b:\n    pass\n".repeat(5_000)),
    ];
    for source in refused {
        let err = parse(&source).unwrap_err();
        assert!(err.message.contains("nests too deeply"), "{}", err.message);
        assert!(err.message.contains(&format!("at most {MAX_DEPTH} levels")));
    }
    for source in [
        deep("(", "1", ")", 60),
        format!("x = {}1", "1 + ".repeat(60)),
        format!("x = a{}", ".b".repeat(60)),
    ] {
        assert!(parse(&source).is_ok(), "{source}");
    }
}
