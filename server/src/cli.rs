//! The command line. Every option can also be set by the environment
//! variable named in `--help`.

use crate::backend::DeviceChoice;
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::net::SocketAddr;
use std::path::PathBuf;

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
    Serve(ServeArgs),
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The command file; `-` reads standard input.
    pub file: PathBuf,
    /// Which device the kernel runs on.
    #[arg(long, env = "VRAMLAB_DEVICE", value_enum, default_value_t = DeviceChoice::Auto)]
    pub device: DeviceChoice,
    /// Check the `expect` fields of lesson lines; report mismatches on
    /// standard error and exit with status 1 if any.
    #[arg(long, env = "VRAMLAB_CHECK")]
    pub check: bool,
    /// After the last command, print the full snapshot (segments, blocks,
    /// live objects, events) as one more JSON line.
    #[arg(long, env = "VRAMLAB_SNAPSHOT")]
    pub snapshot: bool,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "VRAMLAB_ADDR", default_value = "127.0.0.1:8080")]
    pub addr: SocketAddr,
    /// Directory of the built web app (trunk's output).
    #[arg(long, env = "VRAMLAB_DIST", default_value = "dist")]
    pub dist: PathBuf,
    /// Which device kernels run on.
    #[arg(long, env = "VRAMLAB_DEVICE", value_enum, default_value_t = DeviceChoice::Auto)]
    pub device: DeviceChoice,
    /// Log format.
    #[arg(long, env = "VRAMLAB_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
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
        assert_eq!(args.device, DeviceChoice::Sim);
    }
}
