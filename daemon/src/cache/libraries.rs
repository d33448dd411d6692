//! Consumers' own prebuilt libraries (FlashInfer's cubins): a wheel the
//! caller hands over (`ImportLibrary`), or one pulled from the registry
//! (`PullLibrary`), imported under `<cache_dir>/libraries`
//! (`gpuarch_kernels::library`), and its trees laid out for every set of
//! the host's GPUs a container could be given, after the import and after
//! each job, so the hook only ever reads them. With `kernels.remote.push`,
//! a wheel imported here is pushed as it was handed over: push once, pull
//! on every node.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use gpuarch_core::arch::ComputeCapability;
use gpuarch_kernels::library::{self, LibraryError, Limits, Source};
use gpuarch_kernels::remote::{RemoteError, SHARED_WHEEL_SCHEMA, SharedWheel};
use gpuarch_wire::dbus::JobState;
use tracing::{info, warn};

use super::imports::{IMPORT_RESERVE, ImportPlace, free_bytes};
use super::{Cache, JobStatus};

/// Past this many distinct capabilities on one host, trees are laid out
/// for each alone and for all together, not for every subset.
const MAX_SUBSET_CAPS: usize = 4;

/// The sets of capabilities a container on a host with `caps` could be
/// given: every non-empty subset, or, past [`MAX_SUBSET_CAPS`], each alone
/// and all together.
pub fn capability_sets(caps: &BTreeSet<ComputeCapability>) -> Vec<Vec<ComputeCapability>> {
    let all: Vec<_> = caps.iter().copied().collect();
    if all.len() > MAX_SUBSET_CAPS {
        let mut out: Vec<Vec<_>> = all.iter().map(|c| vec![*c]).collect();
        out.push(all);
        return out;
    }
    (1u32..(1 << all.len()))
        .map(|mask| {
            all.iter()
                .enumerate()
                .filter(|(i, _)| mask & (1 << i) != 0)
                .map(|(_, c)| *c)
                .collect()
        })
        .collect()
}

impl Cache {
    fn libraries_dir(&self) -> std::path::PathBuf {
        self.cfg.libraries_dir()
    }

    /// Import the wheel `file` (named `name` by the caller) as a job; one
    /// import (of either kind) at a time.
    pub async fn run_library_import(
        self: &Arc<Self>,
        name: String,
        file: std::fs::File,
        state: Arc<Mutex<JobStatus>>,
        place: ImportPlace,
    ) {
        let failed = format!("{name} not imported, nothing changed");
        let stopped = format!("{failed}: {name}: the import stopped");
        self.run_library_job(state, place, stopped, move |c| {
            c.import_library(&name, &file)
                .map_err(|error| JobError::Import { failed, error })
        })
        .await;
    }

    /// Pull `dist` `version` from the registry and import it as a job,
    /// unless it is imported already; one import (of any kind) at a time.
    pub async fn run_library_pull(
        self: &Arc<Self>,
        dist: &'static str,
        version: String,
        state: Arc<Mutex<JobStatus>>,
        place: ImportPlace,
    ) {
        self.run_library_job(state, place, "the pull stopped".into(), move |c| {
            c.pull_library(dist, &version).map(|lines| Outcome {
                lines,
                not_pushed: None,
            })
        })
        .await;
    }

    /// Run `work` off the runtime when it is the imports' turn, and end
    /// the job with what it did (`stopped`, should it never return).
    async fn run_library_job(
        self: &Arc<Self>,
        state: Arc<Mutex<JobStatus>>,
        _place: ImportPlace,
        stopped: String,
        work: impl FnOnce(&Self) -> Result<Outcome, JobError> + Send + 'static,
    ) {
        let Some(_permit) = self.import_turn(&state).await else {
            return;
        };
        let me = self.clone();
        let result = tokio::task::spawn_blocking(move || work(&me))
            .await
            .unwrap_or_else(|error| Err(JobError::Stopped { stopped, error }));
        finish_library_job(&state, result);
    }

    /// The limits of an import into `root`: `kernels.max_bytes`, and never
    /// the filesystem's last free bytes.
    fn import_limits(&self, root: &std::path::Path) -> Limits {
        let free = free_bytes(root).map_or(u64::MAX, |f| f.saturating_sub(IMPORT_RESERVE));
        Limits::for_store(self.builder.store.max_bytes().min(free))
    }

