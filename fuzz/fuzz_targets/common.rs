// Shared by the targets: the 2080 Ti + 3090 node every container is planned on.
use gpuarch_core::snapshot::Snapshot;

pub fn inventory() -> Snapshot {
    Snapshot::from_json(include_bytes!("../../tests/fixtures/2080ti-3090.json")).expect("fixture")
}

/// The hook's context: that node, default config, kernels from a directory
/// that does not exist (so no mounts), the hook at its installed path.
#[allow(dead_code)] // not every target plans a container
pub fn context() -> gpuarch_container::Context {
    let mut config = gpuarch_core::config::Config::default();
    config.kernels.mount_root = "/nonexistent/gpuarch-fuzz".into();
    gpuarch_container::Context {
        inventory: inventory(),
        config,
        hook_path: Some("/usr/bin/gpuarch-hook".into()),
        hook_env: Vec::new(),
        env_files: false,
    }
}
