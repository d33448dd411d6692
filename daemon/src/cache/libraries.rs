//! Consumers' own prebuilt libraries (FlashInfer's cubins): a wheel the
//! caller hands over (`ImportLibrary`) imported under
//! `<cache_dir>/libraries` (`gpuarch_kernels::library`), and its trees laid
//! out for every set of the host's GPUs a container could be given, after
//! the import and after each job, so the hook only ever reads them.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use gpuarch_core::arch::ComputeCapability;
use gpuarch_kernels::library::{self, LibraryError, Limits};
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
        _place: ImportPlace,
    ) {
        let Some(_permit) = self.import_turn(&state).await else {
            return;
        };
        let me = self.clone();
        let n = name.clone();
        let result = tokio::task::spawn_blocking(move || me.import_library(&n, &file))
            .await
            .unwrap_or_else(|e| {
                Err(LibraryError::Refused {
                    file: name.clone(),
                    why: format!("the import stopped: {e}"),
                })
            });
        if let Ok(mut s) = state.lock() {
            match result {
                Ok(lines) => {
                    s.done = s.total;
                    s.state = JobState::Done;
                    s.message = lines.first().cloned().unwrap_or_default();
                    s.lines.extend(lines.into_iter().skip(1));
                }
                Err(why) => {
                    s.state = JobState::Failed;
                    s.message = format!("{name} not imported, nothing changed: {why}");
                }
            }
        }
    }

    /// The import, then its trees: what to say, a line each.
    fn import_library(
        &self,
        name: &str,
        file: &std::fs::File,
    ) -> Result<Vec<String>, LibraryError> {
        let root = self.libraries_dir();
        std::fs::create_dir_all(&root).map_err(|error| LibraryError::Io {
            path: root.clone(),
            error,
        })?;
        // kernels.max_bytes, and never the filesystem's last free bytes.
        let free = free_bytes(&root).map_or(u64::MAX, |f| f.saturating_sub(IMPORT_RESERVE));
        let limits = Limits::for_store(self.builder.store.max_bytes().min(free));
        let index = library::import_wheel(&root, file, name, &limits)?;
        info!(
            "imported {} {} from {name}: {} files",
            index.dist,
            index.version,
            index.files.len()
        );
        let mut lines = vec![format!(
            "imported {} {}: {} files, {} bytes ({} named in its lists but not in the wheel)",
            index.dist,
            index.version,
            index.files.len(),
            index.bytes(),
            index.missing.len()
        )];
        lines.extend(self.lay_out_version(&index.dist, &index.version));
        Ok(lines)
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
