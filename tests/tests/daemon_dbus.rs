//! gpuarchd on a real, private `dbus-daemon` configured like the system bus
//! (deny by default, holes punched by `packaging/dbus/io.gpuarch1.conf`),
//! with the fake NVML behind the real nvml-wrapper, a real sd_notify socket,
//! and gpuarchctl as users see it.
//!
//! Needs root (only root may own io.gpuarch1 under the shipped policy),
//! dbus-daemon and setpriv; `.ci/run` has them. A missing one is reported
//! and the test skips.

#![allow(clippy::unwrap_used)] // test helpers: a failed unwrap is a failed test

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use gpuarch_core::snapshot::Snapshot;
use gpuarch_tests::daemon::{Node, Policy, block_on};
use gpuarch_tests::{artifacts, cannot_run, fixture, workspace_root};
use gpuarch_wire::dbus::{DaemonProxy, InventoryProxy, JobProxy, JobState};

fn missing(tools: &[&str]) -> Option<String> {
    cannot_run(
        ": only root may own io.gpuarch1 under the shipped bus policy",
        tools,
    )
}

macro_rules! require {
    ($($tool:expr),*) => {
        gpuarch_tests::require!(missing(&["dbus-daemon" $(, $tool)*]))
    };
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The D-Bus error name and message of a failed call.
fn dbus_error(e: zbus::Error) -> (String, String) {
    match e {
        zbus::Error::MethodError(name, msg, _) => {
            (name.as_str().to_owned(), msg.unwrap_or_default())
        }
        zbus::Error::FDO(f) => (
            zbus::DBusError::name(f.as_ref()).as_str().to_owned(),
            zbus::DBusError::description(f.as_ref())
                .unwrap_or_default()
                .to_owned(),
        ),
        other => panic!("not a D-Bus error reply: {other}"),
    }
}

#[test]
fn every_method_and_property_on_two_topologies() {
    require!();
    for topo in ["2080ti-3090", "8xh100"] {
        let mut node = Node::new(topo, Policy::Shipped);
        node.start(&[]);
        let want = Snapshot::from_json(&std::fs::read(fixture(topo)).unwrap()).unwrap();
        block_on(async {
            let conn = node.conn().await;
            let inv = InventoryProxy::new(&conn).await.unwrap();
            let daemon = DaemonProxy::new(&conn).await.unwrap();

            let list = inv.list_devices().await.unwrap();
            let got: Vec<_> = list
                .into_iter()
                .map(|d| gpuarch_core::snapshot::Device::try_from(d).unwrap())
                .collect();
            assert_eq!(got, want.devices, "{topo}: ListDevices");

            let caps: Vec<String> = want
                .devices
                .iter()
                .map(|d| d.compute_capability.to_string())
                .collect();
            assert_eq!(inv.compute_capabilities().await.unwrap(), caps, "{topo}");
            assert_eq!(inv.driver_version().await.unwrap(), want.driver_version);
            assert_eq!(inv.source().await.unwrap(), "nvml", "{topo}: Source");
            assert_eq!(
                inv.cuda_driver_version().await.unwrap(),
                want.cuda_driver_version
            );
            assert!(!inv.stale().await.unwrap());
            assert_eq!(inv.last_error().await.unwrap(), "");
            assert!(inv.last_refresh().await.unwrap() > 0);
            assert!(!inv.generated_at().await.unwrap().is_empty());
            assert_eq!(daemon.version().await.unwrap(), env!("CARGO_PKG_VERSION"));
            assert!(daemon.started_at().await.unwrap() > 0);

            let (env, notes) = inv.plan(&["0", "1"]).await.unwrap();
            let (m, bf16) = if topo == "8xh100" {
                ("9.0", "bfloat16")
            } else {
                ("7.5;8.6", "float16")
            };
            assert_eq!(env["TORCH_CUDA_ARCH_LIST"], m, "{topo}");
            assert_eq!(env["GPUARCH_DTYPE"], bf16, "{topo}");
            assert!(!notes.is_empty());

            let bf16_uuids = inv.match_devices("feature=bf16").await.unwrap();
            let fa3 = inv
                .match_devices("feature=flash_attention_3")
                .await
                .unwrap();
            let old = inv.match_devices("arch<8.0").await.unwrap();
            let all = inv.match_devices("").await.unwrap();
            assert_eq!(all.len(), want.devices.len());
            if topo == "2080ti-3090" {
                // Only the 3090 runs bf16 on the mixed node.
                assert_eq!(bf16_uuids, [want.devices[1].uuid.clone()]);
                assert!(fa3.is_empty());
                assert_eq!(old, [want.devices[0].uuid.clone()]);
                let (env, _) = inv.plan(&["1"]).await.unwrap();
                assert_eq!(env["GPUARCH_ATTN_IMPLEMENTATION"], "flash_attention_2");
            } else {
                assert_eq!(bf16_uuids.len(), 8);
                assert_eq!(fa3.len(), 8);
                assert!(old.is_empty());
                let r = inv.match_devices("arch=9.0,feature=fp8").await.unwrap();
                assert_eq!(r.len(), 8);
            }

            // Bad arguments are D-Bus errors that say what was wrong.
            let (name, msg) = dbus_error(inv.plan(&["0", "42"]).await.unwrap_err());
            assert_eq!(name, "org.freedesktop.DBus.Error.InvalidArgs");
            assert!(
                msg.contains("\"42\"") && msg.contains("no GPU with index 42"),
                "{msg}"
            );
            let (name, msg) = dbus_error(inv.plan(&["GPU-nope"]).await.unwrap_err());
            assert_eq!(name, "org.freedesktop.DBus.Error.InvalidArgs", "{msg}");
            let (name, msg) = dbus_error(
                inv.match_devices("arch>=8.0,feature=bf17")
                    .await
                    .unwrap_err(),
            );
            assert_eq!(name, "org.freedesktop.DBus.Error.InvalidArgs");
            assert!(
                msg.contains("\"feature=bf17\"") && msg.contains("unknown feature"),
                "{msg}"
            );
            let (_, msg) = dbus_error(inv.match_devices("arch>=8.0,,").await.unwrap_err());
            assert!(msg.contains("empty term"), "{msg}");
            // And the daemon is still there.
            assert_eq!(inv.compute_capabilities().await.unwrap(), caps);
        });
        // The snapshot the hook reads says the same.
        assert_eq!(node.snapshot().devices, want.devices, "{topo}: snapshot");
        let (status, _) = node.stop();
        assert!(status.success(), "{topo}: {status}\n{}", node.log());
    }
}

/// The `<interface name="io.gpuarch1.…">` elements of an introspection
/// document, whitespace-normalised.
fn our_interfaces(xml: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = xml;
    while let Some(start) = rest.find("<interface name=\"io.gpuarch1.") {
        let end = rest[start..].find("</interface>").unwrap() + start + "</interface>".len();
        out.push(
            rest[start..end]
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" "),
        );
        rest = &rest[end..];
    }
    out
}

async fn introspect(conn: &zbus::Connection, path: &str) -> String {
    zbus::fdo::IntrospectableProxy::builder(conn)
        .destination("io.gpuarch1")
        .path(path.to_owned())
        .build()
        .await
        .unwrap()
        .introspect()
        .await
        .unwrap()
}

/// A Prewarm of 8.6 as root on a node with no packages: a job that
/// finishes at once.
async fn empty_prewarm(conn: &zbus::Connection) -> zbus::OwnedObjectPath {
    let reply = conn
        .call_method(
            Some("io.gpuarch1"),
            "/io/gpuarch1",
            Some("io.gpuarch1.KernelCache"),
            "Prewarm",
            &(Vec::<String>::new(), vec!["8.6".to_owned()]),
        )
        .await
        .unwrap();
    reply.body().deserialize().unwrap()
}

#[test]
fn the_shipped_interface_xml_is_what_the_daemon_serves() {
    require!();
    let mut node = Node::new("2080ti-3090", Policy::Shipped);
    node.start(&[]);
    let (main, job) = block_on(async {
        let conn = node.conn().await;
        let main = introspect(&conn, "/io/gpuarch1").await;
        // A job object exists once a pre-warm was asked for.
        let path = empty_prewarm(&conn).await;
        (main, introspect(&conn, path.as_str()).await)
    });
    let shipped =
        std::fs::read_to_string(workspace_root().join("packaging/dbus/io.gpuarch1.xml")).unwrap();
    let mut live = our_interfaces(&main);
    live.extend(our_interfaces(&job));
    if let Some(dump) = std::env::var_os("GPUARCH_DUMP_INTROSPECTION") {
        std::fs::write(dump, format!("{main}\n{job}")).unwrap();
    }
    let shipped = our_interfaces(&shipped);
    assert_eq!(
        live.len(),
        5,
        "io.gpuarch1.Daemon, Inventory, JitCache, KernelCache and Job"
    );
    assert_eq!(
        live, shipped,
        "packaging/dbus/io.gpuarch1.xml differs from what gpuarchd serves"
    );
}

/// The gid of group gpuarch, created from the shipped sysusers.d file as a
/// package's postinst would.
fn admin_gid() -> u32 {
    let conf = workspace_root().join("systemd/sysusers.d/gpuarch.conf");
    let st = Command::new("systemd-sysusers")
        .arg(&conf)
        .status()
        .unwrap();
    assert!(st.success(), "systemd-sysusers {}", conf.display());
    nix::unistd::Group::from_name("gpuarch")
        .unwrap()
        .expect("group gpuarch after systemd-sysusers")
        .gid
        .as_raw()
}

#[test]
fn anyone_reads_only_root_and_group_gpuarch_reload() {
    require!("setpriv", "systemd-sysusers");
    // Before the bus starts: dbus-daemon resolves group names when it loads
    // its policy.
    let gid = admin_gid();
    for policy in [Policy::Shipped, Policy::Open] {
        let mut node = Node::new("2080ti-3090", policy);
        node.start(&[]);
        let nobody: &[u32] = &[];

        // Reads are open to every local user.
        let o = node.ctl(Some(nobody), &["devices", "--json"]);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{err}");
        let seen = Snapshot::from_json(out.as_bytes()).unwrap();
        assert_eq!(seen.devices.len(), 2);
        let o = node.ctl(Some(nobody), &["match", "feature=bf16"]);
        assert!(o.status.success(), "{}", text(&o).1);

        // Reload is not, whether the bus or the daemon says so.
        let o = node.ctl(Some(nobody), &["reload"]);
        let (_, err) = text(&o);
        assert_eq!(
            o.status.code(),
            Some(2),
            "{policy_name}: {err}",
            policy_name = policy as u8
        );
        assert!(err.contains("permission denied"), "{err}");
        match policy {
            Policy::Shipped => assert!(err.contains("bus policy"), "{err}"),
            // The bus let it through: the daemon's own check, from the
            // caller's credentials, not the daemon's.
            Policy::Open => assert!(
                err.contains("Reload is for root and members of group gpuarch")
                    && err.contains("uid 65534"),
                "{err}"
            ),
        }

        // A member of group gpuarch, and root, may.
        let o = node.ctl(Some(&[gid]), &["reload"]);
        assert!(o.status.success(), "group gpuarch: {}", text(&o).1);
        let o = node.ctl(None, &["reload"]);
        assert!(o.status.success(), "root: {}", text(&o).1);
    }
}

