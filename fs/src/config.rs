//! The config file, read as root reads what decides what runs as root:
//! opened once, its owner and mode (and every directory's above it)
//! checked on what was opened ([`crate::trust`]), then parsed
//! ([`gpuarch_core::config`]).

use std::io;
use std::path::{Path, PathBuf};

use crate::trust;

/// Where the config is read from when `GPUARCH_CONFIG` does not say.
pub const DEFAULT_CONFIG: &str = "/etc/gpuarch/config.yaml";

/// Why the config could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    #[error("cannot read config {}: {error}", path.display())]
    Read { path: PathBuf, error: io::Error },
    #[error("config {}: {error}", path.display())]
    Parse {
        path: PathBuf,
        error: gpuarch_core::config::ConfigError,
    },
    /// The config decides what runs as root: another user's, or a writable
    /// one, is refused.
    #[error("config: {0}")]
    Untrusted(trust::Untrusted),
}

/// The config file to read: `GPUARCH_CONFIG` if set (it must then exist),
/// else [`DEFAULT_CONFIG`] (which may be absent: defaults apply).
pub fn config_path() -> (PathBuf, bool) {
    match std::env::var_os("GPUARCH_CONFIG") {
        Some(p) => (PathBuf::from(p), true),
        None => (PathBuf::from(DEFAULT_CONFIG), false),
    }
}

/// Read the config named by `GPUARCH_CONFIG`, else [`DEFAULT_CONFIG`]. The
/// default file may be absent (defaults apply); a named one must exist.
pub fn read_config() -> Result<gpuarch_core::config::Config, ConfigFileError> {
    let (path, named) = config_path();
    read_config_at(&path, named)
}

/// Read and check the config at `path`. With `must_exist` false a missing
/// file is the default config.
pub fn read_config_at(
    path: &Path,
    must_exist: bool,
) -> Result<gpuarch_core::config::Config, ConfigFileError> {
    // Opened once and checked as opened: what is read is what was checked.
    let text = match trust::open(path) {
        Ok(f) => io::read_to_string(f).map_err(|error| ConfigFileError::Read {
            path: path.to_owned(),
            error,
        })?,
        Err(e) if e.is_not_found() && !must_exist => {
            return Ok(gpuarch_core::config::Config::default());
        }
        Err(trust::OpenError::Untrusted(u)) => return Err(ConfigFileError::Untrusted(u)),
        Err(trust::OpenError::Io { error, .. }) => {
            return Err(ConfigFileError::Read {
                path: path.to_owned(),
                error,
            });
        }
    };
    gpuarch_core::config::Config::from_yaml(&text).map_err(|error| ConfigFileError::Parse {
        path: path.to_owned(),
        error,
    })
}

/// The name of the file, beside gpuarchd's snapshot, that holds the config
/// gpuarchd has in force: the last valid one it read.
pub const LAST_GOOD_NAME: &str = "config.last-good.yaml";

/// Where gpuarchd publishes the config in force when its snapshot is at
/// `snapshot`.
pub fn last_good_path(snapshot: &Path) -> PathBuf {
    snapshot.with_file_name(LAST_GOOD_NAME)
}

/// Publish `config`, read from `source`, as the config in force, whole or
/// not at all, as private as `source` (a config may name credentials).
pub fn publish_last_good(
    snapshot: &Path,
    config: &gpuarch_core::config::Config,
    source: &Path,
) -> io::Result<()> {
    let yaml = serde_yaml::to_string(config).map_err(io::Error::other)?;
    let text = format!(
        "# gpuarchd's config in force, read from {}. The hook and the shim plan with it\n\
         # while that file is invalid. gpuarchd rewrites it: do not edit.\n{yaml}",
        source.display()
    );
    let path = last_good_path(snapshot);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::symlink_metadata(source) {
        Ok(m) if m.file_type().is_file() => {
            crate::write_atomic_like(&path, text.as_bytes(), source)
        }
        _ => crate::write_atomic(&path, text.as_bytes()),
    }
}

/// The config as the hook and the shim plan with it: the file, else, when
/// the file cannot be used, the last valid one gpuarchd published.
#[derive(Debug)]
pub struct Loaded {
    pub config: gpuarch_core::config::Config,
    /// Why the file was not used, and what was used instead: for the Plan's
    /// notes (so the record of every container planned meanwhile says it).
    pub note: Option<String>,
    /// Why no config could be used at all (the defaults then apply).
    pub error: Option<NoConfig>,
}

/// Why no config could be used: the file's fault, and why gpuarchd's last
/// valid config could not stand in for it.
#[derive(Debug, thiserror::Error)]
pub enum NoConfig {
    #[error("{file} (and gpuarchd has published no valid config at {})", .last.display())]
    NoLastGood {
        file: ConfigFileError,
        last: PathBuf,
    },
    #[error("{file} (and gpuarchd's last valid config is unusable: {error})")]
    LastGoodUnusable {
        file: ConfigFileError,
        error: ConfigFileError,
    },
}

/// [`read_config`], falling back to gpuarchd's last valid config when the
/// file is invalid or cannot be trusted: a typo does not silently leave
/// every new container unplanned. The published file is looked for beside
/// the snapshot (`GPUARCH_INVENTORY`, else the broken file's own
/// `daemon.snapshot` where it can be read as YAML, else the default).
pub fn read_config_or_last_good() -> Loaded {
    let (path, named) = config_path();
    let inventory = std::env::var_os("GPUARCH_INVENTORY").map(PathBuf::from);
    read_config_or_last_good_at(&path, named, inventory)
}

