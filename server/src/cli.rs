//! The command line. Every option can also be set by the environment
//! variable named in `--help`.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::net::SocketAddr;
use std::path::PathBuf;
use vramlab_backend::DeviceChoice;

#[derive(Debug, Parser)]
#[command(
    name = "vramlab",
    version,
    about = "See how PyTorch, TensorFlow and JAX hold and release GPU memory.",
    long_about = "See how PyTorch, TensorFlow and JAX hold and release GPU memory: \
                  allocated vs reserved vs what nvidia-smi shows, number by number."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Execute a file of commands (JSON Lines, one command per line) and print
    /// one JSON line per command with the stats after it. Errors (an OOM too)
    /// are reported and the run goes on.
    Run(RunArgs),
    /// Serve the playground: the web app, /healthz and the engine.
    Serve(Box<ServeArgs>),
    /// Replay a PyTorch memory snapshot (the pickle that
    /// `torch.cuda.memory._dump_snapshot()` writes, or its JSON): exactly as
    /// recorded, checked event by event, and under other settings.
    Replay(ReplayArgs),
    /// Compare two PyTorch memory snapshots (or a recording and its
    /// what-if, exported): each one's peak of allocated memory, and the
    /// frames that make the difference, ranked until they explain 90% of it.
    Diff(DiffArgs),
    /// Compile the training step's GPU kernels with NVRTC for each compute
    /// capability (default: 7.5, 8.0, 8.9 and 9.0), as a GPU run does;
    /// exit 1 if any does not compile. Needs libnvrtc, not a GPU.
    Kernels(KernelsArgs),
    /// Run a Python file with vramlab's torch, tensorflow/keras, jax and
    /// numpy in front of any installed ones (needs python3): the code's
    /// prints, then the numbers it ends with on standard error.
    Python(PythonArgs),
    /// Print a lesson (a commands file of tests/lessons/) as the Python that
    /// does its steps, one file per kernel (each restart starts the next),
    /// with the `vramlab python --settings` line that runs each.
    LessonPython(LessonPythonArgs),
    /// Will it fit? A Hugging Face model (one of the shipped shapes, e.g.
    /// Llama-3.1-8B, or a config.json file) loaded on a GPU and its
    /// `generate()` played request by request on PyTorch's caching
    /// allocator: the verdict, the peak and what holds it, where it runs
    /// out, the largest batch and the longest prompt that fit, and the
    /// Python that does it.
    Plan(Box<PlanArgs>),
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// A shipped shape's name (`vramlab plan --list`) or a config.json file.
    #[arg(required_unless_present = "list")]
    pub model: Option<String>,
    /// List the shipped shapes, with the config.json each copies.
    #[arg(long)]
    pub list: bool,
    /// The GPU (t4, l4, a100-40gb, a100-80gb, rtx-4090, h100-80gb, h200).
    #[arg(long, default_value = "rtx-4090")]
    pub gpu: String,
    /// The task: `generate`, `train` (every parameter, AdamW), `lora`
    /// (peft's LoRA on the model type's default targets, AdamW) or `qlora`
    /// (bitsandbytes' 4-bit weights, `prepare_model_for_kbit_training`,
    /// LoRA on every linear layer) or `serve` (vLLM 0.33.0's start-up:
    /// its KV cache's tokens and how many requests fit).
    #[arg(long, default_value = "generate")]
    pub task: String,
    /// Sequences generated or trained on together.
    #[arg(long, default_value_t = 1)]
    pub batch: u64,
    /// A training sequence's tokens (`train`, `lora`).
    #[arg(long, default_value_t = 512)]
    pub seq: u64,
    /// Gradient checkpointing (`--checkpointing` or `--checkpointing
    /// false`): `gradient_checkpointing_enable(use_reentrant=False)` for
    /// `train` and `lora` (default off); for `qlora`
    /// `prepare_model_for_kbit_training(use_gradient_checkpointing=...)`,
    /// reentrant (default on).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub checkpointing: Option<bool>,
    /// LoRA's rank (`lora`, `qlora`).
    #[arg(long, default_value_t = 16)]
    pub rank: u64,
    /// `bfloat16`: a training step's forward under `torch.autocast`
    /// (`Trainer(bf16=True)`); the weights default to float32 with it
    /// (QLoRA's to the config's type).
    #[arg(long)]
    pub amp: Option<String>,
    /// `bnb_4bit_quant_type` (`qlora`): `nf4` or `fp4`.
    #[arg(long = "quant-type", default_value = "nf4")]
    pub quant_type: String,
    /// `bnb_4bit_use_double_quant` (`qlora`; `--double-quant false` to
    /// turn it off).
    #[arg(long = "double-quant", default_value_t = true, action = clap::ArgAction::Set)]
    pub double_quant: bool,
    /// The optimizer (`train`, `lora`): `adamw` (`torch.optim.AdamW`) or
    /// `adamw8bit` (bitsandbytes' `AdamW8bit`).
    #[arg(long, default_value = "adamw")]
    pub optimizer: String,
    /// The prompt's tokens.
    #[arg(long, default_value_t = 512)]
    pub prompt: u64,
    /// `max_new_tokens`.
    #[arg(long = "new-tokens", default_value_t = 256)]
    pub new_tokens: u64,
    /// `dynamic` (transformers' default) or `static`.
    #[arg(long, default_value = "dynamic")]
    pub cache: String,
    /// `attn_implementation`: `sdpa` or `eager` (default: transformers',
    /// sdpa where the model supports it).
    #[arg(long)]
    pub attn: Option<String>,
    /// The type the weights load in (`torch_dtype=`): bfloat16, float16 or
    /// float32 (default: the config's).
    #[arg(long)]
    pub dtype: Option<String>,
    /// The PyTorch release (2.15, 2.11 or 2.9): 2.15 allocates a cuBLAS
    /// workspace for each matrix product and frees it as it returns, the
    /// others keep one from the first.
    #[arg(long, default_value = "2.15")]
    pub torch: String,
    /// Print the answer as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Serving: vLLM's `--gpu-memory-utilization` (0.9).
    #[arg(long = "gpu-memory-utilization")]
    pub gpu_memory_utilization: Option<f64>,
    /// Serving: `--max-model-len` (the model's positions).
    #[arg(long = "max-model-len")]
    pub max_model_len: Option<u64>,
    /// Serving: `--max-num-seqs` (1024 on an H100 or H200, else 256).
    #[arg(long = "max-num-seqs")]
    pub max_num_seqs: Option<u64>,
    /// Serving: `--max-num-batched-tokens` (8192 on an H100 or H200, else 2048).
    #[arg(long = "max-num-batched-tokens")]
    pub max_num_batched_tokens: Option<u64>,
    /// Serving: `--kv-cache-dtype` (auto or fp8).
    #[arg(long = "kv-cache-dtype")]
    pub kv_cache_dtype: Option<String>,
    /// Serving: `--enforce-eager` (no CUDA graphs).
    #[arg(long = "enforce-eager")]
    pub enforce_eager: bool,
    /// Serving: `--tensor-parallel-size` (1): GPUs of this kind sharing
    /// every layer; the answer is one rank's.
    #[arg(long = "tensor-parallel-size")]
    pub tensor_parallel_size: Option<u64>,
}

