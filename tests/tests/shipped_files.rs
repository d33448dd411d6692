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
