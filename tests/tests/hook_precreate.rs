//! `gpuarch-hook precreate` as podman runs it: config on stdin, config on
//! stdout, the exit status deciding whether the container starts.

#![allow(clippy::unwrap_used)] // test helpers: a failed unwrap is a failed test

use std::process::{Command, Output};

use gpuarch_tests::{artifacts, fixture};
use serde_json::{Value, json};

fn hook(stdin: &[u8], config_yaml: &str) -> Output {
    hook_on(stdin, config_yaml, &fixture("2080ti-3090"))
}

/// The hook with `GPUARCH_INVENTORY` naming `inventory`.
fn hook_on(stdin: &[u8], config_yaml: &str, inventory: &std::path::Path) -> Output {
    hook_env(
        stdin,
        config_yaml,
        &[("GPUARCH_INVENTORY", inventory.as_os_str())],
    )
}

/// The hook with `env` added to this process's, less `GPUARCH_INVENTORY`.
fn hook_env(stdin: &[u8], config_yaml: &str, env: &[(&str, &std::ffi::OsStr)]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.yaml");
    std::fs::write(&cfg, config_yaml).unwrap();
    gpuarch_tests::output_with_stdin(
        Command::new(&artifacts().gpuarch_hook)
            .arg("precreate")
            .env_remove("GPUARCH_INVENTORY")
            .envs(env.iter().copied())
            .env("GPUARCH_CONFIG", &cfg)
            .env("GPUARCH_LOG", "stderr"),
        stdin,
    )
}

fn config(env: &[&str]) -> Value {
    json!({"ociVersion": "1.2.0", "process": {"args": ["sh"], "env": env},
           "root": {"path": "rootfs"}, "x-vendor": {"keep": [1, "two"]}})
}

#[test]
fn the_plan_reaches_the_config() {
    let o = hook(
        config(&["NVIDIA_VISIBLE_DEVICES=1"]).to_string().as_bytes(),
        "",
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out: Value = serde_json::from_slice(&o.stdout).unwrap();
    let env = out["process"]["env"].to_string();
    assert!(env.contains("TORCH_CUDA_ARCH_LIST=8.6"), "{env}");
    assert!(
        env.contains("GPUARCH_ATTN_IMPLEMENTATION=flash_attention_2"),
        "{env}"
    );
    assert_eq!(out["x-vendor"], json!({"keep": [1, "two"]}));
    let log = String::from_utf8_lossy(&o.stderr);
    assert!(
        log.contains("GPU 1 (NVIDIA GeForce RTX 3090, 8.6)"),
        "{log}"
    );
}

#[test]
fn a_bad_config_fails_open_with_the_input_unchanged() {
    let bad = b"{\"process\": {\"env\": [\"A=1\",]}}";
    let o = hook(bad, "");
    assert!(o.status.success());
    assert_eq!(o.stdout, bad);
    let log = String::from_utf8_lossy(&o.stderr);
    assert!(
        log.contains("line 1") && log.contains("starts unchanged"),
        "{log}"
    );
}

#[test]
fn strict_refuses_instead() {
    let o = hook(b"{\"process\": ", "strict: true\n");
    assert_eq!(o.status.code(), Some(1));
    assert!(o.stdout.is_empty());
    assert!(String::from_utf8_lossy(&o.stderr).contains("strict"));
}

#[test]
fn a_broken_gpuarch_config_fails_open() {
    let input = config(&["NVIDIA_VISIBLE_DEVICES=1"]).to_string();
    let o = hook(input.as_bytes(), "strict: maybe\n");
    assert!(o.status.success());
    assert_eq!(o.stdout, input.as_bytes());
    let log = String::from_utf8_lossy(&o.stderr);
    assert!(
        log.contains("config.yaml") && log.contains("line 1"),
        "{log}"
    );
}

#[test]
fn an_oversized_config_streams_through_unchanged_or_fails_strict() {
    // 17 MiB: over the 16 MiB bound, valid JSON, GPUs requested.
    let mut input =
        b"{\"process\": {\"env\": [\"NVIDIA_VISIBLE_DEVICES=1\"]}, \"pad\": \"".to_vec();
    input.resize(17 << 20, b'x');
    input.extend_from_slice(b"\"}");
    let o = hook(&input, "");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(o.stdout == input, "output differs from the input");
    assert!(String::from_utf8_lossy(&o.stderr).contains("over 16 MiB"));
    let o = hook(&input, "strict: true\n");
    assert_eq!(o.status.code(), Some(1));
    assert!(o.stdout.is_empty());
}

/// The hook with stdin from `input`, run by `peak-rss` (tests/src/bin):
/// its output, log, peak resident memory (KiB) and time.
fn hook_measured(
    input: &std::path::Path,
    config_yaml: &str,
) -> (Vec<u8>, String, u64, std::time::Duration) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.yaml");
    std::fs::write(&cfg, config_yaml).unwrap();
    let peak = dir.path().join("peak");
    let t0 = std::time::Instant::now();
    let o = Command::new(env!("CARGO_BIN_EXE_peak-rss"))
        .arg(&peak)
        .arg(&artifacts().gpuarch_hook)
        .arg("precreate")
        .env("GPUARCH_INVENTORY", fixture("2080ti-3090"))
        .env("GPUARCH_CONFIG", &cfg)
        .env("GPUARCH_LOG", "stderr")
        .stdin(std::fs::File::open(input).unwrap())
        .output()
        .unwrap();
    let took = t0.elapsed();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "hook failed: {err}");
    let kib = std::fs::read_to_string(&peak).unwrap().parse().unwrap();
    (o.stdout, err, kib, took)
}

