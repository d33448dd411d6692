//! Unit tests of `core/src/plan`: Plans for every way a container names
//! its GPUs, and the hints for each consumer.

use super::*;
use crate::select::tests::host;
use crate::software::Dist;

mod software;

fn nvd(value: &str) -> ContainerView {
    ContainerView::with_env([("NVIDIA_VISIBLE_DEVICES", value)])
}

fn cfg() -> EnvConfig {
    EnvConfig::default()
}

/// A GB10 (12.1) beside a B300 (10.3) and a Thor (11.0), in images of
/// several toolkits: the arch lists are what each toolkit can build.
fn blackwell_host() -> Snapshot {
    use crate::select::tests::dev;
    let mut h = host();
    h.devices = vec![
        dev(0, 0, "GPU-gb10", "NVIDIA GB10", "12.1", 0x01),
        dev(1, 1, "GPU-b300", "NVIDIA B300 SXM6 AC", "10.3", 0x21),
        dev(2, 2, "GPU-thor", "NVIDIA Thor", "11.0", 0x41),
        dev(3, 3, "GPU-v100", "Tesla V100-SXM2-16GB", "7.0", 0x61),
    ];
    h
}

/// The arch lists, FLASH_ATTN_CUDA_ARCHS and the notes for a container
/// of `blackwell_host` with env `env` (CUDA_VERSION, PYTORCH_VERSION).
/// With `PYTORCH_VERSION`, the image was read and holds no DeepSpeed, its
/// torch the release that variable names; without it, nothing is known
/// of the image.
fn lists(env: &[(&str, &str)], cfg: &EnvConfig) -> [Option<String>; 3] {
    let mut view = ContainerView::with_env(env.to_vec());
    if view.env_get(crate::software::PYTORCH_VERSION).is_some() {
        view.software.read = vec!["/usr/local/lib/python3.12/dist-packages".into()];
    }
    let p = plan(&view, &blackwell_host(), cfg);
    let get = |k: &str| p.env_get(k).map(str::to_owned);
    [
        get("TORCH_CUDA_ARCH_LIST"),
        get("FLASHINFER_CUDA_ARCH_LIST"),
        Some(p.notes.join("\n")),
    ]
}

/// `NVIDIA_REQUIRE_*` per assigned GPU: a term one GPU fails is a
/// note naming the term and the GPU, and blocking; an image whose
/// requirements hold gets one note and nothing blocking.
#[test]
fn image_requirements_are_checked_on_each_assigned_gpu() {
    let mut h = host();
    h.devices[0].brand = Some("geforce".into());
    h.devices[1].brand = Some("geforce".into());
    h.devices[2].brand = Some("nvidia".into());
    let on = |h: &Snapshot, env: &[(&str, &str)]| {
        plan(&ContainerView::with_env(env.to_vec()), h, &cfg())
    };
    let p = |env: &[(&str, &str)]| on(&h, env);
    // arch>=8.0 holds on the 3090 and the A100 MIG device, not the 2080 Ti.
    let r = p(&[
        ("NVIDIA_VISIBLE_DEVICES", "0,1,MIG-aaaa"),
        ("NVIDIA_REQUIRE_ARCH", "arch>=8.0"),
    ]);
    assert_eq!(
        r.blocking,
        [
            "NVIDIA_REQUIRE_ARCH=\"arch>=8.0\" is not met on GPU 0 (NVIDIA GeForce RTX 2080 Ti, 7.5): \"arch>=8.0\" fails"
        ]
    );
    assert!(
        r.notes
            .iter()
            .any(|n| n.starts_with(&r.blocking[0]) && n.contains("legacy runtime refuses"))
    );
    assert!(!r.is_noop(), "without strict the Plan still applies");
    // NGC's form: the first alternative fails on a 13.0 driver, the
    // brand alternative holds only for a Tesla.
    let ngc = "cuda>=13.1 brand=tesla,driver>=580,driver<581";
    let r = p(&[
        ("NVIDIA_VISIBLE_DEVICES", "1"),
        ("NVIDIA_REQUIRE_CUDA", ngc),
    ]);
    assert_eq!(r.blocking.len(), 1);
    assert!(
        r.blocking[0].ends_with("every alternative fails (\"cuda>=13.1\", \"brand=tesla\")"),
        "{:?}",
        r.blocking
    );
    let mut tesla = h.clone();
    tesla.devices[1].brand = Some("tesla".into());
    let r = on(
        &tesla,
        &[
            ("NVIDIA_VISIBLE_DEVICES", "1"),
            ("NVIDIA_REQUIRE_CUDA", ngc),
        ],
    );
    assert!(r.blocking.is_empty(), "{:?}", r.blocking);
    assert!(r.notes.iter().any(
        |n| n == "the image's requirements (NVIDIA_REQUIRE_CUDA) are met on every assigned GPU"
    ));
    // Legacy CUDA_VERSION; and NVIDIA_DISABLE_REQUIRE turns all off.
    let r = p(&[("NVIDIA_VISIBLE_DEVICES", "0"), ("CUDA_VERSION", "13.2.0")]);
    assert!(
        r.blocking[0].starts_with("CUDA_VERSION=\"cuda>=13.2\" is not met on GPU 0"),
        "{:?}",
        r.blocking
    );
    let r = p(&[
        ("NVIDIA_VISIBLE_DEVICES", "0"),
        ("CUDA_VERSION", "13.2.0"),
        ("NVIDIA_DISABLE_REQUIRE", "1"),
    ]);
    assert!(r.blocking.is_empty());
    // A term NVIDIA cannot read.
    let r = p(&[
        ("NVIDIA_VISIBLE_DEVICES", "1"),
        ("NVIDIA_REQUIRE_CUDA", "cuda==13.0"),
    ]);
    assert!(r.blocking[0].ends_with("\"cuda==13.0\" is not a term NVIDIA's runtime can read"));
}

