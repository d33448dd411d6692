//! What the hook reads: `<mount_root>/<package>/manifest.json`, naming for
//! each arch the verified store entry that serves it.

use std::io;
use std::path::Path;

use gpuarch_wire::manifest::{Build, Pending, Published, SCHEMA, Unavailable};

use crate::build::ArchResult;
use crate::import::Record;
use crate::spec::Package;
use crate::store::Entry;
use gpuarch_fs::write_atomic;

/// Write the manifest of `pkg` from `results` (one per arch), atomically.
pub fn publish(mount_root: &Path, pkg: &Package, results: &[ArchResult]) -> io::Result<()> {
    let mut builds = Vec::new();
    let mut unavailable = Vec::new();
    let mut pending = Vec::new();
    for r in results {
        if let Some((e, _)) = &r.served {
            let m = &e.manifest;
            builds.push(Build {
                arch: m.arch.clone(),
                variant: m.variant.clone(),
                dtype: m.dtype.clone(),
                key: m.key.clone(),
                dir: e.dir.clone(),
                files: m.files.keys().cloned().collect(),
                toolkit: m.toolkit.clone(),
            });
        } else if let Some(err) = &r.error {
            pending.push(Pending {
                arch: r.arch.to_string(),
                reason: err.to_string(),
            });
        }
        for u in &r.unavailable {
            unavailable.push(Unavailable {
                arch: r.arch.to_string(),
                variant: u.variant.clone(),
                reason: u.reason.clone(),
            });
        }
    }
    let body = Published {
        schema: SCHEMA,
        package: pkg.name().to_owned(),
        version: pkg.spec.version.clone(),
        description: pkg.spec.description.clone(),
        targets: builds.iter().map(|b| b.arch.clone()).collect(),
        builds,
        unavailable,
        pending,
        imported: false,
        ldconfig: false,
    };
    write_manifest(mount_root, pkg.name(), &body)
}