#[derive(Debug, Args)]
pub struct LessonPythonArgs {
    /// The lesson's commands file (`NN-slug.jsonl`).
    pub file: PathBuf,
    /// Write each kernel's code to DIR/NN-slug.kN.py instead of printing it.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Where kernels run: `run`, `serve` and `python` take the same two options.
#[derive(Debug, Args)]
pub struct DeviceArgs {
    /// Which device kernels run on.
    #[arg(long, env = "VRAMLAB_DEVICE", value_enum, default_value_t = DeviceChoice::Auto)]
    pub device: DeviceChoice,
    /// Which GPU CUDA runs on: its device ordinal, numbered as the driver
    /// (and CUDA_VISIBLE_DEVICES) numbers them.
    #[arg(
        long = "cuda-ordinal",
        env = "VRAMLAB_CUDA_ORDINAL",
        default_value_t = 0
    )]
    pub cuda_ordinal: usize,
}

#[derive(Debug, Args)]
pub struct PythonArgs {
    /// The Python file.
    pub file: PathBuf,
    #[command(flatten)]
    pub on: DeviceArgs,
    /// Restart settings as a JSON object, e.g. '{"gpu": "a100_40gb"}'.
    #[arg(long)]
    pub settings: Option<String>,
    /// The Python interpreter.
    #[arg(long, default_value = "python3")]
    pub python: String,
}

