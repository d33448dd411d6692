//! podman: gpuarch-hook at `precreate`, from a hooks.d file podman reads.

use std::path::Path;

use super::{Engine, HOOK_DIRS, gpuarch_hooks};
use crate::check::{Check, fail, ok};

/// podman, wired by the hooks.d file the package ships.
#[derive(Debug)]
pub struct Podman;

impl Engine for Podman {
    fn name(&self) -> &'static str {
        "podman"
    }

    fn program(&self) -> &'static str {
        "podman"
    }

    fn wiring(&self, root: &Path) -> Vec<Check> {
        vec![wiring(root)]
    }
}

fn wiring(root: &Path) -> Check {
    const NAME: &str = "podman";
    let hooks = gpuarch_hooks(root, &HOOK_DIRS, "precreate");
    match hooks.iter().find(|(_, exe)| *exe) {
        Some((f, _)) => ok(NAME, format!("wired: precreate hook {}", f.display())),
        None => fail(
            NAME,
            "no hooks.d file runs gpuarch-hook at precreate (podman reads /usr/share/containers/oci/hooks.d and /etc/containers/oci/hooks.d unless containers.conf sets hooks_dir)",
            "apt install --reinstall gpuarch (it ships /usr/share/containers/oci/hooks.d/gpuarch-hook.json)",
        ),
    }
}
