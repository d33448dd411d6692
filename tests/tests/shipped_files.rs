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
    let toml = |p: &str| -> toml::Value {
        toml::from_str(&read(p)).unwrap_or_else(|e| panic!("{p}: {e}"))
    };
    let crio = toml("packaging/crio/50-gpuarch.conf");
    let rt = &crio["crio"]["runtime"];
    assert_eq!(
        rt["runtimes"]["gpuarch"]["runtime_path"].as_str(),
        Some("/usr/bin/gpuarch-runtime")
    );
    // CRI-O must not read the directory holding podman's precreate hook,
    // and must read the one holding the createContainer hook.
    let dirs: Vec<&str> = rt["hooks_dir"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(toml::Value::as_str)
        .collect();
    assert!(
        !dirs.contains(&"/usr/share/containers/oci/hooks.d"),
        "{dirs:?}"
    );
    assert!(dirs.contains(&"/usr/share/gpuarch/oci-hooks.d"), "{dirs:?}");
    let cc: serde_json::Value =
        serde_json::from_str(&read("packaging/oci-hooks.d/gpuarch-create-container.json"))
            .expect("createContainer hooks.d");
    assert_eq!(cc["stages"], serde_json::json!(["createContainer"]));
    assert_eq!(cc["hook"]["args"][1], "create-container");
    let rc: serde_yaml::Value =
        serde_yaml::from_str(&read("packaging/containerd/runtimeclass.yaml")).unwrap();
    assert_eq!(rc["kind"].as_str(), Some("RuntimeClass"));
    assert_eq!(rc["handler"].as_str(), Some("gpuarch"));
    assert_eq!(
        rc["handler"].as_str(),
        Some(gpuarch_ctl::engine::containerd::HANDLER),
        "the RuntimeClass handler is the runtime's name in the containerd drop-in"
    );
}

fn have(tool: &str) -> bool {
    gpuarch_tests::which(tool).is_some()
}

/// `systemd-analyze verify` on the unit, with ExecStart pointed at the built
/// gpuarchd (verify insists the binary exists; nothing else is changed).
#[test]
fn the_unit_verifies_and_is_type_notify_with_hardening() {
    if !have("systemd-analyze") {
        gpuarch_tests::skip("systemd-analyze is not installed");
        return;
    }
    let unit = std::fs::read_to_string(workspace_root().join("systemd/gpuarchd.service")).unwrap();
    for line in [
        "Type=notify",
        "ExecStart=/usr/bin/gpuarchd",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "NoNewPrivileges=yes",
        "RestrictAddressFamilies=AF_UNIX",
        "WatchdogSec=",
        "PrivateNetwork=yes",
        "ExecReload=/usr/bin/gpuarchctl reload",
        "MemoryMax=",
        "TasksMax=",
    ] {
        assert!(unit.lines().any(|l| l.starts_with(line)), "missing {line}");
    }
    let dir = tempfile::tempdir().unwrap();
    let bins = gpuarch_tests::artifacts();
    let path = dir.path().join("gpuarchd.service");
    std::fs::write(
        &path,
        unit.replace("/usr/bin/gpuarchd", bins.gpuarchd.to_str().unwrap())
            .replace("/usr/bin/gpuarchctl", bins.gpuarchctl.to_str().unwrap()),
    )
    .unwrap();
    let o = std::process::Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&path)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && err.trim().is_empty(), "{err}");
}

#[test]
fn tmpfiles_and_sysusers_create_what_the_daemon_needs() {
    if !have("systemd-tmpfiles") || !have("systemd-sysusers") {
        gpuarch_tests::skip("systemd-tmpfiles or systemd-sysusers is not installed");
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let o = std::process::Command::new("systemd-tmpfiles")
        .arg("--create")
        .arg(format!("--root={}", root.path().display()))
        .arg(workspace_root().join("systemd/tmpfiles.d/gpuarchd.conf"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for d in [
        "run/gpuarch",
        "var/cache/gpuarch",
        "var/lib/gpuarch/kernels",
    ] {
        let m = std::fs::metadata(root.path().join(d)).unwrap_or_else(|e| panic!("{d}: {e}"));
        assert!(m.is_dir(), "{d}");
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777,
            0o755,
            "{d}: the snapshot and kernels are world-readable"
        );
    }
    std::fs::create_dir_all(root.path().join("etc")).unwrap();
    let o = std::process::Command::new("systemd-sysusers")
        .arg(format!("--root={}", root.path().display()))
        .arg(workspace_root().join("systemd/sysusers.d/gpuarch.conf"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let group = std::fs::read_to_string(root.path().join("etc/group")).unwrap();
    assert!(group.lines().any(|l| l.starts_with("gpuarch:")), "{group}");
}
