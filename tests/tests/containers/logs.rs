//! What the logs and the journal say of a container, and what it cannot
//! forge in them.

use super::*;

/// An image name with a newline in it and a 12 MiB env value full of
/// newlines (before, the first forged a log line, the second
/// became one 12 MiB line past `log.max_bytes`). Through the shim (runc)
/// and with the createContainer hook alone (runc, crun), every record the
/// hook and the shim write is one line of at most 4 KiB, and no line is
/// the one the image forged.
#[test]
fn what_a_container_says_never_forges_nor_floods_a_log_line() {
    need_containers!("runc", "crun", "unshare");
    let mut s = Scene::new();
    let jit = s.path().join("jit");
    s.config_yaml = format!("jit_cache:\n  enable: true\n  dir: {}\n", jit.display());
    let forged = "2026-01-01T00:00:00Z gpuarch-hook[1] info: FORGED";
    let image = format!("torch:2.7\n{forged}");
    let value = format!(
        "TORCH_CUDA_ARCH_LIST={}",
        format!("8.6\n{forged}\n").repeat((12 << 20) / (forged.len() + 5))
    );
    for (runtime, shim) in [("runc", true), ("runc", false), ("crun", false)] {
        let hooks = (!shim).then(|| json!({ "createContainer": s.hook_entry("create-container") }));
        let gpu = ["NVIDIA_VISIBLE_DEVICES=1", value.as_str()];
        let b = jit_bundle(&s, runtime, 0, &image, &gpu, hooks);
        // The 12 MiB variable is past what exec takes: the start may fail,
        // after gpuarch has logged.
        let _ = s.run_bundle(runtime, &b, shim);
        let log = s.take_log();
        assert!(
            log.contains("JIT cache"),
            "{runtime} shim={shim}: {}",
            &log[..log.len().min(2000)]
        );
        for line in log.lines() {
            assert!(
                !line.starts_with(forged),
                "{runtime} shim={shim}: a forged line: {line}"
            );
            assert!(
                line.len() <= 4096 + 128,
                "{runtime} shim={shim}: a line of {} bytes",
                line.len()
            );
        }
    }
}

