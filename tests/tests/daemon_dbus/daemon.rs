//! `io.gpuarch1.Inventory` and `io.gpuarch1.Daemon`, and gpuarchd's life on
//! the bus: every method and property, the interface XML, who may Reload,
//! NVML failures, sd_notify, config errors, a restarted bus.

use super::*;

#[test]
fn every_method_and_property_on_two_topologies() {
    need_bus!();
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
            // Hoppers, for an image not known: the torch list is left to
            // the image's consumers (an xformers needs 9.0a, a DeepSpeed
            // rejects it), and the notes say so.
            let (m, bf16) = if topo == "8xh100" {
                (None, "bfloat16")
            } else {
                (Some("7.5;8.6"), "float16")
            };
            assert_eq!(
                env.get("TORCH_CUDA_ARCH_LIST").map(String::as_str),
                m,
                "{topo}"
            );
            assert_eq!(
                notes
                    .iter()
                    .any(|n| n.starts_with("TORCH_CUDA_ARCH_LIST not set: ")),
                m.is_none(),
                "{topo}: {notes:?}"
            );
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

#[test]
fn the_shipped_interface_xml_is_what_the_daemon_serves() {
    need_bus!();
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
    need_bus!("setpriv", "systemd-sysusers");
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

        // They call the admins' name, where no one else's calls queue;
        // everyone else the public one.
        for (who, groups, name) in [
            ("nobody", Some(nobody), "(io.gpuarch1)"),
            ("group gpuarch", Some(&[gid][..]), "(io.gpuarch1.Admin)"),
            ("root", None, "(io.gpuarch1.Admin)"),
        ] {
            let o = node.ctl(groups, &["devices"]);
            let (out, err) = text(&o);
            assert!(o.status.success(), "{who}: {err}");
            assert!(
                out.contains(&format!("from gpuarchd {name}")),
                "{who}: {out}"
            );
        }

        // The records are root's alone: group gpuarch is told so and what
        // to run, not a bare "Permission denied".
        let records = node.path("records");
        std::fs::create_dir_all(&records).unwrap();
        std::fs::set_permissions(
            &records,
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .unwrap();
        let o = node.ctl(
            Some(&[gid]),
            &["why", "0123456789ab", "--dir", records.to_str().unwrap()],
        );
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(
            err.contains("root's alone") && err.contains("sudo gpuarchctl why 0123456789ab"),
            "{err}"
        );
    }
}

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

#[test]
fn a_restarted_bus_gets_the_same_gpuarchd_back_on_its_name() {
    need_bus!();
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
