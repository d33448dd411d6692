//! gpuarch-fs: the files gpuarch acts on as root, handled with care.
//!
//! - [`trust`]: whether another user could have put a file there or changed it;
//! - [`config`]: the config file, read through [`trust`];
//! - [`crio`]: where CRI-O keeps its containers/storage, from its own config;
//! - [`record`]: what each container got, kept for `gpuarchctl why`;
//! - [`write_atomic`]: replace a file whole or not at all.
//! - [`rewrite_atomic`]: the same for a file that exists, keeping its mode and owner.
//! - [`open_regular`]: open a regular file, and nothing else, without blocking.
//! - [`read_config`], [`read_toml`]: another program's config (CRI-O's,
//!   containerd's, Docker's, a unit's drop-in), read through
//!   [`open_regular`] and bounded.
//!
//! A crate of its own so that what needs only these (the kernel cache)
//! does not depend on the inventory and, through it, on NVML.
#![forbid(unsafe_code)]

pub mod config;
pub mod crio;
pub mod record;
pub mod trust;

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Replace `path` with `data` whole or not at all: a temp file in the same
/// directory (mode 0644), fsync, rename, fsync the directory. On failure the
/// temp file is removed and the old file is untouched.
pub fn write_atomic(path: &Path, data: &[u8]) -> io::Result<()> {
    replace(path, data, 0o644, None)
}

/// [`write_atomic`] for a file only its owner reads (mode 0600).
pub fn write_atomic_private(path: &Path, data: &[u8]) -> io::Result<()> {
    replace(path, data, 0o600, None)
}

/// [`write_atomic`] for a file that exists and is someone's config: the new
/// file keeps the old one's mode and owner (a config may hold credentials
/// at 0600). A symlink is refused rather than replaced by a plain file.
pub fn rewrite_atomic(path: &Path, data: &[u8]) -> io::Result<()> {
    write_atomic_like(path, data, path)
}

/// [`write_atomic`] with the mode and owner of `like`, a regular file (a
/// backup of a config is as private as the config).
pub fn write_atomic_like(path: &Path, data: &[u8], like: &Path) -> io::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let meta = fs::symlink_metadata(like)?;
    if !meta.file_type().is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: not a regular file (a symlink is not replaced)",
                like.display()
            ),
        ));
    }
    replace(
        path,
        data,
        meta.permissions().mode() & 0o7777,
        Some((meta.uid(), meta.gid())),
    )
}

fn replace(path: &Path, data: &[u8], mode: u32, owner: Option<(u32, u32)>) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
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
            .mode(0o600)
            .open(&tmp)?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::fchown(&f, Some(uid), Some(gid))?;
        }
        // After the chown, which clears set-id bits; the umask does not
        // apply to an explicit chmod.
        f.set_permissions(fs::Permissions::from_mode(mode))?;
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

/// The regular file at `path`, opened to read without blocking: a FIFO
/// would otherwise hold its reader until a writer came. Anything but a
/// regular file is refused (`InvalidInput`, "not a regular file"); with
/// `follow_links` false, so is a link (`O_NOFOLLOW`).
pub fn open_regular(path: &Path, follow_links: bool) -> io::Result<File> {
    let nofollow = if follow_links {
        0
    } else {
        nix::libc::O_NOFOLLOW
    };
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(nofollow | nix::libc::O_NONBLOCK)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    Ok(f)
}

/// Longest config file of another program read ([`read_toml`]).
pub const MAX_CONFIG: u64 = 1 << 20;

/// Another program's TOML config file (CRI-O's, containerd's), opened only
/// if regular ([`open_regular`], links followed: a FIFO never blocks) and
/// read up to [`MAX_CONFIG`]. None where there is no such file; the error
/// names the file and why.
pub fn read_toml(path: &Path) -> Result<Option<toml::Table>, String> {
    let Some(text) = read_config(path).map_err(|e| format!("{}: {e}", path.display()))? else {
        return Ok(None);
    };
    text.parse::<toml::Table>().map(Some).map_err(|e| {
        let why = e.message().to_owned();
        format!("{}: not TOML: {why:.200}", path.display())
    })
}

/// Another program's config file as text, opened only if regular
/// ([`open_regular`], links followed) and read up to [`MAX_CONFIG`]: None
/// where there is no such file; the error says why (not the path).
pub fn read_config(path: &Path) -> Result<Option<String>, String> {
    let f = match open_regular(path, true) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let mut bytes = Vec::new();
    f.take(MAX_CONFIG + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_CONFIG {
        return Err(format!("over {MAX_CONFIG} bytes; not read"));
    }
    String::from_utf8(bytes)
        .map(Some)
        .map_err(|_| "not UTF-8".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_rewritten_config_keeps_its_mode_and_a_symlink_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("config.toml");
        fs::write(&conf, "old").unwrap();
        fs::set_permissions(&conf, fs::Permissions::from_mode(0o600)).unwrap();
        rewrite_atomic(&conf, b"new").unwrap();
        let backup = dir.path().join("backup");
        write_atomic_like(&backup, b"old", &conf).unwrap();
        let mode = fs::metadata(&backup).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o600);
        fs::remove_file(backup).unwrap();
        assert_eq!(fs::read_to_string(&conf).unwrap(), "new");
        let mode = fs::metadata(&conf).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o600);

        let link = dir.path().join("link.toml");
        std::os::unix::fs::symlink(&conf, &link).unwrap();
        let e = rewrite_atomic(&link, b"through the link").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(fs::read_to_string(&conf).unwrap(), "new");
        // Nothing was left beside them.
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().flatten().collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }
}