/// podman through the precreate hook: every line the hook logs for a GPU
/// container carries its id (read from podman's userdata mounts, since
/// precreate gets no OCI state), and `gpuarchctl why` shows what it got,
/// by the short id `podman ps` shows, after `podman rm` removed it. (Not
/// `--rm`: podman 5 then removes the `--cidfile` too.)
#[test]
fn podman_logs_name_the_container_and_why_shows_what_it_got() {
    need_containers!("podman");
    let s = Scene::new();
    let cidfile = s.path().join("cid");
    let name = format!("gpuarch-why-{}", std::process::id());
    let seen = s.podman(&[
        "--rm=false",
        "--name",
        &name,
        "--cidfile",
        cidfile.to_str().unwrap(),
        "-e",
        "NVIDIA_VISIBLE_DEVICES=1",
    ]);
    assert_eq!(seen.ok().hints().0, Some("8.6"));
    let id = std::fs::read_to_string(&cidfile).unwrap().trim().to_owned();
    assert_eq!(id.len(), 64, "{id}");
    let log = s.take_log();
    // By its name, asked of podman's Docker-compatible API (what
    // podman.socket serves), as gpuarchctl asks Docker's.
    let sock = s.path().join("podman.sock");
    let mut service = s
        .podman_global()
        .args(["system", "service", "--time", "0"])
        .arg(format!("unix://{}", sock.display()))
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while !sock.exists() && t0.elapsed() < std::time::Duration::from_secs(20) {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let o = Command::new(&artifacts().gpuarchctl)
        .args(["why", &name])
        .env("GPUARCH_CONFIG", s.config_file(None))
        .env("DOCKER_HOST", format!("unix://{}", sock.display()))
        .output()
        .unwrap();
    let _ = service.kill();
    let _ = service.wait();
    assert!(o.status.success(), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stdout).starts_with(&format!("container {id}\n")),
        "{o:?}"
    );
    // A rootful user's container that binds this one's userdata in (the
    // probe's record overwrite): it names two ids, so it gets no record,
    // and this container's stays (its 8.6 below, not the other's 7.5).
    let userdata = s
        .path()
        .join("podman/runroot/vfs-containers")
        .join(&id)
        .join("userdata");
    assert!(userdata.is_dir(), "{}", userdata.display());
    let bind = format!("{}:/mnt/victim:ro", userdata.display());
    let seen = s.podman(&["-e", "NVIDIA_VISIBLE_DEVICES=0", "-v", &bind]);
    assert_eq!(seen.ok().hints().0, Some("7.5"));
    let other_log = s.take_log();
    assert!(
        other_log.contains("assigned from") && !other_log.contains(&id),
        "{other_log}"
    );
    let rm = s.podman_global().args(["rm", &id]).output().unwrap();
    assert!(rm.status.success(), "podman rm: {rm:?}");
    let lines: Vec<&str> = log.lines().collect();
    assert!(lines.iter().any(|l| l.contains("assigned from")), "{log}");
    for l in &lines {
        assert!(
            l.contains(&format!("] info: container={id}: ")),
            "a line without the container's id: {l}"
        );
    }
    let why = |q: &str, json: bool| {
        let mut c = Command::new(&artifacts().gpuarchctl);
        if json {
            c.arg("--json");
        }
        c.args(["why", q])
            .env("GPUARCH_CONFIG", s.config_file(None))
            .output()
            .unwrap()
    };
    let o = why(&id[..12], false);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{o:?}");
    assert!(out.starts_with(&format!("container {id}\n")), "{out}");
    assert!(out.contains("planned by gpuarch-hook precreate"), "{out}");
    assert!(
        out.contains("GPUs (from NVIDIA_VISIBLE_DEVICES, in CUDA order):"),
        "{out}"
    );
    assert!(out.contains("NVIDIA GeForce RTX 3090"), "{out}");
    assert!(out.contains("  TORCH_CUDA_ARCH_LIST=8.6\n"), "{out}");
    assert!(out.contains("notes:\n  - "), "{out}");
    let o = why(&id, true);
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["id"], id.as_str());
    assert_eq!(r["plan"]["env"]["TORCH_CUDA_ARCH_LIST"], "8.6");
    // A container that asked for no GPU has no record; an unknown id neither.
    let cid2 = s.path().join("cid2");
    s.podman(&["--rm=false", "--cidfile", cid2.to_str().unwrap()])
        .ok();
    let other = std::fs::read_to_string(&cid2).unwrap();
    for q in [other.trim(), "0123456789ab"] {
        let o = why(q, false);
        assert_eq!(o.status.code(), Some(1), "{o:?}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("no record of"),
            "{o:?}"
        );
    }
}

