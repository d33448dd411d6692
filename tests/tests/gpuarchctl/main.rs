//! gpuarchctl --offline as a user runs it: the real binary, NVML through the
//! real nvml-wrapper and the fake library, or a snapshot file.

#![allow(clippy::unwrap_used)] // test helpers: a failed unwrap is a failed test

use std::path::Path;
use std::process::{Command, Output};

use gpuarch_tests::{artifacts, fixture, workspace_root};

mod inspect;
mod task_prolog;
use serde_json::Value;

/// gpuarchctl on a fixture through NVML, with a clean gpuarch environment.
fn ctl(topology: &str, args: &[&str]) -> Output {
    let a = artifacts();
    Command::new(&a.gpuarchctl)
        .arg("--nvml-lib")
        .arg(&a.fake_nvml)
        .args(args)
        .env("FAKE_NVML_TOPOLOGY", fixture(topology))
        .env("GPUARCH_CONFIG", "/dev/null")
        .env_remove("GPUARCH_INVENTORY")
        .output()
        .expect("run gpuarchctl")
}

/// gpuarchctl --offline (no daemon asked) with only the arguments and env
/// given. tests/tests/daemon_dbus/ covers the daemon path.
fn ctl_plain(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(&artifacts().gpuarchctl);
    c.arg("--offline")
        .args(args)
        .env("GPUARCH_CONFIG", "/dev/null")
        .env_remove("GPUARCH_INVENTORY")
        .env_remove("GPUARCH_NVML_LIB");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run gpuarchctl")
}

/// A config in `dir` (as `name`) whose only setting moves gpuarchd's
/// snapshot to `snapshot`, off the host's /run/gpuarch.
fn config_with_snapshot(dir: &Path, name: &str, snapshot: &Path) -> std::path::PathBuf {
    let cfg = dir.join(name);
    std::fs::write(
        &cfg,
        format!("daemon:\n  snapshot: {}\n", snapshot.display()),
    )
    .unwrap();
    cfg
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "status {:?}\nstderr: {}",
        o.status,
        stderr(o)
    );
    stdout(o)
}

fn json(o: &Output) -> Value {
    serde_json::from_str(&ok(o)).expect("gpuarchctl --json prints JSON")
}

#[test]
fn devices_lists_the_mixed_node() {
    let out = ok(&ctl("2080ti-3090", &["devices"]));
    assert!(
        out.contains("NVIDIA GeForce RTX 2080 Ti") && out.contains("Turing"),
        "{out}"
    );
    assert!(
        out.contains("NVIDIA GeForce RTX 3090") && out.contains("Ampere"),
        "{out}"
    );
    assert!(out.contains("2 GPU(s) from NVML"), "{out}");
}

#[test]
fn devices_json_is_a_schema_1_snapshot_of_the_topology() {
    for name in gpuarch_tests::FIXTURES {
        let got = json(&ctl(name, &["devices", "--json"]));
        let want: Value = serde_json::from_slice(&std::fs::read(fixture(name)).unwrap()).unwrap();
        assert_eq!(got["schema"], 1);
        assert_eq!(got["source"], "nvml");
        assert_eq!(got["devices"], want["devices"], "{name}");
    }
}

#[test]
fn plan_for_the_mixed_pair_and_for_the_3090_alone() {
    let both = json(&ctl("2080ti-3090", &["plan", "--devices", "0,1", "--json"]));
    assert_eq!(both["env"]["TORCH_CUDA_ARCH_LIST"], "7.5;8.6");
    assert_eq!(both["env"]["GPUARCH_DTYPE"], "float16");
    assert_eq!(both["env"]["GPUARCH_ATTN_IMPLEMENTATION"], "sdpa");
    assert_eq!(both["source"], "request");

    let one = json(&ctl("2080ti-3090", &["plan", "--devices", "1", "--json"]));
    assert_eq!(one["env"]["TORCH_CUDA_ARCH_LIST"], "8.6");
    assert_eq!(one["env"]["GPUARCH_DTYPE"], "bfloat16");
    assert_eq!(
        one["env"]["GPUARCH_ATTN_IMPLEMENTATION"],
        "flash_attention_2"
    );

    let text = ok(&ctl("2080ti-3090", &["plan", "--devices", "0,1"]));
    assert!(text.contains("  TORCH_CUDA_ARCH_LIST=7.5;8.6\n"), "{text}");
    assert!(text.contains("lacks it"), "{text}");
}