/// [`read_config_or_last_good`] of the config at `path`, with
/// `GPUARCH_INVENTORY` given as `inventory`.
pub fn read_config_or_last_good_at(path: &Path, named: bool, inventory: Option<PathBuf>) -> Loaded {
    let path = path.to_owned();
    let error = match read_config_at(&path, named) {
        Ok(config) => {
            return Loaded {
                config,
                note: None,
                error: None,
            };
        }
        Err(e) => e,
    };
    let snapshot = inventory
        .filter(|s| !s.as_os_str().is_empty())
        .or_else(|| snapshot_named_in(&path))
        .unwrap_or_else(|| PathBuf::from(gpuarch_core::config::DEFAULT_SNAPSHOT));
    let last = last_good_path(&snapshot);
    match read_config_at(&last, true) {
        Ok(config) => Loaded {
            config,
            note: Some(format!(
                "{error}; planned with gpuarchd's last valid config ({}): fix the file, \
                 and gpuarchd and every new container take it",
                last.display()
            )),
            error: None,
        },
        Err(e) => Loaded {
            config: gpuarch_core::config::Config::default(),
            note: None,
            error: Some(if e_is_not_found(&e) {
                NoConfig::NoLastGood { file: error, last }
            } else {
                NoConfig::LastGoodUnusable {
                    file: error,
                    error: e,
                }
            }),
        },
    }
}

fn e_is_not_found(e: &ConfigFileError) -> bool {
    matches!(e, ConfigFileError::Read { error, .. } if error.kind() == io::ErrorKind::NotFound)
}

/// `daemon.snapshot` of the config at `path`, read as plain YAML (the file
/// failed the config's own checks, perhaps only for a misspelt key).
fn snapshot_named_in(path: &Path) -> Option<PathBuf> {
    let f = trust::open(path).ok()?;
    let mut text = String::new();
    io::Read::read_to_string(&mut io::Read::take(f, 1 << 20), &mut text).ok()?;
    let v: serde_yaml::Value = serde_yaml::from_str(&text).ok()?;
    let s = v.get("daemon")?.get("snapshot")?.as_str()?;
    Path::new(s).is_absolute().then(|| PathBuf::from(s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn dir() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        d
    }

    /// A typo: the published config in force is used, and the note names
    /// the file's line and what was used.
    #[test]
    fn an_invalid_file_is_planned_with_the_published_config() {
        let d = dir();
        let cfg = d.path().join("config.yaml");
        let snap = d.path().join("inventory.json");
        let good = gpuarch_core::config::Config::from_yaml(
            "strict: true
",
        )
        .unwrap();
        std::fs::write(
            &cfg,
            "strict: true
",
        )
        .unwrap();
        publish_last_good(&snap, &good, &cfg).unwrap();
        std::fs::write(
            &cfg,
            "strict: true
strictt: false
",
        )
        .unwrap();
        let l = read_config_or_last_good_at(&cfg, true, Some(snap.clone()));
        assert_eq!(l.config, good);
        assert!(l.error.is_none());
        let note = l.note.unwrap();
        assert!(
            note.contains("line 2") && note.contains("last valid config"),
            "{note}"
        );
        // Found beside the snapshot the broken file names, too.
        std::fs::write(
            &cfg,
            format!("daemon:\n  snapshot: {}\nstrictt: 1\n", snap.display()),
        )
        .unwrap();
        let l = read_config_or_last_good_at(&cfg, true, None);
        assert_eq!(l.config, good, "{:?}", l.error);
    }

    /// Another user could have written the published file: it is not
    /// used, and the error says why; nor is a missing one invented.
    #[test]
    fn a_published_config_anyone_could_write_is_refused() {
        let d = dir();
        let cfg = d.path().join("config.yaml");
        let snap = d.path().join("inventory.json");
        std::fs::write(
            &cfg,
            "strict: true
",
        )
        .unwrap();
        let good = gpuarch_core::config::Config::from_yaml(
            "strict: true
",
        )
        .unwrap();
        publish_last_good(&snap, &good, &cfg).unwrap();
        std::fs::write(
            &cfg,
            "bogus: 1
",
        )
        .unwrap();
        let last = last_good_path(&snap);
        std::fs::set_permissions(&last, std::fs::Permissions::from_mode(0o666)).unwrap();
        let l = read_config_or_last_good_at(&cfg, true, Some(snap.clone()));
        assert_eq!(l.config, gpuarch_core::config::Config::default());
        let e = l.error.unwrap();
        assert!(matches!(e, NoConfig::LastGoodUnusable { .. }), "{e:?}");
        let e = e.to_string();
        assert!(e.contains("bogus") && e.contains("unusable"), "{e}");
        std::fs::remove_file(&last).unwrap();
        let e = read_config_or_last_good_at(&cfg, true, Some(snap))
            .error
            .unwrap();
        assert!(matches!(e, NoConfig::NoLastGood { .. }), "{e:?}");
        let e = e.to_string();
        assert!(e.contains("has published no valid config"), "{e}");
    }
}
