//! The plan on published shapes: what fits where, held to the GPU's
//! numbers and to what the run's parts must add up to.

use super::*;
use crate::config::Arch;
use crate::generate::Cache;
use crate::known::find;
use vramlab_device::framework::TorchVersion;
use vramlab_train::kinds::step::Attention;

fn question(model: &str, gpu: GpuModel, batch: u64, prompt: u64, new_tokens: u64) -> Question {
    let known = find(model).unwrap();
    Question {
        config: known.config,
        dtype: Dtype::Bfloat16,
        gpu,
        task: Task::Generate(Generation {
            batch,
            prompt,
            new_tokens,
            cache: Cache::Dynamic,
            attention: Attention::Sdpa,
        }),
        torch: TorchVersion::default(),
    }
}

/// A step of `batch` x `seq` tokens training every parameter with AdamW,
/// sdpa attention, nothing else asked for.
fn full_training(batch: u64, seq: u64) -> Training {
    Training {
        batch,
        seq,
        attention: Attention::Sdpa,
        checkpointing: false,
        lora: None,
        adam8bit: false,
        quant: None,
        amp: None,
    }
}

/// The question's `generate`, to change.
fn generation(q: &mut Question) -> &mut Generation {
    match &mut q.task {
        Task::Generate(g) => g,
        Task::Train(_) => unreachable!("a generate question"),
    }
}

/// The question a golden `generate` row of `hf_steps.py` asked of the
/// shipped shape `name`, on the H100.
fn golden_question(name: &str, row: &serde_json::Value) -> Question {
    let n = |k: &str| row[k].as_u64().unwrap();
    let mut q = question(
        name,
        GpuModel::H100_80gb,
        n("batch"),
        n("prompt"),
        n("new_tokens"),
    );
    if row["dtype"] == "float32" {
        q.dtype = Dtype::Float32;
    }
    if row["cache"] == "static" {
        generation(&mut q).cache = Cache::Static;
    }
    if row["attn"] == "eager" {
        generation(&mut q).attention = Attention::Eager;
    }
    q
}

/// The peak over the weights of a process whose cuBLAS workspaces were
/// kept before the run (the H100's: `hf_steps.py` trains before it
/// generates), as PyTorch 2.11 keeps them.
fn peak_over_weights_warm(q: &mut Question) -> f64 {
    q.torch = TorchVersion::V2_11;
    let r = run(q).unwrap();
    (r.peak_allocated - r.weights - r.held_at_peak(Holds::Workspace)) as f64
}

#[test]
fn an_8b_model_in_bfloat16_loads_on_a_24_gb_card_and_generates_within_it() {
    let q = question("Llama-3.1-8B", GpuModel::Rtx4090, 1, 512, 64);
    let r = run(&q).unwrap();
    // 8,030,261,248 bfloat16 parameters and two float32 frequency buffers,
    // each in 512-byte blocks.
    assert_eq!(r.weights, 16_060_522_496 + 2 * 512);
    assert!(r.fits(), "{r:?}");
    // The cache at the peak: 32 layers' keys and values of 8 heads x 128,
    // bfloat16, at most prompt + new tokens long.
    let kv = r.held_at_peak(Holds::KvCache);
    assert!(kv <= 32 * 2 * 8 * 128 * 2 * (512 + 64), "{kv}");
    assert!(r.peak_allocated < r.total - r.context);
    assert!(r.peak_reserved >= r.peak_allocated);
}

#[test]
fn a_batch_too_large_runs_out_in_the_prefill_and_the_largest_that_fits_is_found() {
    let q = question("Llama-3.1-8B", GpuModel::Rtx4090, 64, 2048, 8);
    let r = run(&q).unwrap();
    assert_eq!(
        r.out_of_memory.as_ref().map(|o| &o.0),
        Some(&Stop::Forward(0)),
        "{r:?}"
    );
    let a = answer(&question("Llama-3.1-8B", GpuModel::Rtx4090, 64, 2048, 8)).unwrap();
    assert!(
        a.largest_batch >= 1 && a.largest_batch < 64,
        "{}",
        a.largest_batch
    );
    let fits = |b| {
        run(&question("Llama-3.1-8B", GpuModel::Rtx4090, b, 2048, 8))
            .unwrap()
            .fits()
    };
    assert!(fits(a.largest_batch) && !fits(a.largest_batch + 1));
}

