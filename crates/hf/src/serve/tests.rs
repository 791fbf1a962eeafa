use super::*;
use crate::known;
use serde_json::json;
use vramlab_core::units::MIB;

fn shape(name: &str) -> HfConfig {
    known::find(name).unwrap().config
}

/// A card as a start-up log reports it: its total in GiB.
fn card(total_gib: f64, cc: (u32, u32), sms: u64) -> Card {
    Card {
        total: (total_gib * (1u64 << 30) as f64) as u64,
        compute_capability: cc,
        sms,
        large: total_gib >= 70.0,
    }
}

/// A start-up log of a public issue: the card, the model, the settings,
/// and the KV cache memory it printed.
struct Logged {
    link: &'static str,
    card: Card,
    config: HfConfig,
    serving: Serving,
    kv_gib: f64,
}

fn llama3_8b() -> HfConfig {
    HfConfig::read(
        &json!({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "vocab_size": 128256, "max_position_embeddings": 8192, "tie_word_embeddings": false,
        "torch_dtype": "bfloat16"}),
    )
    .unwrap()
}

fn qwen3_8b() -> HfConfig {
    HfConfig::read(&json!({"model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288,
        "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "vocab_size": 151936, "max_position_embeddings": 40960, "tie_word_embeddings": false,
        "torch_dtype": "bfloat16"}))
    .unwrap()
}

fn qwen25_32b() -> HfConfig {
    HfConfig::read(
        &json!({"model_type": "qwen2", "hidden_size": 5120, "intermediate_size": 27648,
        "num_hidden_layers": 64, "num_attention_heads": 40, "num_key_value_heads": 8,
        "vocab_size": 152064, "max_position_embeddings": 32768, "tie_word_embeddings": false,
        "torch_dtype": "bfloat16"}),
    )
    .unwrap()
}

/// Settings before vLLM 0.21 (no CUDA-graph estimate); before V1 the
/// profile ran `max(max_model_len, 2048)` tokens in 256 sequences.
fn v0(max_model_len: u64, util: f64) -> Serving {
    Serving {
        gpu_memory_utilization: util,
        max_model_len,
        max_num_seqs: 256,
        max_num_batched_tokens: max_model_len.max(2048),
        block_size: 16,
        kv_bytes: 2,
        enforce_eager: false,
        estimate_cudagraphs: false,
        tensor_parallel_size: 1,
    }
}

fn logged() -> Vec<Logged> {
    let rtx3090 = card(23.58, (8, 6), 82);
    vec![
        Logged {
            link: "https://github.com/vllm-project/vllm/pull/10511",
            card: card(79.22, (9, 0), 132),
            config: llama3_8b(),
            serving: v0(8192, 0.9),
            kv_gib: 53.29,
        },
        Logged {
            link: "https://github.com/vllm-project/vllm/issues/10517",
            card: rtx3090,
            config: shape("Llama-3.1-8B"),
            serving: v0(20000, 0.9),
            kv_gib: 3.81,
        },
        Logged {
            link: "https://github.com/vllm-project/vllm/issues/10517",
            card: rtx3090,
            config: shape("Llama-3.1-8B"),
            serving: v0(29000, 0.9),
            kv_gib: 2.89,
        },
        Logged {
            link: "https://github.com/LMCache/LMCache/issues/3430",
            // An RTX A5000: its total as an RTX 3090's (24 GB, 23.58 GiB
            // reported) less the 12 MiB its nvidia-smi total is smaller.
            card: card(23.57, (8, 6), 64),
            config: qwen3_8b(),
            serving: Serving {
                gpu_memory_utilization: 0.9764,
                max_model_len: 16384,
                max_num_seqs: 256,
                max_num_batched_tokens: 8192,
                block_size: 16,
                kv_bytes: 2,
                enforce_eager: false,
                estimate_cudagraphs: true,
                tensor_parallel_size: 1,
            },
            kv_gib: 6.37,
        },
        Logged {
            link: "https://github.com/vllm-project/vllm/issues/15815",
            // Two L40S (44.42 GiB each) sharing Qwen2.5-32B-Instruct.
            card: card(44.42, (8, 9), 142),
            config: qwen25_32b(),
            serving: Serving {
                tensor_parallel_size: 2,
                ..v0(10000, 0.9)
            },
            kv_gib: 7.71,
        },
    ]
}

