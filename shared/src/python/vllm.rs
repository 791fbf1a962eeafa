//! The Python of `{"cmd": "serve"}`: vLLM's `LLM(...)` with the settings
//! the command gives, a shipped shape by its Hugging Face repository, a
//! config.json's object written to a folder and loaded with random
//! weights (`load_format="dummy"`).

use super::python_literal;
use crate::command::ServeArgs;
use serde_json::Value;

/// `from vllm import LLM` and the line that starts the engine.
pub fn serve_code(a: &ServeArgs) -> String {
    let mut args = Vec::new();
    let mut before = String::new();
    match &a.model {
        Value::String(name) => {
            let repo = repo_of(name);
            args.push(format!("model={repo:?}"));
        }
        other => {
            before = format!(
                "import json, os\nos.makedirs(\"model\", exist_ok=True)\njson.dump({}, open(\"model/config.json\", \"w\"))\n",
                python_literal(other)
            );
            args.push("model=\"model\", load_format=\"dummy\", skip_tokenizer_init=True".into());
        }
    }
    if let Some(u) = a.gpu_memory_utilization {
        args.push(format!("gpu_memory_utilization={u}"));
    }
    let numbers = [
        ("max_model_len", a.max_model_len),
        ("max_num_seqs", a.max_num_seqs),
        ("max_num_batched_tokens", a.max_num_batched_tokens),
    ];
    for (key, value) in numbers {
        if let Some(n) = value {
            args.push(format!("{key}={n}"));
        }
    }
    if let Some(k) = &a.kv_cache_dtype {
        args.push(format!("kv_cache_dtype={k:?}"));
    }
    if a.enforce_eager {
        args.push("enforce_eager=True".into());
    }
    if let Some(d) = a.dtype {
        args.push(format!("dtype={:?}", d.torch_name()));
    }
    format!(
        "{before}from vllm import LLM\n{} = LLM({})  # vLLM's engine core starts in a process of its own",
        a.name,
        args.join(", ")
    )
}

/// A shipped shape's Hugging Face repository (`meta-llama/Llama-3.1-8B`
/// for `Llama-3.1-8B`).
#[cfg(feature = "hf-models")]
fn repo_of(name: &str) -> String {
    crate::hf::known::find(name).map_or_else(|| name.to_string(), |k| k.repo())
}

#[cfg(not(feature = "hf-models"))]
fn repo_of(name: &str) -> String {
    name.to_string()
}

#[cfg(all(test, feature = "hf-models"))]
mod tests {
    use super::*;
    use crate::command::{parse_line, Command};

    #[test]
    fn a_shipped_shape_starts_by_its_repository() {
        let line = r#"{"cmd": "serve", "name": "llm", "model": "Llama-3.1-8B", "max_model_len": 32768, "kv_cache_dtype": "fp8"}"#;
        let Ok(Command::Serve(a)) = parse_line(line).command else {
            panic!("not serve");
        };
        assert_eq!(
            serve_code(&a),
            "from vllm import LLM\nllm = LLM(model=\"meta-llama/Llama-3.1-8B\", max_model_len=32768, kv_cache_dtype=\"fp8\")  # vLLM's engine core starts in a process of its own"
        );
    }
}
