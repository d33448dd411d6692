//! gpuarchd's NRI plugin in the test's own process, on the 2080 Ti + 3090
//! fixture, with a runtime played by `fake_runtime`: for the tests and
//! benches that drive CreateContainer themselves against a real image
//! store (containerd's, containers/storage).

#![allow(clippy::unwrap_used)] // test helpers: a failed unwrap is a failed test

use std::path::Path;
use std::sync::Arc;

use gpuarch_core::config::{Config, NriConfig};
use gpuarch_core::snapshot::Snapshot;
use gpuarch_daemon::nri::{self, fake_runtime, proto::nri::CreateContainerResponse};
use gpuarch_daemon::state::Shared;

/// The env of a GPU container of [`crate::stack::PY_IMAGE`]: its venv on
/// `PATH`, GPU 1 (the 3090).
pub const PY_ENV: [&str; 3] = [
    "PATH=/app/.venv/bin:/bin",
    "VIRTUAL_ENV=/app/.venv",
    "NVIDIA_VISIBLE_DEVICES=1",
];

/// gpuarchd's state for an NRI plugin whose files are all in `dir`, its
/// `nri:` config as `nri` leaves it. Records (`gpuarchctl why`) are kept
/// only where the caller makes `dir/records`.
pub fn shared(dir: &Path, nri: impl FnOnce(&mut NriConfig)) -> Arc<Shared> {
    let mut cfg = Config::default();
    cfg.nri.enable = true;
    cfg.nri.socket = dir.join("nri.sock");
    cfg.nri.containerd = dir.join("no-containerd.sock");
    // CRI-O's config files are the test's, not the host's.
    cfg.nri.crio_config = dir.join("crio.conf");
    cfg.nri.storage_conf = dir.join("storage.conf");
    nri(&mut cfg.nri);
    cfg.hook.record_dir = dir.join("records");
    cfg.hook.image_cache = dir.join("images");
    cfg.kernels.mount_root = dir.join("kernels");
    let fixture = crate::fixture("2080ti-3090");
    let shared = Shared::new(
        cfg,
        dir.join("inventory.json"),
        dir.join("config.yaml"),
        false,
    );
    shared.refreshed(Snapshot::from_json(&std::fs::read(fixture).unwrap()).unwrap());
    Arc::new(shared)
}

/// The plugin of `shared` running, registered with a runtime that names
/// itself `runtime` in Configure; it stops when the returned sender drops.
pub async fn start(
    shared: &Arc<Shared>,
    runtime: &str,
) -> (fake_runtime::Plugin, tokio::sync::watch::Sender<bool>) {
    // A socket an earlier plugin of the same directory left.
    let _ = std::fs::remove_file(&shared.config().nri.socket);
    let rt = fake_runtime::FakeRuntime::bind_as(&shared.config().nri.socket, runtime).unwrap();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    tokio::spawn(nri::run(shared.clone(), stop));
    (rt.accept().await.unwrap(), stop_tx)
}

/// The value the adjustment gives `key`, if any.
pub fn var(r: &CreateContainerResponse, key: &str) -> Option<String> {
    r.adjust
        .env
        .iter()
        .find(|kv| kv.key == key)
        .map(|kv| kv.value.clone())
}
