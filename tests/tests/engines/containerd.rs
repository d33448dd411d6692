//! containerd: ctr with gpuarch as the runc binary, the CRI drop-in on
//! real configs, a CRI pod with handler gpuarch.

use super::*;

/// `ctr run` with gpuarch-runtime as its runc binary, on the containerd
/// that also serves Docker and CRI.
#[test]
fn ctr_run_with_gpuarch_as_the_runc_binary() {
    let Some(e) = get() else { return };
    let _turn = e.lock();
    e.set_gpuarch_config("");
    let shim = gpuarch_tests::artifacts()
        .gpuarch_runtime
        .display()
        .to_string();
    // The stdio FIFOs where both ctr and containerd see them (a root's
    // containerd has a /run of its own).
    let fifos = e.scratch();
    let fifo_dir = fifos.path().to_str().unwrap();
    let run = |id: &str, env: &[&str], cmd: &[&str]| {
        let mut args = vec![
            "run",
            "--rm",
            "--snapshotter",
            "native",
            "--fifo-dir",
            fifo_dir,
            "--runc-binary",
            &shim,
        ];
        for v in env {
            args.extend(["--env", v]);
        }
        args.extend([IMAGE, id]);
        args.extend(cmd);
        e.ctr(&args)
    };
    let id = format!("gpuarch-ctr-{}", std::process::id());
    let o = run(&format!("{id}-1"), &["NVIDIA_VISIBLE_DEVICES=1"], &["env"]);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(hints(&env_of(&o)), (Some("8.6"), Some("bfloat16")));
    let o = run(
        &format!("{id}-2"),
        &[],
        &["sh", "-c", "echo out; echo err >&2"],
    );
    assert!(o.status.success(), "{o:?}");
    assert_eq!(text(&o.stdout), "out\n");
    assert_eq!(text(&o.stderr), "err\n");
}

