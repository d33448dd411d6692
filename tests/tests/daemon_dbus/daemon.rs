//! `io.gpuarch1.Inventory` and `io.gpuarch1.Daemon`, and gpuarchd's life on
//! the bus: every method and property, the interface XML, who may Reload,
//! NVML failures, sd_notify, config errors, a restarted bus.

use super::*;

mod bus;

#[test]
fn a_topology_change_emits_one_signal_and_rewrites_the_snapshot() {
    need_bus!();
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
    // The directory holds the snapshot and the config in force, and
    // nothing half-written.
    let mut names: Vec<_> = std::fs::read_dir(node.path("run"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names, ["config.last-good.yaml", "inventory.json"]);
}

#[test]
fn an_nvml_failure_serves_the_last_inventory_marked_stale() {
    need_bus!();
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
    need_bus!();
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
    need_bus!();
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
    need_bus!();
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

    // The hook, which reads the file at every start, plans with gpuarchd's
    // last valid config (GPUARCH_FP8 disabled there), and says so in the
    // Plan's notes; before, the container started unplanned.
    let (config, err) = precreate(&node, "1");
    let env = config["process"]["env"].clone();
    let env: Vec<&str> = env
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert!(
        env.contains(&"TORCH_CUDA_ARCH_LIST=8.6"),
        "unplanned: {env:?}\n{err}"
    );
    assert!(
        !env.iter().any(|e| e.starts_with("GPUARCH_FP8=")),
        "not the last valid config: {env:?}"
    );
    assert!(
        err.contains("line 3") && err.contains("planned with gpuarchd's last valid config"),
        "{err}"
    );
    // status fails, naming the line and what containers get meanwhile (as
    // the hook finds the published config: beside the snapshot it reads).
    let o = node
        .ctl_cmd(None, &["status"])
        .env("GPUARCH_INVENTORY", node.path("run/inventory.json"))
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{err}");
    assert!(
        out.contains("CONFIG INVALID")
            && out.contains("line 3")
            && out.contains("last valid config"),
        "{out}"
    );
}

/// Commands that plan here (plan -e, plan --config, inspect) take the
/// running gpuarchd's inventory, wherever its snapshot is (here its own
/// directory, as in the demo); they looked only at
/// /run/gpuarch/inventory.json and failed.
#[test]
fn local_plans_use_the_running_daemons_inventory() {
    need_bus!();
    let mut node = Node::new("2080ti-3090", Policy::Shipped);
    node.start(&[]);
    let o = node.ctl(None, &["plan", "--devices", "1", "-e", "FOO=1", "--json"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("\"TORCH_CUDA_ARCH_LIST\": \"8.6\""), "{out}");
    let dir = tempfile::tempdir().unwrap();
    let ptx = dir.path().join("k.ptx");
    std::fs::write(&ptx, ".version 8.0\n.target sm_80\n.address_size 64\n").unwrap();
    let o = node.ctl(None, &["inspect", ptx.to_str().unwrap()]);
    let (out, err) = text(&o);
    assert!(
        out.contains("RTX 3090") && out.contains("RTX 2080 Ti"),
        "{out}{err}"
    );
}

#[test]
fn gpuarchctl_talks_to_the_daemon_and_says_when_it_is_down() {
    need_bus!();
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
    need_bus!();
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

/// Started without `--snapshot`, gpuarchd writes the snapshot where the
/// config's `daemon.snapshot` says, the place the hook and shim read.
#[test]
fn the_config_names_where_the_snapshot_is_written() {
    need_bus!();
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
