//! The bus interface: every method and property, the shipped XML, who
//! may call what, a restarted bus.

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
