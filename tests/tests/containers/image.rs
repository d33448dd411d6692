//! The image's own consumers, read from real Python layouts, shape the
//! Plan.

use super::*;

/// The image's own consumers, from real dist-info in its rootfs
/// (tests/fixtures/images), shape the Plan through real runc, behind the
/// shim and with the createContainer hook alone: an image with xformers and
/// no DeepSpeed gets 9.0a on the H100; with DeepSpeed beside it, 9.0 and
/// the note why; an image with DeepSpeed on the 2080 Ti gets the ops that
/// cannot run there switched off; an image without DeepSpeed, none of that.
#[test]
fn the_images_own_consumers_shape_the_plan() {
    need_containers!("runc");
    let mut s = Scene::new();
    let starts = runc_starts();
    // A variable as the container has it: in its env (the shim) or its
    // env file (the hook alone).
    let var = |seen: &Seen, k: &str| seen.ok().var(k).map(str::to_owned);
    let put = |s: &Scene, image: &str| {
        let o = Command::new("cp")
            .arg("-a")
            .arg(image_fixture(image).join("."))
            .arg(s.rootfs())
            .output()
            .unwrap();
        assert!(o.status.success(), "{o:?}");
    };
    let root = s.rootfs();
    let xformers_env = root.join("usr/local/lib/python3.12");
    let deepspeed_env = root.join("opt/conda");
    let h100 = ["NVIDIA_VISIBLE_DEVICES=1"];
    let turing = ["NVIDIA_VISIBLE_DEVICES=0"];
    for (how, start) in starts {
        let _ = std::fs::remove_dir_all(&xformers_env);
        let _ = std::fs::remove_dir_all(&deepspeed_env);
        s.inventory = Some(fixture("a100-h100"));
        s.take_log();
        // No Python environment in the image: the list every torch takes.
        let seen = start(&s, &h100);
        assert_eq!(
            var(&seen, "TORCH_CUDA_ARCH_LIST").as_deref(),
            Some("9.0"),
            "{how}"
        );
        let log = s.take_log();
        assert!(
            log.contains(
                "the image's consumers: none of gpuarch's consumers (no Python environment)"
            ),
            "{how}: {log}"
        );

        put(&s, "xformers");
        let seen = start(&s, &h100);
        assert_eq!(
            var(&seen, "TORCH_CUDA_ARCH_LIST").as_deref(),
            Some("9.0a"),
            "{how}: {}",
            std::fs::read_to_string(s.log_file()).unwrap_or_default()
        );
        let log = s.take_log();
        assert!(
            log.contains(
                "the image's consumers: torch 2.9.1, xformers 0.0.34, read from /usr/local/lib/python3.12/dist-packages"
            ),
            "{how}: {log}"
        );
        // A second start of the same image: the same Plan (from the cache).
        let again = start(&s, &h100);
        assert_eq!(
            var(&again, "TORCH_CUDA_ARCH_LIST").as_deref(),
            Some("9.0a"),
            "{how}"
        );
        s.take_log();

        // DeepSpeed beside it: 9.0a breaks DeepSpeed, 9.0 traps xformers'
        // FlashAttention 3; unset, each builds its own, so it is not set.
        put(&s, "deepspeed");
        let seen = start(&s, &h100);
        assert_eq!(var(&seen, "TORCH_CUDA_ARCH_LIST"), None, "{how}");
        let log = s.take_log();
        assert!(
            log.contains("TORCH_CUDA_ARCH_LIST not set: DeepSpeed 0.19.8 in the image rejects 9.0a, and xformers 0.0.34 built with 9.0 would trap"),
            "{how}: {log}"
        );

        // DeepSpeed on a Turing card: the ops that need Ampere are off.
        s.inventory = Some(fixture("2080ti-3090"));
        let seen = start(&s, &turing);
        for op in [
            "DS_BUILD_FP_QUANTIZER",
            "DS_BUILD_CUTLASS_OPS",
            "DS_BUILD_RAGGED_DEVICE_OPS",
        ] {
            assert_eq!(var(&seen, op).as_deref(), Some("0"), "{how}: {op}");
        }
        assert_eq!(var(&seen, "DS_BUILD_TRANSFORMER_INFERENCE"), None, "{how}");
        // Without DeepSpeed in the image, none of its switches.
        std::fs::remove_dir_all(&deepspeed_env).unwrap();
        let seen = start(&s, &turing);
        assert_eq!(
            var(&seen, "TORCH_CUDA_ARCH_LIST").as_deref(),
            Some("7.5"),
            "{how}"
        );
        assert_eq!(var(&seen, "DS_BUILD_FP_QUANTIZER"), None, "{how}");
        s.take_log();

        // A venv outside every usual place, found only through the
        // process's PATH (as the H100 host's /opt/torch/.venv).
        std::fs::remove_dir_all(&xformers_env).unwrap();
        let venv = root.join("srv/model/.venv");
        let site = venv.join("lib/python3.12/site-packages");
        std::fs::create_dir_all(&site).unwrap();
        let o = Command::new("cp")
            .arg("-a")
            .arg(image_fixture("xformers").join("usr/local/lib/python3.12/dist-packages/."))
            .arg(&site)
            .output()
            .unwrap();
        assert!(o.status.success(), "{o:?}");
        std::fs::write(venv.join("pyvenv.cfg"), "home = /usr/bin\n").unwrap();
        std::fs::create_dir_all(venv.join("bin")).unwrap();
        std::fs::write(venv.join("bin/python3"), "").unwrap();
        s.inventory = Some(fixture("a100-h100"));
        let on_path = ["NVIDIA_VISIBLE_DEVICES=1", "PATH=/srv/model/.venv/bin:/bin"];
        let seen = start(&s, &on_path);
        assert_eq!(
            var(&seen, "TORCH_CUDA_ARCH_LIST").as_deref(),
            Some("9.0a"),
            "{how}"
        );
        let log = s.take_log();
        assert!(
            log.contains("torch 2.9.1, xformers 0.0.34, read from /srv/model/.venv/lib/python3.12/site-packages"),
            "{how}: {log}"
        );
        // Off PATH, nothing leads there: no Python environment is known.
        let seen = start(&s, &h100);
        assert_eq!(
            var(&seen, "TORCH_CUDA_ARCH_LIST").as_deref(),
            Some("9.0"),
            "{how}"
        );
        std::fs::remove_dir_all(root.join("srv")).unwrap();
        s.take_log();
    }
    // The cache held the images' reads, in the test's own directory.
    let cached = std::fs::read_dir(s.path().join("images")).unwrap().count();
    assert!(cached >= 2, "{cached} cache entries");
}

