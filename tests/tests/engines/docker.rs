//! Docker with gpuarch as its runtime: by default and by name, its GPU
//! flags and CDI, exec, logs, strict refusals, NVIDIA's runtime beside it.

use super::*;

/// The Plan's cases through Docker: gpuarch as the default runtime
/// and by name, each way of asking for GPUs, the container's own value and
/// opt-outs; `--runtime runc` is left alone.
#[test]
fn docker_runs_gpuarch_as_its_default_runtime_and_by_name() {
    let Some(e) = get() else { return };
    let _turn = e.lock();
    e.set_gpuarch_config("");
    let nvidia0 = format!("{}:/dev/nvidia0", e.dev.join("nvidia0").display());
    let nvidia1 = format!("{}:/dev/nvidia1", e.dev.join("nvidia1").display());
    let gpu1_uuid = format!("NVIDIA_VISIBLE_DEVICES={GPU1_UUID}");
    let cases: [(&str, Vec<&str>, Hints); 7] = [
        (
            "default runtime, index",
            vec!["-e", "NVIDIA_VISIBLE_DEVICES=1"],
            (Some("8.6"), Some("bfloat16")),
        ),
        (
            "--runtime gpuarch, both",
            vec!["--runtime", "gpuarch", "-e", "NVIDIA_VISIBLE_DEVICES=0,1"],
            (Some("7.5;8.6"), Some("float16")),
        ),
        (
            "all",
            vec!["-e", "NVIDIA_VISIBLE_DEVICES=all"],
            (Some("7.5;8.6"), Some("float16")),
        ),
        (
            "UUID",
            vec!["-e", &gpu1_uuid],
            (Some("8.6"), Some("bfloat16")),
        ),
        (
            "--device /dev/nvidia0",
            vec!["--device", &nvidia0],
            (Some("7.5"), Some("float16")),
        ),
        (
            "--device /dev/nvidia1",
            vec!["--runtime", "gpuarch", "--device", &nvidia1],
            (Some("8.6"), Some("bfloat16")),
        ),
        (
            "CUDA_VISIBLE_DEVICES narrows",
            vec![
                "-e",
                "NVIDIA_VISIBLE_DEVICES=0,1",
                "-e",
                "CUDA_VISIBLE_DEVICES=1",
            ],
            (Some("8.6"), Some("bfloat16")),
        ),
    ];
    for (case, args, want) in &cases {
        let env = docker_env(e, args);
        assert_eq!(hints(&env), *want, "{case}: {env:?}");
    }
    let own = docker_env(
        e,
        &[
            "-e",
            "NVIDIA_VISIBLE_DEVICES=1",
            "-e",
            "TORCH_CUDA_ARCH_LIST=9.0",
        ],
    );
    assert_eq!(hints(&own), (Some("9.0"), Some("bfloat16")), "own value");
    untouched(
        &docker_env(
            e,
            &["-e", "NVIDIA_VISIBLE_DEVICES=1", "-e", "GPUARCH_DISABLE=1"],
        ),
        "GPUARCH_DISABLE=1",
    );
    untouched(
        &docker_env(e, &["--runtime", "runc", "-e", "NVIDIA_VISIBLE_DEVICES=1"]),
        "--runtime runc",
    );
    untouched(&docker_env(e, &[]), "no GPU");
    untouched(
        &docker_env(e, &["-e", "NVIDIA_VISIBLE_DEVICES=none"]),
        "NVIDIA_VISIBLE_DEVICES=none",
    );
    let log = e.take_log();
    assert!(log.contains("NVIDIA GeForce RTX 3090"), "{log}");
}