/// A config of about `mib` MiB in `shape` (0: one long string, 1:
/// annotations, 2: env entries), written to `path`.
fn big_config(shape: usize, mib: usize, path: &std::path::Path) {
    let mut c = config(&["NVIDIA_VISIBLE_DEVICES=1"]);
    // An annotation or env entry takes 50 to 60 bytes.
    let n = (mib << 20) / 60;
    match shape {
        0 => c["pad"] = json!("x".repeat(mib << 20)),
        1 => {
            c["process"]["env"] = json!(["PATH=/bin"]);
            c["annotations"] = (0..n)
                .map(|i| (format!("org.example/a{i}"), json!("v".repeat(30))))
                .chain([("cdi.k8s.io/gpu".to_owned(), json!("nvidia.com/gpu=1"))])
                .collect::<serde_json::Map<String, Value>>()
                .into();
        }
        _ => {
            let mut env: Vec<String> = (0..n).map(|i| format!("V{i}={}", "v".repeat(36))).collect();
            env.push("NVIDIA_VISIBLE_DEVICES=1".to_owned());
            c["process"]["env"] = json!(env);
        }
    }
    std::fs::write(path, serde_json::to_vec(&c).unwrap()).unwrap();
}

const SHAPES: [&str; 3] = ["one long string", "annotations", "env entries"];

/// Configs of 50 MiB in three shapes (one long string, a million
/// annotations, a million env entries): over the 16 MiB bound, so they
/// stream through unchanged in little memory, or with strict the start
/// fails saying why. Just under the bound (15 MiB) they are parsed and
/// planned, every field but process.env coming back as it was, in at most
/// ten times their size.
#[test]
fn a_50_mib_config_streams_through_and_a_15_mib_one_is_planned_in_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("config.json");
    for (shape, name) in SHAPES.into_iter().enumerate() {
        big_config(shape, 50, &input);
        let size = std::fs::metadata(&input).unwrap().len();
        let (out, log, rss_kib, took) = hook_measured(&input, "");
        eprintln!(
            "50 MiB, {name}: streamed through, the hook's peak RSS {} MiB, {took:?}",
            rss_kib >> 10,
        );
        assert!(log.contains("over 16 MiB; not planning it"), "{log}");
        assert!(out == std::fs::read(&input).unwrap(), "{name}: changed");
        assert!(rss_kib < 40 << 10, "{name}: {rss_kib} KiB for {size} bytes");

        let o = hook(&std::fs::read(&input).unwrap(), "strict: true\n");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{name}: {err}");
        assert!(
            err.contains("over 16 MiB") && err.contains("strict"),
            "{err}"
        );
        assert!(o.stdout.is_empty());
    }
    for (shape, name) in SHAPES.into_iter().enumerate() {
        big_config(shape, 15, &input);
        let size = std::fs::metadata(&input).unwrap().len();
        assert!(size < 16 << 20, "{name}: {size}");
        let (out, log, rss_kib, took) = hook_measured(&input, "hook:\n  timeout_ms: 60000\n");
        eprintln!(
            "15 MiB, {name}: planned, the hook's peak RSS {} MiB ({:.1}x), {took:?}",
            rss_kib >> 10,
            (rss_kib << 10) as f64 / size as f64,
        );
        assert!(
            rss_kib << 10 < 10 * size,
            "{name}: {rss_kib} KiB for {size} bytes"
        );
        let mut got: Value = serde_json::from_slice(&out).unwrap();
        let env = got["process"]["env"].to_string();
        assert!(env.contains("TORCH_CUDA_ARCH_LIST=8.6"), "{name}: {log}");
        let mut c: Value = serde_json::from_slice(&std::fs::read(&input).unwrap()).unwrap();
        c["process"]["env"] = Value::Null;
        got["process"]["env"] = Value::Null;
        assert!(got == c, "{name}: a field other than process.env changed");
    }
}

