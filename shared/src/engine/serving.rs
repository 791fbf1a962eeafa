//! vLLM in the kernel: `llm = LLM(model=..., gpu_memory_utilization=...)`
//! starts vLLM 0.33.0's engine core in a process of its own on the same
//! GPU (`VLLM_ENABLE_V1_MULTIPROCESSING`, on by default), which loads the
//! weights, profiles, allocates the KV cache and captures its CUDA graphs
//! (`hf::serve`). That memory is the other process's: this one's
//! `memory_allocated()` does not move, nvidia-smi does. When the `LLM`
//! object is collected its client's finalizer shuts the engine core down,
//! and the process's exit gives everything back to the driver.

use super::generating::thousands;
use super::{check_name, error, Engine, Outcome};
use crate::command::ServeArgs;
use crate::error::{CommandError, ErrorKind};
use crate::hf::ask::serve as ask;
use crate::hf::serve::{gib, Startup};
use crate::runtime::{Class, ObjId, ObjectKind};
use crate::units::format_size;
use serde_json::{json, Value};

impl Engine {
    pub(super) fn serve(&mut self, a: &ServeArgs) -> Result<Outcome, CommandError> {
        check_name(&a.name)?;
        let gpu = self.settings.gpu.ok_or_else(|| {
            error(
                ErrorKind::InvalidValue,
                "vLLM's start-up is modelled on a named card: restart with \"gpu\" (t4, l4, a100-40gb, a100-80gb, rtx-4090, h100-80gb, h200)",
            )
        })?;
        let asked = ask::read(&request(a, gpu.id())).map_err(invalid)?;
        let st = ask::startup(&asked).map_err(invalid)?;
        // The engine core's own CUDA context comes first; vLLM then wants
        // its share of the total free (`Worker.init_device`).
        let context = self.process.device.context_bytes();
        let (free, total) = self.process.device.mem_get_info();
        let free = free.saturating_sub(context);
        if free < st.requested {
            return Err(invalid(format!(
                "Free memory on device ({:.2}/{:.2} GiB) on startup is less than desired GPU memory utilization ({}, {:.2} GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
                gib(free as i64),
                gib(total as i64),
                asked.serving.gpu_memory_utilization,
                gib(st.requested as i64)
            )));
        }
        if let Some(why) = &st.refused {
            let kind = if why.starts_with("CUDA out of memory") {
                ErrorKind::OutOfMemory
            } else {
                ErrorKind::InvalidValue
            };
            return Err(error(
                kind,
                format!("vLLM's engine core did not start, and its process exited: {why}"),
            ));
        }
        let held = context + held_after_start(&st);
        self.process
            .device
            .other_process(held, true)
            .map_err(|e| error(ErrorKind::InvalidValue, e.to_string()))?;
        let id = self
            .process
            .runtime
            .new_local(ObjectKind::Instance(Class::Llm), &a.name);
        self.hf.llms.insert(id, held);
        self.process.bind_local(&a.name, id);
        Ok(started(&asked, &st, held))
    }

    /// The engine cores whose `LLM` died shut down: their processes exit.
    pub(super) fn llms_exit(&mut self, dead: &[ObjId]) {
        for id in dead {
            if let Some(held) = self.hf.llms.remove(id) {
                let _ = self.process.device.other_process(held, false);
            }
        }
    }
}

/// What the engine core holds once started: what stayed after profiling,
/// the KV cache, the CUDA graphs' pool, and the sampler's warm-up, run
/// after the graphs so that `empty_cache()` keeps its blocks (taken as the
/// profile's transient peak).
fn held_after_start(st: &Startup) -> u64 {
    st.consumed + st.num_blocks * st.block_bytes + st.cudagraph + st.transient_peak
}

fn invalid(e: impl std::fmt::Display) -> CommandError {
    error(ErrorKind::InvalidValue, e.to_string())
}