/// The KV cache's tokens within 5% of what each log's own memory holds
/// (docs/serving.md has the table).
#[test]
fn the_kv_cache_is_within_five_percent_of_the_start_up_logs() {
    for l in logged() {
        let st = startup(&l.config, &l.card, Dtype::Bfloat16, &l.serving).unwrap();
        let logged_blocks = (l.kv_gib * (1u64 << 30) as f64) as u64 / st.block_bytes;
        let off = st.num_blocks as f64 / logged_blocks as f64 - 1.0;
        eprintln!(
            "{}: weights {:.4} GiB, consumed {:.3}, transient peak {:.3}, CUDA graphs {:.3}: KV cache {:.2} GiB against {:.2} ({:+.1}%)",
            l.link,
            gib(st.weights as i64),
            gib(st.consumed as i64),
            gib(st.transient_peak as i64),
            gib(st.cudagraph as i64),
            gib(st.available),
            l.kv_gib,
            off * 100.0
        );
        assert!(off.abs() < 0.05, "{}: {:+.1}%", l.link, off * 100.0);
    }
}

/// "Model loading took 14.9889 GiB" for Llama-3.1-8B (vllm#17122): its
/// bfloat16 weights and the rotary cache of 131,072 positions.
#[test]
fn the_weights_are_what_vllm_says_loading_took() {
    let c = shape("Llama-3.1-8B");
    let bytes: u64 = profile::weights(&c, Dtype::Bfloat16, profile::Shard::of(&c, 1))
        .iter()
        .sum();
    assert_eq!(bytes, 8_030_261_248 * 2 + 131_072 * 128 * 2);
    let st = startup(
        &c,
        &Card::of(GpuModel::H100_80gb),
        Dtype::Bfloat16,
        &Serving::defaults(&c, &Card::of(GpuModel::H100_80gb), Dtype::Bfloat16),
    )
    .unwrap();
    assert!((gib(st.weights as i64) - 14.9889).abs() < 0.0002);
    // One of two ranks of Qwen2.5-32B: "Loading model weights took
    // 30.7098 GB" (vllm#15815). That is what the caching allocator
    // counts: a 35 MiB key-value projection takes a 36 MiB block (the
    // 1 MiB left of its segment is too small to split off), 192 MiB over
    // the tensors' own bytes in all.
    let c = qwen25_32b();
    let sh = profile::Shard::of(&c, 2);
    let own: u64 = profile::weights(&c, Dtype::Bfloat16, sh).iter().sum();
    let s = Serving {
        tensor_parallel_size: 2,
        ..v0(10000, 0.9)
    };
    let held = profile::profile(&c, &card(44.42, (8, 9), 142), Dtype::Bfloat16, &s)
        .unwrap()
        .weights;
    assert_eq!(held - own, 192 * MIB);
    assert!(
        (gib(held as i64) - 30.7098).abs() < 0.0002,
        "{}",
        gib(held as i64)
    );
}

#[test]
fn the_kv_cache_counts_blocks_of_every_layer_and_tokens_by_requests() {
    let c = shape("Llama-3.1-8B");
    let card = Card::of(GpuModel::H100_80gb);
    let s = Serving {
        max_model_len: 8192,
        ..Serving::defaults(&c, &card, Dtype::Bfloat16)
    };
    // 2 × 16 tokens × 8 heads × 128 × 2 bytes, in 32 layers.
    assert_eq!(page_bytes(&c, &s), 65_536);
    let st = startup(&c, &card, Dtype::Bfloat16, &s).unwrap();
    assert_eq!(st.block_bytes, 2 * MIB);
    assert_eq!(st.num_blocks, st.available as u64 / (2 * MIB));
    // Whole requests of 512 blocks: the tokens are the blocks' (8,192
    // divides by 16).
    assert_eq!(st.kv_tokens, st.num_blocks * 16);
    assert_eq!(st.max_concurrency, st.num_blocks as f64 / 512.0);
    assert!(st.refused.is_none());
    // The requested share is the total's, the CUDA context outside it.
    assert_eq!(st.requested, (card.total as f64 * 0.9) as u64);
    assert_eq!(
        st.available,
        st.requested as i64 - (st.consumed + st.transient_peak + st.cudagraph) as i64
    );
}

