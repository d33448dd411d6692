//! Docker: gpuarch-runtime as a runtime in `daemon.json`, and whether
//! `--gpus` can work at all (dockerd's gpu driver).

use std::path::Path;

use serde_json::Value;

use super::{EXAMPLES, Engine, RUNTIME, installed};
use crate::check::{Check, fail, ok, under, warn};

/// dockerd, wired by a runtime in its `daemon.json`.
#[derive(Debug)]
pub struct Docker;

impl Engine for Docker {
    fn name(&self) -> &'static str {
        "docker"
    }

    fn program(&self) -> &'static str {
        "dockerd"
    }

    fn wiring(&self, root: &Path) -> Vec<Check> {
        vec![runtime(root), gpus(root)]
    }
}

/// The program dockerd looks for on its PATH at start; only with it does it
/// register the `gpu` device driver that `--gpus` and compose's GPU
/// reservations ask for (NVIDIA's container toolkit installs it).
const NVIDIA_HOOK: &str = "nvidia-container-runtime-hook";

/// Will `docker run --gpus` work? gpuarch plans from the
/// `NVIDIA_VISIBLE_DEVICES` dockerd's gpu driver sets; without the driver
/// dockerd refuses the request before any runtime runs.
fn gpus(root: &Path) -> Check {
    const NAME: &str = "docker gpus";
    match installed(root, NVIDIA_HOOK) {
        Some(p) => ok(
            NAME,
            format!(
                "--gpus and compose GPU reservations work: dockerd finds {} and sets NVIDIA_VISIBLE_DEVICES, which gpuarch plans from",
                p.display()
            ),
        ),
        None => warn(
            NAME,
            format!(
                "docker run --gpus and compose GPU reservations fail (could not select device driver \"\" with capabilities: [[gpu]]): dockerd registers its gpu driver only when {NVIDIA_HOOK} is on its PATH"
            ),
            "install NVIDIA's container toolkit (nvidia-container-toolkit), then systemctl restart docker; until then give GPUs as --device /dev/nvidiaN, which gpuarch plans too",
        ),
    }
}

/// A runtime in `/etc/docker/daemon.json` that runs gpuarch-runtime.
fn runtime(root: &Path) -> Check {
    const NAME: &str = "docker";
    let file = under(root, Path::new("/etc/docker/daemon.json"));
    let fix = format!(
        "gpuarchctl engine docker --write (it merges \"runtimes\": {{\"gpuarch\": {{\"path\": \"{RUNTIME}\"}}}} into /etc/docker/daemon.json, as in {EXAMPLES}/docker/daemon.json, keeping a backup; --default makes it the default runtime), systemctl restart docker, then docker run --runtime gpuarch"
    );
    let doc: Value = match gpuarch_fs::read_config(&file) {
        Ok(Some(b)) => match serde_json::from_str(&b) {
            Ok(v) => v,
            Err(e) => {
                return fail(
                    NAME,
                    format!("{}: not JSON: {e}", file.display()),
                    "correct the file (dockerd refuses to start with it as it is)",
                );
            }
        },
        Ok(None) => {
            return fail(NAME, format!("{} does not exist", file.display()), fix);
        }
        Err(e) => return fail(NAME, format!("{}: {e}", file.display()), fix),
    };
    let names: Vec<&String> = doc["runtimes"]
        .as_object()
        .map(|rs| {
            rs.iter()
                .filter(|(_, r)| {
                    r["path"]
                        .as_str()
                        .is_some_and(|p| super::is_gpuarch_runtime(root, p))
                })
                .map(|(n, _)| n)
                .collect()
        })
        .unwrap_or_default();
    match names.first() {
        Some(n) => {
            let default = doc["default-runtime"].as_str() == Some(n.as_str());
            ok(
                NAME,
                format!(
                    "wired: runtime \"{n}\" in {}{}",
                    file.display(),
                    if default {
                        " (the default runtime)"
                    } else {
                        "; containers use it with --runtime"
                    }
                ),
            )
        }
        None => fail(
            NAME,
            format!("{} has no runtime running gpuarch-runtime", file.display()),
            fix,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A FIFO where daemon.json is, as a hostile or broken host may have:
    /// doctor names it and goes on, where it used to wait for a writer.
    #[test]
    fn a_fifo_as_daemon_json_is_named_not_waited_on() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("etc/docker");
        std::fs::create_dir_all(&dir).unwrap();
        let mode = nix::sys::stat::Mode::from_bits_truncate(0o644);
        nix::unistd::mkfifo(&dir.join("daemon.json"), mode).unwrap();
        let t = std::time::Instant::now();
        let c = runtime(d.path());
        assert!(
            c.status == crate::check::Status::Fail && c.detail.contains("not a regular file"),
            "{c:?}"
        );
        assert!(t.elapsed() < std::time::Duration::from_secs(2));
    }
}
