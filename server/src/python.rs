//! `vramlab python FILE`: a Python file run by the machine's CPython with
//! vramlab's `torch`, `tensorflow`, `keras`, `jax` and `numpy` (the
//! `shims/` folder, built into the binary) in front of any installed ones;
//! every GPU allocation the code makes is a command of `vramlab run -`, a
//! child process the shims talk to line by line. The same shims run in the
//! page's Python (Pyodide).

use crate::cli::PythonArgs;
use anyhow::Context;
use rust_embed::RustEmbed;
use std::path::Path;
use std::process::ExitCode;

/// The shims, as the page's build copies them too.
#[derive(RustEmbed)]
#[folder = "../shims/"]
pub struct Shims;

/// Writes every shim under `dir`.
pub fn write_shims(dir: &Path) -> anyhow::Result<()> {
    for path in Shims::iter().filter(|p| p.ends_with(".py")) {
        let file = Shims::get(&path).context("an embedded shim")?;
        let to = dir.join(path.as_ref());
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&to, file.data)?;
    }
    Ok(())
}

/// A folder for the shims of its own, made afresh and private (0700):
/// never one that another user could have made, or planted a
/// `sitecustomize.py` or a link in. Removed when dropped.
fn private_folder() -> anyhow::Result<tempfile::TempDir> {
    let mut folder = tempfile::Builder::new();
    folder.prefix("vramlab-python-");
    #[cfg(unix)]
    folder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700));
    folder
        .tempdir()
        .context("could not make a private temporary folder for the shims")
}

pub fn run_python(args: &PythonArgs) -> anyhow::Result<ExitCode> {
    let folder = private_folder()?;
    let dir = folder.path().to_path_buf();
    write_shims(&dir)?;
    let binary = std::env::current_exe()?;
    let device = clap::ValueEnum::to_possible_value(&args.on.device)
        .map(|v| v.get_name().to_string())
        .unwrap_or_else(|| "auto".into());
    let mut run_args = format!("--device {device}");
    if let Some(s) = &args.settings {
        serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(s)
            .context("--settings is a JSON object of restart settings")?;
    }
    run_args.push_str(&format!(" --cuda-ordinal {}", args.on.cuda_ordinal));
    let status = std::process::Command::new(&args.python)
        .arg("-c")
        .arg("import sys; from vramlab_shim.runner import main; sys.exit(main(sys.argv[1]))")
        .arg(&args.file)
        .env("PYTHONPATH", &dir)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("VRAMLAB_BIN", &binary)
        .env("VRAMLAB_RUN_ARGS", run_args)
        .env("VRAMLAB_SETTINGS", args.settings.as_deref().unwrap_or("{}"))
        .status()
        .with_context(|| format!("could not start {}", args.python));
    drop(folder);
    Ok(match status?.code() {
        Some(0) => ExitCode::SUCCESS,
        _ => ExitCode::from(1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The folder a planted file would be in (the name it once had, from
    /// the process id) is never used; each run's is new and private.
    #[cfg(unix)]
    #[test]
    fn the_shims_go_to_a_private_folder_made_afresh() {
        use std::os::unix::fs::PermissionsExt;
        let planted = std::env::temp_dir().join(format!("vramlab-python-{}", std::process::id()));
        std::fs::create_dir_all(&planted).unwrap();
        std::fs::write(
            planted.join("sitecustomize.py"),
            "raise SystemExit('planted')",
        )
        .unwrap();
        let (a, b) = (private_folder().unwrap(), private_folder().unwrap());
        assert_ne!(a.path(), b.path());
        assert_ne!(a.path(), planted);
        let mode = std::fs::metadata(a.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        write_shims(a.path()).unwrap();
        assert!(!a.path().join("sitecustomize.py").exists());
        let kept = a.path().to_path_buf();
        drop(a);
        assert!(!kept.exists());
        std::fs::remove_dir_all(planted).unwrap();
    }

    #[test]
    fn every_shim_is_built_in() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shims");
        let mut on_disk = Vec::new();
        let mut stack = vec![root.clone()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.extension().is_some_and(|x| x == "py") {
                    on_disk.push(
                        p.strip_prefix(&root)
                            .unwrap()
                            .to_string_lossy()
                            .replace('\\', "/"),
                    );
                }
            }
        }
        on_disk.sort();
        let mut built: Vec<String> = (Shims::iter().filter(|p| p.ends_with(".py")))
            .map(|p| p.into_owned())
            .collect();
        built.sort();
        assert_eq!(built, on_disk);
        assert!(built.contains(&"torch/__init__.py".to_string()));
    }
}