/// A hostile image: 16 MiB of requirement variables (the most an OCI
/// config holds), each failing on each of 4 GPUs, costs a bounded walk
/// and a bounded Plan.
#[test]
fn a_flood_of_requirements_is_a_bounded_plan() {
    let h = host();
    // Every term is read before the last one fails.
    let long = format!("{},cuda>=99", "arch>=1,".repeat(500));
    let mut env: Vec<(String, String)> = vec![("NVIDIA_VISIBLE_DEVICES".into(), "all".into())];
    let n = (crate::oci::MAX_CONFIG_BYTES as usize) / (long.len() + 24);
    env.extend((0..n).map(|i| (format!("NVIDIA_REQUIRE_X{i}"), long.clone())));
    env.push(("NVIDIA_REQUIRE_BIG".into(), "cuda>=1 ".repeat(10_000)));
    let t = std::time::Instant::now();
    let p = plan(&ContainerView::with_env(env), &h, &cfg());
    let took = t.elapsed();
    assert_eq!(p.blocking.len(), crate::select::MAX_NOTES);
    assert!(
        p.blocking
            .last()
            .unwrap()
            .contains("more requirements not met")
    );
    assert!(p.notes.len() < 64, "{}", p.notes.len());
    assert!(p.blocking.iter().all(|b| b.len() < 400));
    // Over 4 KiB: not walked, reported unreadable.
    let r = plan(
        &ContainerView::with_env([
            ("NVIDIA_VISIBLE_DEVICES", "1"),
            ("NVIDIA_REQUIRE_BIG", &"cuda>=1 ".repeat(10_000)),
        ]),
        &h,
        &cfg(),
    );
    assert!(
        r.blocking[0].contains("not a term NVIDIA's runtime can read"),
        "{:?}",
        r.blocking
    );
    // Measured: 0.2 s in release, 4 s in a debug build, for the 16 MiB
    // walked on each of 3 GPUs; the bound leaves a loaded CI room.
    let bound = if cfg!(debug_assertions) { 60 } else { 3 };
    assert!(took < std::time::Duration::from_secs(bound), "{took:?}");
}