/// In the journal, the hook's lines carry the container in fields an admin
/// filters on, and in their text. The hook runs in a mount namespace whose
/// `/run/systemd/journal/socket` is this test's socket, and the test reads
/// the entries as journald would receive them (its native protocol).
#[test]
fn journal_entries_carry_the_container_in_fields() {
    need_containers!("unshare", "mount");
    use std::os::unix::net::UnixDatagram;
    let tmp = tempfile::tempdir().unwrap();
    let sock_dir = tmp.path().join("journal");
    std::fs::create_dir_all(&sock_dir).unwrap();
    let sock = UnixDatagram::bind(sock_dir.join("socket")).unwrap();
    sock.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let config = tmp.path().join("config.yaml");
    std::fs::write(
        &config,
        gpuarch_tests::private_hook_paths("strict: false\n", tmp.path()),
    )
    .unwrap();
    let id = "c6bc73e047ca83c62f6b452532e52500e5ca650a065941c61787496d7da994f6";
    let oci = json!({
        "ociVersion": "1.0.2",
        "process": {"env": ["NVIDIA_VISIBLE_DEVICES=1"]},
        "annotations": {
            "io.kubernetes.cri.container-name": "trainer",
            "io.kubernetes.cri.sandbox-name": "trainer-0",
            "io.kubernetes.cri.sandbox-namespace": "ml"
        },
        "mounts": [
            {"destination": "/etc/hosts", "source": format!("/run/containers/storage/overlay-containers/{id}/userdata/hosts")},
            {"destination": "/run/.containerenv", "source": format!("/run/containers/storage/overlay-containers/{id}/userdata/.containerenv")}
        ]
    });
    let script = format!(
        "mount -t tmpfs tmpfs /run && mkdir -p /run/systemd/journal && mount --bind {} /run/systemd/journal && exec {} precreate",
        sock_dir.display(),
        artifacts().gpuarch_hook.display()
    );
    let o = gpuarch_tests::output_with_stdin(
        Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .env("GPUARCH_LOG", "journal")
            .env("GPUARCH_CONFIG", &config)
            .env("GPUARCH_INVENTORY", fixture("2080ti-3090")),
        oci.to_string().as_bytes(),
    );
    assert!(o.status.success(), "{o:?}");
    let mut entries = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    sock.set_nonblocking(true).unwrap();
    while let Ok(n) = sock.recv(&mut buf) {
        // tracing-journald first sends an empty datagram, to test the socket.
        if n > 0 {
            entries.push(journal_fields(&buf[..n]));
        }
    }
    let planned: Vec<_> = entries
        .iter()
        .filter(|e| {
            e.get("MESSAGE")
                .is_some_and(|m| m.contains("assigned from"))
        })
        .collect();
    assert_eq!(planned.len(), 1, "{entries:?}");
    let e = planned[0];
    assert_eq!(e["SYSLOG_IDENTIFIER"], "gpuarch-hook");
    assert_eq!(e["CONTAINER_ID"], id[..12]);
    assert_eq!(e["CONTAINER_ID_FULL"], id);
    assert_eq!(e["CONTAINER_NAME"], "trainer");
    assert_eq!(e["POD_NAME"], "trainer-0");
    assert_eq!(e["POD_NAMESPACE"], "ml");
    // Every entry carries the id in its fields, and in its text too (what
    // `journalctl -t gpuarch-hook` shows names the container).
    let head = format!("container={id} name=trainer pod=ml/trainer-0: ");
    for e in &entries {
        assert_eq!(
            e.get("CONTAINER_ID").map(String::as_str),
            Some(&id[..12]),
            "{e:?}"
        );
        assert!(e["MESSAGE"].starts_with(&head), "{e:?}");
    }
}

/// journald's native protocol: `KEY=value\n`, or `KEY\n`, a 64-bit
/// little-endian length, the value and `\n`.
fn journal_fields(mut b: &[u8]) -> std::collections::BTreeMap<String, String> {
    let mut m = std::collections::BTreeMap::new();
    while !b.is_empty() {
        let nl = b.iter().position(|&c| c == b'\n').unwrap_or(b.len());
        let line = &b[..nl];
        if let Some(eq) = line.iter().position(|&c| c == b'=') {
            m.insert(
                String::from_utf8_lossy(&line[..eq]).into_owned(),
                String::from_utf8_lossy(&line[eq + 1..]).into_owned(),
            );
            b = &b[(nl + 1).min(b.len())..];
        } else {
            let key = String::from_utf8_lossy(line).into_owned();
            let rest = &b[nl + 1..];
            let len = u64::from_le_bytes(rest[..8].try_into().unwrap()) as usize;
            m.insert(key, String::from_utf8_lossy(&rest[8..8 + len]).into_owned());
            b = &rest[(8 + len + 1).min(rest.len())..];
        }
    }
    m
}
