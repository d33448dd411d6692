//! `gpuarchctl inspect`: a file's targets judged on a machine without a
//! GPU, what is not a regular file refused, a file truncated while it is
//! read named.

use std::path::Path;
use std::process::Command;

use gpuarch_tests::{artifacts, truncate, workspace_root};

use super::{config_with_snapshot, ok, stderr};

/// `inspect` needs no GPU for a file's own targets: with no driver, no
/// snapshot and nothing else in its environment (an admin's build box, CI),
/// it lists them, says there is nothing here to judge them against, and
/// exits 0. A source asked for by name that cannot be read stays an error.
#[test]
fn inspect_lists_a_files_targets_on_a_machine_without_a_gpu() {
    if Path::new("/dev/nvidiactl").exists() {
        gpuarch_tests::skip("this machine has an NVIDIA driver: the no-GPU case cannot be shown");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // The config only moves the snapshot off the host's /run/gpuarch.
    let cfg = config_with_snapshot(dir.path(), "config.yaml", &dir.path().join("none.json"));
    let cubin = workspace_root().join("kernels/tests/fixtures/nvcc13/sm_120.cubin");
    let run = |args: &[&str]| {
        Command::new(&artifacts().gpuarchctl)
            .args(args)
            .arg(&cubin)
            .env_clear()
            .env("GPUARCH_CONFIG", &cfg)
            .output()
            .unwrap()
    };
    let o = run(&["inspect"]);
    let text = ok(&o);
    assert!(text.contains("sm_120 SASS"), "{text}");
    assert!(text.contains("no GPU here to judge it against"), "{text}");
    let o = run(&["--json", "inspect"]);
    let doc: serde_json::Value = serde_json::from_str(&ok(&o)).unwrap();
    assert_eq!(doc[0]["code"][0]["target"], "sm_120");
    assert!(
        doc[0]["no_gpus"].as_str().unwrap().contains("none.json"),
        "{doc}"
    );
    let o = run(&["--nvml-lib", "/nonexistent/libnvidia-ml.so.1", "inspect"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

/// `inspect` maps the file it reads; anything but a regular file is
/// refused at once, by name: a FIFO (which a read would block on until a
/// writer came), a directory, a device.
#[test]
fn inspect_refuses_what_is_not_a_regular_file_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config_with_snapshot(dir.path(), "config.yaml", &dir.path().join("none.json"));
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    for p in [fifo.as_path(), dir.path(), Path::new("/dev/zero")] {
        let mut child = inspect_cmd(&cfg, p)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // A read of the FIFO would wait for a writer that never comes.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                panic!("gpuarchctl inspect {p:?} still running after 60 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let o = child.wait_with_output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(
            stderr(&o).contains(&format!("{}: not a regular file", p.display())),
            "{}",
            stderr(&o)
        );
    }
}

/// A file truncated while `inspect` reads it (its mapping faults:
/// SIGBUS) is named in a clear error, exit status 2, not a "Bus error"
/// and a core. The file is cut once /proc shows it mapped, while the
/// inspector reads 256 MiB of text through.
#[test]
fn inspect_names_a_file_truncated_while_it_is_read() {
    let dir = truncate::scratch_in_memory();
    let cfg = config_with_snapshot(dir.path(), "config.yaml", &dir.path().join("none.json"));
    let p = dir.path().join("big.ptx");
    let text = vec![b'a'; 256 << 20];
    let outs = truncate::truncated_under(
        || inspect_cmd(&cfg, &p),
        &p,
        || std::fs::write(&p, &text).unwrap(),
    );
    truncate::assert_named_on_sigbus(&outs, &format!("gpuarchctl: {}", p.display()), 2);
}

/// `gpuarchctl inspect --cap 8.6 FILE` with only the config `cfg` in its
/// environment.
fn inspect_cmd(cfg: &Path, file: &Path) -> Command {
    let mut c = Command::new(&artifacts().gpuarchctl);
    c.args(["inspect", "--cap", "8.6"])
        .arg(file)
        .env_clear()
        .env("GPUARCH_CONFIG", cfg);
    c
}
