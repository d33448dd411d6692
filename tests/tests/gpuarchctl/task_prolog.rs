//! The shipped Slurm TaskProlog: it plans from gpuarchd's snapshot as
//! gpuarchctl does, reads the task's own Python environments, and never
//! fails a task.

use std::process::{Command, Output};

use gpuarch_tests::{artifacts, fixture};

use super::{config_with_snapshot, ok, stderr, stdout};

/// The shipped Slurm TaskProlog (`slurm-task-prolog`) with only the env
/// given: Slurm's, and where the config and bus are.
fn task_prolog(env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(&artifacts().slurm_task_prolog);
    c.env_clear().env("PATH", "/usr/bin:/bin");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run gpuarch-slurm-task-prolog")
}

/// What Slurm runs for every task plans from gpuarchd's snapshot itself,
/// and prints the same `export` lines as `gpuarchctl slurm task-prolog`
/// planning from that snapshot; the step's own values are kept; a step
/// without GPUs gets nothing.
#[test]
fn the_task_prolog_plans_from_the_snapshot_as_gpuarchctl_does() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_with_snapshot(dir.path(), "config.yaml", &fixture("2080ti-3090"));
    let config = config.to_str().unwrap();
    // No bus: gpuarchctl falls back to the same snapshot.
    let nobus = format!("unix:path={}", dir.path().join("nobus").display());
    for gpus in ["1", "0", "0,1"] {
        let env = [
            ("SLURM_STEP_GPUS", gpus),
            ("GPUARCH_CONFIG", config),
            ("DBUS_SYSTEM_BUS_ADDRESS", nobus.as_str()),
        ];
        let lean = task_prolog(&env);
        assert!(lean.status.success(), "{lean:?}");
        let lines = stdout(&lean);
        let mut c = Command::new(&artifacts().gpuarchctl);
        c.args(["slurm", "task-prolog"])
            .env_clear()
            .env("PATH", "/usr/bin:/bin");
        for (k, v) in env {
            c.env(k, v);
        }
        let ctl = c.output().unwrap();
        assert_eq!(lines, ok(&ctl), "GPUs {gpus}");
        assert!(stderr(&lean).is_empty(), "{}", stderr(&lean));
        let want = if gpus == "1" {
            "8.6"
        } else if gpus == "0" {
            "7.5"
        } else {
            "7.5;8.6"
        };
        assert!(
            lines.lines().next() == Some(&format!("export TORCH_CUDA_ARCH_LIST={want}")),
            "GPUs {gpus}: {lines}"
        );
        assert!(lines.lines().all(|l| l.starts_with("export ")), "{lines}");
    }

    let own = task_prolog(&[
        ("SLURM_JOB_GPUS", "1"),
        ("GPUARCH_CONFIG", config),
        ("TORCH_CUDA_ARCH_LIST", "9.0"),
    ]);
    let lines = stdout(&own);
    assert!(!lines.contains("TORCH_CUDA_ARCH_LIST"), "{lines}");
    assert!(lines.contains("export GPUARCH_DTYPE=bfloat16\n"), "{lines}");

    let none = task_prolog(&[("GPUARCH_CONFIG", config)]);
    assert!(none.status.success());
    assert_eq!(stdout(&none), "");
    // A task that opts out, as a container does, gets nothing.
    let out = task_prolog(&[
        ("SLURM_JOB_GPUS", "1"),
        ("GPUARCH_CONFIG", config),
        ("GPUARCH_DISABLE", "1"),
    ]);
    assert!(out.status.success());
    assert_eq!(stdout(&out), "");
}

/// The TaskProlog reads the task's Python environments, as the hook reads
/// an image: a job whose venv (on its `PATH`) has no flash-attn is not
/// told to use it on the 3090; one whose venv has it is. gpuarchctl,
/// planning from the snapshot, says the same.
#[test]
fn the_task_prolog_reads_the_tasks_venv() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_with_snapshot(dir.path(), "config.yaml", &fixture("2080ti-3090"));
    let nobus = format!("unix:path={}", dir.path().join("nobus").display());
    let venv = dir.path().join("job/.venv");
    let torch = [("torch", "2.7.1"), ("transformers", "4.57.1")];
    gpuarch_tests::slurm::job_venv(&venv, &torch);
    let path = format!("{}:/usr/bin:/bin", venv.join("bin").display());
    let env = [
        ("SLURM_STEP_GPUS", "1"),
        ("GPUARCH_CONFIG", config.to_str().unwrap()),
        ("DBUS_SYSTEM_BUS_ADDRESS", nobus.as_str()),
        ("PATH", path.as_str()),
        ("VIRTUAL_ENV", venv.to_str().unwrap()),
    ];
    let attn = |want: &str| {
        let lean = task_prolog(&env);
        let lines = stdout(&lean);
        assert!(
            lines.contains(&format!("export GPUARCH_ATTN_IMPLEMENTATION={want}\n")),
            "{lines}{}",
            stderr(&lean)
        );
        let mut c = Command::new(&artifacts().gpuarchctl);
        c.args(["slurm", "task-prolog"]).env_clear().envs(env);
        assert_eq!(ok(&c.output().unwrap()), lines);
    };
    attn("sdpa");
    gpuarch_tests::slurm::job_venv(&venv, &[("flash-attn", "2.7.4.post1")]);
    attn("flash_attention_2");
    std::fs::remove_dir_all(
        venv.join("lib/python3.12/site-packages/flash_attn-2.7.4.post1.dist-info"),
    )
    .unwrap();
    attn("sdpa");

    // A task whose only python is the system's may run an image's
    // (Apptainer, pyxis): the node's Python is not taken for its own, and
    // it is planned as before, for software not known.
    let plain = task_prolog(&[
        ("SLURM_STEP_GPUS", "1"),
        ("GPUARCH_CONFIG", config.to_str().unwrap()),
        ("PATH", "/usr/local/bin:/usr/bin:/bin"),
    ]);
    assert!(
        stdout(&plain).contains("export GPUARCH_ATTN_IMPLEMENTATION=flash_attention_2\n"),
        "{plain:?}"
    );

    // A task whose env leads the read astray (a FIFO for a venv's
    // pyvenv.cfg and for PYTHONPATH, a PATH entry that loops) still gets
    // its Plan at once, and the prolog never fails it.
    let bad = dir.path().join("bad");
    std::fs::create_dir_all(bad.join("bin")).unwrap();
    let fifo = nix::sys::stat::Mode::from_bits_truncate(0o600);
    nix::unistd::mkfifo(&bad.join("pyvenv.cfg"), fifo).unwrap();
    nix::unistd::mkfifo(&bad.join("pp"), fifo).unwrap();
    std::os::unix::fs::symlink("/usr/bin/python3", bad.join("bin/python3")).unwrap();
    std::os::unix::fs::symlink("loop", bad.join("loop")).unwrap();
    let path = format!(
        "{}:{}:/usr/bin:/bin",
        bad.join("bin").display(),
        bad.join("loop").display()
    );
    let pp = bad.join("pp");
    let t = std::time::Instant::now();
    let o = task_prolog(&[
        ("SLURM_STEP_GPUS", "1"),
        ("GPUARCH_CONFIG", config.to_str().unwrap()),
        ("PATH", path.as_str()),
        ("PYTHONPATH", pp.to_str().unwrap()),
        ("HOME", "/proc/self/fd/0"),
    ]);
    assert!(o.status.success(), "{o:?}");
    assert!(
        stdout(&o).starts_with("export TORCH_CUDA_ARCH_LIST=8.6\n"),
        "{o:?}"
    );
    assert!(
        t.elapsed() < std::time::Duration::from_secs(2),
        "{:?}",
        t.elapsed()
    );
}