/// Every line the shim logs for a Docker container carries its id, and
/// `gpuarchctl why` shows what the container got, by the short id `docker
/// ps` shows, after it has exited.
#[test]
fn docker_logs_name_the_container_and_why_shows_what_it_got() {
    let Some(e) = get() else { return };
    let _turn = e.lock();
    e.set_gpuarch_config("");
    e.take_log();
    let name = format!("gpuarch-why-{}", std::process::id());
    let o = e.docker(&[
        "run",
        "--name",
        &name,
        "--network",
        "none",
        "-e",
        "NVIDIA_VISIBLE_DEVICES=1",
        IMAGE,
        "true",
    ]);
    assert!(o.status.success(), "{o:?}");
    let id = text(&e.docker(&["inspect", "-f", "{{.Id}}", &name]).stdout)
        .trim()
        .to_owned();
    assert_eq!(id.len(), 64, "{id}");
    let log = e.take_log();
    assert!(log.contains("assigned from"), "{log}");
    for l in log.lines() {
        assert!(
            l.contains(&format!("] info: container={id}: ")),
            "a line without the container's id: {l}"
        );
    }
    let o = std::process::Command::new(&gpuarch_tests::artifacts().gpuarchctl)
        .args(["why", &id[..12]])
        .env("GPUARCH_CONFIG", &e.gpuarch_config)
        .output()
        .unwrap();
    let out = text(&o.stdout);
    assert!(o.status.success(), "{o:?}");
    assert!(out.starts_with(&format!("container {id}\n")), "{out}");
    assert!(out.contains("planned by gpuarch-runtime create"), "{out}");
    assert!(out.contains("NVIDIA GeForce RTX 3090"), "{out}");
    assert!(out.contains("  TORCH_CUDA_ARCH_LIST=8.6\n"), "{out}");
    // By the name Docker knows it by, asked of Docker's own API (Docker
    // gives the runtime no names; before, this was "no record").
    let why_by_name = || {
        std::process::Command::new(&gpuarch_tests::artifacts().gpuarchctl)
            .args(["why", &name])
            .env("GPUARCH_CONFIG", &e.gpuarch_config)
            .env("DOCKER_HOST", &e.docker_host)
            .output()
            .unwrap()
    };
    let o = why_by_name();
    assert!(o.status.success(), "{o:?}");
    assert!(
        text(&o.stdout).starts_with(&format!("container {id}\n")),
        "{o:?}"
    );
    assert!(e.docker(&["rm", &name]).status.success());
    // Gone from Docker, the name is said to be unknown there.
    let o = why_by_name();
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(
        text(&o.stderr).contains(&format!(
            "as a Docker or podman name: Docker knows no container \"{name}\""
        )),
        "{o:?}"
    );
}

