//! The image under Docker: its consumers and Python layouts read, and
//! its prebuilt CUDA code audited at start.

use super::*;

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
