//! Which packages under the mount root serve every GPU of a container,
//! laid out for it; and, for a GPU with no build of its arch yet, a build
//! request left in the spool for gpuarchd.

use gpuarch_core::arch::CudaVersion;
use gpuarch_core::config::{KernelsConfig, valid_package_name as valid_name};
use gpuarch_core::plan::Plan;

use super::manifest::{PackageManifest, read_manifest};
use super::view::{ViewError, lay_out, linked_ids, same_filesystem, serving, store_objects};
use super::{KernelMount, Kernels, MAX_PACKAGES};

/// The packages under `root` that serve every GPU of `plan`, laid out for
/// the container (see [`Kernels`]), and a note for each package skipped
/// and why. A missing `root` is no packages.
pub fn discover(cfg: &KernelsConfig, plan: &Plan, driver_cuda: &str) -> (Kernels, Vec<String>) {
    let root = cfg.mount_root.as_path();
    let mut handmade = Vec::new();
    let mut notes = Vec::new();
    if plan.gpus.is_empty() {
        return (Kernels::default(), notes);
    }
    let entries = match std::fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return (Kernels::default(), notes),
        Err(e) => {
            notes.push(format!(
                "no kernel mounts: cannot list {}: {e}",
                root.display()
            ));
            return (Kernels::default(), notes);
        }
    };
    let cuda = CudaVersion::parse(driver_cuda).ok();
    let mut names: Vec<String> = Vec::new();
    for entry in entries.flatten().take(MAX_PACKAGES + 1) {
        match entry.file_name().into_string() {
            Ok(n) if valid_name(&n) => names.push(n),
            Ok(n) if n.starts_with('.') => {}
            other => notes.push(format!(
                "kernel package {:?} skipped: not a valid package name",
                other.unwrap_or_else(|os| os.to_string_lossy().into_owned())
            )),
        }
    }
    if names.len() > MAX_PACKAGES {
        notes.push(format!(
            "more than {MAX_PACKAGES} kernel packages under {}: only the first {MAX_PACKAGES} are considered",
            root.display()
        ));
        names.truncate(MAX_PACKAGES);
    }
    names.sort();
    let objects = store_objects(cfg);
    let mut published = Vec::new();
    for name in names {
        let dir = root.join(&name);
        let man = match read_manifest(&dir.join("manifest.json")) {
            Ok(m) => m,
            Err(e) => {
                notes.push(format!("kernel package {name} skipped: manifest.json: {e}"));
                continue;
            }
        };
        if man.builds.is_some() {
            match serving(cfg, &objects, &name, &man, plan, cuda, &mut notes) {
                Ok(Some(s)) => published.push(s),
                Ok(None) => {}
                Err(e) => notes.push(format!("kernel package {name} not mounted: {e}")),
            }
            continue;
        }
        let PackageManifest {
            targets, libraries, ..
        } = man;
        let unserved = plan.gpus.iter().find(|g| {
            !targets
                .iter()
                .any(|t| t.check(g.compute_capability, cuda, None).runs)
        });
        match unserved {
            None => handmade.push(KernelMount {
                package: name,
                source: dir,
                libraries,
                builds: Vec::new(),
            }),
            Some(g) => notes.push(format!(
                "kernel package {name} not mounted: no build in it runs on {}",
                g.label()
            )),
        }
    }
    // Linked: the builds' files are hard links in the view, one mount in
    // all. That needs the view on the store's filesystem: told from the two
    // directories' devices, once, not by trying a link.
    let view_dir = cfg.view_dir();
    let linked =
        !published.is_empty() && same_filesystem(&view_dir, &cfg.cache_dir.join("objects"));
    if linked {
        // The view is named by the identity of every file linked in too,
        // so a build rebuilt under the same key (new inodes) gets a new
        // view rather than the old one's files.
        published.retain_mut(|p| match linked_ids(&p.used) {
            Ok(ids) => {
                p.ids = ids;
                true
            }
            Err(e) => {
                notes.push(format!(
                    "kernel package {} not mounted: a build to link: {e}",
                    p.name
                ));
                false
            }
        });
    } else if !published.is_empty() {
        notes.push(format!(
            "{} is not on the kernel store's filesystem, so each build is one more mount; leave kernels.view_dir unset (it is then {}/views)",
            view_dir.display(),
            cfg.cache_dir.display()
        ));
    }
    let view = if published.is_empty() {
        None
    } else {
        match lay_out(&view_dir, &published, &handmade, linked) {
            Ok(v) => Some(v),
            Err(error) => {
                let e = ViewError::Layout {
                    dir: view_dir,
                    error,
                };
                let names: Vec<&str> = published.iter().map(|p| p.name.as_str()).collect();
                notes.push(format!(
                    "kernel packages {} not mounted: {e}",
                    names.join(", ")
                ));
                None
            }
        }
    };
    let Some(view) = view else {
        return (
            Kernels {
                view: None,
                packages: handmade,
            },
            notes,
        );
    };
    let mut packages = handmade;
    packages.extend(published.into_iter().map(|p| KernelMount {
        source: view.join(&p.name),
        libraries: p.libraries,
        builds: if linked {
            Vec::new()
        } else {
            p.used
                .iter()
                .map(|b| (b.view.clone(), b.dir.clone()))
                .collect()
        },
        package: p.name,
    }));
    packages.sort_by(|a, b| a.package.cmp(&b.package));
    (
        Kernels {
            view: Some(view),
            packages,
        },
        notes,
    )
}