#[test]
fn weights_larger_than_the_card_stop_at_loading() {
    let r = run(&question("Llama-3.1-8B", GpuModel::T4, 1, 16, 4)).unwrap();
    assert_eq!(r.out_of_memory.as_ref().map(|o| &o.0), Some(&Stop::Weights));
    // How far loading got: what the allocator held when it was refused,
    // short of the model's 8,030,261,248 bfloat16 parameters.
    assert_eq!(r.model_bytes, 8_030_261_248 * 2);
    assert!(
        r.weights > r.total / 2 && r.weights < r.model_bytes,
        "{r:?}"
    );
}

/// From any guess, near or far, below or above, `largest_near` finds the
/// edge `largest` finds, and a close guess takes fewer runs.
#[test]
fn largest_near_finds_the_edge_from_any_guess() {
    for edge in [0u64, 1, 2, 7, 100, 4096] {
        for guess in [0u64, 1, 3, edge / 2, edge, edge + 1, 2 * edge + 5, 10_000] {
            for within in [1, 32, 256] {
                let found = largest_near(4096, (guess, within), |n| Ok(n <= edge)).unwrap();
                assert_eq!(found, edge, "edge {edge} guess {guess} within {within}");
            }
        }
    }
    let runs = |guess: u64| {
        let mut runs = 0;
        largest_near(100_000, (guess, 32), |n| {
            runs += 1;
            Ok(n <= 7606)
        })
        .unwrap();
        runs
    };
    let mut halving = 0;
    largest(100_000, |n| {
        halving += 1;
        Ok(n <= 7606)
    })
    .unwrap();
    assert!(runs(7400) < halving, "{} against {halving}", runs(7400));
}

#[test]
fn largest_finds_the_edge() {
    assert_eq!(largest(100, |n| Ok(n <= 37)).unwrap(), 37);
    assert_eq!(largest(100, |_| Ok(false)).unwrap(), 0);
    assert_eq!(largest(100, |_| Ok(true)).unwrap(), 100);
}

/// The H100's own figures (`tests/golden/hf_steps.json`, made by
/// `tests/reference/hf_steps.py`: Llama-3.2-1B in bfloat16 generating 4 x
/// 128 prompt tokens + 64 new, GPT-2 in float32 8 x 256 + 64, sdpa,
/// `max_memory_allocated()` over what lived before `generate`): the plan's
/// peak over the weights within 1% of each.
#[test]
fn generate_peaks_as_an_h100_measured_them() {
    let golden: serde_json::Value =
        serde_json::from_str(include_str!("../../../tests/golden/hf_steps.json")).unwrap();
    let cases = [("llama-3.2-1b", "Llama-3.2-1B"), ("gpt2", "gpt2")];
    for (row, (key, name)) in golden["generate"].as_array().unwrap().iter().zip(cases) {
        assert_eq!(row["model"], key);
        let mut q = golden_question(name, row);
        let measured = row["peak_bytes"].as_u64().unwrap() as f64;
        let ours = peak_over_weights_warm(&mut q);
        assert!(
            ((ours - measured) / measured).abs() < 0.01,
            "{name}: {ours} against {measured}"
        );
    }
}

