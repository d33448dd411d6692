//! `gpuarchctl doctor` against a running gpuarchd and a root of engine
//! configs: what it finds, and the fix it names.

use super::*;

/// A host root for `gpuarchctl doctor --root`: the config, the cache, and
/// every engine installed and wired with the shipped snippets.
pub(super) fn doctor_root(dir: &Path) {
    let w = |rel: &str, data: &[u8]| {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
    };
    let shipped = |rel: &str| std::fs::read(workspace_root().join(rel)).unwrap();
    // A limit any test host's disk holds: the default (10 GiB) is weighed
    // against the host's free space, which the free-space test sets up.
    w(
        "etc/gpuarch/config.yaml",
        b"kernels:\n  cache_dir: /var/cache/gpuarch\n  max_bytes: 268435456\n",
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

/// A running gpuarchd and a host root wired as [`doctor_root`] makes it.
fn wired_node() -> (Node, tempfile::TempDir) {
    let mut node = Node::new("2080ti-3090", Policy::Shipped);
    node.start(&[]);
    let tmp = tempfile::tempdir().unwrap();
    doctor_root(tmp.path());
    (node, tmp)
}

/// `gpuarchctl engine containerd --write` on the root's own config, as an
/// admin runs it; it must succeed.
pub(super) fn write_dropin(root: &Path) {
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

pub(super) fn doctor(node: &Node, root: &Path, extra: &[&str]) -> (i32, String) {
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
pub(super) fn doctor_on(node: &Node, root: &Path, inventory: &Path) -> (i32, String) {
    let fake = artifacts().fake_nvml.clone();
    let args = [
        "--nvml-lib",
        fake.to_str().unwrap(),
        "--inventory",
        inventory.to_str().unwrap(),
    ];
    doctor(node, root, &args)
}

/// The kernel cache's free space is weighed against what the store may
/// still take: a disk with less room than `kernels.max_bytes` allows is a
/// warning naming the limit to set, a full one a failure (before, both
/// were "ok ... writable, 0.0 GiB free" while every build failed ENOSPC).
#[test]
fn doctor_weighs_the_caches_free_space_against_what_the_store_may_take() {
    need_bus!();
    let (node, tmp) = wired_node();
    let root = tmp.path();
    let snapshot = node.path("run/inventory.json");
    let cache = root.join("var/cache/gpuarch");
    let _fs = gpuarch_tests::Tmpfs::mount(&cache, "size=512m,mode=0755");
    // The default limit, 10 GiB, on a 512 MiB disk.
    std::fs::write(
        root.join("etc/gpuarch/config.yaml"),
        "kernels:\n  cache_dir: /var/cache/gpuarch\n",
    )
    .unwrap();
    let (_, out) = doctor_on(&node, root, &snapshot);
    let line = out
        .lines()
        .find(|l| l.contains("kernel cache"))
        .unwrap_or_default();
    assert!(
        line.starts_with("WARN") && line.contains("may grow 10.0 GiB more"),
        "{out}"
    );
    assert!(out.contains("lower kernels.max_bytes to at most"), "{out}");
    // A limit the disk can hold is ok.
    std::fs::write(
        root.join("etc/gpuarch/config.yaml"),
        "kernels:\n  cache_dir: /var/cache/gpuarch\n  max_bytes: 268435456\n",
    )
    .unwrap();
    let (_, out) = doctor_on(&node, root, &snapshot);
    assert!(out.contains("ok    kernel cache"), "{out}");
    // Full: builds and imports fail, and doctor says so.
    let _ = Command::new("dd")
        .args(["if=/dev/zero", "bs=1M", "count=400"])
        .arg(format!("of={}", cache.join("fill").display()))
        .output()
        .unwrap();
    let (code, out) = doctor_on(&node, root, &snapshot);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("FAIL  kernel cache") && out.contains("builds and imports fail (ENOSPC)"),
        "{out}"
    );
}

/// A Docker-only host (Debian's docker.io pulls in containerd, with no
/// config of its own) passes: containerd with no kubelet to use its CRI
/// needs no handler. With a kubelet, the same containerd fails with the fix.
#[test]
fn doctor_passes_a_docker_only_host_and_fails_containerd_once_a_kubelet_uses_it() {
    need_bus!();
    let (node, tmp) = wired_node();
    let root = tmp.path();
    for gone in [
        "etc/containerd",
        "etc/crio",
        "usr/bin/crio",
        "usr/bin/podman",
    ] {
        let p = root.join(gone);
        if p.is_dir() {
            std::fs::remove_dir_all(p).unwrap();
        } else {
            std::fs::remove_file(p).unwrap();
        }
    }
    let snapshot = node.path("run/inventory.json");
    let (code, out) = doctor_on(&node, root, &snapshot);
    let line = |out: &str| {
        out.lines()
            .find(|l| l.contains(" containerd "))
            .unwrap_or_default()
            .to_owned()
    };
    assert!(
        line(&out).starts_with("-     containerd")
            && line(&out).contains("no kubelet here uses its CRI"),
        "{out}"
    );
    assert!(out.contains("ok    docker"), "{out}");
    assert_eq!(code, 0, "{out}");
    std::fs::write(root.join("usr/bin/kubelet"), b"").unwrap();
    let (code, out) = doctor_on(&node, root, &snapshot);
    assert!(line(&out).starts_with("FAIL  containerd"), "{out}");
    assert!(
        out.contains("fix: gpuarchctl engine containerd --write"),
        "{out}"
    );
    assert_eq!(code, 1, "{out}");
}

/// The shim may be a copy or a wrapper named otherwise: `engine containerd
/// --write --runtime /opt/shims/gpu-shim` succeeds (it once exited 2, "no
/// runtime handler gpuarch after the edit", having written it), and doctor
/// recognises a gpuarch-runtime build by what it is, not by its file name,
/// for containerd and Docker alike. A relative --write path goes into
/// containerd's imports absolute (containerd 1.x resolves it from `/`).
#[test]
fn a_shim_named_otherwise_is_wired_and_recognised() {
    need_bus!();
    let (node, tmp) = wired_node();
    let root = tmp.path();
    std::fs::create_dir_all(root.join("opt/shims")).unwrap();
    std::fs::copy(
        &artifacts().gpuarch_runtime,
        root.join("opt/shims/gpu-shim"),
    )
    .unwrap();
    let etc = root.join("etc/containerd");
    // Debian's config without the conf.d import: --write must add its own.
    std::fs::remove_dir_all(etc.join("conf.d")).unwrap();
    std::fs::copy(
        workspace_root().join("tests/fixtures/containerd/debian-1.6.toml"),
        etc.join("config.toml"),
    )
    .unwrap();
    let o = Command::new(&artifacts().gpuarchctl)
        .current_dir(&etc)
        .args(["engine", "containerd", "--root"])
        .arg(root)
        .arg("--config")
        .arg(etc.join("config.toml"))
        .args([
            "--runtime",
            "/opt/shims/gpu-shim",
            "--write",
            "conf.d/gpuarch.toml",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let main = std::fs::read_to_string(etc.join("config.toml")).unwrap();
    // Absolute on the host whose `/` is root (it was "conf.d/gpuarch*.toml").
    assert!(
        main.contains("imports = [\"/etc/containerd/conf.d/gpuarch*.toml\"]"),
        "the import is not absolute:\n{main}"
    );
    let mut daemon: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("etc/docker/daemon.json")).unwrap())
            .unwrap();
    daemon["runtimes"]["gpuarch"]["path"] = "/opt/shims/gpu-shim".into();
    std::fs::write(root.join("etc/docker/daemon.json"), daemon.to_string()).unwrap();
    let (_, out) = doctor_on(&node, root, &node.path("run/inventory.json"));
    assert!(
        out.contains("ok    containerd   CRI loads; runtime handler gpuarch runs gpuarch-runtime"),
        "{out}"
    );
    assert!(
        out.contains("ok    docker       wired: runtime \"gpuarch\""),
        "{out}"
    );
    // A program that is not gpuarch-runtime is not taken for it.
    std::fs::write(
        root.join("opt/shims/gpu-shim"),
        b"#!/bin/sh\nexec runc \"$@\"\n",
    )
    .unwrap();
    let (_, out) = doctor_on(&node, root, &node.path("run/inventory.json"));
    assert!(out.contains("FAIL  docker"), "{out}");
}

/// A wired host passes every check; each way of breaking it is named, with
/// the line that fixes it, and makes the exit status 1.
#[test]
fn doctor_checks_the_daemon_nvml_snapshot_cache_and_each_engine() {
    need_bus!();
    let (mut node, tmp) = wired_node();
    let root = tmp.path();
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
    // What doctor asked of this host, not of --root's, says so.
    for name in ["gpuarchd", "NVML", "snapshot"] {
        let l = out.lines().find(|l| l[6..].starts_with(name)).unwrap();
        assert!(l.contains("[this host's gpuarchd and NVML, not "), "{l}");
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
        "fix: gpuarchctl engine docker --write (it merges \"runtimes\": {\"gpuarch\": {\"path\": \"/usr/bin/gpuarch-runtime\"}} into /etc/docker/daemon.json",
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
    need_bus!();
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
    need_bus!();
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
        "kernels:\n  cache_dir: /var/cache/gpuarch\n  max_bytes: 268435456\ndaemon:\n  refresh_interval_s: 1\n",
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
    need_bus!();
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
