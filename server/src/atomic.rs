//! A file written whole or not at all: into a temporary file beside it
//! (created afresh, private until done), flushed to the disk, then renamed
//! over the name. A full disk, an error or a kill mid-write leaves the
//! file that was there before, never a truncated one.

use std::io::{BufWriter, Write};
use std::path::Path;

/// Writes `path` with `write`, atomically.
pub fn write_atomically(
    path: &Path,
    write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> anyhow::Result<()> {
    let fail = |e: &dyn std::fmt::Display| anyhow::anyhow!("cannot write {}: {e}", path.display());
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut file = tempfile::Builder::new()
        .prefix(".vramlab-")
        .suffix(".part")
        .tempfile_in(dir)
        .map_err(|e| fail(&e))?;
    let mut out = BufWriter::new(file.as_file_mut());
    write(&mut out)
        .and_then(|()| out.flush())
        .map_err(|e| fail(&e))?;
    drop(out);
    file.as_file().sync_all().map_err(|e| fail(&e))?;
    readable_by_all(file.as_file());
    file.persist(path).map_err(|e| fail(&e.error))?;
    Ok(())
}

/// As a file written with `std::fs::write` under the usual umask (the
/// temporary file is private).
#[cfg(unix)]
fn readable_by_all(file: &std::fs::File) {
    use std::os::unix::fs::PermissionsExt;
    let _ = file.set_permissions(std::fs::Permissions::from_mode(0o644));
}

#[cfg(not(unix))]
fn readable_by_all(_: &std::fs::File) {}

#[cfg(test)]
mod tests {
    use super::*;

    /// Leftover temporary files in `dir`.
    fn parts(dir: &Path) -> usize {
        std::fs::read_dir(dir)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".part")
            })
            .count()
    }

    #[test]
    fn a_write_that_fails_halfway_leaves_the_file_that_was_there() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("export.pickle");
        write_atomically(&path, |w| w.write_all(b"the good export")).unwrap();
        let failed = write_atomically(&path, |w| {
            w.write_all(&[0; 256 << 10])?;
            Err(std::io::Error::other("No space left on device"))
        });
        let err = failed.unwrap_err().to_string();
        assert!(err.contains("No space left on device"), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"the good export");
        assert_eq!(parts(dir.path()), 0);
    }

    #[cfg(unix)]
    #[test]
    fn the_file_written_is_readable_as_any_other() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("export.json");
        write_atomically(&path, |w| w.write_all(b"{}")).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o644);
    }

    #[test]
    fn a_folder_that_is_not_there_is_said() {
        let err = write_atomically(Path::new("/nonexistent-folder/x.pickle"), |_| Ok(()))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("cannot write /nonexistent-folder/x.pickle"),
            "{err}"
        );
    }
}
