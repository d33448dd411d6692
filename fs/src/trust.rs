//! Whether a file gpuarch acts on as root could have been put there, or
//! changed, by another user: the config, kernel packages (whose `command`
//! builds run as root), the OCI runtime the shim execs, and the NVRTC and
//! build tools it loads or runs. sudo, sshd and systemd refuse such files;
//! so does gpuarch.
//!
//! A path is trusted when it and every directory above it (symlinks
//! resolved, and the path as given) are owned by root or by the user
//! running gpuarch, and none is writable by group or others. A directory
//! above it may be world-writable with the sticky bit (`/tmp`): others can
//! add entries there, but not replace ours. A symlink on the way must be
//! owned by root or that user too: in a sticky directory its owner could
//! otherwise swap it between the check and the use. `/dev/null` is trusted
//! as an empty file.
//!
//! [`open`] opens the file once and checks what it opened: the descriptor's
//! own owner and mode, and that it is the file the checked path leads to.
//! Callers read or exec through that descriptor, never the path again:
//! the config, credentials, kernel packages and their sources, build
//! programs, the OCI runtime, the JIT cache root. NVRTC alone is loaded by
//! its checked path (its RUNPATH `$ORIGIN` must be its real directory).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// A path gpuarch will not act on, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{} is not trusted: {why} (fix: {fix})", path.display())]
pub struct Untrusted {
    /// The file or directory at fault (the path or one above it).
    pub path: PathBuf,
    pub why: String,
    pub fix: String,
}

/// Check `path` as described in the module docs.
pub fn check(path: &Path) -> Result<(), Untrusted> {
    if path == Path::new("/dev/null") {
        return Ok(());
    }
    let abs = if path.is_absolute() {
        path.to_owned()
    } else {
        std::env::current_dir()
            .map(|d| d.join(path))
            .unwrap_or_else(|_| path.to_owned())
    };
    // The path as given (a symlink on the way is itself a place another
    // user could redirect it), then where it really leads.
    check_chain(&abs, false)?;
    if let Ok(real) = abs.canonicalize()
        && real != abs
    {
        check_chain(&real, true)?;
    }
    Ok(())
}

/// Open `path` for reading (following links, close-on-exec) and check it:
/// the path as [`check`] does, then the descriptor itself (owner and mode,
/// as for the path) and that it is the very file the checked path leads
/// to. What is returned is what was checked, whatever happens to the path
/// afterwards.
pub fn open(path: &Path) -> Result<std::fs::File, OpenError> {
    let file = std::fs::File::open(path).map_err(|error| OpenError::Io {
        path: path.to_owned(),
        error,
    })?;
    if path == Path::new("/dev/null") {
        return Ok(file);
    }
    check(path)?;
    let fd = file.metadata().map_err(|error| OpenError::Io {
        path: path.to_owned(),
        error,
    })?;
    // The file opened, judged itself: it is what will be read or run.
    judge(path, &fd, nix::unistd::geteuid().as_raw(), false)?;
    match std::fs::metadata(path) {
        Ok(now) if now.dev() == fd.dev() && now.ino() == fd.ino() => Ok(file),
        _ => Err(OpenError::Untrusted(Untrusted::at(
            path,
            "it was replaced while it was being checked".into(),
            format!("check who changed {} and why", path.display()),
        ))),
    }
}

/// Why [`open`] gave no file.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("{}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error(transparent)]
    Untrusted(#[from] Untrusted),
}

impl Untrusted {
    fn at(path: &Path, why: String, fix: String) -> Self {
        Self {
            path: path.to_owned(),
            why,
            fix,
        }
    }
}

impl OpenError {
    /// The file is not there.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::Io { error, .. } if error.kind() == std::io::ErrorKind::NotFound)
    }
}

fn check_chain(path: &Path, follow: bool) -> Result<(), Untrusted> {
    let me = nix::unistd::geteuid().as_raw();
    for (depth, p) in path.ancestors().enumerate() {
        let meta = if follow {
            std::fs::metadata(p)
        } else {
            std::fs::symlink_metadata(p)
        };
        let Ok(meta) = meta else {
            // Missing: nothing there to trust or not (the caller's read
            // says what is absent).
            continue;
        };
        if meta.file_type().is_symlink() {
            // A link's own mode means nothing (its directory is checked as
            // the next ancestor, and its target by the resolved pass), but
            // its owner may replace it even in a sticky directory.
            if meta.uid() != 0 && meta.uid() != me {
                return Err(Untrusted::at(
                    p,
                    format!("a symlink owned by uid {}, not root", meta.uid()),
                    format!("chown -h root {}", p.display()),
                ));
            }
            continue;
        }
        judge(p, &meta, me, depth > 0)?;
    }
    Ok(())
}

