//! What the hook reads: `<mount_root>/<package>/manifest.json`, naming for
//! each arch the verified store entry that serves it.

use std::io;
use std::path::Path;

use serde_json::json;

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
            builds.push(json!({
                "arch": m.arch, "variant": m.variant, "dtype": m.dtype,
                "key": m.key, "dir": e.dir, "files": m.files.keys().collect::<Vec<_>>(),
                "toolkit": m.toolkit,
            }));
        } else if let Some(err) = &r.error {
            pending.push(json!({"arch": r.arch.to_string(), "reason": err}));
        }
        for u in &r.unavailable {
            unavailable.push(
                json!({"arch": r.arch.to_string(), "variant": u.variant, "reason": u.reason}),
            );
        }
    }
    let body = json!({
        "schema": 2,
        "package": pkg.name(),
        "version": pkg.spec.version,
        "description": pkg.spec.description,
        "targets": builds.iter().map(|b| b["arch"].clone()).collect::<Vec<_>>(),
        "builds": builds,
        "unavailable": unavailable,
        "pending": pending,
    });
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