/// The snapshot the hook reads is missing, truncated, empty or from a newer
/// gpuarch: the container starts unchanged, with the reason logged, well
/// within the hook's budget; with strict its start fails, saying why.
#[test]
fn a_broken_snapshot_fails_open_or_strict_within_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read(fixture("2080ti-3090")).unwrap();
    let mut future: Value = serde_json::from_slice(&good).unwrap();
    future["schema"] = json!(99);
    let cases: [(&str, Option<Vec<u8>>, &str); 4] = [
        ("missing", None, "No such file"),
        (
            "truncated",
            Some(good[..good.len() / 2].to_vec()),
            "not valid JSON",
        ),
        ("empty", Some(Vec::new()), "not valid JSON"),
        (
            "future",
            Some(future.to_string().into_bytes()),
            "schema 99; this gpuarch reads schema 1",
        ),
    ];
    let input = config(&["NVIDIA_VISIBLE_DEVICES=1"]).to_string();
    for (name, bytes, reason) in cases {
        let path = dir.path().join(format!("{name}.json"));
        if let Some(b) = bytes {
            std::fs::write(&path, b).unwrap();
        }
        let t0 = std::time::Instant::now();
        let o = hook_on(input.as_bytes(), "hook:\n  timeout_ms: 1000\n", &path);
        let took = t0.elapsed();
        let log = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{name}: {log}");
        assert_eq!(o.stdout, input.as_bytes(), "{name}: config changed");
        assert!(
            log.contains(reason) && log.contains("starts unchanged"),
            "{name}: {log}"
        );
        assert!(
            took < std::time::Duration::from_millis(1000),
            "{name}: {took:?}"
        );

        let o = hook_on(input.as_bytes(), "strict: true\n", &path);
        let log = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{name}: {log}");
        assert!(o.stdout.is_empty(), "{name}");
        assert!(
            log.contains(reason) && log.contains("strict"),
            "{name}: {log}"
        );
    }
}

/// No snapshot, and NVML hangs: precreate gives up on it after the budget
/// and passes the config through unchanged, saying why; with strict the
/// start fails.
#[test]
fn a_hung_nvml_costs_precreate_at_most_the_budget() {
    // The config names a snapshot that is not there, whatever the host's
    // /run/gpuarch holds: the hook must ask NVML.
    let none = tempfile::tempdir().unwrap();
    let topology = fixture("2080ti-3090");
    let env = [
        ("GPUARCH_NVML_LIB", artifacts().fake_nvml.as_os_str()),
        ("FAKE_NVML_TOPOLOGY", topology.as_os_str()),
        ("FAKE_NVML_SLEEP", "nvmlInit_v2=20000".as_ref()),
    ];
    let input = config(&["NVIDIA_VISIBLE_DEVICES=1"]).to_string();
    for strict in [false, true] {
        let yaml = format!(
            "strict: {strict}\nhook:\n  timeout_ms: 300\ndaemon:\n  snapshot: {}\n",
            none.path().join("inventory.json").display()
        );
        let t0 = std::time::Instant::now();
        let o = hook_env(input.as_bytes(), &yaml, &env);
        let took = t0.elapsed();
        let log = String::from_utf8_lossy(&o.stderr);
        assert!(log.contains("gave up after 300ms"), "{log}");
        assert!(took < std::time::Duration::from_secs(5), "{took:?}");
        if strict {
            assert_eq!(o.status.code(), Some(1), "{log}");
            assert!(o.stdout.is_empty());
        } else {
            assert!(o.status.success(), "{log}");
            assert_eq!(o.stdout, input.as_bytes(), "config changed");
        }
    }
}