/// A device name that names no GPU of this host blocks (strict refuses
/// it); the GPUs that were found are still planned.
#[test]
fn device_names_of_no_gpu_here_block() {
    let h = host();
    let r = plan(&nvd("7"), &h, &cfg());
    assert_eq!(r.blocking.len(), 1, "{:?}", r.notes);
    assert!(
        r.blocking[0].starts_with("NVIDIA_VISIBLE_DEVICES entry \"7\""),
        "{:?}",
        r.blocking
    );
    assert!(r.is_noop());
    let r = plan(&nvd("1,GPU-nope"), &h, &cfg());
    assert_eq!(r.gpus.len(), 1);
    assert!(r.blocking[0].contains("\"GPU-nope\""));
    assert!(!r.is_noop());
    assert!(plan(&nvd("all"), &h, &cfg()).blocking.is_empty());
    // Thousands of bad names: a bounded reason.
    let many: Vec<String> = (100..5100).map(|i| i.to_string()).collect();
    let r = plan(&nvd(&many.join(",")), &h, &cfg());
    assert_eq!(r.blocking.len(), crate::select::MAX_NOTES);
    assert!(r.blocking.last().unwrap().contains("more device names"));
}

#[test]
fn arch_lists_are_built_for_the_containers_own_toolkit_and_torch() {
    let nvd = |d: &'static str| ("NVIDIA_VISIBLE_DEVICES", d);
    let torch = |v: &'static str| ("PYTORCH_VERSION", v);
    let cuda = |v: &'static str| ("CUDA_VERSION", v);
    // (env, torch list, FlashInfer list, notes each case must have)
    type Case<'a> = (
        &'a [(&'a str, &'a str)],
        Option<&'a str>,
        Option<&'a str>,
        &'a [&'a str],
    );
    let cases: &[Case] = &[
        // The GB10 case: 12.8 builds sm_120, whose SASS runs on 12.1,
        // and torch 2.7 names it; FlashInfer's 12.1a is not built.
        (
            &[nvd("0"), cuda("12.8.1"), torch("2.7.1")],
            Some("12.0"),
            None,
            &[
                "the container's toolkit: CUDA 12.8 (from CUDA_VERSION in the container)",
                "cannot build sm_121: TORCH_CUDA_ARCH_LIST has 12.0 for 12.1",
                "FLASHINFER_CUDA_ARCH_LIST not set",
                "the image's consumers: torch 2.7.1 (torch from PYTORCH_VERSION)",
            ],
        ),
        // Nothing known: a DeepSpeed before 0.16 may be there, which cannot
        // parse 12.0; a name it parses would give the GB10 PTX where torch
        // builds SASS unset: not set.
        (
            &[nvd("0"), cuda("12.8.1")],
            None,
            None,
            &[
                "TORCH_CUDA_ARCH_LIST not set: a DeepSpeed may be in the image",
                "cannot parse 12.0, torch's SASS for 12.1; a list it parses would give 12.1 older code than torch builds unset",
                "the image's consumers are not known",
            ],
        ),
        (
            &[nvd("0,1,2"), torch("2.15.0")],
            Some("10.3;11.0;12.1"),
            Some("10.3a 11.0a 12.1a"),
            &[],
        ),
        (
            &[nvd("0,1,2")],
            None,
            Some("10.3a 11.0a 12.1a"),
            &["cannot parse 10.0, torch's SASS for 10.3"],
        ),
        // 12.9 names Thor sm_101: torch 2.8 takes that name...
        (
            &[nvd("0,1,2"), cuda("12.9.0"), torch("2.8.0")],
            Some("10.1;10.3;12.1"),
            Some("10.1a 10.3a 12.1a"),
            &["CUDA 12.9 (CUDA_VERSION in the container) names the architecture of 11.0 sm_101"],
        ),
        // ...torch 2.9 does not: sm_100 with its PTX, which runs on Thor
        // whichever name its driver gives it.
        (
            &[nvd("2"), cuda("12.9.0"), torch("2.9.1")],
            Some("10.0+PTX"),
            Some("10.1a"),
            &[
                "torch 2.9.1 in the image does not take 10.1: TORCH_CUDA_ARCH_LIST has 10.0+PTX for 11.0",
            ],
        ),
        (
            &[nvd("0,1,2"), cuda("12.8"), torch("2.7.1")],
            Some("10.0;10.1;12.0"),
            Some("10.1a"),
            &["cannot build sm_103: TORCH_CUDA_ARCH_LIST has 10.0 for 10.3 (its SASS runs there)"],
        ),
        (
            &[
                nvd("0,1,2"),
                ("NVIDIA_REQUIRE_CUDA", "cuda>=12.6 brand=tesla,driver>=470"),
                torch("2.6.0"),
            ],
            Some("9.0+PTX"),
            None,
            &["9.0+PTX for 12.1, which the driver JIT-compiles there"],
        ),
        // The container's own list still wins.
        (
            &[
                nvd("0"),
                cuda("12.8.1"),
                torch("2.7.1"),
                ("TORCH_CUDA_ARCH_LIST", "12.0+PTX"),
            ],
            None,
            None,
            &["TORCH_CUDA_ARCH_LIST left as the container sets it"],
        ),
    ];
    for (env, want_torch, want_fi, want_notes) in cases {
        let [torch, fi, notes] = lists(env, &cfg());
        let notes = notes.unwrap();
        assert_eq!(torch.as_deref(), *want_torch, "{env:?}\n{notes}");
        assert_eq!(fi.as_deref(), *want_fi, "{env:?}\n{notes}");
        for n in *want_notes {
            assert!(notes.contains(n), "{env:?}: no {n:?} in\n{notes}");
        }
    }
    // Two B200s, torch not known: their own 10.0 wherever no DeepSpeed
    // that cannot parse it may be there, with any toolkit that builds it
    // or none known; the older torches that reject 10.0 have no kernels
    // for a B200 anyway.
    let mut h = host();
    h.devices = vec![
        crate::select::tests::dev(0, 0, "GPU-b200-0", "NVIDIA B200", "10.0", 0x01),
        crate::select::tests::dev(1, 1, "GPU-b200-1", "NVIDIA B200", "10.0", 0x02),
    ];
    let b200 = |env: &[(&str, &str)], ds: Option<&str>, read: bool| {
        let mut v = ContainerView::with_env(env.to_vec());
        if let Some(ds) = ds {
            v.software.dists.insert(
                Dist::DeepSpeed,
                crate::software::Release::parse(ds).unwrap(),
            );
        }
        if read {
            v.software
                .read
                .push("/app/.venv/lib/python3.12/site-packages".into());
        }
        let p = plan(&v, &h, &cfg());
        (
            p.env_get("TORCH_CUDA_ARCH_LIST").map(str::to_owned),
            p.notes.join("\n"),
        )
    };
    for env in [
        &[nvd("0,1"), cuda("12.8.1")][..],
        &[nvd("0,1"), cuda("13.0.2")],
        &[nvd("0,1")],
    ] {
        assert_eq!(b200(env, None, true).0.as_deref(), Some("10.0"), "{env:?}");
        assert_eq!(
            b200(env, Some("0.19.8"), true).0.as_deref(),
            Some("10.0"),
            "{env:?}"
        );
        // A DeepSpeed that cannot parse 10.0, there or maybe there: no
        // list serves it and torch's native code both; unset does.
        for (ds, read) in [(Some("0.15.4"), true), (None, false)] {
            let (list, notes) = b200(env, ds, read);
            assert_eq!(list, None, "{env:?} {ds:?}");
            assert!(
                notes.contains("whose op builder cannot parse 10.0, torch's SASS for 10.0"),
                "{notes}"
            );
        }
    }
    // Under a toolkit that cannot build it, as before: Hopper PTX; beside
    // a DeepSpeed 0.15 too, as torch could have no SASS there either.
    for ds in [None, Some("0.15.4")] {
        let (list, _) = b200(&[nvd("0,1"), cuda("12.6.3")], ds, true);
        assert_eq!(list.as_deref(), Some("9.0+PTX"), "{ds:?}");
    }
    // CUDA 13 dropped Volta: left out, the rest kept; from the config.
    let with_default = EnvConfig {
        cuda_version: Some(crate::arch::CudaVersion::new(13, 0)),
        ..EnvConfig::default()
    };
    let [torch, fi, notes] = lists(&[nvd("2,3"), torch("2.9.1")], &with_default);
    let notes = notes.unwrap();
    assert_eq!(
        (torch.as_deref(), fi.as_deref()),
        (Some("11.0"), Some("11.0a"))
    );
    assert!(
        notes.contains("nothing that runs on 7.0 is both built and taken"),
        "{notes}"
    );
    assert!(
        notes.contains("from env.cuda_version in the config"),
        "{notes}"
    );
    let [torch, fi, notes] = lists(&[nvd("3")], &with_default);
    assert_eq!((torch, fi), (None, None));
    assert!(notes.unwrap().contains("TORCH_CUDA_ARCH_LIST not set"));
}