#[derive(Debug, Args)]
pub struct KernelsArgs {
    /// Compute capabilities, e.g. `8.0`, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub arch: Vec<String>,
    /// Write each cubin here, as `vramlab-sm_XY.cubin`.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The first snapshot file.
    pub a: PathBuf,
    /// The second.
    pub b: PathBuf,
    /// Which CUDA device's trace of each (default: each one's first with an
    /// out-of-memory, else its busiest).
    #[arg(long = "cuda-device")]
    pub cuda_device: Option<usize>,
    /// Print the comparison as one JSON object (both peaks with their
    /// frames and timelines, every frame's bytes at each peak).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The snapshot file.
    pub file: PathBuf,
    /// Replay again with these `restart` settings changed, as key=value
    /// pairs, comma-separated (repeat for several runs), e.g.
    /// 'expandable_segments=true' or 'max_split_size_mb=128'.
    #[arg(long = "what-if")]
    pub what_if: Vec<String>,
    /// Run the what-if replays on this GPU (t4, l4, a100-40gb, a100-80gb,
    /// rtx-4090, h100-80gb, h200); with no --what-if, one run with the
    /// recorded settings on it.
    #[arg(long)]
    pub gpu: Option<String>,
    /// Which CUDA device's trace (default: the first with an
    /// out-of-memory, else the one with the most events).
    #[arg(long = "cuda-device")]
    pub cuda_device: Option<usize>,
    /// Print one JSON record per trace event of the exact replay, then one
    /// JSON line with the outcome of every run.
    #[arg(long)]
    pub json: bool,
    /// Search the settings that would have avoided the recording's first
    /// out-of-memory: allocator settings in the room the process had, and
    /// larger GPUs; print those that run through, fewest bytes reserved
    /// first, with the PYTORCH_CUDA_ALLOC_CONF line to set, or how much
    /// memory was short and which frames held it.
    #[arg(long)]
    pub fix: bool,
    /// Write the last what-if run as a PyTorch memory snapshot (pickle;
    /// JSON for a .json name) that memory_viz opens and `replay` follows;
    /// with --events and no what-if, the window of events.
    #[arg(long = "export-snapshot")]
    pub export_snapshot: Option<PathBuf>,
    /// Only trace events I..J (I.. runs to the end): the window is replayed
    /// and compared as a recording of its own, its state at event I
    /// rebuilt from the recording.
    #[arg(long, value_name = "I..J", value_parser = parse_events)]
    pub events: Option<std::ops::Range<usize>>,
    /// Only the N trace events either side of the moment allocated memory
    /// peaks, as --events does.
    #[arg(long = "around-peak", value_name = "N", conflicts_with = "events")]
    pub around_peak: Option<usize>,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The command file; `-` reads standard input.
    pub file: PathBuf,
    #[command(flatten)]
    pub on: DeviceArgs,
    /// Check the `expect` fields of lesson lines; report mismatches on
    /// standard error and exit with status 1 if any.
    #[arg(long, env = "VRAMLAB_CHECK")]
    pub check: bool,
    /// After the last command, print the full snapshot (segments, blocks,
    /// live objects, events) as one more JSON line.
    #[arg(long, env = "VRAMLAB_SNAPSHOT")]
    pub snapshot: bool,
    /// After the last command, write the session as a PyTorch memory
    /// snapshot pickle (for pytorch.org/memory_viz, or `vramlab replay`);
    /// a name ending in .json writes JSON.
    #[arg(long = "export-snapshot")]
    pub export_snapshot: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "VRAMLAB_ADDR", default_value = "127.0.0.1:8080")]
    pub addr: SocketAddr,
    /// Also serve `/healthz`, `/readyz` and `/metrics` here, with no token
    /// or host check: an internal port for probes and Prometheus.
    #[arg(long = "admin-addr", env = "VRAMLAB_ADMIN_ADDR")]
    pub admin_addr: Option<SocketAddr>,
    /// Serve the web app from this folder (scripts/build-web's output)
    /// instead of the one built into the binary.
    #[arg(long, env = "VRAMLAB_DIST")]
    pub dist: Option<PathBuf>,
    #[command(flatten)]
    pub on: DeviceArgs,
    /// Log format.
    #[arg(long, env = "VRAMLAB_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Require this access token: open the page once with ?token=..., a
    /// cookie keeps it. Never logged.
    #[arg(long, env = "VRAMLAB_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Origins allowed to open the websocket (repeat, or comma-separate in
    /// the variable); by default only the server's own origin.
    #[arg(
        long = "allowed-origin",
        env = "VRAMLAB_ALLOWED_ORIGINS",
        value_delimiter = ','
    )]
    pub allowed_origins: Vec<String>,
    /// Host names the server answers to besides loopback ones (repeat, or
    /// comma-separate in the variable). A loopback server answers only to
    /// loopback names; one on other addresses to any name unless given.
    #[arg(
        long = "allowed-host",
        env = "VRAMLAB_ALLOWED_HOSTS",
        value_delimiter = ','
    )]
    pub allowed_hosts: Vec<String>,
    /// Take users from this header of an authenticating reverse proxy
    /// (oauth2-proxy: X-Forwarded-User, X-Auth-Request-User): a session
    /// belongs to the user who made it. Off by default; needs
    /// --trusted-proxy.
    #[arg(long, env = "VRAMLAB_USER_HEADER", requires = "trusted_proxies")]
    pub user_header: Option<String>,
    /// The proxies whose user header and X-Forwarded-For are believed:
    /// addresses, or networks such as a cluster's pod range 10.0.0.0/8
    /// (repeat, or comma-separate in the variable). Behind one, the
    /// per-client limits count the address it forwards.
    #[arg(
        long = "trusted-proxy",
        env = "VRAMLAB_TRUSTED_PROXIES",
        value_delimiter = ',',
        value_parser = proxy_network
    )]
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// Behind a load balancer: this server's name (letters and digits, up
    /// to 16), the start of every session and watch id it hands out, so the
    /// balancer routes reconnects and watch links back (deploy/nginx.conf).
    #[arg(long = "instance-id", env = "VRAMLAB_INSTANCE_ID", value_parser = instance_id)]
    pub instance_id: Option<String>,
    /// On SIGTERM, drain first for up to this many seconds: /readyz says 503,
    /// no new session starts, running ones go on until they end.
    #[arg(long = "drain-secs", env = "VRAMLAB_DRAIN_SECS", default_value_t = 0)]
    pub drain_secs: u64,
    /// The most sessions the server holds at once.
    #[arg(long, env = "VRAMLAB_MAX_SESSIONS", default_value_t = 64)]
    pub max_sessions: usize,
    /// The most sessions one client (an IPv4 address or an IPv6 /64; with
    /// --user-header, one user) may hold at once (0: no limit). Listening on loopback alone,
    /// this machine's users are not counted; behind a reverse proxy, name
    /// it with --trusted-proxy so its clients are told apart.
    #[arg(long, env = "VRAMLAB_MAX_SESSIONS_PER_CLIENT", default_value_t = 8)]
    pub max_sessions_per_client: usize,
    /// The most TCP connections open at once; more wait to be accepted.
    #[arg(long, env = "VRAMLAB_MAX_CONNECTIONS", default_value_t = 1024)]
    pub max_connections: usize,
    /// The most TCP connections one client (an IPv4 address or an IPv6
    /// /64) may hold (0: no limit); more are closed as they arrive. A --trusted-proxy's address
    /// is not limited (it speaks for many clients).
    #[arg(
        long,
        env = "VRAMLAB_MAX_CONNECTIONS_PER_ADDRESS",
        default_value_t = 256
    )]
    pub max_connections_per_address: usize,
    /// The most read-only watchers one session may have.
    #[arg(long, env = "VRAMLAB_MAX_WATCHERS", default_value_t = 100)]
    pub max_watchers: usize,
    /// How long a session outlives its dropped connection, in seconds.
    #[arg(long, env = "VRAMLAB_SESSION_TTL_SECS", default_value_t = 300)]
    pub session_ttl_secs: u64,
    /// The shortest time between two live snapshots, in milliseconds.
    #[arg(long, env = "VRAMLAB_SNAPSHOT_INTERVAL_MS", default_value_t = 33)]
    pub snapshot_interval_ms: u64,
    /// The largest websocket message accepted, in bytes.
    #[arg(long, env = "VRAMLAB_MAX_MESSAGE_BYTES", default_value_t = 65536)]
    pub max_message_bytes: u64,
    /// Command messages (one command, or a batch of up to 64 from the code
    /// cell) and snapshot requests a session's owner may send per second,
    /// all its connections together; its watchers' snapshot requests have
    /// a budget of the same size of their own.
    #[arg(long, env = "VRAMLAB_COMMANDS_PER_SECOND", default_value_t = 50)]
    pub commands_per_second: u32,
    /// Commands that may wait behind a running one, per session.
    #[arg(long, env = "VRAMLAB_MAX_QUEUE", default_value_t = 64)]
    pub max_queue: usize,
    /// The most device memory one session may hold (its segments), in bytes;
    /// past it allocations fail as with set_per_process_memory_fraction.
    #[arg(long, env = "VRAMLAB_SESSION_QUOTA_BYTES")]
    pub session_quota_bytes: Option<u64>,
}