/// Every place real images keep Python, in one rootfs
/// (tests/fixtures/images/layouts, real METADATA): Debian's dist-packages
/// (torch), conda's base (xformers) and a named env (flashinfer-python),
/// uv's `/app/.venv` on PATH (DeepSpeed), root's `~/.local` (accelerate),
/// RHEL's `lib64` (flash-attn), and the `~/.local` of a user whose home
/// only `/etc/passwd` names (bitsandbytes). Through runc behind the shim,
/// runc with the createContainer hook, and podman's precreate hook, as
/// root and (podman) as that user: each environment is read, each
/// consumer named, and the Plan follows them: DeepSpeed, seen only in the
/// venv, beside xformers leaves the H100's torch list unset (9.0a breaks
/// the one, 9.0 traps the other), and flash-attn, seen only in lib64,
/// lets the FlashAttention-2 hint stand.
#[test]
fn every_real_python_layout_is_read() {
    need_containers!("runc");
    let mut s = Scene::new();
    s.inventory = Some(fixture("a100-h100"));
    let o = Command::new("cp")
        .arg("-a")
        .arg(image_fixture("layouts").join("."))
        .arg(s.rootfs())
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let env = [
        "NVIDIA_VISIBLE_DEVICES=1",
        gpuarch_tests::layouts::ENV[0],
        gpuarch_tests::layouts::ENV[1],
    ];
    let check = |how: &str, seen: &Seen, log: &str, user_site: bool| {
        let var = |k: &str| seen.ok().var(k).map(str::to_owned);
        assert_eq!(var("TORCH_CUDA_ARCH_LIST"), None, "{how}");
        assert_eq!(
            var("FLASHINFER_CUDA_ARCH_LIST").as_deref(),
            Some("9.0a"),
            "{how}"
        );
        assert_eq!(
            var("GPUARCH_ATTN_IMPLEMENTATION").as_deref(),
            Some("flash_attention_2"),
            "{how}"
        );
        gpuarch_tests::layouts::assert_read(how, log, user_site);
        assert!(
            log.contains(
                "TORCH_CUDA_ARCH_LIST not set: DeepSpeed 0.19.8 in the image rejects 9.0a"
            ),
            "{how}: {log}"
        );
    };
    for (how, start) in runc_starts() {
        s.take_log();
        let seen = start(&s, &env);
        check(how, &seen, &s.take_log(), false);
    }
    if let Some(why) = gpuarch_tests::cannot_run("to run podman", &["podman"]) {
        return gpuarch_tests::skip(&why);
    }
    let args: Vec<&str> = env.iter().flat_map(|e| ["-e", e]).collect();
    for (how, user) in [
        ("podman, root", None),
        ("podman, uid 1000", Some("1000:1000")),
    ] {
        let mut a = args.clone();
        if let Some(u) = user {
            a.extend(["--user", u]);
        }
        let seen = s.podman(&a);
        check(how, &seen, &s.take_log(), user.is_some());
    }
}