/// Whether the file or directory `p` whose metadata is `meta` is root's
/// (or `me`'s) and writable by nobody else; a sticky directory may be
/// world-writable when it is `above` the path.
fn judge(p: &Path, meta: &std::fs::Metadata, me: u32, above: bool) -> Result<(), Untrusted> {
    let fail = |why, fix| Untrusted::at(p, why, fix);
    if meta.uid() != 0 && meta.uid() != me {
        return Err(fail(
            format!("owned by uid {}, not root", meta.uid()),
            format!("chown root {}", p.display()),
        ));
    }
    let mode = meta.permissions().mode();
    let sticky_above = above && meta.is_dir() && mode & 0o1000 != 0;
    if mode & 0o022 != 0 && !sticky_above {
        let who = if mode & 0o002 != 0 {
            "everyone"
        } else {
            "its group"
        };
        return Err(fail(
            format!("writable by {who} (mode {:o})", mode & 0o7777),
            format!("chmod go-w {}", p.display()),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn chmod(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn own_files_pass_and_writable_ones_are_named_with_their_fix() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("conf");
        std::fs::create_dir(&d).unwrap();
        chmod(&d, 0o755);
        let f = d.join("config.yaml");
        std::fs::write(&f, "x").unwrap();
        chmod(&f, 0o644);
        check(&f).unwrap();
        check(Path::new("/dev/null")).unwrap();

        chmod(&f, 0o666);
        let e = check(&f).unwrap_err();
        assert_eq!(e.path, f);
        assert_eq!(e.why, "writable by everyone (mode 666)");
        assert!(
            e.to_string()
                .ends_with(&format!("(fix: chmod go-w {})", f.display()))
        );
        chmod(&f, 0o664);
        assert_eq!(
            check(&f).unwrap_err().why,
            "writable by its group (mode 664)"
        );
        chmod(&f, 0o644);

        // A group-writable directory above it: the directory is named.
        chmod(&d, 0o775);
        assert_eq!(check(&f).unwrap_err().path, d);
        // World-writable with the sticky bit, above the path: fine (/tmp).
        chmod(&d, 0o1777);
        check(&f).unwrap();
        // But not as the path itself: anyone could add a package to it.
        assert_eq!(check(&d).unwrap_err().path, d);
        chmod(&d, 0o755);
    }

    #[test]
    fn a_symlink_is_judged_by_where_it_leads_and_where_it_sits() {
        let tmp = tempfile::tempdir().unwrap();
        let open = tmp.path().join("open");
        std::fs::create_dir(&open).unwrap();
        chmod(&open, 0o777);
        let target = open.join("config.yaml");
        std::fs::write(&target, "x").unwrap();
        chmod(&target, 0o644);
        let safe = tmp.path().join("safe");
        std::fs::create_dir(&safe).unwrap();
        chmod(&safe, 0o755);
        let link = safe.join("config.yaml");
        symlink(&target, &link).unwrap();
        // The link sits in a safe place but leads into a world-writable one.
        assert_eq!(check(&link).unwrap_err().path, open);
    }

    #[test]
    fn a_symlink_another_user_owns_is_refused_even_in_a_sticky_directory() {
        gpuarch_testkit::skip_unless!(gpuarch_testkit::unless_root("to give a link away"));
        let tmp = tempfile::tempdir().unwrap();
        let sticky = tmp.path().join("tmp");
        std::fs::create_dir(&sticky).unwrap();
        chmod(&sticky, 0o1777);
        let safe = tmp.path().join("safe");
        std::fs::create_dir(&safe).unwrap();
        chmod(&safe, 0o755);
        let target = safe.join("config.yaml");
        std::fs::write(&target, "x").unwrap();
        chmod(&target, 0o644);
        let link = sticky.join("config.yaml");
        symlink(&target, &link).unwrap();
        // root's link: fine, nobody can swap it.
        check(&link).unwrap();
        open(&link).unwrap();
        // nobody's: they could point it elsewhere between check and use.
        nix::unistd::fchownat(
            nix::fcntl::AT_FDCWD,
            &link,
            Some(nix::unistd::Uid::from_raw(65534)),
            None,
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .unwrap();
        let e = check(&link).unwrap_err();
        assert_eq!(e.path, link);
        assert_eq!(e.why, "a symlink owned by uid 65534, not root");
        assert!(matches!(open(&link), Err(OpenError::Untrusted(_))));
    }

    #[test]
    fn another_users_file_is_refused() {
        gpuarch_testkit::skip_unless!(gpuarch_testkit::unless_root("to give a file away"));
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("kernel.yaml");
        std::fs::write(&f, "x").unwrap();
        chmod(&f, 0o644);
        std::os::unix::fs::chown(&f, Some(65534), None).unwrap();
        let e = check(&f).unwrap_err();
        assert_eq!(e.why, "owned by uid 65534, not root");
        assert!(
            e.to_string()
                .contains(&format!("chown root {}", f.display()))
        );
    }
}
