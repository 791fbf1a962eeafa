//! What the cell knows of its names: imported modules (by their usual
//! aliases even without an import), values it keeps itself (host arrays,
//! loss functions, loaders' batch sizes, a Keras model's optimizer), and
//! which names it bound in the kernel.

use super::value::{Loader, TensorInfo, Value};
use crate::command::Command;
use crate::types::Framework;
use std::collections::{BTreeMap, BTreeSet};

/// Module paths under one spelling: `tensorflow.keras` and `tf.keras` are
/// `keras`, `torch.nn` is `nn`, `jax.numpy` is `jnp`, ...
const CANONICAL: [(&str, &str); 11] = [
    ("bitsandbytes", "bnb"),
    ("tensorflow.compat.v1.keras", "keras"),
    ("tf.compat.v1.keras", "keras"),
    ("tensorflow.keras", "keras"),
    ("tf.keras", "keras"),
    ("tensorflow", "tf"),
    ("jax.numpy", "jnp"),
    ("numpy", "np"),
    ("torch.nn.functional", "F"),
    ("torch.nn", "nn"),
    ("torch.utils.checkpoint", "checkpoint"),
];

/// Names a snippet often uses without importing them.
const USUAL: [(&str, &str); 21] = [
    ("bnb", "bnb"),
    ("torch", "torch"),
    ("nn", "nn"),
    ("F", "F"),
    ("optim", "torch.optim"),
    ("tf", "tf"),
    ("keras", "keras"),
    ("K", "keras.backend"),
    ("jax", "jax"),
    ("jnp", "jnp"),
    ("np", "np"),
    ("gc", "gc"),
    ("DataLoader", "torch.utils.data.DataLoader"),
    ("TensorDataset", "torch.utils.data.TensorDataset"),
    ("checkpoint_sequential", "checkpoint.checkpoint_sequential"),
    ("range", "builtins.range"),
    ("zip", "builtins.zip"),
    ("enumerate", "builtins.enumerate"),
    ("iter", "builtins.iter"),
    ("next", "builtins.next"),
    ("print", "builtins.print"),
];

/// `path` under its one spelling.
pub fn canonical(path: &str) -> String {
    for (long, short) in CANONICAL {
        if path == long {
            return short.to_string();
        }
        if let Some(rest) = path.strip_prefix(long).and_then(|r| r.strip_prefix('.')) {
            return format!("{short}.{rest}");
        }
    }
    path.to_string()
}

/// The framework a function belongs to, by its canonical path.
pub fn framework_of(path: &str) -> Option<Framework> {
    match path.split('.').next()? {
        "torch" | "nn" | "F" | "checkpoint" | "bnb" => Some(Framework::Pytorch),
        "tf" | "keras" => Some(Framework::Tensorflow),
        "jax" | "jnp" => Some(Framework::Jax),
        _ => None,
    }
}

/// What one Python name stands for in the cell (a name binds one thing).
#[derive(Clone, Debug)]
enum Binding {
    /// An imported module, by its canonical path.
    Module(String),
    /// A value the cell keeps itself.
    Value(Value),
    /// A kernel tensor the cell made, with its shape.
    Tensor(TensorInfo),
    /// A loader (kernel dataset) the cell made, with its batch size.
    Loader(Loader),
    /// A Keras model, with the optimizer `compile` made for it and its
    /// `jit_compile`.
    Keras(Option<String>, bool),
}

#[derive(Clone, Debug, Default)]
pub struct Names {
    names: BTreeMap<String, Binding>,
    /// Names the cell bound in the kernel.
    pub bound: BTreeSet<String>,
}

impl Names {
    /// `import module as name`
    pub fn import(&mut self, name: &str, module: &str) {
        self.bind(name, Binding::Module(canonical(module)));
    }

    /// What `a.b.c` stands for, when its first name is one the cell keeps.
    pub fn resolve(&self, path: &[&str]) -> Option<Value> {
        let (first, rest) = path.split_first()?;
        let module = match self.names.get(*first) {
            Some(Binding::Value(v)) => return rest.is_empty().then(|| v.clone()),
            Some(Binding::Module(m)) => m.as_str(),
            _ => USUAL.iter().find(|(n, _)| n == first).map(|(_, m)| *m)?,
        };
        let full = std::iter::once(module)
            .chain(rest.iter().copied())
            .collect::<Vec<_>>()
            .join(".");
        Some(Value::Func(canonical(&full)))
    }

    /// `name = value` for a value the cell keeps (not in the kernel).
    pub fn keep(&mut self, name: &str, value: Value) {
        self.bind(name, Binding::Value(value));
    }

    /// `name` now names a kernel tensor of this shape.
    pub fn keep_tensor(&mut self, name: &str, tensor: TensorInfo) {
        self.bind(name, Binding::Tensor(tensor));
    }

    /// `name` now names a kernel dataset read in batches.
    pub fn keep_loader(&mut self, name: &str, loader: Loader) {
        self.bind(name, Binding::Loader(loader));
    }

