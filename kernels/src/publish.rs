//! What the hook reads: `<mount_root>/<package>/manifest.json`, naming for
//! each arch the verified store entry that serves it.

use std::io;
use std::path::Path;

use gpuarch_wire::manifest::{Build, Pending, Published, SCHEMA, Unavailable};

use crate::build::ArchResult;
use crate::spec::Package;
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
    };
    let text = serde_json::to_vec_pretty(&body).map_err(io::Error::other)?;
    if std::fs::read(dir.join("manifest.json")).is_ok_and(|old| old == text) {
        return Ok(());
    }
    write_atomic(&dir.join("manifest.json"), &text)
}

/// Remove a package the daemon no longer has.
pub fn unpublish(mount_root: &Path, name: &str) -> io::Result<()> {
    match std::fs::remove_dir_all(mount_root.join(name)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}