/// On an RTX 5090 the venv's torch 2.12 takes `12.0`, native code. A
/// python on `PATH` the read cannot follow (a pyenv shim) may import
/// another torch, and a DeepSpeed that cannot parse `12.0`: then nothing
/// read is taken, and the list is not set (a name that DeepSpeed parses
/// would give the 5090 older code than torch builds unset).
#[test]
fn the_task_prolog_takes_the_venvs_torch_unless_a_python_is_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_with_snapshot(dir.path(), "config.yaml", &fixture("4090-5090"));
    let venv = dir.path().join("job/.venv");
    let bin = gpuarch_tests::slurm::job_venv(&venv, &[("torch", "2.12.0")]);
    let shim = dir.path().join("pyenv/shims");
    std::fs::create_dir_all(&shim).unwrap();
    std::fs::write(shim.join("python3"), "#!/bin/sh\nexec python3 \"$@\"\n").unwrap();
    for (path, want) in [
        (format!("{}:/usr/bin:/bin", bin.display()), Some("12.0")),
        (
            format!("{}:{}:/usr/bin:/bin", shim.display(), bin.display()),
            None,
        ),
    ] {
        let o = task_prolog(&[
            ("SLURM_STEP_GPUS", "1"),
            ("GPUARCH_CONFIG", config.to_str().unwrap()),
            ("PATH", &path),
        ]);
        let list = stdout(&o)
            .lines()
            .find_map(|l| l.strip_prefix("export TORCH_CUDA_ARCH_LIST="))
            .map(str::to_owned);
        assert!(
            stdout(&o).contains("export GPUARCH_COMPUTE_CAPABILITIES=12.0\n"),
            "{o:?}"
        );
        assert_eq!(list.as_deref(), want, "{path}: {o:?}");
    }
}

/// Where the snapshot gives no Plan, the TaskProlog hands over to
/// `gpuarchctl slurm task-prolog` (gpuarchd, then the snapshot); with
/// neither, the task starts unchanged: nothing printed, exit 0.
#[test]
fn without_a_snapshot_the_task_prolog_asks_gpuarchd_and_never_fails_the_task() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_with_snapshot(dir.path(), "config.yaml", &dir.path().join("absent.json"));
    let nobus = format!("unix:path={}", dir.path().join("nobus").display());
    let o = task_prolog(&[
        ("SLURM_STEP_GPUS", "1"),
        ("GPUARCH_CONFIG", config.to_str().unwrap()),
        ("DBUS_SYSTEM_BUS_ADDRESS", &nobus),
    ]);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(stdout(&o), "");
    // The log goes to /dev/log where syslog listens; else to stderr, where
    // both programs' lines show the hand-over.
    let syslog = std::os::unix::net::UnixDatagram::unbound()
        .and_then(|s| s.connect("/dev/log"))
        .is_ok();
    if !syslog {
        let err = stderr(&o);
        assert!(err.contains("no Plan from the snapshot"), "{err}");
        assert!(err.contains("asking gpuarchd"), "{err}");
        assert!(
            err.contains("gpuarchctl slurm task-prolog: gpuarchd did not answer"),
            "{err}"
        );
    }
    // A GPU the snapshot does not list is handed over too, and planned by
    // neither.
    let snap_config = config_with_snapshot(dir.path(), "snap.yaml", &fixture("2080ti-3090"));
    let o = task_prolog(&[
        ("SLURM_STEP_GPUS", "7"),
        ("GPUARCH_CONFIG", snap_config.to_str().unwrap()),
        ("DBUS_SYSTEM_BUS_ADDRESS", &nobus),
    ]);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(stdout(&o), "");
}