#[test]
fn flash_attention_hints_agree_with_what_flash_attn_builds() {
    let h = blackwell_host();
    let on = |h: &Snapshot, env: &[(&str, &str)]| {
        plan(&ContainerView::with_env(env.to_vec()), h, &cfg())
    };
    let p = |env: &[(&str, &str)]| on(&h, env);
    let fa = |env: &[(&str, &str)]| p(env).env_get("FLASH_ATTN_CUDA_ARCHS").map(str::to_owned);
    assert_eq!(
        fa(&[("NVIDIA_VISIBLE_DEVICES", "0,1")]).as_deref(),
        Some("100;120")
    );
    // Thor: desktop SASS runs on a Tegra GPU under neither name (10.1 to
    // CUDA 12, 11.0 to CUDA 13); nor FlashAttention-2 hinted.
    for cuda in ["12.9", "13.0"] {
        let plan = p(&[("NVIDIA_VISIBLE_DEVICES", "2"), ("CUDA_VERSION", cuda)]);
        assert_eq!(plan.env_get("FLASH_ATTN_CUDA_ARCHS"), None, "{cuda}");
        assert_eq!(
            plan.env_get("GPUARCH_ATTN_IMPLEMENTATION"),
            Some("sdpa"),
            "{cuda}"
        );
        let notes = plan.notes.join("\n");
        assert!(
            notes.contains("none runs on 11.0 (an integrated Tegra GPU: desktop SASS does not run there)")
                && notes.contains("GPUARCH_ATTN_IMPLEMENTATION=sdpa: flash-attn builds nothing that runs on GPU 2 (NVIDIA Thor, 11.0)"),
            "{notes}"
        );
    }
    assert_eq!(
        fa(&[("NVIDIA_VISIBLE_DEVICES", "0,3")]),
        None,
        "Volta: no FA2"
    );
    assert_eq!(
        fa(&[("NVIDIA_VISIBLE_DEVICES", "0"), ("CUDA_VERSION", "12.6.3")]),
        None,
        "sm_120 needs CUDA 12.8 in flash-attn's build"
    );
    let p = plan(&nvd("1,2"), &super::tests::host(), &cfg());
    assert_eq!(
        p.env_get("FLASH_ATTN_CUDA_ARCHS"),
        Some("80"),
        "8.6 and 8.0: 80 once"
    );
}