/// The fake NVML serving what the real H100 host's NVML gave yields the
/// Plan gpuarchctl printed on that host (docs/gpu/h100-2026-11-23.json,
/// written by scripts/gpu-check).
#[test]
fn plan_on_the_real_h100_reading_is_what_the_real_host_printed() {
    let report: Value = serde_json::from_slice(
        &std::fs::read(workspace_root().join("docs/gpu/h100-2026-11-23.json")).unwrap(),
    )
    .unwrap();
    let on_host = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["part"] == "consumers" && c["name"] == "plan")
        .expect("the report's consumers/plan check")["data"]["env"]
        .clone();
    assert_eq!(on_host["TORCH_CUDA_ARCH_LIST"], "9.0");
    let here = json(&ctl("h100-real", &["plan", "--devices", "0", "--json"]));
    let mut env = here["env"].clone();
    // Set since that run: flash-attn's build list, sm_90 for Hopper.
    assert_eq!(env["FLASH_ATTN_CUDA_ARCHS"], "90");
    env.as_object_mut().unwrap().remove("FLASH_ATTN_CUDA_ARCHS");
    // Changed since: FlashInfer's suffix written out, as its releases
    // before 0.6.7 use the list verbatim and would lose sm_90a.
    assert_eq!(on_host["FLASHINFER_CUDA_ARCH_LIST"], "9.0");
    assert_eq!(env["FLASHINFER_CUDA_ARCH_LIST"], "9.0a");
    env["FLASHINFER_CUDA_ARCH_LIST"] = on_host["FLASHINFER_CUDA_ARCH_LIST"].clone();
    // Changed since: for an image not known on a Hopper, TORCH_CUDA_ARCH_LIST
    // is left to the consumers (an xformers there needs 9.0a, a DeepSpeed
    // rejects it; unset, both build their own).
    assert!(env.get("TORCH_CUDA_ARCH_LIST").is_none(), "{env}");
    let notes = here["notes"].to_string();
    assert!(notes.contains("TORCH_CUDA_ARCH_LIST not set: "), "{notes}");
    let mut on_host = on_host;
    on_host
        .as_object_mut()
        .unwrap()
        .remove("TORCH_CUDA_ARCH_LIST");
    assert_eq!(env, on_host);
    // An image known to hold torch alone gets the host's 9.0 as then.
    let known = json(&ctl(
        "h100-real",
        &[
            "plan",
            "--devices",
            "0",
            "--software",
            "torch==2.11.0",
            "--json",
        ],
    ));
    assert_eq!(known["env"]["TORCH_CUDA_ARCH_LIST"], "9.0");
}

#[test]
fn plan_reads_an_oci_config() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.json");
    std::fs::write(
        &cfg,
        r#"{"ociVersion": "1.2.0",
            "process": {"env": ["NVIDIA_VISIBLE_DEVICES=all", "CUDA_VISIBLE_DEVICES=1"]},
            "linux": {}}"#,
    )
    .unwrap();
    let p = json(&ctl(
        "a100-h100",
        &["plan", "--config", cfg.to_str().unwrap(), "--json"],
    ));
    assert_eq!(p["source"], "nvidia_visible_devices");
    // The H100, in an image not known: the torch list is left unset.
    assert!(p["env"].get("TORCH_CUDA_ARCH_LIST").is_none(), "{p}");
    assert_eq!(p["env"]["FLASHINFER_CUDA_ARCH_LIST"], "9.0a");
    assert_eq!(p["env"]["GPUARCH_FP8"], "1");
    assert_eq!(p["gpus"][0]["name"], "NVIDIA H100 80GB HBM3");
}