#[test]
fn defaults_follow_the_card_and_graphs_the_sequences() {
    let c = shape("Qwen2.5-7B");
    let h100 = Serving::defaults(&c, &Card::of(GpuModel::H100_80gb), Dtype::Bfloat16);
    assert_eq!(
        (h100.max_num_seqs, h100.max_num_batched_tokens),
        (1024, 8192)
    );
    let a100 = Serving::defaults(&c, &Card::of(GpuModel::A100_80gb), Dtype::Bfloat16);
    assert_eq!(
        (a100.max_num_seqs, a100.max_num_batched_tokens),
        (256, 2048)
    );
    // 1, 2, 4, 8 … 248, 256 … 512: 51 piecewise graphs; full decode
    // graphs up to 256 sequences: 35 (the logs' "PIECEWISE=51
    // (largest=512), FULL=35 (largest=256)").
    let [piecewise, full] = a100.capture_sizes();
    assert_eq!((piecewise.len(), piecewise.last()), (51, Some(&512)));
    assert_eq!((full.len(), full.last()), (35, Some(&256)));
    let eager = Serving {
        enforce_eager: true,
        ..a100
    };
    let st = startup(&c, &Card::of(GpuModel::A100_80gb), Dtype::Bfloat16, &eager).unwrap();
    assert_eq!(st.cudagraph, 0);
    assert_eq!(
        auto_dtype(&shape("gpt2"), &Card::of(GpuModel::T4)),
        Dtype::Float16
    );
    assert_eq!(
        auto_dtype(&shape("gpt2"), &Card::of(GpuModel::L4)),
        Dtype::Bfloat16
    );
}

#[test]
fn it_refuses_to_start_as_vllm_does() {
    let c = shape("Llama-3.1-8B");
    let card = Card::of(GpuModel::Rtx4090);
    let s = Serving::defaults(&c, &card, Dtype::Bfloat16);
    // 128K positions of an 8B model on a 24 GB card: one request needs
    // 16 GiB of cache.
    let st = startup(&c, &card, Dtype::Bfloat16, &s).unwrap();
    let refused = st.refused.unwrap();
    assert!(
        refused.starts_with("To serve at least one request with the model's max seq len (131072)"),
        "{refused}"
    );
    assert!(st.longest_model_len > 0 && st.longest_model_len < 131_072);
    let shorter = Serving {
        max_model_len: st.longest_model_len,
        ..s
    };
    assert!(startup(&c, &card, Dtype::Bfloat16, &shorter)
        .unwrap()
        .refused
        .is_none());
    let low = Serving {
        gpu_memory_utilization: 0.5,
        ..shorter
    };
    assert!(startup(&c, &card, Dtype::Bfloat16, &low)
        .unwrap()
        .refused
        .unwrap()
        .starts_with("No available memory for the cache blocks"));
    // The weights alone do not fit a T4.
    let t4 = Card::of(GpuModel::T4);
    let st = startup(
        &c,
        &t4,
        Dtype::Float16,
        &Serving::defaults(&c, &t4, Dtype::Float16),
    )
    .unwrap();
    assert!(st.refused.unwrap().contains("while loading the weights"));
    let e = startup(&c, &t4, Dtype::Bfloat16, &s).unwrap_err().0;
    assert!(e.starts_with("Bfloat16 is only supported"), "{e}");
    let e = startup(&shape("gemma-2-2b"), &card, Dtype::Bfloat16, &s)
        .unwrap_err()
        .0;
    assert!(e.contains("sliding-window"), "{e}");
}