/// An address (a network of one) or a network in CIDR notation.
fn proxy_network(text: &str) -> Result<ipnet::IpNet, String> {
    text.parse::<ipnet::IpNet>()
        .or_else(|_| text.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
        .map_err(|_| "an address (10.1.2.3) or a network (10.0.0.0/8)".into())
}

fn instance_id(text: &str) -> Result<String, String> {
    let ok =
        !text.is_empty() && text.len() <= 16 && text.chars().all(|c| c.is_ascii_alphanumeric());
    ok.then(|| text.to_string())
        .ok_or_else(|| "letters and digits, 1 to 16 of them".into())
}

impl ServeArgs {
    /// The options the server is built with.
    pub fn options(&self) -> vramlab_http::http::ServeOptions {
        vramlab_http::http::ServeOptions {
            dist: self.dist.clone(),
            access: vramlab_http::access::Access {
                token: self.token.clone().filter(|t| !t.is_empty()),
                allowed_origins: self.allowed_origins.clone(),
                allowed_hosts: vramlab_http::access::AllowedHosts::for_listener(
                    self.addr,
                    &self.allowed_hosts,
                ),
                user_header: self.user_header.as_ref().map(|h| h.to_ascii_lowercase()),
                trusted_proxies: self.trusted_proxies.clone(),
                local_only: self.addr.ip().is_loopback(),
            },
            limits: vramlab_shared::protocol::Limits {
                max_message_bytes: self.max_message_bytes,
                commands_per_second: self.commands_per_second.max(1),
                snapshot_interval_ms: self.snapshot_interval_ms,
                session_ttl_seconds: self.session_ttl_secs,
                session_quota_bytes: self.session_quota_bytes,
            },
            max_sessions: self.max_sessions,
            max_sessions_per_client: self.max_sessions_per_client,
            max_watchers: self.max_watchers,
            max_queue: self.max_queue.max(1),
            keepalive: vramlab_http::app::Keepalive::default(),
            connections: vramlab_http::listener::ConnectionLimits {
                max_connections: self.max_connections,
                max_per_address: self.max_connections_per_address,
                shared: self.trusted_proxies.clone(),
                ..Default::default()
            },
            instance: self.instance_id.clone(),
            drain: std::time::Duration::from_secs(self.drain_secs),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// `I..J` or `I..` (to the end).
fn parse_events(text: &str) -> Result<std::ops::Range<usize>, String> {
    let bad = || format!("events are I..J or I.. (whole numbers, I < J), not {text:?}");
    let (i, j) = text.split_once("..").ok_or_else(bad)?;
    let i = i.trim().parse().map_err(|_| bad())?;
    let j = match j.trim() {
        "" => usize::MAX,
        j => j.parse().map_err(|_| bad())?,
    };
    if i >= j {
        return Err(bad());
    }
    Ok(i..j)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn run_reads_stdin_dash() {
        let cli = Cli::try_parse_from(["vramlab", "run", "-", "--device", "sim"]).unwrap();
        let Command::Run(args) = cli.command else {
            panic!()
        };
        assert_eq!(args.file, PathBuf::from("-"));
        assert_eq!(args.on.device, DeviceChoice::Sim);
        assert_eq!(args.on.cuda_ordinal, 0, "the first GPU unless told");
    }

    /// `--cuda-ordinal` picks the GPU, on `run` and `serve` alike; it is a
    /// number.
    #[test]
    fn the_cuda_ordinal_picks_the_gpu() {
        let cli = Cli::try_parse_from(["vramlab", "run", "-", "--cuda-ordinal", "3"]).unwrap();
        let Command::Run(args) = cli.command else {
            panic!()
        };
        assert_eq!(args.on.cuda_ordinal, 3);
        let cli = Cli::try_parse_from(["vramlab", "serve", "--cuda-ordinal", "1"]).unwrap();
        let Command::Serve(args) = cli.command else {
            panic!()
        };
        assert_eq!(args.on.cuda_ordinal, 1);
        assert!(Cli::try_parse_from(["vramlab", "serve", "--cuda-ordinal", "first"]).is_err());
    }

    /// A proxy is an address or a network; a user's own address outside the
    /// network is not believed.
    #[test]
    fn trusted_proxies_are_addresses_or_networks() {
        let cli = Cli::try_parse_from([
            "vramlab",
            "serve",
            "--user-header",
            "X-Forwarded-User",
            "--trusted-proxy",
            "10.0.0.0/8",
            "--trusted-proxy",
            "192.168.1.7",
        ])
        .unwrap();
        let Command::Serve(args) = cli.command else {
            panic!()
        };
        let access = args.options().access;
        let believed = |ip: &str| {
            let ip: std::net::IpAddr = ip.parse().unwrap();
            access.trusted_proxies.iter().any(|n| n.contains(&ip))
        };
        assert!(believed("10.244.3.17") && believed("192.168.1.7"));
        assert!(!believed("192.168.1.8") && !believed("11.0.0.1"));
        let bad = Cli::try_parse_from(["vramlab", "serve", "--trusted-proxy", "10.0.0.0/33"]);
        assert!(bad
            .unwrap_err()
            .to_string()
            .contains("a network (10.0.0.0/8)"));
    }
}