/// The first `generate` in a new process on the H100 (PyTorch 2.11,
/// `tests/golden/hf_generate-fresh.log`): Qwen3-0.6B, 4 x 128 + 64 tokens,
/// whose first matrix product makes the cuBLAS workspace 2.11 keeps (32 MiB
/// on compute capability 9.0). The plan for 2.11 holds it too; for 2.15
/// each product's workspace comes and goes, and one is at the peak.
#[test]
fn the_first_generate_in_a_process_carries_its_cublas_workspace() {
    let log = include_str!("../../../tests/golden/hf_generate-fresh.log");
    let line = log.lines().next().unwrap();
    assert!(
        line.contains("'Qwen3-0.6B'") && !line.contains("static"),
        "{line}"
    );
    let measured: f64 = line.split_whitespace().last().unwrap().parse().unwrap();
    let mut q = question("Qwen3-0.6B", GpuModel::H100_80gb, 4, 128, 64);
    let workspace_at_peak = |q: &Question| {
        let r = run(q).unwrap();
        let held = r.held_at_peak(Holds::Workspace);
        (r, held)
    };
    q.torch = TorchVersion::V2_11;
    let (r, held) = workspace_at_peak(&q);
    assert_eq!(held, 32 << 20);
    let ours = (r.peak_allocated - r.weights) as f64;
    assert!(
        ((ours - measured) / measured).abs() < 0.01,
        "{ours} against {measured}"
    );
    q.torch = TorchVersion::V2_15;
    assert_eq!(workspace_at_peak(&q).1, 32 << 20);
    // On an RTX 4090 (compute capability 8.9) 2.15's workspace is
    // `:4096:2:16:8`'s 8,519,680 bytes.
    q.gpu = GpuModel::Rtx4090;
    assert_eq!(workspace_at_peak(&q).1, 8_519_680);
}

/// The other families on the H100 (`tests/golden/hf_steps-families.json`,
/// `hf_steps.py --families`; transformers 5.17 and PyTorch 2.11 there, the
/// plan follows 5.24's op order). The cases ran one after another in one
/// process that had trained first, so PyTorch 2.11's cuBLAS workspace was
/// kept before each, except after a static cache's case: transformers
/// compiles that one with CUDA graphs, and inductor's cudagraph trees clear
/// the workspaces around recording (`clear_cublas_manager` in
/// `torch/_inductor/cudagraph_trees.py`), so the next case makes it again
/// and its peak carries it. Each case is within 1% of the GPU's peak over
/// what lived before `generate`, or listed here with why it is not; a
/// listed case that comes within 1% fails, so the list stays true.
#[test]
fn generate_peaks_of_the_other_families_as_an_h100_measured_them() {
    let golden: serde_json::Value =
        serde_json::from_str(include_str!("../../../tests/golden/hf_steps-families.json")).unwrap();
    let differs: [(&str, &str, &str); 3] = [
        (
            "Qwen3-0.6B",
            "static",
            "on a GPU transformers compiles the decoding forward of a static cache (torch.compile, \
             reduce-overhead: CUDA graphs); the plan is the eager run, which disable_compile=True gives",
        ),
        ("Llama-3.1-8B", "static", "the same: compiled on the GPU"),
        (
            "Qwen3-0.6B",
            "dynamic",
            "+3.3%: the bytes asked for peak at 93,705,184 in the plan and 93,717,504 in \
             transformers' CPU trace; memory_allocated() counts whole blocks, and the plan's fresh \
             cache leaves 4.7 MB of unsplit remainders at its peak, the GPU's warm one 1.5 MB",
        ),
    ];
    let mut kept = true;
    for row in golden["generate"].as_array().unwrap() {
        let name = row["model"].as_str().unwrap();
        let mut q = golden_question(name, row);
        let cache = row["cache"].as_str().unwrap_or("dynamic");
        let ours = if kept {
            peak_over_weights_warm(&mut q)
        } else {
            q.torch = TorchVersion::V2_11;
            let r = run(&q).unwrap();
            (r.peak_allocated - r.weights) as f64
        };
        kept = cache != "static";
        let measured = row["peak_bytes"].as_u64().unwrap() as f64;
        let off = (ours - measured) / measured;
        let listed = differs.iter().find(|(m, c, _)| *m == name && *c == cache);
        match listed {
            None => assert!(
                off.abs() < 0.01,
                "{name} {cache}: {ours} against the H100's {measured}"
            ),
            Some((_, _, why)) => assert!(
                off.abs() >= 0.01,
                "{name} {cache} now within 1% ({ours} against {measured}): take it off the list ({why})"
            ),
        }
    }
}