    fn libraries_root(&self) -> Result<std::path::PathBuf, LibraryError> {
        let root = self.libraries_dir();
        std::fs::create_dir_all(root.join("tmp")).map_err(|error| LibraryError::Io {
            path: root.clone(),
            error,
        })?;
        Ok(root)
    }

    /// The pull, its import, then its trees: what to say, a line each.
    fn pull_library(&self, dist: &str, version: &str) -> Result<Vec<String>, JobError> {
        let head = format!("{dist} {version}");
        if let Ok(index) = library::read_index(&self.libraries_dir(), dist, version) {
            let mut lines = vec![format!(
                "{head}: imported already, from {}",
                index.origin.as_deref().unwrap_or(&index.source)
            )];
            lines.extend(self.lay_out_version(dist, version));
            return Ok(lines);
        }
        let remote = self
            .builder
            .remote()
            .ok_or_else(|| JobError::NoRegistry { head: head.clone() })?;
        let root = self.libraries_root()?;
        let path = root.join("tmp").join(format!(
            "pull-{dist}-{version}.{}.{}.whl",
            std::process::id(),
            self.next_job.load(std::sync::atomic::Ordering::Relaxed)
        ));
        let file = {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .map_err(|error| JobError::Io {
                    path: path.clone(),
                    error,
                })?
        };
        // The wheel and what it unpacks to must both fit: the wheel is
        // bounded as the import is, and the import by what is left.
        let result = (|| {
            let budget = std::time::Duration::from_secs(self.cfg.build_timeout_s);
            let max = self.import_limits(&root).max_bytes;
            let (about, origin) = remote
                .pull_wheel(dist, version, &file, max, budget)
                .map_err(|error| JobError::Pull {
                    head: head.clone(),
                    error,
                })?
                .ok_or_else(|| JobError::NotInRegistry { head: head.clone() })?;
            info!("pulled the wheel of {head} from {origin}");
            let source = Source {
                name: &about.wheel,
                origin: Some(&origin),
                expect: Some((dist, version)),
            };
            let index = library::import_wheel(&root, &file, &source, &self.import_limits(&root))
                .map_err(|error| JobError::NotImported {
                    head: head.clone(),
                    origin: origin.clone(),
                    error,
                })?;
            let mut lines = vec![format!("{head}: pulled from {origin}")];
            lines.push(imported_line(&index));
            lines.extend(self.lay_out_version(dist, version));
            Ok(lines)
        })();
        drop(file);
        let _ = std::fs::remove_file(&path);
        result
    }

    /// The import (of a wheel, or of the directory a copy is installed
    /// in), then its trees, then its push where builds are pushed: what to
    /// say, a line each.
    fn import_library(&self, name: &str, file: &std::fs::File) -> Result<Outcome, LibraryError> {
        let root = self.libraries_root()?;
        let limits = self.import_limits(&root);
        let is_dir = file.metadata().is_ok_and(|m| m.is_dir());
        let index = if is_dir {
            library::import_installed(&root, file, &Source::file(name), &limits)?
        } else {
            library::import_wheel(&root, file, &Source::file(name), &limits)?
        };
        info!(
            "imported {} {} from {name}: {} files",
            index.dist,
            index.version,
            index.files.len()
        );
        let mut lines = vec![imported_line(&index)];
        lines.extend(self.lay_out_version(&index.dist, &index.version));
        let mut not_pushed = None;
        let remote = self.builder.remote().filter(|r| r.pushes());
        if remote.is_some() && is_dir {
            not_pushed = Some(format!(
                "{name} is an installed copy, not a wheel; import the wheel to share it"
            ));
        } else if let Some(remote) = remote {
            let about = SharedWheel {
                schema: SHARED_WHEEL_SCHEMA,
                dist: index.dist.clone(),
                version: index.version.clone(),
                wheel: name.to_owned(),
                sha256: index.sha256.clone(),
                bytes: file.metadata().map_or(0, |m| m.len()),
            };
            match remote.push_wheel(file, &about) {
                Ok(at) => {
                    info!("pushed {} {} to {at}", index.dist, index.version);
                    lines.push(format!("pushed to {at}"));
                }
                Err(e) => {
                    warn!("{} {} not pushed: {e}", index.dist, index.version);
                    not_pushed = Some(e.to_string());
                }
            }
        }
        Ok(Outcome { lines, not_pushed })
    }