#[test]
fn turing_beside_ampere_gets_the_lowest_common_hints() {
    let p = plan(&nvd("0,1"), &host(), &cfg());
    let want = [
        ("TORCH_CUDA_ARCH_LIST", "7.5;8.6"),
        ("FLASHINFER_CUDA_ARCH_LIST", "7.5 8.6"),
        ("CUDA_DEVICE_ORDER", "PCI_BUS_ID"),
        ("GPUARCH_COMPUTE_CAPABILITIES", "7.5,8.6"),
        ("GPUARCH_MIN_COMPUTE_CAPABILITY", "7.5"),
        ("GPUARCH_DTYPE", "float16"),
        ("GPUARCH_ATTN_IMPLEMENTATION", "sdpa"),
        ("GPUARCH_TF32", "0"),
        ("GPUARCH_FP8", "0"),
    ];
    let got: Vec<(&str, &str)> = p
        .env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(got, want);
    assert!(
        p.notes.iter().any(|n| n.contains("GPUARCH_DTYPE=float16")
            && n.contains("GPU 0 (NVIDIA GeForce RTX 2080 Ti, 7.5) lacks it")),
        "{:?}",
        p.notes
    );
}

#[test]
fn the_3090_alone_gets_bf16_and_flash_attention_2() {
    let p = plan(&nvd("1"), &host(), &cfg());
    assert_eq!(p.env_get("TORCH_CUDA_ARCH_LIST"), Some("8.6"));
    assert_eq!(p.env_get("GPUARCH_DTYPE"), Some("bfloat16"));
    assert_eq!(
        p.env_get("GPUARCH_ATTN_IMPLEMENTATION"),
        Some("flash_attention_2")
    );
    assert_eq!(p.env_get("GPUARCH_TF32"), Some("1"));
    assert_eq!(p.env_get("GPUARCH_FP8"), Some("0"));
    assert!(
        p.notes
            .iter()
            .any(|n| n.contains("every assigned GPU has bf16"))
    );
}