#[test]
fn a_malformed_oci_config_is_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.json");
    std::fs::write(&cfg, "{\n  \"process\": {\"env\": [\"A=1\",]}\n}").unwrap();
    let o = ctl("t4", &["plan", "--config", cfg.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(e.contains("config.json") && e.contains("line 2"), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");
    assert_eq!(
        e.matches("trailing comma").count(),
        1,
        "the reason once: {e}"
    );

    // The caller's file is read before the host's inventory is needed.
    let o = ctl_plain(&["plan", "--config", "/nonexistent/config.json"], &[]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("/nonexistent/config.json") && !e.contains("NVML"),
        "{e}"
    );
}

#[test]
fn unknown_devices_are_notes_and_nothing_changes() {
    let p = json(&ctl("t4", &["plan", "--devices", "3", "--json"]));
    assert!(p["env"].as_object().unwrap().is_empty());
    let notes = p["notes"].to_string();
    assert!(
        notes.contains("no GPU with index 3 on this host"),
        "{notes}"
    );
}

#[test]
fn a_snapshot_file_is_read_through_gpuarch_inventory() {
    let inv = fixture("4090-5090");
    let out = ctl_plain(
        &[
            "plan",
            "--devices",
            "all",
            "--json",
            "--software",
            "torch==2.9.1",
        ],
        &[("GPUARCH_INVENTORY", inv.to_str().unwrap())],
    );
    let p = json(&out);
    assert_eq!(p["env"]["TORCH_CUDA_ARCH_LIST"], "8.9;12.0");
    assert_eq!(p["env"]["GPUARCH_FP8"], "1");
    // The image named has no flash-attn: FlashAttention-2 runs on both
    // GPUs, but nothing there would load it.
    assert_eq!(p["env"]["GPUARCH_ATTN_IMPLEMENTATION"], "sdpa");
    // The flag names a file too, and a bad one is an error with its path.
    let o = ctl_plain(&["devices", "--inventory", "/nonexistent/inv.json"], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("/nonexistent/inv.json"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn the_config_file_is_obeyed_and_its_errors_located() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.yaml");
    std::fs::write(&cfg, "env:\n  override: true\n  disable: [GPUARCH_FP8]\n").unwrap();
    let inv = fixture("2080ti-3090");
    let env = [
        ("GPUARCH_INVENTORY", inv.to_str().unwrap()),
        ("GPUARCH_CONFIG", cfg.to_str().unwrap()),
    ];
    let p = json(&ctl_plain(
        &[
            "plan",
            "--devices",
            "1",
            "-e",
            "TORCH_CUDA_ARCH_LIST=7.0",
            "--json",
        ],
        &env,
    ));
    assert_eq!(p["env"]["TORCH_CUDA_ARCH_LIST"], "8.6");
    assert!(p["env"].get("GPUARCH_FP8").is_none());

    std::fs::write(&cfg, "env:\n  overide: true\n").unwrap();
    let o = ctl_plain(&["plan", "--devices", "1"], &env);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("config.yaml") && e.contains("line 2") && e.contains("overide"),
        "{e}"
    );
}

#[test]
fn a_missing_nvml_library_is_named() {
    let o = ctl_plain(
        &["devices", "--nvml-lib", "/nonexistent/libnvidia-ml.so.1"],
        &[],
    );
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("cannot load the NVML library '/nonexistent/libnvidia-ml.so.1'"),
        "{e}"
    );
}

/// A GB10 in an image of CUDA 12.8, as an admin or a scheduler asks: the
/// arch list CUDA 12.8 can build (sm_120 SASS runs on 12.1), the reason in
/// the notes, and `arch toolkit` giving the same answer.
#[test]
fn a_gb10_under_cuda_12_8_gets_12_0_and_the_reason() {
    let p = json(&ctl(
        "blackwell-mix",
        &[
            "plan",
            "--devices",
            "0",
            "-e",
            "CUDA_VERSION=12.8.1",
            "--software",
            "torch==2.7.1",
            "--json",
        ],
    ));
    assert_eq!(p["env"]["TORCH_CUDA_ARCH_LIST"], "12.0", "{p}");
    assert!(p["env"].get("FLASHINFER_CUDA_ARCH_LIST").is_none(), "{p}");
    let notes = p["notes"].to_string();
    assert!(
        notes.contains("CUDA 12.8 (from CUDA_VERSION in the container)")
            && notes.contains("cannot build sm_121: TORCH_CUDA_ARCH_LIST has 12.0 for 12.1"),
        "{notes}"
    );
    // The GB10 with no toolkit named, and these consumers in the image.
    let gb10 = |software: &[&str]| {
        let mut args = vec!["plan", "--devices", "0", "--json"];
        for s in software {
            args.extend(["--software", *s]);
        }
        json(&ctl("blackwell-mix", &args))
    };
    // Torch 2.9 in the image: the GPU's own capability.
    let p = gb10(&["torch==2.9.1"]);
    assert_eq!(p["env"]["TORCH_CUDA_ARCH_LIST"], "12.1", "{p}");
    assert_eq!(p["env"]["FLASHINFER_CUDA_ARCH_LIST"], "12.1a", "{p}");
    // Neither known: a DeepSpeed that cannot parse 12.x may be there, and
    // a name it parses would give the GB10 older code than torch's own
    // default: not set.
    let p = gb10(&[]);
    assert!(p["env"].get("TORCH_CUDA_ARCH_LIST").is_none(), "{p}");
    // An image known to hold flash-attn and no DeepSpeed, its torch not
    // known: what every torch whose own kernels run on a GB10 takes (2.7
    // on, which names 12.0, not 12.1).
    let p = gb10(&["flash-attn==2.8.3"]);
    assert_eq!(p["env"]["TORCH_CUDA_ARCH_LIST"], "12.0", "{p}");

    let o = ctl_plain(&["arch", "toolkit", "12.8.1", "--on", "12.1"], &[]);
    assert!(
        ok(&o).contains("CUDA 12.8 for 12.1: 12.0 (SASS of its family"),
        "{}",
        stdout(&o)
    );
    let o = ctl_plain(&["arch", "toolkit", "13.0", "--on", "7.0"], &[]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(stdout(&o).contains("nothing it builds runs there"));
    let t = json(&ctl_plain(&["arch", "toolkit", "--json"], &[]));
    let has = |v: &str, a: &str| t["releases"][v].as_array().unwrap().iter().any(|x| x == a);
    assert!(has("12.9", "12.1") && !has("12.8", "12.1"), "{t}");
    assert!(has("12.9", "10.1") && !has("13.0", "10.1") && has("13.0", "11.0"));
    assert!(has("12.9", "7.0") && !has("13.0", "7.0"));
    let bad = ctl_plain(&["arch", "toolkit", "9.2"], &[]);
    assert!(!bad.status.success());
    assert!(
        stderr(&bad).contains("older than the table"),
        "{}",
        stderr(&bad)
    );
}

#[test]
fn arch_check_answers_with_its_exit_status() {
    let yes = ctl_plain(&["arch", "check", "8.0", "--on", "8.6"], &[]);
    assert_eq!(yes.status.code(), Some(0));
    assert!(stdout(&yes).contains("sm_80 runs on 8.6"));

    let no = ctl_plain(&["arch", "check", "sm_75", "--on", "sm_86"], &[]);
    assert_eq!(no.status.code(), Some(1));

    let a = json(&ctl_plain(
        &["arch", "check", "9.0a", "--on", "9.0", "--json"],
        &[],
    ));
    assert_eq!(a["runs"], true);
    let a = ctl_plain(&["arch", "check", "9.0a", "--on", "10.0"], &[]);
    assert_eq!(a.status.code(), Some(1));

    let o = ctl_plain(
        &[
            "arch",
            "check",
            "compute_80",
            "--on",
            "9.0",
            "--driver-cuda",
            "12.2",
            "--ptx-cuda",
            "12.8",
            "--json",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(1), "a 'no' exits 1 with --json too");
    let ptx: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(ptx["runs"], false);
    assert!(
        ptx["targets"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("CUDA 12.8")
    );

    let bad = ctl_plain(&["arch", "check", "8.x", "--on", "8.6"], &[]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(stderr(&bad).contains("'8.x'"));
}

#[test]
fn arch_parse_and_features() {
    let p = json(&ctl_plain(
        &["arch", "parse", "Turing;Ampere", "--json"],
        &[],
    ));
    assert_eq!(p["canonical"], "7.5+PTX;8.0;8.6+PTX");
    let f = json(&ctl_plain(&["arch", "features", "9.0", "--json"], &[]));
    assert_eq!(f["features"]["flash_attention_3"], true);
    assert_eq!(f["arch"], "Hopper");
    let bad = ctl_plain(&["arch", "parse", "7.5;;8.6"], &[]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        stderr(&bad).contains("empty entry at position 2"),
        "{}",
        stderr(&bad)
    );
}