    /// The trees of one imported version for the host's sets: a line each.
    fn lay_out_version(&self, dist: &str, version: &str) -> Vec<String> {
        let root = self.libraries_dir();
        capability_sets(&super::host_caps(&self.shared))
            .into_iter()
            .map(|caps| {
                let set = library::set_name(&caps);
                match library::serve(&root, dist, version, &caps) {
                    Ok((_, s)) if !s.complete() => format!(
                        "{set}: not served, {} file(s) missing among its kernels",
                        s.missing_count
                    ),
                    Ok((_, s)) if s.code_files == 0 => format!("{set}: no kernels for it"),
                    Ok((_, s)) => format!("{set}: {} kernels, {} bytes", s.code_files, s.bytes),
                    Err(e) => {
                        warn!("cannot lay out {dist} {version} for {set}: {e}");
                        format!("{set}: not laid out: {e}")
                    }
                }
            })
            .collect()
    }

    /// The trees of every imported version for the host's sets, where
    /// missing (after each job: the host's GPUs may have changed).
    pub fn lay_out_libraries(&self) {
        for (dist, version) in library::list(&self.libraries_dir()) {
            self.lay_out_version(&dist, &version);
        }
    }
}

/// What an import did: its lines, and why it was not pushed where it
/// should have been.
struct Outcome {
    lines: Vec<String>,
    not_pushed: Option<String>,
}

fn imported_line(index: &library::Index) -> String {
    format!(
        "imported {} {}: {} files, {} bytes ({} named in its lists but not in the wheel)",
        index.dist,
        index.version,
        index.files.len(),
        index.bytes(),
        index.missing.len()
    )
}

/// Why a library job (an import, a pull) failed, as its message says it.
#[derive(Debug, thiserror::Error)]
enum JobError {
    #[error("{failed}: {error}")]
    Import {
        failed: String,
        #[source]
        error: LibraryError,
    },
    #[error("{stopped}: {error}")]
    Stopped {
        stopped: String,
        #[source]
        error: tokio::task::JoinError,
    },
    #[error("{head}: no registry (kernels.remote)")]
    NoRegistry { head: String },
    #[error(transparent)]
    Library(#[from] LibraryError),
    #[error("{}: {error}", .path.display())]
    Io {
        path: std::path::PathBuf,
        #[source]
        error: std::io::Error,
    },
    #[error("{head}: not pulled: {error}")]
    Pull {
        head: String,
        #[source]
        error: RemoteError,
    },
    #[error("{head}: not in the registry")]
    NotInRegistry { head: String },
    #[error("{head}: pulled from {origin}, not imported: {error}")]
    NotImported {
        head: String,
        origin: String,
        #[source]
        error: LibraryError,
    },
}

/// The job's end: its first line as its message, the rest as its log. An
/// import kept but not pushed fails the job, since it was not all that was
/// asked; importing it again pushes it.
fn finish_library_job(state: &Mutex<JobStatus>, result: Result<Outcome, JobError>) {
    let Ok(mut s) = state.lock() else {
        return;
    };
    match result {
        Ok(Outcome { lines, not_pushed }) => {
            s.done = s.total;
            let mut lines = lines.into_iter();
            let first = lines.next().unwrap_or_default();
            s.lines.extend(lines);
            match not_pushed {
                None => {
                    s.state = JobState::Done;
                    s.message = first;
                }
                Some(why) => {
                    s.state = JobState::Failed;
                    s.message = format!(
                        "{first}; kept, but not pushed: {why} (import it again to push it)"
                    );
                }
            }
        }
        Err(why) => {
            s.state = JobState::Failed;
            s.message = why.to_string();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_set_a_container_could_be_given_has_a_tree() {
        let caps = |v: &[&str]| -> BTreeSet<ComputeCapability> {
            v.iter()
                .map(|s| ComputeCapability::parse_known(s).unwrap())
                .collect()
        };
        let names = |c| {
            let mut v: Vec<String> = capability_sets(&c)
                .iter()
                .map(|s| library::set_name(s))
                .collect();
            v.sort();
            v
        };
        assert_eq!(names(caps(&["10.0"])), ["10.0"]);
        assert_eq!(names(caps(&["9.0", "10.0"])), ["10.0", "9.0", "9.0+10.0"]);
        assert_eq!(
            capability_sets(&caps(&["7.0", "10.3", "11.0", "12.1"])).len(),
            15
        );
        let five = caps(&["7.0", "8.0", "9.0", "10.0", "12.0"]);
        assert_eq!(
            capability_sets(&five).len(),
            6,
            "each alone and all together"
        );
    }
}