#[test]
fn a_topology_change_emits_one_signal_and_rewrites_the_snapshot() {
    require!();
    let mut node = Node::new("2080ti-3090", Policy::Shipped);
    node.start(&[]);
    let before = node.snapshot();
    block_on(async {
        let conn = node.conn().await;
        let inv = InventoryProxy::new(&conn).await.unwrap();
        let daemon = DaemonProxy::new(&conn).await.unwrap();
        let mut signals = inv.receive_devices_changed().await.unwrap();
        let mut caps_changes = inv.receive_compute_capabilities_changed().await;

        // Nothing changed: no signal, no rewrite.
        daemon.reload().await.unwrap();
        let quiet = tokio::time::timeout(Duration::from_millis(400), signals.next()).await;
        assert!(quiet.is_err(), "DevicesChanged without a change");
        assert_eq!(node.snapshot(), before);

        // The 2080 Ti is swapped for a 4090.
        node.rewrite_topology(|s| {
            s.devices[0].name = "NVIDIA GeForce RTX 4090".into();
            s.devices[0].compute_capability = gpuarch_core::arch::ComputeCapability::new(8, 9);
            s.devices[0].uuid = "GPU-44444444-0000-0000-0000-000000000000".into();
        });
        daemon.reload().await.unwrap();
        tokio::time::timeout(Duration::from_secs(2), signals.next())
            .await
            .expect("DevicesChanged after the change")
            .unwrap();
        let more = tokio::time::timeout(Duration::from_millis(400), signals.next()).await;
        assert!(more.is_err(), "more than one DevicesChanged for one change");
        // PropertiesChanged carried the new capabilities.
        let mut last = None;
        while let Ok(Some(c)) =
            tokio::time::timeout(Duration::from_millis(200), caps_changes.next()).await
        {
            last = Some(c.get().await.unwrap());
        }
        assert_eq!(last.unwrap(), ["8.9", "8.6"]);
        assert_eq!(
            inv.match_devices("feature=fp8").await.unwrap(),
            ["GPU-44444444-0000-0000-0000-000000000000"]
        );
    });
    let after = node.snapshot();
    assert_eq!(after.devices[0].name, "NVIDIA GeForce RTX 4090");
    assert!(!after.stale);
    // The directory holds the snapshot and nothing half-written.
    let names: Vec<_> = std::fs::read_dir(node.path("run"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["inventory.json"]);
}

#[test]
fn an_nvml_failure_serves_the_last_inventory_marked_stale() {
    require!();
    let mut node = Node::new("2080ti-3090", Policy::Shipped);
    node.start(&[]);
    let good = node.snapshot();
    // The driver goes away: the fake's topology is gone, so nvmlInit fails.
    std::fs::rename(node.path("topology.json"), node.path("topology.away")).unwrap();
    block_on(async {
        let conn = node.conn().await;
        let inv = InventoryProxy::new(&conn).await.unwrap();
        let daemon = DaemonProxy::new(&conn).await.unwrap();
        let (name, msg) = dbus_error(daemon.reload().await.unwrap_err());
        assert_eq!(name, "org.freedesktop.DBus.Error.Failed");
        assert!(msg.contains("NVML"), "{msg}");
        assert!(inv.stale().await.unwrap());
        assert!(inv.last_error().await.unwrap().contains("NVML"));
        assert_eq!(inv.list_devices().await.unwrap().len(), 2);
        assert_eq!(
            inv.match_devices("feature=bf16").await.unwrap(),
            [good.devices[1].uuid.clone()]
        );
    });
    let stale = node.snapshot();
    assert!(stale.stale);
    assert_eq!(stale.devices, good.devices);
    let o = node.ctl(None, &["status"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("STALE") && out.contains("NVML"), "{out}");

    // The driver is back: fresh again, same devices, no DevicesChanged needed.
    std::fs::rename(node.path("topology.away"), node.path("topology.json")).unwrap();
    block_on(async {
        let conn = node.conn().await;
        DaemonProxy::new(&conn)
            .await
            .unwrap()
            .reload()
            .await
            .unwrap();
        assert!(
            !InventoryProxy::new(&conn)
                .await
                .unwrap()
                .stale()
                .await
                .unwrap()
        );
    });
    assert!(!node.snapshot().stale);
    assert!(node.daemon.as_mut().unwrap().try_wait().unwrap().is_none());
}

#[test]
fn an_nvml_failure_at_start_still_starts_and_retries() {
    require!();
    let mut node = Node::new("2080ti-3090", Policy::Shipped);
    std::fs::rename(node.path("topology.json"), node.path("topology.away")).unwrap();
    std::fs::write(
        node.path("config.yaml"),
        node.private_config("daemon: {refresh_interval_s: 1}\n"),
    )
    .unwrap();
    node.start(&[]);
    assert!(!node.path("run/inventory.json").exists());
    let o = node.ctl(None, &["status"]);
    assert!(text(&o).0.contains("inventory: none yet"), "{}", text(&o).0);
    let o = node.ctl(None, &["devices"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).1.contains("no GPU inventory yet"),
        "{}",
        text(&o).1
    );
    // Backoff retries find the driver once it is there.
    std::fs::rename(node.path("topology.away"), node.path("topology.json")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !node.path("run/inventory.json").exists() {
        assert!(Instant::now() < deadline, "no retry:\n{}", node.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(node.snapshot().devices.len(), 2);
}

#[test]
fn sd_notify_ready_follows_the_bus_name_and_sigterm_stops_cleanly() {
    require!();
    let mut node = Node::new("8xh100", Policy::Shipped);
    let took = node.start(&[("WATCHDOG_USEC", "200000")]);
    // At READY=1 the name is owned and the snapshot is there.
    let owned = node.name_owned();
    assert!(owned, "READY=1 before io.gpuarch1 was owned");
    assert_eq!(node.snapshot().devices.len(), 8);
    let ready = node
        .notes
        .iter()
        .position(|n| n.contains("READY=1"))
        .unwrap();
    assert!(
        node.notes[..ready]
            .iter()
            .any(|n| n.starts_with("STATUS=serving 8 GPU(s)")),
        "{:?}",
        node.notes
    );
    eprintln!("start to READY=1: {took:?}");
    node.wait_note("WATCHDOG=1", Duration::from_secs(2));

    let (status, took) = node.stop();
    assert!(status.success(), "{status}\n{}", node.log());
    assert!(took < Duration::from_secs(2), "SIGTERM took {took:?}");
    node.wait_note("STOPPING=1", Duration::from_secs(1));
    // The snapshot is left whole for the hook.
    assert_eq!(node.snapshot().devices.len(), 8);
    // And the name is free again.
    let owned = node.name_owned();
    assert!(!owned);
}

#[test]
fn config_errors_refuse_a_start_and_leave_a_running_daemon_as_it_was() {
    require!();
    let mut node = Node::new("2080ti-3090", Policy::Shipped);

    // --check-config
    let check = |path: &Path| {
        Command::new(&artifacts().gpuarchd)
            .arg("--check-config")
            .arg(path)
            .output()
            .unwrap()
    };
    let o = check(&node.path("config.yaml"));
    assert!(
        o.status.success() && text(&o).0.contains("valid"),
        "{:?}",
        text(&o)
    );
    std::fs::write(node.path("bad.yaml"), "env:\n  disable: [GPUARCH_FP9]\n").unwrap();
    let o = check(&node.path("bad.yaml"));
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o).1;
    assert!(
        err.contains("bad.yaml") && err.contains("line 2") && err.contains("GPUARCH_FP9"),
        "{err}"
    );

    // A malformed config: the daemon refuses to start, saying where.
    std::fs::write(
        node.path("config.yaml"),
        node.private_config("strict: false\nenv:\n  overide: true\n"),
    )
    .unwrap();
    let o = node.daemon_cmd().output().unwrap();
    assert!(!o.status.success());
    let err = text(&o).1;
    assert!(
        err.contains("config.yaml") && err.contains("line 3") && err.contains("overide"),
        "{err}"
    );

    // A good one: it starts; an edit applies without a restart.
    std::fs::write(
        node.path("config.yaml"),
        node.private_config("strict: false\n"),
    )
    .unwrap();
    node.start(&[]);
    let has_fp8 = |node: &Node| {
        block_on(async {
            let conn = node.conn().await;
            let (env, _) = InventoryProxy::new(&conn)
                .await
                .unwrap()
                .plan(&["1"])
                .await
                .unwrap();
            env.contains_key("GPUARCH_FP8")
        })
    };
    assert!(has_fp8(&node));
    // Written as editors do: a new file renamed over the old.
    std::fs::write(
        node.path("config.new"),
        node.private_config("env:\n  disable: [GPUARCH_FP8]\n"),
    )
    .unwrap();
    std::fs::rename(node.path("config.new"), node.path("config.yaml")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while has_fp8(&node) {
        assert!(
            Instant::now() < deadline,
            "config change not applied:\n{}",
            node.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // A broken edit is logged with file and line; the last good config stays.
    std::fs::write(
        node.path("config.yaml"),
        node.private_config("env:\n  disable: [GPUARCH_FP8]\n  bogus: 1\n"),
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !node.log().contains("bogus") {
        assert!(
            Instant::now() < deadline,
            "bad config not reported:\n{}",
            node.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = node.log();
    assert!(
        log.contains("config.yaml") && log.contains("line 3"),
        "{log}"
    );
    assert!(log.contains("the previous config stays in force"), "{log}");
    assert!(!has_fp8(&node), "the old config must stay in force");
    // Reload says so too, and the daemon keeps serving.
    let o = node.ctl(None, &["reload"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).1.contains("line 3"), "{}", text(&o).1);
    assert!(node.daemon.as_mut().unwrap().try_wait().unwrap().is_none());
}

#[test]
fn gpuarchctl_talks_to_the_daemon_and_says_when_it_is_down() {
    require!();
    let mut node = Node::new("2080ti-3090", Policy::Shipped);
    node.start(&[]);
    let o = node.ctl(None, &["status"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("gpuarchd 0.1.0: running"), "{out}");
    assert!(out.contains("inventory: 2 GPU(s) (7.5, 8.6)"), "{out}");

    let o = node.ctl(None, &["devices"]);
    let (out, _) = text(&o);
    assert!(
        out.contains("NVIDIA GeForce RTX 3090") && out.contains("from gpuarchd"),
        "{out}"
    );

    let o = node.ctl(None, &["match", "arch>=8.0,feature=bf16"]);
    let uuid = node.snapshot().devices[1].uuid.clone();
    assert_eq!(text(&o).0.trim(), uuid);
    let o = node.ctl(None, &["match", "arch>=9.0"]);
    assert_eq!(o.status.code(), Some(1), "no GPU matches: exit 1");
    let o = node.ctl(None, &["match", "feature=bf17"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).1.contains("feature=bf17"), "{}", text(&o).1);

    let o = node.ctl(None, &["plan", "--devices", "0,1", "--json"]);
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["env"]["TORCH_CUDA_ARCH_LIST"], "7.5;8.6");
    let o = node.ctl(None, &["plan", "--devices", "5"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).1.contains("no GPU with index 5"), "{}", text(&o).1);

    // --offline gives the same answers from the snapshot.
    let snap = node.path("run/inventory.json");
    let snap = snap.to_str().unwrap();
    let o = node.ctl(
        None,
        &["--inventory", snap, "match", "arch>=8.0,feature=bf16"],
    );
    assert_eq!(text(&o).0.trim(), uuid);

    // Daemon down: one line, and the way out.
    node.stop();
    for cmd in [
        &["status"][..],
        &["devices"],
        &["match", "feature=bf16"],
        &["reload"],
    ] {
        let o = node.ctl(None, cmd);
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(2), "{cmd:?}");
        assert!(out.is_empty(), "{out}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains("gpuarchd is not running") && err.contains("--offline"),
            "{err}"
        );
    }
    let o = node.ctl(None, &["--offline", "--inventory", snap, "devices"]);
    assert!(o.status.success());
}

#[test]
fn a_hung_nvml_costs_the_budget_not_the_daemon() {
    require!();
    let mut node = Node::new("2080ti-3090", Policy::Shipped);
    std::fs::write(
        node.path("config.yaml"),
        node.private_config("daemon: {nvml_timeout_ms: 200, refresh_interval_s: 1}\n"),
    )
    .unwrap();
    // Every NVML read wedges for 3 s in nvmlDeviceGetCount.
    let took = node.start(&[("FAKE_NVML_SLEEP", "nvmlDeviceGetCount_v2=3000")]);
    assert!(took < Duration::from_secs(2), "READY=1 after {took:?}");
    let t0 = Instant::now();
    let o = node.ctl(None, &["status"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "status waited on NVML"
    );
    assert!(out.contains("NVML did not answer within 200 ms"), "{out}");
    // A Reload while that read is still stuck answers at once, saying so.
    let t0 = Instant::now();
    let o = node.ctl(None, &["reload"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(t0.elapsed() < Duration::from_secs(1));
    assert!(text(&o).1.contains("NVML"), "{}", text(&o).1);
    // SIGTERM does not wait for the stuck thread.
    let (status, took) = node.stop();
    assert!(status.success(), "{status}\n{}", node.log());
    assert!(took < Duration::from_secs(1), "stop took {took:?}");
}

#[test]
fn a_restarted_bus_gets_the_same_gpuarchd_back_on_its_name() {
    require!();
    let mut node = Node::new("2080ti-3090", Policy::Shipped);
    node.start(&[]);
    // A finished job, kept on the bus for late readers (no packages: it
    // finishes at once).
    let job = block_on(async { empty_prewarm(&node.conn().await).await });
    for round in 1..=2 {
        node.kill_bus();
        // Away from the bus, gpuarchd lives on and the hook's snapshot
        // stays whole.
        std::thread::sleep(Duration::from_millis(500));
        let alive = node.daemon.as_mut().unwrap().try_wait().unwrap();
        assert!(
            alive.is_none(),
            "gpuarchd exited: {alive:?}\n{}",
            node.log()
        );
        assert_eq!(node.snapshot().devices.len(), 2);
        let o = node.ctl(Some(&[]), &["devices"]);
        assert_eq!(o.status.code(), Some(2), "{}", all_text(&o));

        node.restart_bus();
        let t0 = Instant::now();
        let o = loop {
            let o = node.ctl(Some(&[]), &["devices"]);
            if o.status.success() {
                break o;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "round {round}: not back on the bus within 5 s: {}\n{}",
                all_text(&o),
                node.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        eprintln!(
            "round {round}: answering {:?} after the bus came back",
            t0.elapsed()
        );
        assert!(text(&o).0.contains("8.6"), "{}", all_text(&o));
        // gpuarchd answers as soon as it has its name back, and then
        // serves its job objects again before it says it is back: the next
        // round's outage is a second one only once this one has ended.
        while node
            .log()
            .matches("back on the system bus as io.gpuarch1")
            .count()
            < round
        {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "round {round}: gpuarchd never said it was back\n{}",
                node.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let log = node.log();
    assert_eq!(
        log.matches("lost the connection to the system bus; reconnecting")
            .count(),
        2,
        "{log}"
    );
    assert_eq!(
        log.matches("back on the system bus as io.gpuarch1").count(),
        2,
        "{log}"
    );
    node.wait_note("STATUS=serving", Duration::from_secs(1));
    // The job object is served on the new connection too.
    let state = block_on(async {
        let conn = node.conn().await;
        let p = JobProxy::builder(&conn)
            .path(job.clone())
            .build()
            .await
            .unwrap();
        p.state().await
    });
    assert_eq!(state.ok(), Some(JobState::Done), "{job}");
    let (status, _) = node.stop();
    assert!(status.success(), "{status:?}");
}

fn all_text(o: &Output) -> String {
    let (out, err) = text(o);
    format!("{out}{err}")
}

/// gpuarchctl prewarm, kernels, verify, gc and inspect against gpuarchd
/// building the sample packages with real NVRTC; the privileged ones are
/// refused to nobody by the shipped bus policy.
#[test]
fn prewarm_verify_and_gc_through_gpuarchctl() {
    require!();
    let Some(cuda) = gpuarch_tests::cuda_dir() else {
        return;
    };
    let mut node = Node::with_kernels(&cuda, "  prewarm: false\n");
    node.start(&[]);

    let o = node.ctl(Some(&[]), &["prewarm", "saxpy", "--arch", "8.6"]);
    assert_eq!(o.status.code(), Some(2), "{}", all_text(&o));
    assert!(
        all_text(&o).contains("permission denied by the bus policy"),
        "{}",
        all_text(&o)
    );

    let o = node.ctl(None, &["prewarm", "nosuch"]);
    assert_eq!(o.status.code(), Some(2), "{}", all_text(&o));
    assert!(
        all_text(&o).contains("no kernel package named \"nosuch\""),
        "{}",
        all_text(&o)
    );

    let o = node.ctl(
        None,
        &["prewarm", "saxpy", "rmsnorm", "--arch", "7.5,sm_86"],
    );
    let out = all_text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    for line in [
        "saxpy sm_75: built fp32",
        "saxpy sm_86: built fp32",
        "rmsnorm sm_75: built fp16",
        "rmsnorm sm_86: built bf16",
        "done: 4 of 4 served",
    ] {
        assert!(out.contains(line), "{line:?} not in {out}");
    }
    let o = node.ctl(None, &["prewarm", "saxpy", "--arch", "8.6"]);
    assert!(
        all_text(&o).contains("saxpy sm_86: cached fp32"),
        "{}",
        all_text(&o)
    );

    let o = node.ctl(None, &["--json", "kernels"]);
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let list = doc["kernels"].as_array().unwrap();
    assert_eq!(list.len(), 4, "{doc}");
    assert!(
        list.iter()
            .all(|k| k["pinned"] == true && k["in_use"] == false)
    );
    let sm75 = list
        .iter()
        .find(|k| k["package"] == "saxpy" && k["arch"] == "sm_75")
        .unwrap();
    let cubin = Path::new(sm75["path"].as_str().unwrap()).join("saxpy.cubin");

    // inspect judges the stored cubin from its ELF header.
    let o = node.ctl(None, &["inspect", cubin.to_str().unwrap(), "--cap", "8.6"]);
    assert_eq!(o.status.code(), Some(1), "{}", all_text(&o));
    assert!(
        all_text(&o).contains("sm_75 SASS (cubin): saxpy"),
        "{}",
        all_text(&o)
    );
    assert!(
        all_text(&o).contains("capability 8.6: will not run"),
        "{}",
        all_text(&o)
    );
    let o = node.ctl(
        None,
        &[
            "--offline",
            "--inventory",
            node.path("run/inventory.json").to_str().unwrap(),
            "inspect",
            cubin.to_str().unwrap(),
        ],
    );
    assert!(
        all_text(&o).contains("GPU 0 NVIDIA GeForce RTX 2080 Ti (7.5): runs from SASS sm_75"),
        "{}",
        all_text(&o)
    );

    // A flipped byte: verify finds it, quarantines it, and it is rebuilt.
    assert_eq!(node.ctl(Some(&[]), &["verify"]).status.code(), Some(2));
    let mut data = std::fs::read(&cubin).unwrap();
    data[100] ^= 0xff;
    std::fs::write(&cubin, &data).unwrap();
    let o = node.ctl(None, &["verify"]);
    if o.status.code() == Some(1) {
        assert!(
            all_text(&o).contains("4 builds checked, 1 corrupt"),
            "{}",
            all_text(&o)
        );
        assert!(
            all_text(&o).contains("saxpy.cubin: sha256"),
            "{}",
            all_text(&o)
        );
    } else {
        // gpuarchd re-publishes on any event of its package and spool
        // watchers, checking every entry it serves: that check may have
        // quarantined the entry before Verify came (seen once in CI, "3
        // builds checked, 0 corrupt"). Then the quarantine says why.
        assert_eq!(o.status.code(), Some(0), "{}", all_text(&o));
        let reasons: Vec<String> = std::fs::read_dir(node.path("cache/quarantine"))
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path().join("reason.txt")).ok())
            .collect();
        assert!(
            reasons.iter().any(|r| r.contains("saxpy.cubin: sha256")),
            "verify said {} and the quarantine {reasons:?}",
            all_text(&o)
        );
        // Publishing does not rebuild what it quarantines; asking does.
        let o = node.ctl(None, &["prewarm", "saxpy", "--arch", "7.5"]);
        assert_eq!(o.status.code(), Some(0), "{}", all_text(&o));
    }
    let t0 = Instant::now();
    loop {
        let o = node.ctl(None, &["verify"]);
        if o.status.success() && all_text(&o).contains("4 builds checked, 0 corrupt") {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "not rebuilt: {}",
            all_text(&o)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        std::fs::read_dir(node.path("cache/quarantine"))
            .unwrap()
            .count(),
        1
    );

    let o = node.ctl(None, &["gc"]);
    assert!(all_text(&o).contains("freed 0 B"), "{}", all_text(&o));
    assert_eq!(node.ctl(Some(&[]), &["gc"]).status.code(), Some(2));

    // A store that cannot be read is an error, not an empty cache: a shard
    // that is a file breaks the scan.
    let shard = node.path("cache/objects/zz");
    std::fs::write(&shard, b"").unwrap();
    for args in [&["kernels"][..], &["verify"], &["--json", "kernels"]] {
        let o = node.ctl(None, args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", all_text(&o));
        assert!(
            all_text(&o).contains("reading the kernel cache: Not a directory"),
            "{args:?}: {}",
            all_text(&o)
        );
        assert!(o.stdout.is_empty(), "{args:?}: {}", all_text(&o));
    }
    std::fs::remove_file(&shard).unwrap();
    let o = node.ctl(None, &["kernels"]);
    assert!(all_text(&o).contains("4 builds"), "{}", all_text(&o));
    // The compiler the builds came from, as gpuarchd loaded it.
    assert!(
        all_text(&o).contains(&format!("compiler: NVRTC 12.9 ({}", cuda.display())),
        "{}",
        all_text(&o)
    );

    // The cache's commands are gpuarchd's: --offline is refused, not
    // quietly sent to the daemon.
    for cmd in ["kernels", "verify", "gc", "prewarm"] {
        let o = node.ctl(None, &["--offline", cmd]);
        assert_eq!(o.status.code(), Some(2), "{cmd}: {}", all_text(&o));
        assert!(
            all_text(&o).contains("the kernel cache is gpuarchd's"),
            "{cmd}: {}",
            all_text(&o)
        );
    }
    node.stop();
}

/// A host root for `gpuarchctl doctor --root`: the config, the cache, and
/// every engine installed and wired with the shipped snippets.
fn doctor_root(dir: &Path) {
    let w = |rel: &str, data: &[u8]| {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
    };
    let shipped = |rel: &str| std::fs::read(workspace_root().join(rel)).unwrap();
    w(
        "etc/gpuarch/config.yaml",
        b"kernels:\n  cache_dir: /var/cache/gpuarch\n",
    );
    std::fs::create_dir_all(dir.join("var/cache/gpuarch")).unwrap();
    for bin in ["podman", "dockerd", "containerd", "crio", "gpuarch-hook"] {
        w(&format!("usr/bin/{bin}"), b"");
    }
    w(
        "usr/share/containers/oci/hooks.d/gpuarch-hook.json",
        &shipped("packaging/oci-hooks.d/gpuarch-hook.json"),
    );
    w(
        "usr/share/gpuarch/oci-hooks.d/gpuarch-create-container.json",
        &shipped("packaging/oci-hooks.d/gpuarch-create-container.json"),
    );
    w(
        "etc/docker/daemon.json",
        &shipped("packaging/docker/daemon.json"),
    );
    // Debian's containerd config, importing conf.d, and the drop-in
    // gpuarchctl writes from it.
    let debian = shipped("tests/fixtures/containerd/debian-1.6.toml");
    w(
        "etc/containerd/config.toml",
        &[
            &b"imports = [\"/etc/containerd/conf.d/*.toml\"]\n"[..],
            &debian,
        ]
        .concat(),
    );
    write_dropin(dir);
    w(
        "etc/crio/crio.conf.d/50-gpuarch.conf",
        &shipped("packaging/crio/50-gpuarch.conf"),
    );
}

/// `gpuarchctl engine containerd --write` on the root's own config, as an
/// admin runs it; it must succeed.
fn write_dropin(root: &Path) {
    let etc = root.join("etc/containerd");
    let o = Command::new(&artifacts().gpuarchctl)
        .args(["engine", "containerd", "--root"])
        .arg(root)
        .arg("--config")
        .arg(etc.join("config.toml"))
        .arg("--write")
        .arg(etc.join("conf.d/gpuarch.toml"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
}

fn doctor(node: &Node, root: &Path, extra: &[&str]) -> (i32, String) {
    let o = Command::new(&artifacts().gpuarchctl)
        .arg("doctor")
        .arg("--root")
        .arg(root)
        .args(extra)
        .env("DBUS_SYSTEM_BUS_ADDRESS", &node.address)
        .env("FAKE_NVML_TOPOLOGY", node.path("topology.json"))
        .env_remove("GPUARCH_CONFIG")
        .env_remove("GPUARCH_INVENTORY")
        .env_remove("GPUARCH_NVML_LIB")
        .output()
        .unwrap();
    let (out, err) = text(&o);
    (o.status.code().unwrap_or(-1), format!("{out}{err}"))
}

/// [`doctor`] with the fake NVML gpuarchd uses and `inventory` as the
/// snapshot.
fn doctor_on(node: &Node, root: &Path, inventory: &Path) -> (i32, String) {
    let fake = artifacts().fake_nvml.clone();
    let args = [
        "--nvml-lib",
        fake.to_str().unwrap(),
        "--inventory",
        inventory.to_str().unwrap(),
    ];
    doctor(node, root, &args)
}

/// A wired host passes every check; each way of breaking it is named, with
/// the line that fixes it, and makes the exit status 1.
#[test]
fn doctor_checks_the_daemon_nvml_snapshot_cache_and_each_engine() {
    require!();
    let mut node = Node::new("2080ti-3090", Policy::Shipped);
    node.start(&[]);
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    doctor_root(root);
    let snapshot = node.path("run/inventory.json");
    let (code, out) = doctor_on(&node, root, &snapshot);
    assert_eq!(code, 0, "{out}");
    for line in [
        "ok    config",
        "ok    gpuarchd     0.1.0 running on the system bus; GPUs: 7.5, 8.6",
        "ok    NVML",
        "2 GPU(s), driver 580.95.05",
        "ok    snapshot",
        "ok    kernel cache",
        "ok    podman       wired: precreate hook",
        "ok    docker       wired: runtime \"gpuarch\"",
        "ok    containerd   CRI loads; runtime handler gpuarch runs gpuarch-runtime",
        "ok    cri-o        wired: [crio.runtime.runtimes.gpuarch]",
        "ok    cri-o hooks",
        "no problems found",
    ] {
        assert!(out.contains(line), "missing {line:?} in:\n{out}");
    }
    // Docker without NVIDIA's hook: --gpus cannot work, the rest does.
    assert!(
        out.contains("WARN  docker gpus  docker run --gpus and compose GPU reservations fail")
            && out.contains("fix: install NVIDIA's container toolkit"),
        "{out}"
    );
    std::fs::write(root.join("usr/bin/nvidia-container-runtime-hook"), b"").unwrap();
    let (code, out) = doctor_on(&node, root, &snapshot);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("ok    docker gpus  --gpus and compose GPU reservations work")
            && out.contains("no problems found\n"),
        "{out}"
    );

    // Break each part.
    std::fs::write(root.join("etc/docker/daemon.json"), b"{}").unwrap();
    std::fs::write(
        root.join("etc/containerd/config.toml"),
        b"version = 2\n[x\n",
    )
    .unwrap();
    std::fs::remove_file(root.join("etc/crio/crio.conf.d/50-gpuarch.conf")).unwrap();
    // Without 50-gpuarch.conf, CRI-O reads its default hooks_dir, where
    // podman's precreate hook is.
    let mut old = node.snapshot();
    old.generated_at = "2020-01-01T00:00:00Z".into();
    let old_path = root.join("old.json");
    std::fs::write(&old_path, old.to_json_pretty()).unwrap();
    node.stop();
    let broken = [
        "--nvml-lib",
        "/nonexistent/libnvidia-ml.so.1",
        "--inventory",
        old_path.to_str().unwrap(),
    ];
    let (code, out) = doctor(&node, root, &broken);
    assert_eq!(code, 1, "{out}");
    for line in [
        "FAIL  gpuarchd     not running (nothing owns io.gpuarch1 on the system bus)",
        "fix: systemctl enable --now gpuarchd",
        "FAIL  NVML         cannot load the NVML library '/nonexistent/libnvidia-ml.so.1'",
        "fix: install the NVIDIA driver",
        // A snapshot years old with gpuarchd down: its age is when the GPUs
        // last changed, not a failure; gpuarchd's own check fails.
        "ok    snapshot",
        "unchanged for",
        "gpuarchd does not answer, so whether it is current is not known",
        "FAIL  docker",
        "has no runtime running gpuarch-runtime",
        "fix: add \"runtimes\": {\"gpuarch\": {\"path\": \"/usr/bin/gpuarch-runtime\"}} to /etc/docker/daemon.json",
        "FAIL  containerd",
        "not TOML",
        "FAIL  cri-o        no runtime handler runs gpuarch-runtime",
        "fix: cp /usr/share/doc/gpuarch/examples/crio/50-gpuarch.conf /etc/crio/crio.conf.d/",
        "FAIL  cri-o hooks",
        "holds podman's precreate hook",
        "ok    podman       wired: precreate hook",
        "6 problem(s)",
    ] {
        assert!(out.contains(line), "missing {line:?} in:\n{out}");
    }

    // --json: the same verdicts, for scripts.
    let (code, out) = doctor(&node, root, &[&broken[..], &["--json"]].concat());
    assert_eq!(code, 1);
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(doc["ok"], false);
    let failed: Vec<&str> = doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] == "fail")
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        failed,
        [
            "gpuarchd",
            "NVML",
            "docker",
            "containerd",
            "cri-o",
            "cri-o hooks"
        ]
    );
}

/// A host where NVRTC cannot be found (none on the library path, in the
/// default roots or in kernels.cuda_dirs): `gpuarchctl kernels` and doctor
/// say that no NVRTC build is possible and why, as gpuarchd loads it;
/// doctor fails only where there is an NVRTC package to build.
#[test]
fn doctor_and_kernels_name_a_missing_nvrtc() {
    require!();
    let found = Command::new("sh")
        .args(["-c", "ldconfig -p | grep -q libnvrtc || ls /usr/local/cuda*/lib64/libnvrtc.so* /usr/lib/x86_64-linux-gnu/libnvrtc.so* >/dev/null 2>&1"])
        .status()
        .unwrap()
        .success();
    if found {
        // This host has an NVRTC gpuarchd would load: nothing is missing.
        gpuarch_tests::skip("an NVRTC is installed on this host, so none is missing");
        return;
    }
    let mut node = Node::new("2080ti-3090", Policy::Shipped);
    node.start(&[]);
    let o = node.ctl(None, &["kernels"]);
    let out = all_text(&o);
    assert!(
        out.contains("compiler: none; no NVRTC builds possible: NVRTC (libnvrtc.so.13 or libnvrtc.so.12) not found"),
        "{out}"
    );
    let o = node.ctl(None, &["--json", "kernels"]);
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        doc["compiler"].as_str().unwrap().starts_with("none: NVRTC"),
        "{doc}"
    );

    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    doctor_root(root);
    let snapshot = node.path("run/inventory.json");
    // No package to build: nothing to fail.
    let (code, out) = doctor_on(&node, root, &snapshot);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("-     compiler     no NVRTC package to build; gpuarchd: none: NVRTC"),
        "{out}"
    );
    // The sample packages installed: no build of them is possible.
    let pkgs = root.join("usr/share/gpuarch/kernels.d");
    std::fs::create_dir_all(&pkgs).unwrap();
    let o = Command::new("cp")
        .arg("-a")
        .arg(workspace_root().join("kernels/packages/saxpy"))
        .arg(&pkgs)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    // A warning, not a failure: containers still get their Plan.
    let (code, out) = doctor_on(&node, root, &snapshot);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("WARN  compiler     no builds possible for saxpy (1 NVRTC package(s)): NVRTC (libnvrtc.so.13 or libnvrtc.so.12) not found"),
        "{out}"
    );
    assert!(out.contains("fix: install NVRTC"), "{out}");
    // Counted apart from the problems (Docker's --gpus warns here too).
    assert!(out.contains("no problems found; 2 warning(s)"), "{out}");
}

/// gpuarchd rewrites the snapshot only when the GPUs change: on a healthy
/// node well past three refresh intervals, and with a snapshot years old,
/// doctor's snapshot check passes, judged by gpuarchd's last successful
/// NVML read. When those reads stop, it fails.
#[test]
fn doctor_judges_the_snapshot_by_the_daemons_last_read() {
    require!();
    let mut node = Node::new("2080ti-3090", Policy::Shipped);
    std::fs::write(
        node.path("config.yaml"),
        node.private_config("daemon: {refresh_interval_s: 1, nvml_timeout_ms: 200}\n"),
    )
    .unwrap();
    node.start(&[]);
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    doctor_root(root);
    std::fs::write(
        root.join("etc/gpuarch/config.yaml"),
        "kernels:\n  cache_dir: /var/cache/gpuarch\ndaemon:\n  refresh_interval_s: 1\n",
    )
    .unwrap();
    let snapshot = node.path("run/inventory.json");
    let written = node.snapshot().generated_at;
    std::thread::sleep(Duration::from_secs(4));
    let snap = node.snapshot();
    assert_eq!(snap.generated_at, written, "the snapshot was rewritten");
    let (_, out) = doctor_on(&node, root, &snapshot);
    let line = out
        .lines()
        .find(|l| l.contains(" snapshot "))
        .unwrap_or_default();
    assert!(line.starts_with("ok    snapshot"), "{out}");
    assert!(line.contains("gpuarchd read NVML"), "{line}");
    // Years unchanged, gpuarchd reading: still fine.
    let mut old = snap.clone();
    old.generated_at = "2020-01-01T00:00:00Z".into();
    let old_path = root.join("old.json");
    std::fs::write(&old_path, old.to_json_pretty()).unwrap();
    let (_, out) = doctor_on(&node, root, &old_path);
    assert!(out.contains("ok    snapshot"), "{out}");
    // NVML as gpuarchd loads it: the fake library from its own environment,
    // which doctor's lacks (there libnvidia-ml.so.1 is not to be found).
    let (_, out) = doctor(&node, root, &["--inventory", snapshot.to_str().unwrap()]);
    let fake = artifacts().fake_nvml.display().to_string();
    assert!(
        out.contains(&format!(
            "ok    NVML         gpuarchd loads {fake}: 2 GPU(s), driver 580.95.05; it last answered"
        )),
        "{out}"
    );

    // Its NVML reads stop succeeding: after three intervals, a FAIL.
    std::fs::rename(node.path("topology.json"), node.path("topology.away")).unwrap();
    std::thread::sleep(Duration::from_secs(4));
    let (code, out) = doctor_on(&node, root, &snapshot);
    assert_eq!(code, 1, "{out}");
    let line = out
        .lines()
        .find(|l| l.contains(" snapshot "))
        .unwrap_or_default();
    assert!(line.starts_with("FAIL  snapshot"), "{out}");
    assert!(
        line.contains("marked stale: gpuarchd's last NVML read failed"),
        "{out}"
    );
    let (_, out) = doctor(&node, root, &["--inventory", snapshot.to_str().unwrap()]);
    assert!(
        out.contains(&format!(
            "FAIL  NVML         gpuarchd's NVML ({fake}) fails: "
        )) && out.contains("Environment=GPUARCH_NVML_LIB="),
        "{out}"
    );
}

/// containerd 1.x replaces the admin's whole CRI section with an import's:
/// doctor names a drop-in that leaves CRI without runc (the old shipped
/// snippet), passes the one `gpuarchctl engine containerd` writes, and names
/// that one once config.toml's CRI section has changed under it.
#[test]
fn doctor_names_a_containerd_config_where_cri_would_not_load() {
    require!();
    let node = Node::new("2080ti-3090", Policy::Shipped);
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let etc = root.join("etc/containerd");
    std::fs::create_dir_all(etc.join("conf.d")).unwrap();
    std::fs::create_dir_all(root.join("usr/bin")).unwrap();
    std::fs::write(root.join("usr/bin/containerd"), b"").unwrap();
    let debian =
        std::fs::read_to_string(workspace_root().join("tests/fixtures/containerd/debian-1.6.toml"))
            .unwrap();
    let main = etc.join("config.toml");
    std::fs::write(
        &main,
        format!("imports = [\"/etc/containerd/conf.d/*.toml\"]\n{debian}"),
    )
    .unwrap();
    let containerd_line = |out: &str| {
        out.lines()
            .skip_while(|l| !l.contains(" containerd "))
            .take(2)
            .collect::<Vec<_>>()
            .join("\n")
    };
    std::fs::write(
        etc.join("conf.d/gpuarch.toml"),
        "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.gpuarch]\n  runtime_type = \"io.containerd.runc.v2\"\n  [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.gpuarch.options]\n    BinaryName = \"/usr/bin/gpuarch-runtime\"\n",
    )
    .unwrap();
    let (_, out) = doctor(&node, root, &[]);
    let line = containerd_line(&out);
    assert!(
        line.contains("FAIL  containerd   CRI will not load: default_runtime_name = \"runc\"")
            && line.contains("fix: gpuarchctl engine containerd --write"),
        "{out}"
    );

    write_dropin(root);
    let (_, out) = doctor(&node, root, &[]);
    assert!(
        containerd_line(&out)
            .contains("ok    containerd   CRI loads; runtime handler gpuarch runs gpuarch-runtime"),
        "{out}"
    );

    std::fs::write(
        &main,
        format!(
            "imports = [\"/etc/containerd/conf.d/*.toml\"]\n{}",
            debian.replace("/usr/lib/cni", "/opt/cni/bin")
        ),
    )
    .unwrap();
    let (_, out) = doctor(&node, root, &[]);
    assert!(
        containerd_line(&out).contains("holds an older copy of"),
        "{out}"
    );

    // Debian's own config imports nothing: a drop-in beside it is never
    // read. doctor says so; --write adds the entry, and doctor then passes.
    std::fs::write(&main, &debian).unwrap();
    let (_, out) = doctor(&node, root, &[]);
    let line = containerd_line(&out);
    assert!(
        line.contains("does not import")
            && line.contains("so containerd never reads gpuarch's handler")
            && line
                .contains("fix: gpuarchctl engine containerd --write (it adds the imports entry"),
        "{out}"
    );
    write_dropin(root);
    let edited = std::fs::read_to_string(&main).unwrap();
    assert!(
        edited.contains("imports = [\"/etc/containerd/conf.d/gpuarch*.toml\"]"),
        "{edited}"
    );
    assert_eq!(
        std::fs::read_to_string(etc.join("config.toml.before-gpuarch")).unwrap(),
        debian
    );
    let (_, out) = doctor(&node, root, &[]);
    assert!(
        containerd_line(&out)
            .contains("ok    containerd   CRI loads; runtime handler gpuarch runs gpuarch-runtime"),
        "{out}"
    );
}

/// The complete entries of the store under `cache`: `objects/xx/<key>`
/// directories that hold a manifest.
fn store_entries(cache: &Path) -> Vec<std::path::PathBuf> {
    let mut v = Vec::new();
    for shard in std::fs::read_dir(cache.join("objects"))
        .into_iter()
        .flatten()
        .flatten()
    {
        for e in std::fs::read_dir(shard.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            v.push(e.path());
        }
    }
    v.sort();
    v
}

/// gpuarchd killed with SIGKILL in the middle of its start-up pre-warm: no
/// partial build is ever in the store, and the restarted daemon finishes the
/// job, with its index (ListKernels) matching the disk and every file
/// verifying.
#[test]
fn a_daemon_killed_during_prewarm_leaves_no_partial_build_and_finishes_on_restart() {
    require!();
    let Some(cuda) = gpuarch_tests::cuda_dir() else {
        return;
    };
    let mut node = Node::with_kernels(&cuda, "  workers: 1\n");
    let cache = node.path("cache");
    node.start(&[]);
    // Kill as soon as the first build is in: the job is under way.
    let deadline = Instant::now() + Duration::from_secs(60);
    while store_entries(&cache).is_empty() {
        assert!(
            Instant::now() < deadline,
            "no build in 60 s:\n{}",
            node.log()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut child = node.daemon.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let at_kill = store_entries(&cache);
    assert!(
        at_kill.len() < 6,
        "the pre-warm had already finished: {at_kill:?}"
    );
    for e in &at_kill {
        assert!(
            e.join("manifest.json").is_file(),
            "{} is in the store without its manifest",
            e.display()
        );
    }

    node.start(&[]);
    let deadline = Instant::now() + Duration::from_secs(120);
    let listed = loop {
        let o = node.ctl(None, &["--json", "kernels"]);
        let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        let n = doc["kernels"].as_array().map_or(0, Vec::len);
        if n == 6 {
            break doc;
        }
        assert!(
            Instant::now() < deadline,
            "{n} of 6 after restart:\n{}",
            node.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut paths: Vec<std::path::PathBuf> = listed["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| std::path::PathBuf::from(k["path"].as_str().unwrap()))
        .collect();
    paths.sort();
    assert_eq!(
        paths,
        store_entries(&cache),
        "the index differs from the disk"
    );
    for e in &at_kill {
        assert!(
            paths.contains(e),
            "{} built before the kill was lost",
            e.display()
        );
    }
    let o = node.ctl(None, &["verify"]);
    assert_eq!(o.status.code(), Some(0), "{}", all_text(&o));
    let leftovers: Vec<_> = std::fs::read_dir(cache.join("tmp"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(leftovers.is_empty(), "temp builds left: {leftovers:?}");
}

/// The cache on a filesystem too small for a build: the build fails with the
/// reason, nothing half-written is stored, the daemon goes on serving, and
/// once there is room the same request builds (a full disk is not recorded
/// as the compiler's refusal).
#[test]
fn a_full_cache_disk_fails_the_build_clearly_and_stores_nothing_corrupt() {
    require!("mount");
    let Some(cuda) = gpuarch_tests::cuda_dir() else {
        return;
    };
    let mut node = Node::with_kernels(&cuda, "  prewarm: false\n");
    let cache = node.path("cache");
    // Two pages: saxpy's cubin, PTX and manifest need three.
    let _unmount = gpuarch_tests::Tmpfs::mount(&cache, "size=8k,mode=0755");
    node.start(&[]);

    let o = node.ctl(None, &["prewarm", "saxpy", "--arch", "8.6"]);
    let out = all_text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("saxpy sm_86"), "{out}");
    assert!(out.contains("No space left on device"), "{out}");
    assert!(
        store_entries(&cache).is_empty(),
        "{:?}",
        store_entries(&cache)
    );
    // Still serving.
    let o = node.ctl(None, &["devices"]);
    assert_eq!(o.status.code(), Some(0), "{}", all_text(&o));
    assert!(all_text(&o).contains("RTX 3090"));

    let st = Command::new("mount")
        .args(["-o", "remount,size=64m"])
        .arg(&cache)
        .status()
        .unwrap();
    assert!(st.success(), "remount");
    let o = node.ctl(None, &["prewarm", "saxpy", "--arch", "8.6"]);
    let out = all_text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("saxpy sm_86: built fp32"), "{out}");
    let o = node.ctl(None, &["verify"]);
    assert_eq!(o.status.code(), Some(0), "{}", all_text(&o));
    node.stop();
}

/// Started without `--snapshot`, gpuarchd writes the snapshot where the
/// config's `daemon.snapshot` says, the place the hook and shim read.
#[test]
fn the_config_names_where_the_snapshot_is_written() {
    require!();
    let node = Node::new("2080ti-3090", Policy::Shipped);
    let snap = node.path("elsewhere/inventory.json");
    std::fs::create_dir_all(snap.parent().unwrap()).unwrap();
    let mut yaml = std::fs::read_to_string(node.path("config.yaml")).unwrap();
    yaml.push_str(&format!("daemon:\n  snapshot: {}\n", snap.display()));
    std::fs::write(node.path("config.yaml"), yaml).unwrap();
    let mut daemon = Command::new(&artifacts().gpuarchd)
        .arg("--nvml-lib")
        .arg(&artifacts().fake_nvml)
        .arg("--config")
        .arg(node.path("config.yaml"))
        .env("DBUS_SYSTEM_BUS_ADDRESS", &node.address)
        .env("FAKE_NVML_TOPOLOGY", node.path("topology.json"))
        .env_remove("NOTIFY_SOCKET")
        .env_remove("GPUARCH_CONFIG")
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !snap.exists() && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = daemon.kill();
    let _ = daemon.wait();
    let s = Snapshot::from_json(&std::fs::read(&snap).unwrap()).unwrap();
    assert_eq!(s.devices.len(), 2);
}

/// A JIT cache as the hook leaves one: `bytes` of "build", `age_s` old.
fn jit_cache(
    dir: &Path,
    scope: &str,
    targets: &str,
    bytes: usize,
    age_s: u64,
) -> std::path::PathBuf {
    let p = dir.join(scope).join(targets);
    std::fs::create_dir_all(p.join("torch_extensions/ext")).unwrap();
    std::fs::write(p.join("torch_extensions/ext/ext.so"), vec![7u8; bytes]).unwrap();
    let label = format!(r#"{{"scope":"image","uid":1000,"gid":1000,"image":"torch:{scope}"}}"#);
    std::fs::write(dir.join(scope).join("scope.json"), label).unwrap();
    let t = std::time::SystemTime::now() - Duration::from_secs(age_s);
    std::fs::File::open(&p).unwrap().set_modified(t).unwrap();
    p
}

/// `gpuarchctl jit ls` and `jit gc`: the caches with their size
/// (never counted through a symlink a container left), whether a container
/// has one mounted (seen from another mount namespace); gc removes the
/// least recently started above the limit, never one mounted or just
/// handed out, and never anything a symlink in a cache points at.
#[test]
fn jit_ls_and_gc_through_gpuarchctl() {
    require!("unshare", "setpriv");
    let mut node = Node::new("2080ti-3090", Policy::Shipped);
    let jit = node.path("jit");
    let config = std::fs::read_to_string(node.path("config.yaml")).unwrap();
    let with_limit = |max: u64| {
        format!(
            "{config}jit_cache:\n  enable: true\n  dir: {}\n  max_bytes: {max}\n",
            jit.display()
        )
    };
    std::fs::write(node.path("config.yaml"), with_limit(1 << 30)).unwrap();
    node.start(&[]);

    let old = jit_cache(&jit, "uid1000-image-aaaa", "sm_75", 2 << 20, 7200);
    let mounted = jit_cache(&jit, "uid1000-image-aaaa", "sm_86", 2 << 20, 10_800);
    let fresh = jit_cache(&jit, "uid1000-image-bbbb", "sm_90", 2 << 20, 5);
    let host = node.path("host");
    std::fs::create_dir_all(&host).unwrap();
    std::fs::write(host.join("precious"), vec![1u8; 8 << 20]).unwrap();
    std::os::unix::fs::symlink(&host, old.join("escape")).unwrap();
    std::os::unix::fs::symlink(host.join("precious"), old.join("big.so")).unwrap();
    // Planting them made it new again; it was last started two hours ago.
    let two_hours = std::time::SystemTime::now() - Duration::from_secs(7200);
    std::fs::File::open(&old)
        .unwrap()
        .set_modified(two_hours)
        .unwrap();
    // A container holding sm_86, in its own mount namespace.
    let ready = node.path("ready");
    let target = node.path("in-container");
    std::fs::create_dir_all(&target).unwrap();
    let mut holder = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "mount --bind {} {} && touch {} && exec sleep 120",
            mounted.display(),
            target.display(),
            ready.display()
        ))
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !ready.exists() {
        assert!(t0.elapsed() < Duration::from_secs(10), "no namespace");
        std::thread::sleep(Duration::from_millis(20));
    }

    let o = node.ctl(None, &["--json", "jit", "ls"]);
    assert!(o.status.success(), "{}", all_text(&o));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let caches = doc["caches"].as_array().unwrap();
    assert_eq!(caches.len(), 3, "{doc}");
    let by = |t: &str| caches.iter().find(|c| c["targets"] == t).unwrap();
    assert_eq!(by("sm_86")["in_use"], true, "{doc}");
    assert_eq!(by("sm_75")["in_use"], false, "{doc}");
    let b75 = by("sm_75")["bytes"].as_u64().unwrap();
    assert!(
        (2 << 20..4 << 20).contains(&b75),
        "counted through a link: {b75}"
    );
    assert_eq!(by("sm_75")["image"], "torch:uid1000-image-aaaa");
    assert_eq!(by("sm_75")["kind"], "image");
    assert_eq!(doc["limit_bytes"], 1u64 << 30);
    // Anyone may look; only root and group gpuarch may collect.
    let o = node.ctl(Some(&[]), &["jit", "ls"]);
    assert!(o.status.success(), "{}", all_text(&o));
    assert!(
        all_text(&o)
            .lines()
            .any(|l| l.contains("sm_86") && l.contains("yes")),
        "{}",
        all_text(&o)
    );
    let o = node.ctl(Some(&[]), &["jit", "gc"]);
    assert_eq!(o.status.code(), Some(2), "{}", all_text(&o));
    assert!(
        all_text(&o).contains("permission denied by the bus policy"),
        "{}",
        all_text(&o)
    );
    // Under the limit: nothing goes.
    let o = node.ctl(None, &["jit", "gc"]);
    assert!(all_text(&o).contains("freed 0 B"), "{}", all_text(&o));

    // Over it: the oldest that may go goes, and only it.
    std::fs::write(node.path("config.yaml"), with_limit(1 << 20)).unwrap();
    assert!(node.ctl(None, &["reload"]).status.success());
    let o = node.ctl(None, &["--json", "jit", "gc"]);
    assert!(o.status.success(), "{}", all_text(&o));
    let freed: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(freed["freed_bytes"].as_u64(), Some(b75), "{}", all_text(&o));
    assert!(!old.exists(), "the oldest unmounted cache is still there");
    assert!(mounted.exists(), "a mounted cache was removed");
    assert!(fresh.exists(), "a cache just handed out was removed");
    assert_eq!(std::fs::read(host.join("precious")).unwrap().len(), 8 << 20);

    // The mount gone, it may go too.
    let _ = holder.kill();
    let _ = holder.wait();
    let o = node.ctl(None, &["jit", "gc"]);
    assert!(o.status.success(), "{}", all_text(&o));
    assert!(!mounted.exists() && fresh.exists());

    let o = node.ctl(None, &["--offline", "jit", "ls"]);
    assert_eq!(o.status.code(), Some(2), "{}", all_text(&o));
    assert!(
        all_text(&o).contains("the JIT caches are gpuarchd's"),
        "{}",
        all_text(&o)
    );
    node.stop();
}

/// The caches belong to the containers' uids (mode 0700, and whatever
/// modes the software inside chose): gpuarchd, with the unit's capability
/// bounding set, sizes and removes them. With none at all (the unit before
/// the JIT caches) it could do neither: the control.
#[test]
fn jit_caches_of_other_uids_are_sized_and_removed_under_the_units_capabilities() {
    require!("setpriv");
    use std::os::unix::fs::PermissionsExt;
    let cache_of_1000 = |jit: &Path| {
        let p = jit_cache(jit, "uid1000-image-cccc", "sm_86", 2 << 20, 0);
        let locked = p.join("torch_extensions/ext");
        for d in [&p, &locked] {
            nix::unistd::chown(d.as_path(), Some(1000.into()), Some(1000.into())).unwrap();
        }
        nix::unistd::chown(&locked.join("ext.so"), Some(1000.into()), None).unwrap();
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o500)).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700)).unwrap();
        let t = std::time::SystemTime::now() - Duration::from_secs(7200);
        std::fs::File::open(&p).unwrap().set_modified(t).unwrap();
        p
    };
    let run = |bounding: String| {
        let mut node = Node::new("2080ti-3090", Policy::Shipped);
        node.bounding_set = Some(bounding);
        let jit = node.path("jit");
        let base = std::fs::read_to_string(node.path("config.yaml")).unwrap();
        let yaml = |max: u64| {
            format!(
                "{base}jit_cache:\n  enable: true\n  dir: {}\n  max_bytes: {max}\n",
                jit.display()
            )
        };
        std::fs::write(node.path("config.yaml"), yaml(1 << 30)).unwrap();
        node.start(&[]);
        let cache = cache_of_1000(&jit);
        let o = node.ctl(None, &["--json", "jit", "ls"]);
        let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let bytes = doc["caches"][0]["bytes"].as_u64().unwrap();
        std::fs::write(node.path("config.yaml"), yaml(1 << 20)).unwrap();
        assert!(node.ctl(None, &["reload"]).status.success());
        let gc = node.ctl(None, &["jit", "gc"]);
        let log = node.log();
        node.stop();
        (bytes, gc, cache.exists(), log)
    };
    let (bytes, gc, left, _) = run(gpuarch_tests::daemon::unit_bounding_set());
    assert!(
        bytes >= 2 << 20,
        "sized {bytes} under the unit's capabilities"
    );
    assert!(gc.status.success(), "{}", all_text(&gc));
    assert!(!left, "not removed under the unit's capabilities");

    // No capability: the cache cannot be read, so it is never found over
    // the limit. gpuarchd says so rather than report it small and quiet.
    let (bytes, gc, left, log) = run("-all".to_owned());
    assert!(bytes < 2 << 20, "sized {bytes} with no capability at all");
    assert!(all_text(&gc).contains("freed 0 B"), "{}", all_text(&gc));
    assert!(left);
    assert!(log.contains("cannot be read (Permission denied"), "{log}");
}

/// `export.nfd`: gpuarchd keeps Node Feature Discovery's feature file with
/// the node's labels, every one valid by Kubernetes' rules, rewrites it only
/// when the GPUs change, removes it when the export is turned off, and
/// `gpuarchctl doctor` tells a current file from a stale one.
#[test]
fn nfd_labels_follow_the_inventory_and_go_when_turned_off() {
    require!();
    use std::collections::BTreeMap;
    use std::os::unix::fs::MetadataExt;
    let mut node = Node::new("2080ti-3090", Policy::Shipped);
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    doctor_root(root);
    let dir = root.join("etc/kubernetes/node-feature-discovery/features.d");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("gpuarch");
    // The doctor root's config names the default path; gpuarchd's names the
    // same file from outside the root.
    let mut root_cfg = std::fs::read_to_string(root.join("etc/gpuarch/config.yaml")).unwrap();
    root_cfg.push_str("export:\n  nfd: true\n");
    std::fs::write(root.join("etc/gpuarch/config.yaml"), root_cfg).unwrap();
    let base = std::fs::read_to_string(node.path("config.yaml")).unwrap();
    let yaml = |on: bool| {
        format!(
            "{base}export:\n  nfd: {on}\n  nfd_file: {}\n",
            file.display()
        )
    };
    std::fs::write(node.path("config.yaml"), yaml(true)).unwrap();
    node.start(&[]);
    let t0 = Instant::now();
    while !file.exists() && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    // Parsed the way NFD's local source does: trimmed lines, `#` comments,
    // `name=value` split at the first `=`.
    let labels = || -> BTreeMap<String, String> {
        std::fs::read_to_string(&file)
            .unwrap()
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| {
                let (k, v) = l.split_once('=').unwrap_or((l, "true"));
                gpuarch_core::nfd::check_label(k, v).unwrap();
                (k.to_owned(), v.to_owned())
            })
            .collect()
    };
    let get = |l: &BTreeMap<String, String>, k: &str| l.get(&format!("gpuarch.io/{k}")).cloned();
    let l = labels();
    assert_eq!(get(&l, "gpu.count").as_deref(), Some("2"));
    assert_eq!(get(&l, "sm_75.count").as_deref(), Some("1"));
    assert_eq!(get(&l, "sm_86.count").as_deref(), Some("1"));
    assert_eq!(get(&l, "arch.mixed").as_deref(), Some("true"));
    assert_eq!(get(&l, "bf16.all").as_deref(), Some("false"));
    assert_eq!(get(&l, "compute-capability.min").as_deref(), Some("7.5"));
    let snapshot = node.path("run/inventory.json");
    let (_, out) = doctor_on(&node, root, &snapshot);
    assert!(out.contains("ok    NFD labels"), "{out}");
    // gpuarchctl labels prints what gpuarchd keeps.
    let o = node.ctl(None, &["labels"]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        std::fs::read_to_string(&file).unwrap()
    );

    // No change: the file is not rewritten.
    let ino = std::fs::metadata(&file).unwrap().ino();
    assert!(node.ctl(None, &["reload"]).status.success());
    assert_eq!(
        std::fs::metadata(&file).unwrap().ino(),
        ino,
        "rewritten without a change"
    );

    // The 2080 Ti is swapped for a second 3090.
    node.rewrite_topology(|s| {
        s.devices[0].name = "NVIDIA GeForce RTX 3090".into();
        s.devices[0].compute_capability = gpuarch_core::arch::ComputeCapability::new(8, 6);
    });
    // Until gpuarchd reads it, the file describes the GPUs that were there.
    std::fs::copy(&file, root.join("before")).unwrap();
    assert!(node.ctl(None, &["reload"]).status.success());
    let l = labels();
    assert_eq!(get(&l, "sm_86.count").as_deref(), Some("2"));
    assert_eq!(get(&l, "sm_75.count"), None);
    assert_eq!(get(&l, "arch.mixed").as_deref(), Some("false"));
    assert_eq!(get(&l, "bf16.all").as_deref(), Some("true"));
    assert_ne!(std::fs::metadata(&file).unwrap().ino(), ino);
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["gpuarch"], "a temporary left beside the file");
    let (_, out) = doctor_on(&node, root, &snapshot);
    assert!(out.contains("ok    NFD labels"), "{out}");
    std::fs::copy(root.join("before"), &file).unwrap();
    let (code, out) = doctor_on(&node, root, &snapshot);
    assert!(
        code == 1
            && out.contains("FAIL  NFD labels")
            && out.contains("does not match the inventory"),
        "{out}"
    );

    // Turned off: the labels go with it.
    std::fs::write(node.path("config.yaml"), yaml(false)).unwrap();
    assert!(node.ctl(None, &["reload"]).status.success());
    assert!(
        !file.exists(),
        "labels left after export.nfd was turned off"
    );

    // On again, with NFD's directory gone: gpuarchd says which, once, and
    // serves on.
    std::fs::remove_dir(&dir).unwrap();
    std::fs::write(node.path("config.yaml"), yaml(true)).unwrap();
    assert!(node.ctl(None, &["reload"]).status.success());
    assert!(node.ctl(None, &["reload"]).status.success());
    let log = node.log();
    let warned = log
        .lines()
        .filter(|l| l.contains("cannot keep the Node Feature Discovery labels"))
        .count();
    assert_eq!(warned, 1, "{log}");
    assert!(log.contains("features.d does not exist"), "{log}");
    let (_, out) = doctor_on(&node, root, &snapshot);
    assert!(out.contains("FAIL  NFD labels"), "{out}");
    assert!(node.name_owned());
    node.stop();
}

/// `kernels.remote` through gpuarchd: one node's daemon pre-warms and
/// pushes to a real registry (docker-registry on 127.0.0.1); a second
/// node's daemon, with its own store, pre-warms the same set and builds
/// nothing: every build is pulled, and says where from.
#[test]
fn a_second_node_prewarms_from_the_registry_with_no_build() {
    require!("docker-registry");
    let Some(cuda) = gpuarch_tests::cuda_dir() else {
        return;
    };
    let mut reg = gpuarch_tests::registry::Registry::start();
    let repo = format!("{}/gpuarch/kernels", reg.host());
    let remote = |push: bool, extra: &str| {
        format!(
            "  prewarm: false\n{extra}  remote:\n    repository: {repo}\n    plain_http: true\n    push: {push}\n    pull_timeout_ms: 2000\n"
        )
    };
    let count = |out: &str, what: &str| out.matches(what).count();
    let ctl = |node: &Node, args: &[&str]| {
        let o = node.ctl(None, args);
        (o.status.code(), all_text(&o))
    };

    // Node A pushes as it builds: 4 builds, 4 artifacts.
    let set = ["saxpy", "rmsnorm", "--arch", "7.5,8.6"];
    let mut a = Node::with_kernels(&cuda, &remote(true, ""));
    a.start(&[]);
    let (code, out) = ctl(&a, &[&["prewarm"][..], &set].concat());
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(count(&out, ": built "), 4, "{out}");
    assert!(count(&a.log(), "pushed ") >= 4, "{}", a.log());
    // rotary for three archs, built without pushing, then pushed by hand.
    a.stop();
    std::fs::write(a.path("config.yaml"), {
        let mut y = std::fs::read_to_string(a.path("config.yaml")).unwrap();
        y = y.replace("    push: true\n", "    push: false\n");
        y
    })
    .unwrap();
    a.start(&[]);
    let (code, out) = ctl(&a, &["prewarm", "rotary", "--arch", "7.5,8.6,9.0"]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(count(&a.log(), "pushed "), 0, "{}", a.log());
    let (code, out) = ctl(&a, &["kernels", "push", "rotary"]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        count(&out, &format!(": pushed to {repo}@sha256:")),
        3,
        "{out}"
    );
    assert!(out.contains("3 of 3 pushed"), "{out}");
    a.stop();

    // Node B fetches one without pinning it, then pre-warms from the
    // registry only: everything pulled or cached, nothing built.
    let mut b = Node::with_kernels(&cuda, &remote(false, ""));
    b.start(&[]);
    let (code, out) = ctl(&b, &["kernels", "pull", "saxpy", "--arch", "7.5"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("saxpy sm_75: pulled "), "{out}");
    let (_, list) = ctl(&b, &["--json", "kernels"]);
    let list: serde_json::Value = serde_json::from_str(&list).unwrap();
    assert_eq!(list["kernels"][0]["pinned"], false, "{list}");
    let (code, out) = ctl(&b, &[&["prewarm", "--from-registry"][..], &set].concat());
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(count(&out, ": built "), 0, "node B built: {out}");
    assert_eq!(count(&out, ": pulled "), 3, "{out}");
    assert_eq!(count(&out, ": cached "), 1, "{out}");
    assert!(out.contains(&format!("from {repo}@sha256:")), "{out}");
    // What the registry lacks is not built by a pull: it fails and says so.
    let (code, out) = ctl(
        &b,
        &["prewarm", "--from-registry", "rotary", "--arch", "8.0"],
    );
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("not in the registry"), "{out}");
    assert_eq!(count(&out, ": built "), 0, "{out}");
    b.stop();

    // Node C pre-warms all nine while the registry goes away: what it
    // pulled before is kept, the rest is built here, and all is served.
    let mut c = Node::with_kernels(&cuda, &remote(false, "  workers: 1\n"));
    c.start(&[]);
    let job = c
        .ctl_cmd(
            None,
            &[
                "prewarm",
                "saxpy",
                "rmsnorm",
                "rotary",
                "--arch",
                "7.5,8.6,9.0",
            ],
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !c.log().contains("pulled ") {
        assert!(t0.elapsed() < Duration::from_secs(30), "{}", c.log());
        std::thread::sleep(Duration::from_millis(2));
    }
    reg.stop();
    let o = job.wait_with_output().unwrap();
    let out = all_text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    let (pulled, built) = (count(&out, ": pulled "), count(&out, ": built "));
    assert!(
        pulled >= 1 && built >= 1,
        "pulled {pulled}, built {built}: {out}"
    );
    assert_eq!(pulled + built, 9, "{out}");
    eprintln!("registry stopped mid pre-warm: {pulled} pulled, {built} built here");
    assert!(c.log().contains("building here"), "{}", c.log());
    c.stop();
}

/// `gpuarch-hook precreate` on `node`'s config and inventory for a
/// container given `visible` (NVIDIA_VISIBLE_DEVICES): the config it
/// returns, and its log (the plan's notes).
fn precreate(node: &Node, visible: &str) -> (serde_json::Value, String) {
    let config = serde_json::json!({"ociVersion": "1.2.0",
        "process": {"args": ["sh"], "env": [format!("NVIDIA_VISIBLE_DEVICES={visible}")]},
        "root": {"path": "rootfs"}});
    let o = gpuarch_tests::output_with_stdin(
        Command::new(&artifacts().gpuarch_hook)
            .arg("precreate")
            .env("GPUARCH_CONFIG", node.path("config.yaml"))
            .env("GPUARCH_INVENTORY", node.path("run/inventory.json"))
            .env("GPUARCH_LOG", "stderr"),
        config.to_string().as_bytes(),
    );
    let (out, log) = text(&o);
    assert!(o.status.success(), "{log}");
    (serde_json::from_str(&out).unwrap(), log)
}

/// The view manifest of `package` a precreate config mounts, if it does.
fn view_manifest(config: &serde_json::Value, package: &str) -> Option<serde_json::Value> {
    let view = config["mounts"]
        .as_array()?
        .iter()
        .find(|m| m["destination"] == "/opt/gpuarch/kernels")?["source"]
        .as_str()?
        .to_owned();
    let text = std::fs::read(Path::new(&view).join(package).join("manifest.json")).ok()?;
    Some(serde_json::from_slice(&text).unwrap())
}

/// What serves each GPU of a view manifest: (arch, file) or the reason.
fn served(view: &serde_json::Value) -> Vec<String> {
    view["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| match g["files"].as_array() {
            Some(f) => format!("{} {}", g["arch"].as_str().unwrap(), f[0].as_str().unwrap()),
            None => g["missing"].as_str().unwrap().to_owned(),
        })
        .collect()
}

#[test]
fn imported_libraries_serve_each_container_by_the_code_they_carry() {
    require!("gcc", "objcopy");
    let Some(cuda) = gpuarch_tests::cuda_dir() else {
        return;
    };
    let nvrtc = gpuarch_kernels::toolchain::Nvrtc::load(std::slice::from_ref(&cuda)).unwrap();
    let src = std::fs::read(workspace_root().join("kernels/packages/saxpy/saxpy.cu")).unwrap();
    let code = |t: &str| {
        let t = gpuarch_core::arch::Target::parse(t).unwrap();
        nvrtc.compile(("saxpy.cu", &src), &[], t, &[]).unwrap().code
    };
    let (sm75, sm86, sm80, sm90) = (code("sm_75"), code("sm_86"), code("sm_80"), code("sm_90"));
    let fatbin = gpuarch_kernels::inspect::write_fatbin;
    let libs = tempfile::tempdir().unwrap();
    // nobody opens them too (and is refused by the bus, not the file).
    std::fs::set_permissions(
        libs.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let lib = |name: &str, entries: &[(u16, u32, &[u8])]| {
        gpuarch_tests::fatlib::shared_library_with(libs.path(), name, &fatbin(entries))
    };
    let both = lib("libsaxpy.so", &[(2, 75, &sm75), (2, 86, &sm86)]);
    let only80 = lib("libsaxpy80.so", &[(2, 80, &sm80)]);
    let only90 = lib("libsaxpy90.so", &[(2, 90, &sm90)]);
    let plain = gpuarch_tests::fatlib::shared_library_with(libs.path(), "libplain.so", &[]);

    let mut node = Node::new("2080ti-3090", Policy::Shipped);
    node.start(&[]);
    let import = |args: &[&str]| {
        let mut a = vec!["kernels", "import"];
        a.extend_from_slice(args);
        let o = node.ctl(None, &a);
        (o.status.code(), all_text(&o))
    };
    let s = |p: &Path| p.to_str().unwrap().to_owned();

    // One library with sm_75 and sm_86 SASS: each GPU gets its own code.
    let (code, out) = import(&["saxpy", &s(&both)]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("libsaxpy.so: carries sm_75, sm_86"), "{out}");
    assert!(out.contains("GPU 0 (7.5): runs from SASS sm_75"), "{out}");
    assert!(out.contains("GPU 1 (8.6): runs from SASS sm_86"), "{out}");
    let (cfg, log) = precreate(&node, "0,1");
    let view = view_manifest(&cfg, "saxpy").unwrap_or_else(|| panic!("not mounted: {log}"));
    assert_eq!(
        served(&view),
        [
            "sm_75 libsaxpy.so/libsaxpy.so",
            "sm_86 libsaxpy.so/libsaxpy.so"
        ]
    );
    // The file in the container is the imported one, byte for byte.
    let source = cfg["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["destination"] == "/opt/gpuarch/kernels")
        .unwrap()["source"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        std::fs::read(Path::new(&source).join("saxpy/libsaxpy.so/libsaxpy.so")).unwrap(),
        std::fs::read(&both).unwrap()
    );
    // Nothing is asked of gpuarchd's builder for an import.
    assert!(
        std::fs::read_dir(node.path("spool")).map_or(true, |mut d| d.next().is_none()),
        "an import was requested as a build"
    );

    // sm_80 only, for the loader: the 3090 runs it, the 2080 Ti does not.
    let (code, out) = import(&["saxpy80", &s(&only80), "--ldconfig"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("GPU 0 (7.5): will not run"), "{out}");
    assert!(out.contains("GPU 1 (8.6): runs from SASS sm_80"), "{out}");
    assert!(!out.contains("warning"), "{out}");
    let (cfg, log) = precreate(&node, "1");
    let view = view_manifest(&cfg, "saxpy80").unwrap_or_else(|| panic!("not mounted: {log}"));
    assert_eq!(served(&view), ["sm_80 libsaxpy80.so/libsaxpy80.so"]);
    assert_eq!(view["libraries"], serde_json::json!(["libsaxpy80.so"]));
    // The loader cache needs the createContainer stage: it is added.
    let hooks = cfg["hooks"]["createContainer"].to_string();
    assert!(hooks.contains("gpuarch-hook"), "{hooks}");
    for visible in ["0", "0,1"] {
        let (cfg, log) = precreate(&node, visible);
        assert!(view_manifest(&cfg, "saxpy80").is_none(), "{visible}: {cfg}");
        assert!(
            log.contains("kernel package saxpy80 not mounted: no imported file runs on all of"),
            "{visible}: {log}"
        );
    }

    // Code for no GPU of this host: accepted, with a warning.
    let (code, out) = import(&["saxpy90", &s(&only90)]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("warning: it runs on none of this host's GPUs"),
        "{out}"
    );
    assert!(node.log().contains("runs on none of this host's GPUs"));

    // A failed import changes nothing: the earlier one is still served.
    let before = std::fs::read(node.path("kernels/saxpy/manifest.json")).unwrap();
    let (code, out) = import(&["saxpy", &s(&plain), &s(&both)]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("saxpy not imported, nothing changed: libplain.so: it carries no GPU code"),
        "{out}"
    );
    assert_eq!(
        std::fs::read(node.path("kernels/saxpy/manifest.json")).unwrap(),
        before
    );
    let (cfg, _) = precreate(&node, "0");
    assert_eq!(
        served(&view_manifest(&cfg, "saxpy").unwrap()),
        ["sm_75 libsaxpy.so/libsaxpy.so"]
    );

    // Without kernels.remote there is nothing to push to or pull from.
    for args in [&["kernels", "push"][..], &["kernels", "pull"]] {
        let o = node.ctl(None, args);
        assert_eq!(o.status.code(), Some(2), "{}", all_text(&o));
        assert!(
            all_text(&o).contains("no registry: kernels.remote is not set"),
            "{}",
            all_text(&o)
        );
    }

    // Only root and group gpuarch import; a file name can't be passed twice.
    let o = node.ctl(Some(&[]), &["kernels", "import", "x", &s(&both)]);
    assert_eq!(o.status.code(), Some(2), "{}", all_text(&o));
    assert!(
        all_text(&o).contains("permission denied by the bus policy"),
        "{}",
        all_text(&o)
    );
    let (code, out) = import(&["x", &s(&both), &s(&both)]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("given twice"), "{out}");

    // Unimport: new containers no longer get it, its file is unpinned and
    // stays in the cache for the LRU; the other imports are untouched.
    let o = node.ctl(Some(&[]), &["kernels", "unimport", "saxpy80"]);
    assert_eq!(o.status.code(), Some(2), "{}", all_text(&o));
    assert!(
        all_text(&o).contains("permission denied by the bus policy"),
        "{}",
        all_text(&o)
    );
    let o = node.ctl(None, &["kernels", "unimport", "saxpy80"]);
    assert_eq!(o.status.code(), Some(0), "{}", all_text(&o));
    assert!(
        all_text(&o).contains("removed import saxpy80: 1 file(s) unpinned"),
        "{}",
        all_text(&o)
    );
    assert!(!node.path("kernels/saxpy80").exists());
    let (cfg, log) = precreate(&node, "1");
    assert!(view_manifest(&cfg, "saxpy80").is_none(), "{log}");
    assert!(view_manifest(&cfg, "saxpy").is_some(), "{log}");
    let listed: serde_json::Value =
        serde_json::from_slice(&node.ctl(None, &["--json", "kernels"]).stdout).unwrap();
    let pinned = |pkg: &str| -> Vec<bool> {
        listed["kernels"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|k| k["package"] == pkg)
            .map(|k| k["pinned"].as_bool().unwrap())
            .collect()
    };
    assert_eq!(pinned("saxpy80"), [false], "{listed}");
    assert_eq!(pinned("saxpy"), [true], "{listed}");
    let o = node.ctl(None, &["kernels", "unimport", "saxpy80"]);
    assert_eq!(o.status.code(), Some(2), "{}", all_text(&o));
    assert!(
        all_text(&o).contains("no import named saxpy80 (imports: saxpy, saxpy90)"),
        "{}",
        all_text(&o)
    );
    node.stop();
}