/// `ctr plugins ls`'s line for the CRI plugin of a containerd started on
/// `fixture` (its host paths moved under `dir`) with the drop-in `dropin`
/// (`None`: written by gpuarchctl) beside it, and containerd's own `config
/// dump` of what it then reads. `imports`: the test adds the import line;
/// otherwise it is left to `gpuarchctl engine containerd --write`.
fn cri_status(
    e: &Engines,
    dir: &Path,
    fixture: &str,
    dropin: Option<&str>,
    imports: bool,
) -> (String, String) {
    use std::process::{Command, Stdio};
    let original = std::fs::read_to_string(
        gpuarch_tests::workspace_root()
            .join("tests/fixtures/containerd")
            .join(fixture),
    )
    .unwrap();
    let mut doc: toml::Table = original.parse().unwrap();
    let d = dir.display();
    let conf_d = dir.join("conf.d");
    std::fs::create_dir_all(&conf_d).unwrap();
    // Only where containerd keeps its own files changes; the CRI section
    // stays as Debian or containerd wrote it.
    if imports {
        doc.insert(
            "imports".into(),
            toml::Value::Array(vec![format!("{d}/conf.d/*.toml").into()]),
        );
    }
    doc.insert("root".into(), format!("{d}/root").into());
    doc.insert("state".into(), format!("{d}/state").into());
    if e.root.is_some() {
        doc.insert(
            "disabled_plugins".into(),
            toml::Value::Array(
                gpuarch_tests::stack::DISABLED
                    .iter()
                    .map(|p| (*p).into())
                    .collect(),
            ),
        );
    }
    let sock = dir.join("c.sock");
    let table = |v: &[(&str, String)]| {
        toml::Value::Table(
            v.iter()
                .map(|(k, x)| ((*k).to_owned(), toml::Value::from(x.clone())))
                .collect(),
        )
    };
    doc.insert(
        "grpc".into(),
        table(&[("address", sock.display().to_string())]),
    );
    doc.insert(
        "ttrpc".into(),
        table(&[("address", format!("{d}/c.sock.ttrpc"))]),
    );
    let plugins = doc
        .entry("plugins")
        .or_insert_with(|| toml::Value::Table(toml::Table::new()))
        .as_table_mut()
        .unwrap();
    plugins.insert(
        "io.containerd.internal.v1.opt".into(),
        table(&[("path", format!("{d}/opt"))]),
    );
    let main = dir.join("config.toml");
    std::fs::write(&main, toml::to_string(&doc).unwrap()).unwrap();
    let out = conf_d.join("gpuarch.toml");
    match dropin {
        Some(text) => std::fs::write(&out, text).unwrap(),
        None => {
            let o = std::process::Command::new(&gpuarch_tests::artifacts().gpuarchctl)
                .args(["engine", "containerd", "--config"])
                .arg(&main)
                .arg("--write")
                .arg(&out)
                .output()
                .unwrap();
            assert!(o.status.success(), "{o:?}");
        }
    }
    let log = std::fs::File::create(dir.join("containerd.log")).unwrap();
    let mut child = e
        .program("containerd")
        .arg("--config")
        .arg(&main)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let ctr = |args: &[&str]| {
        Command::new(e.tool("ctr").unwrap())
            .arg("--address")
            .arg(&sock)
            .args(args)
            .output()
            .unwrap()
    };
    let t = Instant::now();
    while !ctr(&["version"]).status.success() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "{fixture}: containerd did not start"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let plugins = text(&ctr(&["plugins", "ls"]).stdout);
    let dump = e
        .program("containerd")
        .arg("--config")
        .arg(&main)
        .args(["config", "dump"])
        .output()
        .unwrap();
    // SIGTERM: in a root, the child is containerd itself (unshare, sh and
    // chroot each exec the next), and its mounts go with its namespace.
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(10) && matches!(child.try_wait(), Ok(None)) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::process::Command::new("umount")
        .arg("-R")
        .arg(dir.join("state"))
        .output();
    let line = plugins
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("cri"))
        .unwrap_or("(no cri line)")
        .to_owned();
    (line, text(&dump.stdout) + &text(&dump.stderr))
}

/// Debian's own containerd config and `containerd config default` of the
/// release under test (1.6 on the host, 2.1 in the sid root).
fn containerd_fixtures(e: &Engines) -> [&'static str; 2] {
    if e.root.is_some() {
        ["debian-2.1.toml", "default-2.1.toml"]
    } else {
        ["debian-1.6.toml", "default-1.6.toml"]
    }
}

/// The drop-in keeps CRI loading on Debian's own containerd config and on
/// `containerd config default`, with a real containerd 1.6 and 2.1; the
/// snippet gpuarch used to ship (only `runtimes.gpuarch`) disables CRI on
/// both under 1.6 (2.1 migrates it and loads).
#[test]
fn the_drop_in_keeps_cri_loading_on_debians_config_and_the_default() {
    let Some(e) = get() else { return };
    let _turn = e.lock();
    let old = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.gpuarch]\n  runtime_type = \"io.containerd.runc.v2\"\n  [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.gpuarch.options]\n    BinaryName = \"/usr/bin/gpuarch-runtime\"\n";
    let old_gives = if e.root.is_some() { "ok" } else { "error" };
    for fixture in containerd_fixtures(e) {
        for (dropin, want) in [(None, "ok"), (Some(old), old_gives)] {
            let dir = e.scratch();
            let (line, _) = cri_status(e, dir.path(), fixture, dropin, true);
            assert!(
                line.trim_end().ends_with(want),
                "{fixture} with {}: {line}\n{}",
                if dropin.is_some() {
                    "the old snippet"
                } else {
                    "gpuarchctl's drop-in"
                },
                std::fs::read_to_string(dir.path().join("containerd.log")).unwrap_or_default()
            );
        }
    }
}