/// The plan request a command makes on the process's card.
fn request(a: &ServeArgs, gpu: &str) -> Value {
    let mut r = json!({"task": "serve", "gpu": gpu});
    match &a.model {
        Value::Object(_) => r["config"] = a.model.clone(),
        other => r["model"] = other.clone(),
    }
    let fields: [(&str, Option<Value>); 6] = [
        (
            "gpu_memory_utilization",
            a.gpu_memory_utilization.map(Value::from),
        ),
        ("max_model_len", a.max_model_len.map(Value::from)),
        ("max_num_seqs", a.max_num_seqs.map(Value::from)),
        (
            "max_num_batched_tokens",
            a.max_num_batched_tokens.map(Value::from),
        ),
        ("kv_cache_dtype", a.kv_cache_dtype.clone().map(Value::from)),
        ("dtype", a.dtype.map(|d| d.torch_name().into())),
    ];
    for (key, value) in fields {
        if let Some(v) = value {
            r[key] = v;
        }
    }
    if a.enforce_eager {
        r["enforce_eager"] = true.into();
    }
    r
}

fn started(asked: &ask::ServeAsked, st: &Startup, held: u64) -> Outcome {
    let s = &asked.serving;
    let note = format!(
        "vLLM's engine core started in a process of its own: {} of the weights, {} of KV cache ({} tokens, {:.2} requests of {} at once), {} of CUDA graphs; the process holds {} (its context included), none of it in this process's allocator.",
        format_size(st.weights),
        format_size(st.num_blocks * st.block_bytes),
        thousands(st.kv_tokens),
        st.max_concurrency,
        thousands(s.max_model_len),
        format_size(st.cudagraph),
        format_size(held),
    );
    let mut value = ask::to_json(asked, st);
    value["engine_process_bytes"] = held.into();
    Outcome {
        note: Some(note),
        value: Some(value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::StepRecord;

    fn run(engine: &mut Engine, line: &str) -> StepRecord {
        let r = engine.run_line(line);
        engine.check_invariants().unwrap();
        r
    }

    /// The engine core's memory is another process's: nvidia-smi's other
    /// processes grow by what the plan says it holds, this process's
    /// allocator by nothing; a second `LLM` while the first lives is
    /// refused by vLLM's free-memory check; `del` of the last name gives
    /// it all back, a name still holding it nothing.
    #[test]
    fn an_llm_is_another_processs_memory_until_it_is_collected() {
        let mut e = Engine::new_simulated();
        let r = run(
            &mut e,
            r#"{"cmd":"restart","framework":"pytorch","gpu":"rtx-4090"}"#,
        );
        assert!(r.ok, "{:?}", r.error);
        let free = r.stats.device_free_bytes;
        let r = run(
            &mut e,
            r#"{"cmd":"serve","name":"llm","model":"meta-llama/Llama-3.1-8B"}"#,
        );
        let message = r.error.unwrap().message;
        assert!(
            message.contains("the estimated maximum model length is 41136"),
            "{message}"
        );
        assert_eq!(r.stats.other_processes_bytes, 0);
        let line = r#"{"cmd":"serve","name":"llm","model":"meta-llama/Llama-3.1-8B","max_model_len":32768}"#;
        let r = run(&mut e, line);
        assert!(r.ok, "{:?}", r.error);
        let held = r.value.as_ref().unwrap()["engine_process_bytes"]
            .as_u64()
            .unwrap();
        assert_eq!(r.stats.other_processes_bytes, held);
        assert_eq!(r.stats.allocated_bytes, 0);
        assert_eq!(r.stats.device_free_bytes, free - held);
        // 90% of the card, and the engine core's own context.
        let total = crate::gpu::GpuModel::Rtx4090.spec().total_bytes;
        assert!(held > total * 9 / 10 && held < total * 9 / 10 + 400 * crate::units::MIB);
        let r = run(&mut e, &line.replace("\"llm\"", "\"again\""));
        let message = r.error.unwrap().message;
        assert!(
            message.starts_with("Free memory on device (1.49/23.65 GiB) on startup is less than desired GPU memory utilization (0.9, 21.29 GiB)"),
            "{message}"
        );
        run(&mut e, r#"{"cmd":"assign","name":"other","value":"llm"}"#);
        let r = run(&mut e, r#"{"cmd":"del","name":"llm"}"#);
        assert_eq!(r.stats.other_processes_bytes, held);
        let r = run(&mut e, r#"{"cmd":"del","name":"other"}"#);
        assert_eq!(r.stats.other_processes_bytes, 0);
        assert_eq!(r.stats.device_free_bytes, free);
        assert!(r.note.unwrap().contains("shut the engine core down"));
    }
}
