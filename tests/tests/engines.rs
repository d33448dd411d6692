//! gpuarch under the engines most GPU nodes run: Docker (gpuarch as
//! `--runtime`, as `default-runtime`, opted out with `--runtime runc`, and
//! with a stand-in for NVIDIA's runtime on either side of it; `--gpus`,
//! compose and, from Docker 28, CDI), containerd through `ctr`, and
//! Kubernetes' path: the CRI calls kubelet makes, with `runtime_handler:
//! gpuarch` from the drop-in `gpuarchctl engine containerd` wrote. The
//! engines start once for this binary (gpuarch_tests::engines): the host's
//! Debian 12 releases (containerd 1.6, Docker 20.10, runc 1.1), or with
//! `GPUARCH_ENGINES=sid` today's (containerd 2.1, Docker 28, runc 1.3);
//! `scripts/test` runs this binary both ways. The tests take turns, since
//! some change the gpuarch config.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use gpuarch_tests::engines::{DEEPSPEED_IMAGE, Engines, IMAGE, LAYOUTS_IMAGE, engines, missing};

const GPU1_UUID: &str = "GPU-0ce1cf70-9353-208e-0e37-0746dc707745";

fn get() -> Option<&'static Engines> {
    let e = engines();
    if e.is_none() {
        gpuarch_tests::skip(&missing().unwrap_or_default());
    }
    e
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn env_of(o: &Output) -> BTreeMap<String, String> {
    text(&o.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// `docker run --rm ARGS IMAGE env`, which must succeed with nothing on
/// stderr; the container's env.
fn docker_env(e: &Engines, args: &[&str]) -> BTreeMap<String, String> {
    let o = e.docker(&[&["run", "--rm", "--network", "none"], args, &[IMAGE, "env"]].concat());
    assert!(o.status.success(), "docker run {args:?}: {o:?}");
    assert_eq!(text(&o.stderr), "", "docker run {args:?}: stderr");
    env_of(&o)
}

/// `TORCH_CUDA_ARCH_LIST` and `GPUARCH_DTYPE`.
type Hints<'a> = (Option<&'a str>, Option<&'a str>);

fn hints(env: &BTreeMap<String, String>) -> Hints<'_> {
    (
        env.get("TORCH_CUDA_ARCH_LIST").map(String::as_str),
        env.get("GPUARCH_DTYPE").map(String::as_str),
    )
}

fn untouched(env: &BTreeMap<String, String>, case: &str) {
    gpuarch_tests::containers::no_gpuarch_env(env, case);
    assert!(!env.contains_key("TORCH_CUDA_ARCH_LIST"), "{case}: {env:?}");
}

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

/// An image with DeepSpeed installed (its real dist-info) on the 2080 Ti,
/// under Docker: the Plan switches off the DeepSpeed ops that cannot run on
/// Turing and says what it read; the bare busybox image, read too, gets
/// none of DeepSpeed's switches.
#[test]
fn docker_plans_for_the_consumers_in_the_image() {
    let Some(e) = get() else { return };
    let _turn = e.lock();
    e.set_gpuarch_config("");
    let env_of = |image: &str| {
        let o = e.docker(&[
            "run",
            "--rm",
            "--network",
            "none",
            "-e",
            "NVIDIA_VISIBLE_DEVICES=0",
            image,
            "sh",
            "-c",
            "env | grep -E '^(TORCH_CUDA_ARCH_LIST|DS_BUILD_)' | sort",
        ]);
        assert!(o.status.success(), "{o:?}");
        text(&o.stdout)
    };
    let ds = env_of(DEEPSPEED_IMAGE);
    assert_eq!(
        ds,
        "DS_BUILD_CUTLASS_OPS=0\nDS_BUILD_FP_QUANTIZER=0\nDS_BUILD_RAGGED_DEVICE_OPS=0\nTORCH_CUDA_ARCH_LIST=7.5\n"
    );
    let log = e.take_log();
    assert!(
        log.contains("the image's consumers: torch 2.9.1, deepspeed 0.19.8, read from /opt/conda/lib/python3.11/site-packages"),
        "{log}"
    );
    assert_eq!(env_of(IMAGE), "TORCH_CUDA_ARCH_LIST=7.5\n");
    e.take_log();
}

/// Every real Python layout (tests/fixtures/images/layouts) in an image
/// Docker imported, uv's venv on the image's PATH, through gpuarch-runtime
/// on the 3090: as root, and as a user whose home only the image's
/// `/etc/passwd` names, whose `~/.local` holds bitsandbytes. Each
/// environment is read and each consumer named; that user's site only for
/// that user.
#[test]
fn docker_reads_every_python_layout_of_the_image() {
    let Some(e) = get() else { return };
    let _turn = e.lock();
    e.set_gpuarch_config("");
    e.take_log();
    for (user, user_site) in [(None, false), (Some("1000:1000"), true)] {
        let mut args = vec![
            "run",
            "--rm",
            "--network",
            "none",
            "-e",
            "NVIDIA_VISIBLE_DEVICES=1",
        ];
        if let Some(u) = user {
            args.extend(["--user", u]);
        }
        args.extend([
            LAYOUTS_IMAGE,
            "sh",
            "-c",
            "env | grep -E '^(TORCH_CUDA_ARCH_LIST|GPUARCH_ATTN_IMPLEMENTATION)=' | sort",
        ]);
        let o = e.docker(&args);
        assert!(o.status.success(), "{user:?}: {o:?}");
        assert_eq!(
            text(&o.stdout),
            "GPUARCH_ATTN_IMPLEMENTATION=flash_attention_2\nTORCH_CUDA_ARCH_LIST=8.6\n",
            "{user:?}"
        );
        gpuarch_tests::layouts::assert_read(&format!("{user:?}"), &e.take_log(), user_site);
    }
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

#[path = "common/cri.rs"]
mod cri;

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

/// What the JIT tests' containers run: the cache's variable, then a
/// "build" into it unless one is there (`/out/ext`: built or reused).
const JIT_SCRIPT: &str = "echo $TORCH_EXTENSIONS_DIR > /out/tex; e=$TORCH_EXTENSIONS_DIR/ext/ext.so; \
    if [ -z \"$TORCH_EXTENSIONS_DIR\" ]; then echo none > /out/ext; \
    elif [ -e $e ]; then echo reused > /out/ext; \
    else mkdir -p ${e%/*} && echo built > $e && echo built > /out/ext; fi";

/// Per-arch JIT caches under the real engines. containerd's CRI
/// names the image (`io.kubernetes.cri.image-name`): under the default
/// scope two pods of the image on GPU 1 share a cache, a pod on GPU 0 does
/// not. Docker names none: under the default scope it gets no cache (and
/// the log says why), under `scope: uid` two containers on GPU 1 share one.
#[test]
fn jit_caches_under_cri_and_docker() {
    let Some(e) = get() else { return };
    let _turn = e.lock();
    let jit = e.path(&format!("jit-{}", std::process::id()));
    e.set_gpuarch_config(&format!(
        "jit_cache:\n  enable: true\n  dir: {}\n",
        jit.display()
    ));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let id = std::process::id();
    let pod = |name: &str, gpu: &str| {
        let name = format!("{name}-{id}");
        let pods = e.path("pods");
        let p = cri::Pod {
            sock: &e.containerd_sock,
            pods: &pods,
            image: IMAGE,
            name: &name,
            handler: "gpuarch",
            envs: &[("NVIDIA_VISIBLE_DEVICES", gpu)],
            annotations: &[],
            devices: &[],
        };
        rt.block_on(p.run(JIT_SCRIPT)).unwrap();
        let read = |f: &str| {
            std::fs::read_to_string(e.path(&format!("pods/{name}/{f}")))
                .unwrap()
                .trim()
                .to_owned()
        };
        (read("tex"), read("ext"))
    };
    let log = |e: &Engines| e.take_log();
    let (tex, first) = pod("jit-a", "1");
    assert_eq!(tex, "/var/cache/gpuarch/jit/torch_extensions", "{}", log(e));
    assert_eq!(first, "built");
    let said = log(e);
    assert!(
        said.contains(&format!("image {IMAGE}")) || said.contains("image docker.io/library/"),
        "the CRI runtime's image annotation: {said}"
    );
    assert_eq!(pod("jit-b", "1").1, "reused");
    assert_eq!(pod("jit-c", "0").1, "built");
    let caches: Vec<_> = std::fs::read_dir(&jit)
        .unwrap()
        .flatten()
        .flat_map(|s| std::fs::read_dir(s.path()).unwrap().flatten())
        .filter(|c| c.file_type().unwrap().is_dir())
        .map(|c| c.file_name().to_string_lossy().into_owned())
        .collect();
    let mut sorted = caches.clone();
    sorted.sort();
    assert_eq!(sorted, ["sm_75", "sm_86"], "{caches:?}");

    // Docker: no image in the config, so no cache under the default scope.
    let out = e.path("docker-jit");
    std::fs::create_dir_all(&out).unwrap();
    let docker = |e: &Engines| {
        let o = e.docker(&[
            "run",
            "--rm",
            "--network",
            "none",
            "--runtime",
            "gpuarch",
            "-e",
            "NVIDIA_VISIBLE_DEVICES=1",
            "-v",
            &format!("{}:/out", out.display()),
            IMAGE,
            "sh",
            "-c",
            JIT_SCRIPT,
        ]);
        assert!(o.status.success(), "{o:?}");
        std::fs::read_to_string(out.join("ext"))
            .unwrap()
            .trim()
            .to_owned()
    };
    assert_eq!(docker(e), "none");
    assert!(
        log(e).contains("no JIT cache: jit_cache.scope is image, and the runtime names no image")
    );
    e.set_gpuarch_config(&format!(
        "jit_cache:\n  enable: true\n  dir: {}\n  scope: uid\n",
        jit.display()
    ));
    assert_eq!(docker(e), "built");
    assert_eq!(docker(e), "reused");
    let _ = std::fs::remove_dir_all(&jit);
}

/// Seed 000 under Docker (issue "image audit"): an image whose xformers
/// nvcc built for sm_75 alone. gpuarchd (where dockerd's mounts are seen)
/// audits it at its first start; GPU 0 (the 2080 Ti) starts clean; GPU 1
/// (the 3090) starts with the note in gpuarch's log, and with
/// `audit.refuse` its start is refused in Docker's own error, naming the
/// file, its distribution, the GPU and the list to rebuild with.
#[test]
fn docker_refuses_a_gpu_that_cannot_run_the_images_prebuilt_code() {
    let Some(e) = get() else { return };
    let (_python, cuda_home) = match gpuarch_tests::torch_image() {
        Ok(t) => t,
        Err(why) => return gpuarch_tests::skip(&why),
    };
    let _turn = e.lock();
    let scratch = e.scratch();
    let lib = gpuarch_tests::audit::nvcc_library(
        &cuda_home,
        scratch.path(),
        &["arch=compute_75,code=sm_75"],
    );
    let root = scratch.path().join("rootfs");
    let cp = std::process::Command::new("cp")
        .arg("-a")
        .arg(e.path("rootfs"))
        .arg(&root)
        .status()
        .unwrap();
    assert!(cp.success());
    gpuarch_tests::audit::xformers_in(&root, &lib);
    let tar = scratch.path().join("xformers.tar");
    let t = std::process::Command::new("tar")
        .arg("-C")
        .arg(&root)
        .arg("-cf")
        .arg(&tar)
        .arg(".")
        .status()
        .unwrap();
    assert!(t.success());
    let image = "gpuarch.test/xformers-sm75:1";
    let o = e.docker(&[
        "import",
        "--change",
        r#"CMD ["/bin/sh"]"#,
        tar.to_str().unwrap(),
        image,
    ]);
    assert!(o.status.success(), "{o:?}");

    let mut node = gpuarch_tests::daemon::Node::new_in(
        scratch.path(),
        "2080ti-3090",
        gpuarch_tests::daemon::Policy::Shipped,
    );
    let audits = scratch.path().join("audits");
    let audit_yaml = |extra: &str| format!("audit:\n  dir: {}\n{extra}", audits.display());
    std::fs::write(
        node.path("config.yaml"),
        node.private_config(&audit_yaml("")),
    )
    .unwrap();
    node.start_via(&e.in_dockers_mounts(), &[]);
    let run = |gpu: &str| {
        e.docker(&[
            "run",
            "--rm",
            "--network",
            "none",
            "-e",
            &format!("NVIDIA_VISIBLE_DEVICES={gpu}"),
            image,
            "sh",
            "-c",
            "echo ran",
        ])
    };
    // A start waits for the audit (its budget), then is judged.
    e.set_gpuarch_config(&audit_yaml("  wait_ms: 20000\n"));
    let o = run("0");
    assert!(
        o.status.success() && text(&o.stdout) == "ran\n",
        "{o:?}\n{}",
        node.log()
    );
    let log = e.take_log();
    assert!(!log.contains("cannot run it"), "{log}");
    let o = run("1");
    assert!(o.status.success() && text(&o.stdout) == "ran\n", "{o:?}");
    let log = e.take_log();
    assert!(
        log.contains(
            "xformers 0.0.29 \"/usr/local/lib/python3.12/dist-packages/xformers/_C.so\" carries only sm_75: GPU 1 (NVIDIA GeForce RTX 3090, 8.6) cannot run it"
        ),
        "{log}"
    );
    // gpuarchctl why shows it, from the record of that start.
    let records = e.path("containers");
    let newest = std::fs::read_dir(&records)
        .unwrap()
        .flatten()
        .filter(|f| f.file_name().to_string_lossy().ends_with(".json"))
        .max_by_key(|f| f.metadata().unwrap().modified().unwrap())
        .unwrap();
    let id = newest
        .file_name()
        .to_string_lossy()
        .trim_end_matches(".json")
        .to_owned();
    let o = std::process::Command::new(&gpuarch_tests::artifacts().gpuarchctl)
        .args(["why", &id, "--dir"])
        .arg(&records)
        .output()
        .unwrap();
    let why = text(&o.stdout);
    assert!(
        o.status.success()
            && why
                .contains("carries only sm_75: GPU 1 (NVIDIA GeForce RTX 3090, 8.6) cannot run it"),
        "{why}{}",
        text(&o.stderr)
    );

    // The harness's Docker keeps each container's rootfs as a copy (the
    // vfs driver), so each start is an image of its own to the image
    // read's key (with overlay2, one image's containers share it): each
    // start here waits for its own audit.
    e.set_gpuarch_config(&audit_yaml("  wait_ms: 20000\n  refuse: true\n"));
    let o = run("1");
    let err = text(&o.stderr);
    assert!(
        !o.status.success(),
        "the refused start ran: {o:?}\n{}",
        e.take_log()
    );
    assert!(
        err.contains("gpuarch-runtime:")
            && err.contains("audit.refuse: xformers 0.0.29")
            && err.contains("GPU 1 (NVIDIA GeForce RTX 3090, 8.6) cannot run it; rebuild with TORCH_CUDA_ARCH_LIST"),
        "the refusal is not in Docker's error: {err}"
    );
    assert!(!text(&o.stdout).contains("ran"));
    let o = run("0");
    assert!(o.status.success() && text(&o.stdout) == "ran\n", "{o:?}");
    e.set_gpuarch_config("");
    e.take_log();
    let _ = e.docker(&["rmi", image]);
    node.stop();
}