/// On Debian's config and on `containerd config default`, neither of which
/// imports anything, `--write` adds the import itself, and a real
/// containerd (1.6; 2.1, which migrates the config to version 3) then
/// serves CRI with gpuarch's handler running the shim.
#[test]
fn write_adds_the_import_and_cri_comes_up_with_the_handler() {
    let Some(e) = get() else { return };
    let _turn = e.lock();
    // 1.6 dumps TOML with double quotes, 2.x with single ones.
    let table = if e.root.is_some() {
        "[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.gpuarch]"
    } else {
        "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.gpuarch]"
    };
    for fixture in containerd_fixtures(e) {
        let dir = e.scratch();
        let (line, dump) = cri_status(e, dir.path(), fixture, None, false);
        let dump = dump.replace('\'', "\"");
        let log = std::fs::read_to_string(dir.path().join("containerd.log")).unwrap_or_default();
        assert!(line.trim_end().ends_with("ok"), "{fixture}: {line}\n{log}");
        assert!(
            dump.contains(table) && dump.contains("BinaryName = \"/usr/bin/gpuarch-runtime\""),
            "{fixture}: containerd's merged config has no gpuarch handler:\n{dump}"
        );
        let main = std::fs::read_to_string(dir.path().join("config.toml")).unwrap();
        assert!(main.contains("conf.d/gpuarch*.toml"), "{main}");
        assert!(dir.path().join("config.toml.before-gpuarch").exists());
    }
}

/// Kubernetes on containerd: the drop-in kept CRI loading (with the
/// admin's own CRI settings: without its pause image no pod starts); a pod
/// with runtime handler gpuarch on GPU 1 of the 2080 Ti + 3090 gets its
/// Plan, by env and by device node; a pod with no handler (runtimeClassName
/// unset) gets nothing.
#[test]
fn a_cri_pod_with_handler_gpuarch_gets_its_plan() {
    let Some(e) = get() else { return };
    let _turn = e.lock();
    e.set_gpuarch_config("");
    let plugins = text(&e.ctr(&["plugins", "ls"]).stdout);
    assert!(
        plugins.lines().any(|l| l.contains("io.containerd.grpc.v1")
            && l.split_whitespace().nth(1) == Some("cri")
            && l.trim_end().ends_with("ok")),
        "{plugins}"
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let line = cri::var;
    let pods = e.path("pods");
    let pod = |name: &str, handler: &str, envs: &[(&str, &str)], devices: &[(&Path, &str)]| {
        let p = cri::Pod {
            sock: &e.containerd_sock,
            pods: &pods,
            image: IMAGE,
            name,
            handler,
            envs,
            annotations: &[],
            devices,
        };
        rt.block_on(p.env()).unwrap()
    };
    let id = std::process::id();
    let env = pod(
        &format!("plain-{id}"),
        "",
        &[("NVIDIA_VISIBLE_DEVICES", "1")],
        &[],
    );
    assert_eq!(line(&env, "TORCH_CUDA_ARCH_LIST"), None, "{env}");
    assert_eq!(line(&env, "GPUARCH_DTYPE"), None, "{env}");
    let env = pod(
        &format!("gpu1-{id}"),
        "gpuarch",
        &[("NVIDIA_VISIBLE_DEVICES", "1")],
        &[],
    );
    assert_eq!(
        line(&env, "TORCH_CUDA_ARCH_LIST").as_deref(),
        Some("8.6"),
        "{env}"
    );
    assert_eq!(
        line(&env, "GPUARCH_DTYPE").as_deref(),
        Some("bfloat16"),
        "{env}"
    );
    let node = e.dev.join("nvidia1");
    let env = pod(
        &format!("dev1-{id}"),
        "gpuarch",
        &[],
        &[(&node, "/dev/nvidia1")],
    );
    assert_eq!(
        line(&env, "TORCH_CUDA_ARCH_LIST").as_deref(),
        Some("8.6"),
        "{env}"
    );
}