/// What most Docker users type: `--gpus`, and compose's GPU reservations.
/// dockerd turns both into `NVIDIA_VISIBLE_DEVICES` (and NVIDIA's prestart
/// hook) once its gpu driver is registered, which needs
/// `nvidia-container-runtime-hook` on its PATH (a stand-in here; NVIDIA's
/// toolkit on a real host). gpuarch, the default runtime, plans from it.
#[test]
fn docker_gpus_and_compose_gpu_reservations_get_the_plan() {
    let Some(e) = get() else { return };
    let _turn = e.lock();
    e.set_gpuarch_config("");
    let calls = e.dir.join("nvidia-hook.calls");
    let _ = std::fs::remove_file(&calls);
    for (gpus, want) in [
        ("device=1", (Some("8.6"), Some("bfloat16"))),
        ("\"device=0,1\"", (Some("7.5;8.6"), Some("float16"))),
        ("all", (Some("7.5;8.6"), Some("float16"))),
        ("1", (Some("7.5"), Some("float16"))),
    ] {
        let env = docker_env(e, &["--gpus", gpus]);
        assert_eq!(hints(&env), want, "--gpus {gpus}: {env:?}");
    }
    // dockerd added NVIDIA's hook to each of those containers.
    let called = std::fs::read_to_string(&calls).unwrap_or_default();
    assert_eq!(
        called.lines().filter(|l| *l == "prestart").count(),
        4,
        "{called}"
    );

    let Some(compose) = e.tool("docker-compose") else {
        gpuarch_tests::skip(
            "no docker-compose (apt install docker-compose; in an engine root, its pin)",
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("docker-compose.yml"),
        format!(
            "version: \"3.8\"\nservices:\n  train:\n    image: {IMAGE}\n    command: env\n    network_mode: none\n    deploy:\n      resources:\n        reservations:\n          devices:\n            - driver: nvidia\n              device_ids: [\"1\"]\n              capabilities: [gpu]\n"
        ),
    )
    .unwrap();
    let project = format!("gpuarch{}", std::process::id());
    let run = |args: &[&str]| {
        std::process::Command::new(&compose)
            .args(["--project-name", &project, "--ansi", "never"])
            .args(args)
            .current_dir(dir.path())
            .env("DOCKER_HOST", &e.docker_host)
            .output()
            .unwrap()
    };
    let o = run(&["up", "--abort-on-container-exit"]);
    let _ = run(&["down"]);
    assert!(o.status.success(), "{o:?}");
    // Each line of the service's output, after compose's `train_1  | `
    // (1.29) or `train-1  | ` (2.x).
    let env: BTreeMap<String, String> = text(&o.stdout)
        .lines()
        .filter_map(|l| l.split_once("| "))
        .filter_map(|(_, kv)| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    assert_eq!(
        hints(&env),
        (Some("8.6"), Some("bfloat16")),
        "compose: {env:?}\n{o:?}"
    );
}

/// Docker's own CDI (Docker 28; 20.10 has none): `--device
/// nvidia.com/gpu=N`, resolved by dockerd from NVIDIA's spec, gives the
/// container that GPU's node, and gpuarch, the default runtime, the Plan of
/// the GPU behind it.
#[test]
fn docker_cdi_devices_get_the_plan() {
    let Some(e) = get() else { return };
    if e.root.is_none() {
        eprintln!("not here: Docker 20.10 has no CDI (the GPUARCH_ENGINES=sid run covers it)");
        return;
    }
    let _turn = e.lock();
    e.set_gpuarch_config("");
    for (device, want, node) in [
        (
            "nvidia.com/gpu=1",
            (Some("8.6"), Some("bfloat16")),
            "/dev/nvidia1",
        ),
        (
            "nvidia.com/gpu=0",
            (Some("7.5"), Some("float16")),
            "/dev/nvidia0",
        ),
        (
            "nvidia.com/gpu=all",
            (Some("7.5;8.6"), Some("float16")),
            "/dev/nvidia1",
        ),
    ] {
        let o = e.docker(&[
            "run",
            "--rm",
            "--network",
            "none",
            "--device",
            device,
            IMAGE,
            "sh",
            "-c",
            &format!("ls {node} >&2 && env"),
        ]);
        assert!(o.status.success(), "--device {device}: {o:?}");
        assert_eq!(
            text(&o.stderr),
            format!("{node}\n"),
            "--device {device}: the node"
        );
        assert_eq!(
            hints(&env_of(&o)),
            want,
            "--device {device}: {}",
            text(&o.stdout)
        );
    }
    let log = e.take_log();
    assert!(log.contains("NVIDIA GeForce RTX 3090"), "{log}");
}

/// `docker exec` starts a process with the env Docker stored, not the
/// bundle's: it does not get the Plan. The env files the shim writes with
/// `runtime.env_files: true` carry it there.
#[test]
fn docker_exec_gets_the_plan_from_the_env_files() {
    let Some(e) = get() else { return };
    let _turn = e.lock();
    e.set_gpuarch_config("runtime:\n  env_files: true\n");
    e.take_log();
    let name = format!("gpuarch-exec-{}", std::process::id());
    let o = e.docker(&[
        "run",
        "-d",
        "--name",
        &name,
        "--network",
        "none",
        "-e",
        "NVIDIA_VISIBLE_DEVICES=1",
        IMAGE,
        "sleep",
        "60",
    ]);
    assert!(o.status.success(), "{o:?}");
    let exec = |cmd: &str| e.docker(&["exec", &name, "sh", "-c", cmd]);
    let plain = exec("env");
    let files = exec(
        "cat /run/gpuarch/env; . /etc/profile.d/gpuarch.sh; echo sourced=$TORCH_CUDA_ARCH_LIST",
    );
    let _ = e.docker(&["rm", "-f", &name]);
    assert!(
        plain.status.success() && files.status.success(),
        "{plain:?} {files:?}\n{}",
        e.take_log()
    );
    assert!(
        !text(&plain.stdout).contains("TORCH_CUDA_ARCH_LIST"),
        "docker exec got the Plan: the README says it does not"
    );
    let files = text(&files.stdout);
    assert!(files.contains("TORCH_CUDA_ARCH_LIST=8.6\n"), "{files}");
    assert!(files.contains("sourced=8.6\n"), "{files}");
    // Written by the shim itself: Docker mounts nothing over /run or /etc,
    // so no createContainer process was needed.
    let log = e.take_log();
    assert!(log.contains("wrote /run/gpuarch/env"), "{log}");
    assert!(!log.contains("createContainer hook added"), "{log}");
}

/// A container without a GPU prints exactly what its command prints, in
/// `docker run` and in `docker logs`, at the default level and at debug;
/// a strict refusal still reaches the user in Docker's error.
#[test]
fn docker_containers_print_only_their_own_output() {
    let Some(e) = get() else { return };
    let _turn = e.lock();
    let script = "echo out; echo err >&2";
    for (level, gpu) in [("info", false), ("debug", false), ("debug", true)] {
        e.set_gpuarch_config_with(level, &e.snapshot(), "");
        let env: &[&str] = if gpu {
            &["-e", "NVIDIA_VISIBLE_DEVICES=1"]
        } else {
            &[]
        };
        let name = format!("gpuarch-logs-{}-{level}-{gpu}", std::process::id());
        let o = e.docker(
            &[
                &["run", "--name", &name, "--network", "none"][..],
                env,
                &[IMAGE, "sh", "-c", script],
            ]
            .concat(),
        );
        assert!(o.status.success(), "{o:?}");
        assert_eq!(text(&o.stdout), "out\n", "{level}: docker run stdout");
        assert_eq!(text(&o.stderr), "err\n", "{level}: docker run stderr");
        let logs = e.docker(&["logs", &name]);
        assert_eq!(text(&logs.stdout), "out\n", "{level}: docker logs");
        assert_eq!(text(&logs.stderr), "err\n", "{level}: docker logs");
        assert!(e.docker(&["rm", &name]).status.success());
        let log = e.take_log();
        if gpu {
            assert!(
                log.contains("assigned from NVIDIA_VISIBLE_DEVICES"),
                "{log}"
            );
        } else if level == "debug" {
            assert!(log.contains("no GPU requested"), "{log}");
        } else {
            assert!(!log.contains("no GPU requested"), "{log}");
        }
    }

    let bad = e.path("bad-inventory.json");
    std::fs::write(&bad, "{\"schema\": 1, \"devices\": [").unwrap();
    e.set_gpuarch_config_with("info", &bad, "strict: true\n");
    let o = e.docker(&[
        "run",
        "--rm",
        "--network",
        "none",
        "-e",
        "NVIDIA_VISIBLE_DEVICES=1",
        IMAGE,
        "sh",
        "-c",
        script,
    ]);
    e.set_gpuarch_config("");
    assert!(!o.status.success(), "a strict refusal started: {o:?}");
    let err = text(&o.stderr);
    assert!(
        err.contains("gpuarch-runtime:")
            && err.contains("strict: refusing")
            && err.contains("bad-inventory.json"),
        "the refusal is not in Docker's error: {err}"
    );
    assert!(!text(&o.stdout).contains("out"), "the container ran");
    assert!(e.take_log().contains("strict: refusing"));
}

/// An image whose `NVIDIA_REQUIRE_ARCH` the assigned 2080 Ti does not
/// meet starts under Docker with the term and the GPU in gpuarch's log;
/// with strict, Docker's own error says so and the container does not run.
/// `NVIDIA_VISIBLE_DEVICES=7` on this 2-GPU node: likewise.
#[test]
fn docker_shows_a_strict_refusal_of_an_unmet_requirement() {
    let Some(e) = get() else { return };
    let _turn = e.lock();
    let run = |env: &[&str]| {
        let mut args = vec!["run", "--rm", "--network", "none"];
        for kv in env {
            args.extend(["-e", kv]);
        }
        args.extend([IMAGE, "sh", "-c", "echo ran"]);
        e.docker(&args)
    };
    let unmet = ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_REQUIRE_ARCH=arch>=8.0"];
    let gpu0 = "is not met on GPU 0 (NVIDIA GeForce RTX 2080 Ti, 7.5)";
    e.set_gpuarch_config_with("info", &e.snapshot(), "");
    let o = run(&unmet);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(text(&o.stdout), "ran\n");
    let log = e.take_log();
    assert!(log.contains(gpu0) && log.contains("arch>=8.0"), "{log}");

    e.set_gpuarch_config_with("info", &e.snapshot(), "strict: true\n");
    let cases: [(&[&str], &str); 2] = [
        (&unmet, gpu0),
        (
            &["NVIDIA_VISIBLE_DEVICES=7"],
            "NVIDIA_VISIBLE_DEVICES entry",
        ),
    ];
    for (env, why) in cases {
        let o = run(env);
        let err = text(&o.stderr);
        assert!(!o.status.success(), "strict started {env:?}: {o:?}");
        assert!(
            err.contains("gpuarch-runtime:")
                && err.contains("strict: refusing")
                && err.contains(why),
            "the refusal is not in Docker's error: {err}"
        );
        assert!(!text(&o.stdout).contains("ran"), "the container ran");
    }
    let o = run(&["NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_REQUIRE_ARCH=arch>=8.0"]);
    e.set_gpuarch_config("");
    assert!(o.status.success(), "a met requirement was refused: {o:?}");
    assert_eq!(text(&o.stdout), "ran\n");
    e.take_log();
}

/// NVIDIA's runtime (a stand-in) on either side of gpuarch: Docker runs the
/// stand-in, which execs gpuarch-runtime, whose `runtime.path` is a second
/// stand-in that execs runc. Each gets exactly the arguments Docker gave,
/// the inner one gpuarch's config, and the container its Plan.
#[test]
fn nvidias_runtime_on_either_side_of_gpuarch_gets_dockers_arguments() {
    let Some(e) = get() else { return };
    let _turn = e.lock();
    let rec = e.path("chain");
    for f in [
        "outer.args",
        "inner.args",
        "outer.config.json",
        "inner.config.json",
    ] {
        let _ = std::fs::remove_file(rec.join(f));
    }
    e.set_gpuarch_config(&format!(
        "runtime:\n  path: {}\n",
        e.path("nvidia-inner").display()
    ));
    let env = docker_env(
        e,
        &[
            "--runtime",
            "nvidia-standin",
            "-e",
            "NVIDIA_VISIBLE_DEVICES=1",
        ],
    );
    e.set_gpuarch_config("");
    assert_eq!(hints(&env), (Some("8.6"), Some("bfloat16")), "{env:?}");
    let outer = std::fs::read_to_string(rec.join("outer.args")).unwrap();
    let inner = std::fs::read_to_string(rec.join("inner.args")).unwrap();
    assert_eq!(
        outer, inner,
        "gpuarch-runtime changed the runtime's arguments"
    );
    assert!(
        outer
            .lines()
            .any(|l| l.contains(" create ") && l.contains("--bundle")),
        "{outer}"
    );
    let before: serde_json::Value =
        serde_json::from_slice(&std::fs::read(rec.join("outer.config.json")).unwrap()).unwrap();
    let after: serde_json::Value =
        serde_json::from_slice(&std::fs::read(rec.join("inner.config.json")).unwrap()).unwrap();
    let has = |c: &serde_json::Value| {
        c["process"]["env"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v == "TORCH_CUDA_ARCH_LIST=8.6")
    };
    assert!(!has(&before), "Docker's config already had the Plan");
    assert!(
        has(&after),
        "the inner runtime did not get gpuarch's config"
    );
}