/// `torch_dtype=` decides every parameter's type, whatever the config
/// says; the rotary frequencies stay float32, Gemma's embedding scale
/// follows the weights.
#[test]
fn the_weights_load_in_the_type_asked_for() {
    let mut q = question("gpt2", GpuModel::H100_80gb, 1, 8, 2);
    let bf16 = run(&q).unwrap().weights;
    q.dtype = Dtype::Float32;
    let f32 = run(&q).unwrap().weights;
    // 124,439,808 parameters; the caching allocator's blocks add what a
    // large request leaves of its segment when under 1 MiB (not split).
    let slack = 8 << 20;
    assert!(bf16 >= 248_879_616 && bf16 < 248_879_616 + slack, "{bf16}");
    assert!(
        f32 >= 2 * 248_879_616 && f32 < 2 * 248_879_616 + slack,
        "{f32}"
    );
    let mut gemma = question("gemma-2-2b", GpuModel::H100_80gb, 1, 8, 2);
    generation(&mut gemma).attention = vramlab_train::kinds::step::Attention::Eager;
    let half = run(&gemma).unwrap().weights;
    gemma.dtype = Dtype::Float32;
    assert!(run(&gemma).unwrap().weights > 2 * half - 4096);
}

/// The peak by token: one per forward. With the dynamic cache the last
/// token's peak is above the first's by about the cache's growth (32
/// layers' keys and values, 8 x 8 heads x 64 x 2 bytes a token each;
/// memory_allocated() counts whole blocks, so the steps between are not
/// all upward); with the static cache the decode steps' peaks stay within
/// a few blocks of each other.
#[test]
fn the_peak_by_token_grows_with_the_dynamic_cache_and_not_the_static_one() {
    let q = question("Llama-3.2-1B", GpuModel::H100_80gb, 8, 256, 32);
    let r = run(&q).unwrap();
    assert_eq!(r.by_token.len(), 32);
    let decode: Vec<u64> = r.by_token[1..].iter().map(|t| t.0).collect();
    let growth = 30 * 16 * 2 * 8 * 8 * 64 * 2;
    let rise = decode[decode.len() - 1] - decode[0];
    assert!(
        rise >= growth / 2 && rise <= 2 * growth,
        "{rise} against {growth}: {decode:?}"
    );
    let mut fixed = q;
    generation(&mut fixed).cache = Cache::Static;
    let r = run(&fixed).unwrap();
    let decode: Vec<u64> = r.by_token[1..].iter().map(|t| t.0).collect();
    let spread = decode.iter().max().unwrap() - decode.iter().min().unwrap();
    assert!(spread < growth / 4, "{spread}: {decode:?}");
}

/// Whether a batch fits need not be monotone near the limit: the caching
/// allocator's blocks fall otherwise from one batch to the next (the
/// README says so beside the largest batch the search reports).
#[test]
fn near_the_limit_whether_a_batch_fits_alternates() {
    let mut q = question("Qwen2.5-0.5B", GpuModel::Rtx4090, 840, 512, 256);
    let fits: Vec<bool> = (840..=845)
        .map(|b| {
            generation(&mut q).batch = b;
            run(&q).unwrap().fits()
        })
        .collect();
    assert_eq!(fits, [true, false, true, false, true, false]);
    // The answer says when the value below the one found does not fit.
    generation(&mut q).batch = 1;
    let a = answer(&q).unwrap();
    assert_eq!(a.largest_batch, 864);
    assert_eq!(a.batch_below_fails, Some(863));
}

