//! Compiled kernels kept on disk between processes. NVRTC takes seconds
//! for each compute capability, so the first process to compile a cubin
//! writes it to the cache folder and later ones read it:
//! `VRAMLAB_CACHE_DIR` (empty: no cache), else `$XDG_CACHE_HOME/vramlab`,
//! else `~/.cache/vramlab`. A file is named by the capability and a hash
//! of the source and NVRTC's options, and ends with a checksum of its
//! bytes; one that does not check out is compiled again.

use std::path::{Path, PathBuf};

/// The environment variable naming the folder.
pub const ENV: &str = "VRAMLAB_CACHE_DIR";

/// The cache folder, from the environment; `None` when it is turned off
/// or no home is known.
pub fn folder() -> Option<PathBuf> {
    folder_from(
        std::env::var_os(ENV),
        std::env::var_os("XDG_CACHE_HOME"),
        std::env::var_os("HOME"),
    )
}

fn folder_from(
    own: Option<std::ffi::OsString>,
    xdg: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
) -> Option<PathBuf> {
    match own {
        Some(dir) if dir.is_empty() => None,
        Some(dir) => Some(dir.into()),
        None => match xdg.filter(|d| !d.is_empty()) {
            Some(dir) => Some(PathBuf::from(dir).join("vramlab")),
            None => home
                .filter(|d| !d.is_empty())
                .map(|h| PathBuf::from(h).join(".cache").join("vramlab")),
        },
    }
}

/// FNV-1a, 64 bits: stable across builds, as a file name needs.
fn fnv(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in *part {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        // A separator, so that ("ab", "c") and ("a", "bc") differ.
        h = (h ^ 0xff).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The file of capability `cc`'s cubin compiled from `source` with
/// `options`.
pub fn file(folder: &Path, cc: (u32, u32), source: &str, options: &[String]) -> PathBuf {
    let mut parts: Vec<&[u8]> = vec![source.as_bytes()];
    parts.extend(options.iter().map(|o| o.as_bytes()));
    let key = fnv(&parts);
    folder.join(format!("kernels-sm_{}{}-{key:016x}.cubin", cc.0, cc.1))
}

/// The cubin stored at `path`, if it is there whole.
pub fn read(path: &Path) -> Option<Vec<u8>> {
    let mut bytes = std::fs::read(path).ok()?;
    let split = bytes.len().checked_sub(8)?;
    let sum = u64::from_le_bytes(bytes[split..].try_into().ok()?);
    bytes.truncate(split);
    (!bytes.is_empty() && fnv(&[&bytes]) == sum).then_some(bytes)
}

/// Stores `cubin` at `path` (written beside it, then renamed, so a
/// reader never sees half a file); a failure is logged and otherwise
/// ignored.
pub fn write(path: &Path, cubin: &[u8]) {
    let stored = (|| -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let partial = path.with_extension(format!("partial-{}", std::process::id()));
        let mut bytes = cubin.to_vec();
        bytes.extend_from_slice(&fnv(&[cubin]).to_le_bytes());
        std::fs::write(&partial, &bytes)?;
        std::fs::rename(&partial, path)
    })();
    if let Err(e) = stored {
        tracing::warn!(file = %path.display(), error = %e, "cannot keep the compiled kernels");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_folder_is_the_own_setting_then_xdg_then_home() {
        let s = |v: &str| Some(std::ffi::OsString::from(v));
        assert_eq!(
            folder_from(s("/c"), s("/x"), s("/h")),
            Some(PathBuf::from("/c"))
        );
        assert_eq!(folder_from(s(""), s("/x"), s("/h")), None, "turned off");
        assert_eq!(
            folder_from(None, s("/x"), s("/h")),
            Some(PathBuf::from("/x/vramlab"))
        );
        assert_eq!(
            folder_from(None, s(""), s("/h")),
            Some(PathBuf::from("/h/.cache/vramlab"))
        );
        assert_eq!(folder_from(None, None, None), None);
    }

    #[test]
    fn a_file_is_named_by_capability_source_and_options() {
        let dir = Path::new("/c");
        let opts = vec!["--a".to_string()];
        let a = file(dir, (9, 0), "src", &opts);
        assert!(a.to_string_lossy().starts_with("/c/kernels-sm_90-"));
        assert_eq!(a, file(dir, (9, 0), "src", &opts));
        assert_ne!(a, file(dir, (8, 0), "src", &opts));
        assert_ne!(a, file(dir, (9, 0), "src2", &opts));
        assert_ne!(a, file(dir, (9, 0), "src", &[]));
    }

    #[test]
    fn a_stored_cubin_reads_back_and_a_damaged_one_does_not() {
        let dir = std::env::temp_dir().join(format!("vramlab-cubin-{}", std::process::id()));
        let path = file(&dir, (9, 0), "src", &[]);
        assert_eq!(read(&path), None, "nothing there yet");
        write(&path, b"\x7fELF cubin bytes");
        assert_eq!(read(&path).as_deref(), Some(&b"\x7fELF cubin bytes"[..]));
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[3] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(read(&path), None, "a changed byte");
        std::fs::write(&path, &bytes[..5]).unwrap();
        assert_eq!(read(&path), None, "a short file");
        std::fs::write(&path, b"").unwrap();
        assert_eq!(read(&path), None, "an empty file");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
