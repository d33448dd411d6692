//! gpuarch-fs: the files gpuarch acts on as root, handled with care.
//!
//! - [`trust`]: whether another user could have put a file there or changed it;
//! - [`write_atomic`]: replace a file whole or not at all.
//!
//! A crate of its own so that what needs only these (the kernel cache)
//! does not depend on the inventory and, through it, on NVML.

pub mod trust;

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Replace `path` with `data` whole or not at all: a temp file in the same
/// directory (mode 0644), fsync, rename, fsync the directory. On failure the
/// temp file is removed and the old file is untouched.
pub fn write_atomic(path: &Path, data: &[u8]) -> io::Result<()> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}-{}",
        name.to_string_lossy(),
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}