#[test]
fn an_explicit_device_list_is_planned_as_the_same_request_is() {
    let inv = host();
    let empty = ContainerView::default();
    for (devices, list) in [
        (&["1", "0"][..], "1,0"),
        (&["all"][..], "all"),
        (&["0", " 0 ", "all"][..], "0,0,all"),
    ] {
        let strict = plan_devices(devices, &inv, &cfg()).unwrap();
        assert_eq!(
            strict,
            plan_request(list, &empty, &inv, &cfg()),
            "{devices:?}"
        );
        assert!(strict.blocking.is_empty() && strict.notes.iter().all(|n| !n.contains("ignored")));
    }
    assert_eq!(
        plan_devices(&["1"], &inv, &cfg())
            .unwrap()
            .env_get("TORCH_CUDA_ARCH_LIST"),
        Some("8.6")
    );
    // Where the request notes and skips a bad name, the list refuses it.
    let e = plan_devices(&["0", "7"], &inv, &cfg()).unwrap_err();
    assert!(
        matches!(&e, DeviceListError::Unknown { name, .. } if name == "7"),
        "{e}"
    );
    assert!(matches!(
        plan_devices(&["0,1"], &inv, &cfg()),
        Err(DeviceListError::Unknown { .. })
    ));
}

#[test]
fn capabilities_follow_cuda_order_and_the_arch_list_is_sorted() {
    let v = ContainerView::with_env([
        ("NVIDIA_VISIBLE_DEVICES", "all"),
        ("CUDA_VISIBLE_DEVICES", "2,0,1"),
    ]);
    let p = plan(&v, &host(), &cfg());
    assert_eq!(
        p.env_get("GPUARCH_COMPUTE_CAPABILITIES"),
        Some("8.0,7.5,8.6")
    );
    assert_eq!(p.env_get("TORCH_CUDA_ARCH_LIST"), Some("7.5;8.0;8.6"));
}

#[test]
fn mig_devices_take_their_parents_capability() {
    let p = plan(&nvd("MIG-bbbb"), &host(), &cfg());
    assert_eq!(p.env_get("TORCH_CUDA_ARCH_LIST"), Some("8.0"));
    assert_eq!(p.gpus[0].mig, Some(1));
}

#[test]
fn container_values_win_unless_override() {
    let v = ContainerView::with_env([
        ("NVIDIA_VISIBLE_DEVICES", "0,1"),
        ("TORCH_CUDA_ARCH_LIST", "8.0"),
        ("CUDA_DEVICE_ORDER", "FASTEST_FIRST"),
    ]);
    let p = plan(&v, &host(), &cfg());
    assert_eq!(p.env_get("TORCH_CUDA_ARCH_LIST"), None);
    assert_eq!(p.env_get("CUDA_DEVICE_ORDER"), None);
    assert_eq!(p.env_get("GPUARCH_DTYPE"), Some("float16"));
    assert!(
        p.notes
            .iter()
            .any(|n| n.contains("TORCH_CUDA_ARCH_LIST left as the container sets it (\"8.0\""))
    );
    assert!(
        p.notes
            .iter()
            .any(|n| n.contains("may number the GPUs differently"))
    );

    let over = EnvConfig {
        override_existing: true,
        ..cfg()
    };
    let p = plan(&v, &host(), &over);
    assert_eq!(p.env_get("TORCH_CUDA_ARCH_LIST"), Some("7.5;8.6"));
    assert!(
        p.notes
            .iter()
            .any(|n| n.contains("overrides the container's \"8.0\""))
    );
}