/// Every training row the H100 recorded (`tests/reference/hf_steps.py`,
/// PyTorch 2.11, its cuBLAS workspaces kept from the first step) of a
/// family the step builds, without autocast: the second step's peak over
/// what lived before it: the Llama family's to the byte, GPT-2's within
/// 1%, Gemma's within 2%.
#[test]
fn training_steps_peak_as_the_h100_measured_them() {
    let text = [
        include_str!("../../../tests/golden/hf_steps.json"),
        include_str!("../../../tests/golden/hf_steps-families.json"),
    ];
    let names = [("llama-3.2-1b", "Llama-3.2-1B")];
    let mut checked = 0;
    for text in text {
        let golden: serde_json::Value = serde_json::from_str(text).unwrap();
        for row in golden["train"].as_array().unwrap() {
            let model = row["model"].as_str().unwrap();
            let name = names.iter().find(|n| n.0 == model).map_or(model, |n| n.1);
            let known = find(name);
            if known.is_none() {
                continue;
            }
            let n = |k: &str| row[k].as_u64().unwrap();
            let training = Training {
                batch: n("batch"),
                seq: n("seq"),
                attention: if row["attn"] == "eager" {
                    Attention::Eager
                } else {
                    Attention::Sdpa
                },
                checkpointing: row["checkpointing"].as_bool().unwrap_or(false),
                lora: row["lora"].as_u64(),
                adam8bit: false,
                quant: None,
                amp: (row["amp"] == "bfloat16").then_some(Dtype::Bfloat16),
            };
            let mut config = known.unwrap().config;
            // `hf_steps.py` turned GPT-2's dropout off.
            config.dropout = Default::default();
            let q = Question {
                config,
                dtype: if row["dtype"] == "float32" {
                    Dtype::Float32
                } else {
                    Dtype::Bfloat16
                },
                gpu: GpuModel::H100_80gb,
                task: Task::Train(training),
                torch: TorchVersion::V2_11,
            };
            let r = run(&q).unwrap();
            let ours = r.peak_allocated - r.weights - r.state - r.held_at_peak(Holds::Workspace);
            let theirs = n("peak_bytes");
            let ratio = ours as f64 / theirs as f64;
            if training.amp.is_some() {
                eprintln!("{model} under autocast: {ours} against {theirs} ({ratio:.4})");
            }
            match q.config.arch {
                // Recorded with transformers 5.17, whose Gemma masks and
                // sliding caches differ from 5.24's, which the step follows
                // (the CPU traces hold it to 5.24 event by event).
                Arch::Gemma2 | Arch::Gemma3 => {
                    assert!((ratio - 1.0).abs() < 0.02, "{model} {training:?}: {ratio}")
                }
                // In float32 on an H100, the memory-efficient kernel's
                // buffers, as `kinds::step::fused` has them.
                Arch::Gpt2 => assert!((ratio - 1.0).abs() < 0.01, "{model} {training:?}: {ratio}"),
                // Under autocast: within 1% (Qwen2.5-0.5B's step is
                // 0.61% above the H100's; GPT-2's within 1% too).
                _ if training.amp.is_some() => {
                    assert!((ratio - 1.0).abs() < 0.01, "{model} {training:?}: {ratio}")
                }
                _ => assert_eq!(ours, theirs, "{model} {training:?}"),
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 20);
}

/// The training searches stop at the tokens whose logits, their float32
/// copy and their log-probabilities alone would fill the card, and start
/// near where the asked run's memory points: the same answers as halving
/// every batch up to 4,096 and every sequence up to the model's positions.
#[test]
fn a_training_search_bounded_by_its_logits_finds_the_same_limits() {
    let known = find("Qwen2.5-0.5B").unwrap();
    let q = Question {
        config: known.config,
        dtype: Dtype::Bfloat16,
        gpu: GpuModel::T4,
        task: Task::Train(Training {
            batch: 1,
            seq: 512,
            attention: Attention::Sdpa,
            checkpointing: true,
            lora: Some(8),
            adam8bit: false,
            quant: None,
            amp: None,
        }),
        torch: TorchVersion::default(),
    };
    let a = answer(&q).unwrap();
    let fits = |task: Task| Ok(run(&Question { task, ..q }).is_ok_and(|r| r.fits()));
    let every_batch = largest(4096, |b| fits(q.task.with(b, 512))).unwrap();
    let every_seq = largest(known.config.max_positions, |n| fits(q.task.with(1, n))).unwrap();
    assert_eq!(
        (a.largest_batch, a.longest_prompt),
        (every_batch, every_seq)
    );
    assert!(a.largest_batch > 1 && a.longest_prompt > 512, "{a:?}");
}

/// At a training step's peak, without checkpointing, every decoder layer
/// holds the activations its backward needs; they are part of the
/// activations held then, the loss's tensors apart from them.
#[test]
fn a_step_s_activations_are_told_by_layer() {
    let known = find("Qwen3-0.6B").unwrap();
    let q = Question {
        config: known.config,
        dtype: Dtype::Bfloat16,
        gpu: GpuModel::H100_80gb,
        task: Task::Train(Training {
            batch: 2,
            seq: 1024,
            attention: Attention::Sdpa,
            checkpointing: false,
            lora: None,
            adam8bit: false,
            quant: None,
            amp: None,
        }),
        torch: TorchVersion::default(),
    };
    let r = run(&q).unwrap();
    let layers = &r.activations_by_layer;
    assert_eq!(layers.len() as u64, known.config.layers);
    assert!(layers.iter().all(|&b| b > 0), "{layers:?}");
    assert!(layers.iter().sum::<u64>() <= r.held_at_peak(Holds::Activation));
    // The peak comes in the loss: over 151,936 tokens its float32
    // log-probabilities (1.16 GiB for 2 x 1,024 tokens) are counted as
    // logits, not among the layers' activations.
    assert!(
        r.held_at_peak(Holds::Logits) >= 2 * 1024 * 151_936 * 4,
        "{r:?}"
    );
}

/// bitsandbytes' `AdamW8bit` state: the two quantization maps, then for
/// each parameter two 8-bit states and a float32 maximum per block of 256
/// (float32 states for parameters under 4,096 elements).
#[test]
fn adamw8bit_state_is_a_byte_an_element_and_a_maximum_a_block() {
    let known = find("Qwen2.5-0.5B").unwrap();
    let training = Training {
        adam8bit: true,
        ..full_training(1, 128)
    };
    let loaded = HfConfig {
        dtype: Dtype::Bfloat16,
        ..known.config
    };
    let params = parameters(&loaded);
    let sizes = adam_state(&loaded, &params, &training);
    let expected: u64 = 2 * 256 * 4
        + (params.iter())
            .map(|p| {
                let n = p.numel();
                if n < 4096 {
                    2 * n * 4
                } else {
                    2 * n + 2 * n.div_ceil(256) * 4
                }
            })
            .sum::<u64>();
    assert_eq!(sizes.iter().sum::<u64>(), expected);
    let q = Question {
        config: known.config,
        dtype: Dtype::Bfloat16,
        gpu: GpuModel::T4,
        task: Task::Train(training),
        torch: TorchVersion::default(),
    };
    let r = run(&q).unwrap();
    assert!(r.fits());
    assert_eq!(r.held_at_peak(Holds::Optimizer), 0);
}

/// QLoRA as the H100 ran it (`tests/golden/qlora.json`, made by
/// `tests/reference/gpu_qlora.py`: Llama-3.2-1B's shape by `from_pretrained`
/// in bitsandbytes' 4 bits, `prepare_model_for_kbit_training`, LoRA r=16
/// on every linear layer, two AdamW steps of 2 x 512, PyTorch 2.11): the
/// bytes the model holds, within 0.5% (an allocation of 2 MiB the H100
/// held without double quantization is left), and the second step's peak
/// over what lived before it, within 1% (it is 0.14% under). The script
/// never called `model.train()`: `from_pretrained` leaves the model in eval
/// mode, where transformers' layers skip their checkpoint and the forward
/// makes its `DynamicCache`, so the step ran without checkpointing. Its
/// float32 attention with grouped heads ran the math kernel (PyTorch 2.11's
/// memory-efficient kernel refuses grouped heads): 76 MiB a layer of
/// scores and repeated keys and values more than the fused kernel's.
#[test]
fn qlora_loads_and_steps_as_the_h100_measured_them() {
    let golden: serde_json::Value =
        serde_json::from_str(include_str!("../../../tests/golden/qlora.json")).unwrap();
    let mut config = find("Llama-3.2-1B").unwrap().config;
    config.dtype = Dtype::Bfloat16;
    let runs = golden["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3);
    for row in runs {
        let n = |k: &str| row[k].as_u64().unwrap();
        let quant = step::Quant4 {
            nf4: row["quant_type"] == "nf4",
            double_quant: row["double_quant"].as_bool().unwrap(),
            compute: Dtype::Bfloat16,
        };
        let q = Question {
            config,
            dtype: Dtype::Bfloat16,
            gpu: GpuModel::H100_80gb,
            task: Task::Train(Training {
                batch: n("batch"),
                seq: n("seq"),
                attention: Attention::Sdpa,
                checkpointing: false,
                lora: Some(16),
                adam8bit: false,
                quant: Some(quant),
                amp: None,
            }),
            torch: TorchVersion::V2_11,
        };
        let r = run(&q).unwrap();
        let ratio = r.weights as f64 / n("lora") as f64;
        assert!((ratio - 1.0).abs() < 0.005, "{quant:?}: loaded {ratio}");
        let ours = r.peak_allocated - r.weights - r.state - r.held_at_peak(Holds::Workspace);
        let theirs = row["steps"][1]["peak_over_before"].as_u64().unwrap();
        let ratio = ours as f64 / theirs as f64;
        assert!(
            (ratio - 1.0).abs() < 0.01,
            "{quant:?}: step {ours} against {theirs} ({ratio})"
        );
        // peft's adapters and AdamW's two states of them, exactly.
        assert_eq!(r.state, n("trainable") * 8, "{quant:?}");
    }
}

/// Training Llama-3.1-8B's every parameter on a 24 GB card does not fit
/// (AdamW's state alone is 60 GiB): checkpointing and LoRA together fit
/// before QLoRA alone, then an 80 GB card; each change offered is one the
/// planner played and found to fit, and the ones left out do not.
#[test]
fn a_step_that_does_not_fit_is_offered_the_cheapest_changes_that_do() {
    let known = find("Llama-3.1-8B").unwrap();
    let t = full_training(8, 512);
    let q = Question {
        config: known.config,
        dtype: Dtype::Bfloat16,
        gpu: GpuModel::Rtx4090,
        task: Task::Train(t),
        torch: TorchVersion::default(),
    };
    let a = answer(&q).unwrap();
    assert!(!a.run.fits());
    let offered: Vec<Vec<Change>> = a.remedies.iter().map(|r| r.changes.clone()).collect();
    assert_eq!(
        offered,
        [
            vec![Change::Checkpointing, Change::Lora],
            vec![Change::Qlora],
            vec![Change::Gpu(GpuModel::A100_80gb)],
        ]
    );
    let fits = |t: Training, gpu| {
        run(&Question {
            task: Task::Train(t),
            gpu,
            ..q
        })
        .unwrap()
    };
    let lora = Training {
        checkpointing: true,
        lora: Some(16),
        ..t
    };
    assert_eq!(fits(lora, q.gpu).peak_reserved, a.remedies[0].peak_reserved);
    // Neither alone fits, nor 8-bit AdamW, nor a smaller batch.
    for alone in [
        Training {
            checkpointing: true,
            ..t
        },
        Training {
            lora: Some(16),
            ..t
        },
        Training {
            adam8bit: true,
            ..t
        },
        Training { batch: 1, ..t },
    ] {
        assert!(!fits(alone, q.gpu).fits(), "{alone:?}");
    }
    assert!(!fits(t, GpuModel::A100_40gb).fits());
    assert!(a.remedies.iter().all(|r| r.peak_reserved <= r.total));
}

/// `generate` of too large a batch is offered the largest batch that fits,
/// then the smallest card with more memory that holds it as asked; a run
/// that fits is offered nothing.
#[test]
fn a_generation_that_does_not_fit_is_offered_a_smaller_batch_then_a_larger_card() {
    let q = question("Qwen2.5-0.5B", GpuModel::T4, 256, 4096, 16);
    let a = answer(&q).unwrap();
    assert!(!a.run.fits());
    assert_eq!(
        a.remedies[0].changes,
        [Change::Batch(a.largest_batch)],
        "{:?}",
        a.remedies
    );
    let gpus: Vec<Change> = (a.remedies.iter().skip(1))
        .flat_map(|r| r.changes.clone())
        .collect();
    let [Change::Gpu(gpu)] = gpus[..] else {
        panic!("{gpus:?}")
    };
    let on = |gpu| run(&Question { gpu, ..q }).unwrap().fits();
    assert!(on(gpu));
    let smaller = GpuModel::ALL.iter().copied().filter(|g| {
        g.spec().total_bytes > q.gpu.spec().total_bytes
            && g.spec().total_bytes < gpu.spec().total_bytes
    });
    for g in smaller {
        assert!(!on(g), "{g:?}");
    }
    let fitting = question("Qwen2.5-0.5B", GpuModel::T4, 1, 512, 16);
    assert!(answer(&fitting).unwrap().remedies.is_empty());
}
