//! Files the package ships must be what their comments say they are.

use gpuarch_core::config::Config;
use gpuarch_tests::{FIXTURES, fixture, workspace_root};

#[test]
fn the_default_config_parses_and_holds_the_defaults() {
    let text = std::fs::read_to_string(workspace_root().join("packaging/config.yaml"))
        .expect("packaging/config.yaml");
    let c = Config::from_yaml(&text).expect("shipped config parses");
    assert_eq!(
        c,
        Config::default(),
        "the shipped file documents the defaults"
    );
}

#[test]
fn every_fixture_is_a_valid_snapshot() {
    for name in FIXTURES {
        let bytes = std::fs::read(fixture(name)).expect("fixture");
        let s = gpuarch_core::snapshot::Snapshot::from_json(&bytes)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(!s.devices.is_empty(), "{name}");
    }
}

#[test]
fn the_engine_snippets_name_the_installed_programs() {
    let read = |p: &str| {
        std::fs::read_to_string(workspace_root().join(p)).unwrap_or_else(|e| panic!("{p}: {e}"))
    };
    let hook: serde_json::Value =
        serde_json::from_str(&read("packaging/oci-hooks.d/gpuarch-hook.json")).expect("hooks.d");
    assert_eq!(hook["version"], "1.0.0");
    assert_eq!(hook["hook"]["path"], "/usr/bin/gpuarch-hook");
    assert_eq!(hook["hook"]["args"][1], "precreate");
    let docker: serde_json::Value =
        serde_json::from_str(&read("packaging/docker/daemon.json")).expect("daemon.json");
    assert_eq!(
        docker["runtimes"]["gpuarch"]["path"],
        "/usr/bin/gpuarch-runtime"
    );
    assert!(
        read("packaging/containerd/gpuarch.toml")
            .contains("BinaryName = \"/usr/bin/gpuarch-runtime\"")
    );
}