/// Device names a container's owner wrote to reach files or confuse
/// parsing: `../` paths, NUL bytes and 64 KiB values in CDI annotations,
/// NVIDIA_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES and device paths. Each
/// config is planned from what names real GPUs, with a bounded log and the
/// rest passed through, within the budget.
#[test]
fn hostile_device_names_are_notes_in_a_bounded_log() {
    let long_bad = "../x,".repeat(64 << 10 >> 5);
    let long_zero = "0,".repeat(32 << 10);
    let cases: Vec<(&str, Value)> = vec![
        (
            "CDI ../",
            json!({"process": {"env": ["PATH=/bin"]},
                   "annotations": {"cdi.k8s.io/a": "nvidia.com/gpu=../../../../etc/passwd,nvidia.com/gpu=1"}}),
        ),
        (
            "CDI NUL",
            json!({"process": {"env": ["PATH=/bin"]},
                   "annotations": {"cdi.k8s.io/a": "nvidia.com/gpu=0\u{0}1,nvidia.com/gpu=1"}}),
        ),
        (
            "CDI 64 KiB",
            json!({"process": {"env": ["PATH=/bin"]},
                   "annotations": {"cdi.k8s.io/a": format!("nvidia.com/gpu=1,{}", long_bad.replace("../", "nvidia.com/gpu=../"))}}),
        ),
        (
            "env 64 KiB",
            json!({"process": {"env": [format!("NVIDIA_VISIBLE_DEVICES=1,{long_bad}"),
                                       format!("CUDA_VISIBLE_DEVICES={long_zero}")]}}),
        ),
        (
            "env NUL",
            // "1\0" names no GPU: the container gets GPU 0 alone.
            json!({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=1\u{0},0", "GPUARCH_DISABLE=\u{0}"]}}),
        ),
        (
            "device paths",
            json!({"process": {"env": ["PATH=/bin"]},
                   "linux": {"devices": [{"path": "/dev/../dev/nvidia0"}, {"path": "/dev/nvidia1\u{0}"},
                                         {"path": format!("/dev/{}", "a".repeat(64 << 10))}, {"path": "/dev/nvidia1"}]}}),
        ),
    ];
    let _ = artifacts(); // built before the clock starts
    for (name, mut c) in cases {
        c["ociVersion"] = json!("1.2.0");
        c["x-vendor"] = json!({"keep": "\u{0}"});
        let input = serde_json::to_vec(&c).unwrap();
        let t0 = std::time::Instant::now();
        let o = hook(&input, "hook:\n  timeout_ms: 2000\n");
        let took = t0.elapsed();
        let log = String::from_utf8_lossy(&o.stderr);
        eprintln!("{name}: {} bytes of log in {took:?}", log.len());
        assert!(o.status.success(), "{name}: {log}");
        let out: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(out["x-vendor"], c["x-vendor"], "{name}");
        assert_eq!(out["annotations"], c["annotations"], "{name}");
        assert_eq!(out["linux"], c["linux"], "{name}");
        let env = out["process"]["env"].to_string();
        let arch = if name == "env NUL" { "7.5" } else { "8.6" };
        assert!(
            env.contains(&format!("TORCH_CUDA_ARCH_LIST={arch}\"")),
            "{name}: {log}"
        );
        assert!(log.len() < 16 << 10, "{name}: {} bytes of log", log.len());
        assert!(!log.contains('\u{0}'), "{name}: a NUL reached the log");
        assert!(took < std::time::Duration::from_secs(2), "{name}: {took:?}");
    }
}

/// The snapshot comes from the config's `daemon.snapshot` when the
/// environment names none: the shim runs in whatever environment the
/// engine's containerd has, so the admin sets it there. The
/// environment still wins, for tests and demos.
#[test]
fn the_config_names_the_snapshot() {
    let h100 = fixture("a100-h100");
    let yaml = format!("daemon:\n  snapshot: {}\n", h100.display());
    let o = hook_env(
        config(&["NVIDIA_VISIBLE_DEVICES=1"]).to_string().as_bytes(),
        &yaml,
        &[],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let env = serde_json::from_slice::<Value>(&o.stdout).unwrap()["process"]["env"].to_string();
    assert!(env.contains("GPUARCH_COMPUTE_CAPABILITIES=9.0"), "{env}");

    let mixed = fixture("2080ti-3090");
    let o = hook_env(
        config(&["NVIDIA_VISIBLE_DEVICES=1"]).to_string().as_bytes(),
        &yaml,
        &[("GPUARCH_INVENTORY", mixed.as_os_str())],
    );
    let env = serde_json::from_slice::<Value>(&o.stdout).unwrap()["process"]["env"].to_string();
    assert!(env.contains("TORCH_CUDA_ARCH_LIST=8.6"), "{env}");

    // Set but empty is unset (it was read as the path "", and the
    // container started unplanned with nothing said).
    let o = hook_env(
        config(&["NVIDIA_VISIBLE_DEVICES=1"]).to_string().as_bytes(),
        &yaml,
        &[("GPUARCH_INVENTORY", std::ffi::OsStr::new(""))],
    );
    let env = serde_json::from_slice::<Value>(&o.stdout).unwrap()["process"]["env"].to_string();
    assert!(env.contains("GPUARCH_COMPUTE_CAPABILITIES=9.0"), "{env}");

    // gpuarchctl --offline reads the same key.
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.yaml");
    std::fs::write(&cfg, &yaml).unwrap();
    let o = Command::new(&artifacts().gpuarchctl)
        .args(["--offline", "plan", "--devices", "1", "--json"])
        .env_remove("GPUARCH_INVENTORY")
        .env("GPUARCH_CONFIG", &cfg)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let plan: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(plan["env"]["GPUARCH_COMPUTE_CAPABILITIES"], "9.0");
}