/// Write `body` as `<mount_root>/<name>/manifest.json`, unless it says that
/// already. A new package's directory appears with its manifest in it:
/// made under a dot-name, which the hook passes over, and renamed into
/// place. A container starting meanwhile sees the package whole or not at
/// all, never a directory without its manifest ("skipped: manifest.json:
/// No such file or directory").
fn write_manifest(mount_root: &Path, name: &str, body: &Published) -> io::Result<()> {
    let text = serde_json::to_vec_pretty(body).map_err(io::Error::other)?;
    let dir = mount_root.join(name);
    let manifest = dir.join("manifest.json");
    if std::fs::read(&manifest).is_ok_and(|old| old == text) {
        return Ok(());
    }
    if dir.is_dir() {
        return write_atomic(&manifest, &text);
    }
    std::fs::create_dir_all(mount_root)?;
    for e in std::fs::read_dir(mount_root)?.flatten() {
        if e.file_name()
            .to_str()
            .is_some_and(|n| left_by_the_dead(n, name))
        {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
    let tmp = aside(mount_root, name, "new");
    std::fs::create_dir(&tmp)?;
    let made =
        write_atomic(&tmp.join("manifest.json"), &text).and_then(|()| std::fs::rename(&tmp, &dir));
    let _ = std::fs::remove_dir_all(&tmp);
    match made {
        // Made meanwhile by another publisher: write into it.
        Err(_) if dir.is_dir() => write_atomic(&manifest, &text),
        r => r,
    }
}

/// Write the manifest of an import from its files' entries: one build per
/// target each file carries, SASS and PTX, as the inspector read them.
pub fn publish_import(mount_root: &Path, record: &Record, entries: &[Entry]) -> io::Result<()> {
    let mut builds = Vec::new();
    for e in entries {
        let m = &e.manifest;
        for (file, info) in &m.files {
            builds.extend(info.targets.iter().map(|t| Build {
                arch: t.clone(),
                variant: file.clone(),
                dtype: None,
                key: m.key.clone(),
                dir: e.dir.clone(),
                files: vec![file.clone()],
                toolkit: m.toolkit.clone(),
            }));
        }
    }
    let body = Published {
        schema: SCHEMA,
        package: record.name.clone(),
        version: entries
            .iter()
            .map(|e| e.manifest.version.as_str())
            .collect::<Vec<_>>()
            .join(","),
        description: format!("imported {} file(s)", entries.len()),
        targets: builds.iter().map(|b| b.arch.clone()).collect(),
        builds,
        unavailable: Vec::new(),
        pending: Vec::new(),
        imported: true,
        ldconfig: record.ldconfig,
    };
    write_manifest(mount_root, &record.name, &body)
}

/// Remove a package the daemon no longer has: renamed to a dot-name first,
/// so that it goes whole, never a directory left without its manifest.
pub fn unpublish(mount_root: &Path, name: &str) -> io::Result<()> {
    let gone = aside(mount_root, name, "old");
    match std::fs::rename(mount_root.join(name), &gone) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
        Ok(()) => std::fs::remove_dir_all(&gone),
    }
}

/// Where this process keeps package `name` aside while it makes (`new`) or
/// removes (`old`) it: a dot-name, which the hook passes over.
fn aside(mount_root: &Path, name: &str, what: &str) -> std::path::PathBuf {
    mount_root.join(format!(".{name}.{}.{what}", std::process::id()))
}

/// Whether `entry` of the mount root is package `name`'s [`aside`] of a
/// process that is gone (one that died between its two steps). Neither
/// another package's (`.a.b.…` is package `a.b`'s, not `a`'s) nor a live
/// publisher's, such as the other gpuarchd's during a handover.
fn left_by_the_dead(entry: &str, name: &str) -> bool {
    let Some(rest) = entry
        .strip_prefix('.')
        .and_then(|e| e.strip_prefix(name))
        .and_then(|e| e.strip_prefix('.'))
    else {
        return false;
    };
    let Some(pid) = rest
        .strip_suffix(".new")
        .or_else(|| rest.strip_suffix(".old"))
    else {
        return false;
    };
    !pid.is_empty()
        && pid.bytes().all(|b| b.is_ascii_digit())
        && !Path::new("/proc").join(pid).exists()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    fn body(name: &str, version: &str) -> Published {
        Published {
            schema: SCHEMA,
            package: name.to_owned(),
            version: version.to_owned(),
            description: String::new(),
            targets: Vec::new(),
            builds: Vec::new(),
            unavailable: Vec::new(),
            pending: Vec::new(),
            imported: false,
            ldconfig: false,
        }
    }

    /// A package's directory is never seen without its manifest, as a hook
    /// lists the mount root while gpuarchd publishes (the window made
    /// `kernel package rmsnorm skipped: manifest.json: No such file or
    /// directory` in a container starting then).
    #[test]
    fn a_package_appears_with_its_manifest_or_not_at_all() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("kernels");
        let stop = AtomicBool::new(false);
        let (seen, torn) = std::thread::scope(|s| {
            let watcher = s.spawn(|| {
                let (mut seen, mut torn) = (0, 0);
                while !stop.load(Ordering::Relaxed) {
                    for e in std::fs::read_dir(&root).into_iter().flatten().flatten() {
                        let n = e.file_name();
                        if n.to_string_lossy().starts_with('.') {
                            continue;
                        }
                        seen += 1;
                        if std::fs::read(e.path().join("manifest.json")).is_err()
                            && e.path().exists()
                        {
                            torn += 1;
                        }
                    }
                }
                (seen, torn)
            });
            for i in 0..300 {
                write_manifest(&root, "rmsnorm", &body("rmsnorm", &i.to_string())).unwrap();
                if i % 2 == 1 {
                    unpublish(&root, "rmsnorm").unwrap();
                }
            }
            stop.store(true, Ordering::Relaxed);
            watcher.join().unwrap()
        });
        assert!(seen > 0, "the watcher never saw the package");
        assert_eq!(
            torn, 0,
            "a package seen without its manifest ({seen} looks)"
        );
        // Nothing left under a dot-name; a republish rewrites in place.
        write_manifest(&root, "rmsnorm", &body("rmsnorm", "last")).unwrap();
        let names: Vec<_> = std::fs::read_dir(&root)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names, ["rmsnorm"]);
        let text = std::fs::read_to_string(root.join("rmsnorm/manifest.json")).unwrap();
        assert!(text.contains("\"last\""), "{text}");
    }

    /// What a publisher that died between making and renaming left goes
    /// at the next publication of that package; another package's, and a
    /// live publisher's, stay.
    #[test]
    fn a_dead_publishers_leftover_goes() {
        let d = tempfile::tempdir().unwrap();
        // Above any pid_max: no such process.
        let dead = 99_999_999;
        let left = d.path().join(format!(".rmsnorm.{dead}.new"));
        std::fs::create_dir_all(&left).unwrap();
        std::fs::write(left.join("manifest.json"), b"{").unwrap();
        let removing = d.path().join(format!(".rmsnorm.{dead}.old"));
        std::fs::create_dir_all(&removing).unwrap();
        let other = d.path().join(format!(".other.{dead}.new"));
        let dotted = d.path().join(format!(".rmsnorm.v2.{dead}.new"));
        let live = d
            .path()
            .join(format!(".rmsnorm.{}.old", std::process::id()));
        for keep in [&other, &dotted, &live] {
            std::fs::create_dir_all(keep).unwrap();
        }
        write_manifest(d.path(), "rmsnorm", &body("rmsnorm", "1")).unwrap();
        assert!(!left.exists() && !removing.exists());
        assert!(
            other.exists(),
            "another package's is not this one's to take"
        );
        assert!(dotted.exists(), "nor package rmsnorm.v2's");
        assert!(live.exists(), "nor a live publisher's");
        assert!(d.path().join("rmsnorm/manifest.json").is_file());
    }
}
