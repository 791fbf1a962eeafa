use clap::Parser;
use std::io::{BufReader, IsTerminal};
use std::process::ExitCode;
use tracing_subscriber::EnvFilter;
use vramlab_backend::select;
use vramlab_http::http::{self, build};
use vramlab_server::cli::{Cli, Command, LogFormat, RunArgs, ServeArgs};
use vramlab_server::replay::replay_file;
use vramlab_server::runner::{run, RunOptions};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => run_file(args),
        Command::Serve(args) => serve(*args).map(|()| ExitCode::SUCCESS),
        Command::Replay(args) => replay_file(&args, &mut std::io::stdout().lock()),
        Command::Kernels(args) => {
            vramlab_backend::cuda::compile_kernels(&args.arch, args.out.as_deref())
        }
        Command::Python(args) => vramlab_server::python::run_python(&args),
        Command::LessonPython(args) => {
            vramlab_server::lesson_python::lesson_python(&args, &mut std::io::stdout().lock())
        }
        Command::Plan(args) => vramlab_server::plan::plan(&args, &mut std::io::stdout().lock()),
        Command::Diff(args) => {
            vramlab_server::diff::diff_files(&args, &mut std::io::stdout().lock())
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("vramlab: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run_file(args: RunArgs) -> anyhow::Result<ExitCode> {
    let backend = select(args.on.device, args.on.cuda_ordinal)?;
    let options = RunOptions {
        check: args.check,
        snapshot: args.snapshot,
        export_snapshot: args.export_snapshot.clone(),
    };
    let stdout = std::io::stdout().lock();
    let summary = if args.file.as_os_str() == "-" {
        let stdin = std::io::stdin();
        if stdin.is_terminal() {
            eprintln!("vramlab: reading commands from standard input (one JSON object per line, Ctrl-D to end)");
        }
        run(&backend, stdin.lock(), stdout, &options)?
    } else {
        let file = std::fs::File::open(&args.file).map_err(|e| {
            anyhow::anyhow!("cannot open command file {}: {e}", args.file.display())
        })?;
        run(&backend, BufReader::new(file), stdout, &options)?
    };
    for m in &summary.mismatches {
        eprintln!("mismatch: {m}");
    }
    Ok(if summary.mismatches.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn init_tracing(format: LogFormat) {
    let filter = EnvFilter::try_from_env("VRAMLAB_LOG")
        .unwrap_or_else(|_| EnvFilter::new("info,tower_http=info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    init_tracing(args.log_format);
    let backend = select(args.on.device, args.on.cuda_ordinal)?;
    tracing::info!(backend = backend.name, "{}", backend.reason);
    match &args.dist {
        Some(dist) if !dist.join("index.html").exists() => tracing::warn!(
            dist = %dist.display(),
            "the web app is not built there: run scripts/build-web"
        ),
        None if !vramlab_http::webapp::is_built() => tracing::warn!(
            "this binary was built without its web app: run scripts/build-web, then build again"
        ),
        _ => {}
    }
    let options = args.options();
    let server = build(&options, backend)?;
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.addr)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", args.addr))?;
        let local = listener.local_addr()?;
        if let Some(addr) = args.admin_addr {
            serve_admin(addr, server.admin.clone()).await?;
        }
        tracing::info!(
            token = options.access.token.is_some(),
            "vramlab serving on http://{local}"
        );
        http::serve_until(listener, server, async {
            shutdown_signal().await;
            tracing::info!("shutting down");
        })
        .await?;
        Ok(())
    })
}

/// The probes on their own port, for as long as the server runs.
async fn serve_admin(addr: std::net::SocketAddr, admin: http::Router) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr} (--admin-addr): {e}"))?;
    tracing::info!("probes and metrics on http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, admin).await });
    Ok(())
}

/// SIGINT (Ctrl-C) or, on Unix, SIGTERM (what service managers and
/// container runtimes send).
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
