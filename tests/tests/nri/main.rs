//! gpuarchd as an NRI plugin under real containerd: 2.1 from Debian sid
//! (NRI on by default) and 1.7 from trixie (NRI turned on in its config),
//! each from its engine root (gpuarch_tests::stack), driven through CRI as
//! kubelet drives it. One containerd and one gpuarchd (the fake NVML's
//! 2080 Ti + 3090) per release, shared by that release's cases, which run
//! in order because some stop one or the other.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use gpuarch_tests::stack::{LAYOUTS_IMAGE, PY_IMAGE, layouts_image, python_image};

mod audit;
mod churn;
#[path = "../common/cri.rs"]
mod cri;
mod crio;
mod stack;
use churn::churn;
use stack::{REGISTERED, Stack};

fn cases(suite: &str) {
    let Some(mut s) = Stack::new(suite) else {
        return;
    };
    s.wait_log(REGISTERED, 1);
    let gpu1 = [("NVIDIA_VISIBLE_DEVICES", "1")];

    // No runtimeClassName: NRI gives the Plan, by env and by device node,
    // with the kernel package read-only. No JIT cache: these releases do
    // not tell NRI the pod's user, and a cache made for root is not
    // writable by another (the container keeps its own default).
    let (name, r) = s.pod_run(
        "",
        &gpu1,
        &[],
        "env > /out/env; cat /opt/gpuarch/kernels/demo/manifest.json > /out/manifest; \
         if touch /opt/gpuarch/kernels/demo/x 2>/dev/null; then echo writable; else echo ro; fi > /out/kernels",
    );
    r.unwrap();
    let env = s.out(&name, "env");
    assert_eq!(
        cri::var(&env, "GPUARCH_KERNELS_DIR").as_deref(),
        Some("/opt/gpuarch/kernels"),
        "{env}"
    );
    assert!(s.out(&name, "manifest").contains(r#""package": "demo""#));
    assert_eq!(s.out(&name, "kernels"), "ro");
    assert_eq!(cri::var(&env, "TORCH_EXTENSIONS_DIR"), None, "{env}");
    assert!(
        s.why(&name)
            .contains("no JIT cache: the runtime does not say which user"),
        "{}",
        s.why(&name)
    );
    assert_eq!(
        cri::var(&env, "TORCH_CUDA_ARCH_LIST").as_deref(),
        Some("8.6"),
        "{env}"
    );
    assert_eq!(
        cri::var(&env, "GPUARCH_DTYPE").as_deref(),
        Some("bfloat16"),
        "{env}"
    );
    let why = s.why(&name);
    assert!(why.contains(r#""by": "nri""#), "{why}");
    // An admin sees NRI working: registered, how many planned, the last.
    let o = s.node.ctl(None, &["status"]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        out.contains("nri: registered with containerd")
            && out.contains("container(s) planned, the last "),
        "{out}"
    );
    let o = s.node.ctl(None, &["doctor"]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        out.contains("ok    NRI          registered with containerd"),
        "{out}"
    );

    // An image with Python in its layers: read from them, through the
    // whiteout and the opaque directory, from the venv on PATH and
    // conda's env; twice, the second from what gpuarchd kept.
    python_image(&s.containerd);
    for round in ["read", "kept"] {
        let name = s.read_pod(PY_IMAGE, &gpu1, "env > /out/env");
        let env = s.out(&name, "env");
        assert_eq!(
            cri::var(&env, "GPUARCH_ATTN_IMPLEMENTATION").as_deref(),
            Some("sdpa"),
            "{round}: flash-attn is whited out; gpuarchd on the pod:\n{}\nits env: {env}",
            s.lines_of(&name)
        );
        assert_eq!(
            cri::var(&env, "TORCH_CUDA_ARCH_LIST").as_deref(),
            Some("8.6")
        );
        let log = s.node.log();
        let line = log
            .lines()
            .find(|l| l.contains(&format!("pod=default/{name}: the image's consumers")))
            .unwrap_or_else(|| panic!("{round}: no line on the image's consumers:\n{log}"));
        for want in [
            "torch 2.7.1",
            "xformers 0.0.30",
            "deepspeed 0.18.2",
            "accelerate 1.2.0",
            "bitsandbytes 0.45.0",
            "/app/.venv/lib/python3.12/site-packages",
            "/home/app/.local/lib/python3.12/site-packages",
            "/opt/conda/envs/serve/lib/python3.11/site-packages",
        ] {
            assert!(line.contains(want), "{round}: {want}: {line}");
        }
        assert!(
            !line.contains("flash-attn") && !line.contains("vllm"),
            "{line}"
        );
        let took = log
            .lines()
            .find(|l| l.contains(&format!("pod=default/{name}: TORCH_CUDA_ARCH_LIST")))
            .unwrap_or_default();
        eprintln!("{suite}: the Python image, {round}: {took}");
    }
    // Every place real images keep Python, in one layer: each site read,
    // each consumer named; every passwd user's ~/.local, as NRI does not
    // say which user the pod runs as.
    layouts_image(&s.containerd);
    let (name, r) = s.pod_of(LAYOUTS_IMAGE, "", &gpu1, &[], &[], "env > /out/env");
    r.unwrap();
    let env = s.out(&name, "env");
    assert_eq!(
        cri::var(&env, "TORCH_CUDA_ARCH_LIST").as_deref(),
        Some("8.6"),
        "{env}"
    );
    assert_eq!(
        cri::var(&env, "GPUARCH_ATTN_IMPLEMENTATION").as_deref(),
        Some("flash_attention_2"),
        "flash-attn is in lib64: {env}"
    );
    // NRI does not say which user: app's site is read too.
    let log = s.node.log();
    let mine: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(&format!("pod=default/{name}: the image's consumers")))
        .collect();
    gpuarch_tests::layouts::assert_read(suite, &mine.join("\n"), true);
    let node0 = s.dev.join("nvidia0");
    let (_, env) = s.pod("", &[], &[(&node0, "/dev/nvidia0")]);
    let env = env.unwrap();
    assert_eq!(
        cri::var(&env, "TORCH_CUDA_ARCH_LIST").as_deref(),
        Some("7.5"),
        "{env}"
    );
    // The container's own value wins.
    let (_, env) = s.pod("", &[gpu1[0], ("TORCH_CUDA_ARCH_LIST", "8.0")], &[]);
    assert_eq!(
        cri::var(&env.unwrap(), "TORCH_CUDA_ARCH_LIST").as_deref(),
        Some("8.0")
    );
    let (_, env) = s.pod("", &[gpu1[0], ("GPUARCH_DISABLE", "1")], &[]);
    assert_eq!(cri::var(&env.unwrap(), "TORCH_CUDA_ARCH_LIST"), None);

    // A CDI device, as the NVIDIA device plugin's CDI mode asks for it.
    let (name, r) = s.pod_with(
        "",
        &[],
        &[("cdi.k8s.io/gpu", "nvidia.com/gpu=1")],
        &[],
        "env > /out/env; ls /dev/nvidia1 > /out/dev",
    );
    r.unwrap();
    assert_eq!(
        s.out(&name, "dev"),
        "/dev/nvidia1",
        "the CDI device was injected"
    );
    let env = s.out(&name, "env");
    assert_eq!(
        cri::var(&env, "TORCH_CUDA_ARCH_LIST").as_deref(),
        Some("8.6"),
        "{env}"
    );
    // What this release shows the plugin: the device injected already, or
    // its CDI name (both are planned alike).
    let log = s.node.log();
    let shown = log
        .lines()
        .find(|l| l.contains(&format!("pod=default/{name}:")) && l.contains("device nodes"))
        .unwrap_or_default();
    eprintln!("{suite}: a CDI pod as NRI shows it: {shown}");

    // The gpuarch handler as well: the shim's Plan alone, once.
    let (name, env) = s.pod("gpuarch", &gpu1, &[]);
    let env = env.unwrap();
    assert_eq!(
        env.lines()
            .filter(|l| l.starts_with("TORCH_CUDA_ARCH_LIST="))
            .count(),
        1,
        "{env}"
    );
    assert_eq!(
        cri::var(&env, "TORCH_CUDA_ARCH_LIST").as_deref(),
        Some("8.6"),
        "{env}"
    );
    let why = s.why(&name);
    assert!(why.contains(r#""by": "gpuarch-runtime"#), "{why}");
    assert!(
        s.node
            .log()
            .contains("runtime handler gpuarch plans it itself"),
        "{}",
        s.node.log()
    );

    audit::audit(&mut s, suite);
    churn(&mut s, suite);

    // gpuarchd down: pods start, unchanged. Its stop is at once (it waited
    // out a 1 s timer, and every GPU pod of that second went unplanned).
    let sigterm = std::time::SystemTime::now();
    let (status, took) = s.node.stop();
    assert!(status.success(), "{status:?}\n{}", s.node.log());
    // gpuarchd's own part, from its "stopping" to its "stopped" line, is
    // held to 100 ms; what the test saw (the signal's delivery and the
    // reaping too, beside the other suite's pods) is reported.
    let log = s.node.log();
    let own = |what: &str| {
        log.lines()
            .filter(|l| l.ends_with(what) && logged_at(l) >= sigterm)
            .map(logged_at)
            .next()
            .unwrap_or_else(|| panic!("no {what:?} after the SIGTERM:\n{log}"))
    };
    let own = own(" stopped")
        .duration_since(own(" stopping"))
        .unwrap_or_default();
    eprintln!(
        "{suite}: gpuarchd stopped {own:?} after its SIGTERM ({took:?} from the kill to the reaping)"
    );
    assert!(
        own < Duration::from_millis(100),
        "gpuarchd took {own:?} to stop; its log from the SIGTERM on:\n{}",
        log.lines()
            .filter(|l| {
                l.split_whitespace()
                    .next()
                    .and_then(|t| humantime::parse_rfc3339(t).ok())
                    .is_some_and(|t| t >= sigterm)
            })
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        took < Duration::from_secs(1),
        "{took:?} from the kill to the reaping"
    );
    // A restart (systemctl restart, a package upgrade): GPU pods go
    // unplanned from the SIGTERM to the new gpuarchd's registration.
    s.start_gpuarchd(true);
    s.wait_log(REGISTERED, 1);
    let log = s.node.log();
    let line = log.lines().find(|l| l.contains(REGISTERED)).unwrap();
    let gap = logged_at(line).duration_since(sigterm).unwrap_or_default();
    eprintln!("{suite}: a restart of gpuarchd leaves NRI without it for {gap:?}");
    s.node.stop();
    let t = Instant::now();
    let (_, env) = s.pod("", &gpu1, &[]);
    let env = env.unwrap();
    assert_eq!(cri::var(&env, "TORCH_CUDA_ARCH_LIST"), None, "{env}");
    assert!(t.elapsed() < Duration::from_secs(30));

    // NRI off in gpuarch's config: gpuarchd runs, pods get nothing.
    s.start_gpuarchd(false);
    std::thread::sleep(Duration::from_secs(2));
    assert!(!s.node.log().contains(REGISTERED), "{}", s.node.log());
    let (_, env) = s.pod("", &gpu1, &[]);
    assert_eq!(cri::var(&env.unwrap(), "TORCH_CUDA_ARCH_LIST"), None);
}

/// When `line` (a line of gpuarchd's log) was written.
fn logged_at(line: &str) -> std::time::SystemTime {
    let stamp = line.split_whitespace().next().unwrap_or_default();
    humantime::parse_rfc3339(stamp).unwrap_or_else(|e| panic!("{e}: {line}"))
}

#[test]
fn nri_under_containerd_2_1() {
    cases("sid");
}

#[test]
fn nri_under_containerd_1_7() {
    cases("trixie");
}