    /// `name` now names a Keras model, compiled with `optimizer` if any.
    pub fn keep_keras(&mut self, name: &str, optimizer: Option<String>) {
        let jit_compile = self.jit_compile(name);
        self.bind(name, Binding::Keras(optimizer, jit_compile));
    }

    /// `compile(jit_compile=...)` of the Keras model `name`.
    pub fn set_jit_compile(&mut self, name: &str, jit_compile: bool) {
        if let Some(Binding::Keras(_, j)) = self.names.get_mut(name) {
            *j = jit_compile;
        }
    }

    /// Whether XLA compiles the Keras model `name`'s step (Keras's
    /// `"auto"` on a GPU, unless `compile` said otherwise).
    pub fn jit_compile(&self, name: &str) -> bool {
        !matches!(self.names.get(name), Some(Binding::Keras(_, false)))
    }

    fn bind(&mut self, name: &str, binding: Binding) {
        self.names.insert(name.to_string(), binding);
    }

    /// `name` now names a kernel object (or nothing the cell keeps).
    pub fn forget(&mut self, name: &str) {
        self.names.remove(name);
    }

    /// The shape of the kernel tensor `name`, if the cell made it.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        match self.names.get(name)? {
            Binding::Tensor(t) => Some(t),
            _ => None,
        }
    }

    /// The loader `name`, if the cell made it.
    pub fn loader(&self, name: &str) -> Option<&Loader> {
        match self.names.get(name)? {
            Binding::Loader(l) => Some(l),
            _ => None,
        }
    }

    /// The Keras model `name`: the optimizer `compile` gave it, if any.
    pub fn keras(&self, name: &str) -> Option<Option<&str>> {
        match self.names.get(name)? {
            Binding::Keras(o, _) => Some(o.as_deref()),
            _ => None,
        }
    }

    /// `n = src` for kernel objects: `n` knows what `src` knows.
    pub fn alias(&mut self, n: &str, src: &str) {
        match self.names.get(src).cloned() {
            Some(b @ (Binding::Tensor(_) | Binding::Loader(_) | Binding::Keras(..))) => {
                self.bind(n, b)
            }
            _ => self.forget(n),
        }
    }

    /// A copy with comprehension variables bound.
    pub fn with(&self, bindings: &[(String, Value)]) -> Names {
        let mut n = self.clone();
        for (k, v) in bindings {
            n.keep(k, v.clone());
        }
        n
    }

    /// Follows the names the kernel binds and unbinds for `cmds`.
    pub fn follow(&mut self, cmds: &[Command]) {
        for c in cmds {
            match c {
                Command::Del(a) => {
                    self.bound.remove(&a.name);
                }
                c => {
                    if let Some(n) = binds(c) {
                        self.bound.insert(n.to_string());
                    }
                }
            }
        }
    }

    /// Names bound to a Python value the cell keeps, not the kernel.
    pub fn kept(&self, name: &str) -> bool {
        matches!(
            self.names.get(name),
            Some(Binding::Value(_) | Binding::Module(_))
        )
    }
}

/// The name a command binds in the kernel.
fn binds(c: &Command) -> Option<&str> {
    Some(match c {
        Command::Alloc(a) => &a.name,
        Command::Hold(a) => &a.name,
        Command::Assign(a) => &a.name,
        Command::Model(a) => &a.name,
        Command::Optimizer(a) => &a.name,
        Command::Data(a) => &a.name,
        Command::Forward(a) => &a.name,
        Command::TfSession(a) => &a.name,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_spelling_per_module() {
        assert_eq!(
            canonical("tensorflow.keras.backend.clear_session"),
            "keras.backend.clear_session"
        );
        assert_eq!(
            canonical("tf.compat.v1.keras.backend.clear_session"),
            "keras.backend.clear_session"
        );
        assert_eq!(canonical("tf.compat.v1.Session"), "tf.compat.v1.Session");
        assert_eq!(canonical("torch.nn.Linear"), "nn.Linear");
        assert_eq!(canonical("numpyx.zeros"), "numpyx.zeros");
        assert_eq!(
            framework_of("keras.layers.Dense"),
            Some(Framework::Tensorflow)
        );
    }

    #[test]
    fn imports_and_usual_names() {
        let mut n = Names::default();
        assert_eq!(
            n.resolve(&["torch", "cuda", "empty_cache"]),
            Some(Value::Func("torch.cuda.empty_cache".into()))
        );
        assert_eq!(n.resolve(&["x"]), None);
        n.import("backend", "tensorflow.keras.backend");
        assert_eq!(
            n.resolve(&["backend", "clear_session"]),
            Some(Value::Func("keras.backend.clear_session".into()))
        );
        n.keep("torch", Value::Int(1));
        assert_eq!(n.resolve(&["torch"]), Some(Value::Int(1)));
        assert_eq!(n.resolve(&["torch", "cuda"]), None);
    }
}
