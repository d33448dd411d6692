//! CRI-O: a runtime handler that runs gpuarch-runtime, and a hooks_dir
//! its hooks library accepts.

use std::path::Path;

use super::{EXAMPLES, Engine, HOOK_DIRS, gpuarch_hooks, toml_find};
use crate::check::{Check, fail, ok, under, warn};

/// CRI-O, wired by a drop-in in `crio.conf.d`.
#[derive(Debug)]
pub struct Crio;

impl Engine for Crio {
    fn name(&self) -> &'static str {
        "cri-o"
    }

    fn program(&self) -> &'static str {
        "crio"
    }

    fn wiring(&self, root: &Path) -> Vec<Check> {
        wiring(root)
    }
}

/// CRI-O: a runtime handler, and a hooks_dir it can read. Its hooks library
/// refuses a directory holding a hook for a stage it does not know, such as
/// podman's precreate.
fn wiring(root: &Path) -> Vec<Check> {
    const NAME: &str = "cri-o";
    // crio.conf, then crio.conf.d/*.conf in name order: later settings win.
    let mut unread = Vec::new();
    let files = gpuarch_fs::crio::crio_files(
        &under(root, Path::new(gpuarch_core::config::DEFAULT_CRIO_CONFIG)),
        &mut unread,
    );

    let mut handler = None;
    let mut hooks_dir: Vec<String> = vec![HOOK_DIRS[0].to_owned()];
    for f in &files {
        // Bounded and never blocking, as gpuarchd reads the same files.
        let doc = match gpuarch_fs::read_toml(f) {
            Ok(Some(d)) => toml::Value::Table(d),
            Ok(None) => continue,
            Err(e) => return vec![fail(NAME, e, "correct the file")],
        };
        let mut found = Vec::new();
        toml_find(&doc, "runtime_path", "gpuarch-runtime", "", &mut found);
        if let Some(t) = found.into_iter().next() {
            handler = Some((t, f.clone()));
        }
        if let Some(dirs) = doc
            .get("crio")
            .and_then(|c| c.get("runtime"))
            .and_then(|r| r.get("hooks_dir"))
            .and_then(toml::Value::as_array)
        {
            hooks_dir = dirs
                .iter()
                .filter_map(|d| d.as_str().map(str::to_owned))
                .collect();
        }
    }
    let fix = format!(
        "cp {EXAMPLES}/crio/50-gpuarch.conf /etc/crio/crio.conf.d/ and systemctl restart crio"
    );
    let mut checks = vec![match handler {
        Some((t, f)) => ok(
            NAME,
            format!("wired: [{t}] in {} runs gpuarch-runtime", f.display()),
        ),
        None => fail(NAME, "no runtime handler runs gpuarch-runtime", fix.clone()),
    }];
    let dirs: Vec<&str> = hooks_dir.iter().map(String::as_str).collect();
    let precreate = gpuarch_hooks(root, &dirs, "precreate");
    if let Some((f, _)) = precreate.first() {
        checks.push(fail(
            "cri-o hooks",
            format!(
                "CRI-O reads {}, which holds podman's precreate hook; CRI-O has no precreate stage and its hooks library refuses that directory",
                f.parent().map_or_else(String::new, |p| p.display().to_string())
            ),
            fix,
        ));
    } else if !gpuarch_hooks(root, &dirs, "createContainer").is_empty() {
        checks.push(ok(
            "cri-o hooks",
            "the createContainer hook is in its hooks_dir",
        ));
    }
    // Past gpuarch's bound on drop-ins: what CRI-O reads there is not
    // looked at, by this check nor by gpuarchd.
    for why in unread {
        checks.push(warn(NAME, why, "merge the drop-ins"));
    }
    checks
}
