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
    let dir = mount_root.join(pkg.name());
    std::fs::create_dir_all(&dir)?;
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
    write_manifest(&dir, &body)
}

/// Write `body` as `dir/manifest.json`, unless it says that already.
fn write_manifest(dir: &Path, body: &Published) -> io::Result<()> {
    let text = serde_json::to_vec_pretty(body).map_err(io::Error::other)?;
    if std::fs::read(dir.join("manifest.json")).is_ok_and(|old| old == text) {
        return Ok(());
    }
    write_atomic(&dir.join("manifest.json"), &text)
}

/// Write the manifest of an import from its files' entries: one build per
/// target each file carries, SASS and PTX, as the inspector read them.
pub fn publish_import(mount_root: &Path, record: &Record, entries: &[Entry]) -> io::Result<()> {
    let dir = mount_root.join(&record.name);
    std::fs::create_dir_all(&dir)?;
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
    write_manifest(&dir, &body)
}

/// Remove a package the daemon no longer has.
pub fn unpublish(mount_root: &Path, name: &str) -> io::Result<()> {
    match std::fs::remove_dir_all(mount_root.join(name)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}