#[test]
fn accelerates_mixed_precision_only_when_the_config_enables_it() {
    assert_eq!(
        plan(&nvd("0,1"), &host(), &cfg()).env_get("ACCELERATE_MIXED_PRECISION"),
        None
    );
    let on = EnvConfig {
        enable: [EnvVar::AccelerateMixedPrecision].into(),
        ..cfg()
    };
    let p = plan(&nvd("0,1"), &host(), &on);
    assert_eq!(p.env_get("ACCELERATE_MIXED_PRECISION"), Some("fp16"));
    assert!(
        p.notes
            .iter()
            .any(|n| n.starts_with("ACCELERATE_MIXED_PRECISION=fp16: bf16 needs")),
        "{:?}",
        p.notes
    );
    let p = plan(&nvd("1"), &host(), &on);
    assert_eq!(p.env_get("ACCELERATE_MIXED_PRECISION"), Some("bf16"));
    // The container's own choice stays.
    let mine = ContainerView::with_env([
        ("NVIDIA_VISIBLE_DEVICES", "1"),
        ("ACCELERATE_MIXED_PRECISION", "no"),
    ]);
    assert_eq!(
        plan(&mine, &host(), &on).env_get("ACCELERATE_MIXED_PRECISION"),
        None
    );
}

#[test]
fn the_config_switches_variables_off() {
    let c = EnvConfig {
        disable: [EnvVar::Fp8, EnvVar::CudaDeviceOrder].into(),
        ..cfg()
    };
    let p = plan(&nvd("1"), &host(), &c);
    assert_eq!(p.env_get("GPUARCH_FP8"), None);
    assert_eq!(p.env_get("CUDA_DEVICE_ORDER"), None);
    // The 3090: FLASH_ATTN_CUDA_ARCHS too, sm_80's SASS running on 8.6.
    assert_eq!(p.env_get("FLASH_ATTN_CUDA_ARCHS"), Some("80"));
    assert_eq!(p.env.len(), 8);
    assert!(
        p.notes
            .iter()
            .any(|n| n == "GPUARCH_FP8 not set: disabled in the config (env.disable)")
    );
}

#[test]
fn opt_outs_change_nothing() {
    let v = ContainerView::with_env([("NVIDIA_VISIBLE_DEVICES", "all"), ("GPUARCH_DISABLE", "1")]);
    let p = plan(&v, &host(), &cfg());
    assert!(p.is_noop() && p.gpus.is_empty());
    assert!(p.notes[0].contains("GPUARCH_DISABLE=1"));

    let mut v = nvd("all");
    v.annotations
        .insert("io.gpuarch.disable".into(), "true".into());
    let p = plan(&v, &host(), &cfg());
    assert!(p.is_noop());
    assert!(p.notes[0].contains("io.gpuarch.disable"));

    // "0" is not an opt-out.
    let v = ContainerView::with_env([("NVIDIA_VISIBLE_DEVICES", "all"), ("GPUARCH_DISABLE", "0")]);
    assert!(!plan(&v, &host(), &cfg()).is_noop());
}

#[test]
fn no_gpu_means_no_change() {
    for v in [ContainerView::default(), nvd("none"), nvd("void"), nvd("7")] {
        let p = plan(&v, &host(), &cfg());
        assert!(p.is_noop(), "{v:?}");
        assert!(
            p.notes.last().unwrap().contains("nothing changes"),
            "{:?}",
            p.notes
        );
    }
}

#[test]
fn fp8_needs_every_gpu_at_8_9() {
    assert_eq!(
        hints(&[ComputeCapability::new(8, 9), ComputeCapability::new(9, 0)])
            .iter()
            .find(|(v, _)| *v == EnvVar::Fp8)
            .map(|(_, x)| x.as_str()),
        Some("1")
    );
}

#[test]
fn plan_serialises_env_as_an_ordered_object() {
    let p = plan(&nvd("1"), &host(), &cfg());
    let j = serde_json::to_string(&p).unwrap();
    let t = j.find("TORCH_CUDA_ARCH_LIST").unwrap();
    let f = j.find("GPUARCH_FP8").unwrap();
    assert!(t < f, "{j}");
    assert!(j.contains("\"source\":\"nvidia_visible_devices\""), "{j}");
}
