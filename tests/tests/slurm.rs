//! gpuarch under a real Slurm: a single-node cluster from
//! Debian's packages whose gres.conf `gpuarchctl slurm gres` wrote for the
//! 2080 Ti + 3090 fixture, with the shipped TaskProlog planning from
//! gpuarchd's snapshot (fake NVML, private bus), and asking gpuarchd where
//! the snapshot gives no Plan. The cluster starts once for this
//! test, its cases in turn.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use gpuarch_tests::slurm::{Cluster, job_venv};

/// One cluster for every case, as a local: dropped (its daemons stopped)
/// when the test ends, which a static never is.
#[test]
fn slurm_jobs_get_the_plan_of_their_gpus() {
    let Some(mut c) = Cluster::start("2080ti-3090") else {
        return;
    };
    srun_steps_get_the_plan_of_their_gpus(&c);
    sbatch_jobs_get_the_same_plan(&c);
    jobs_run_when_gpuarchd_is_down(&mut c);
}

fn get<'a>(env: &'a std::collections::BTreeMap<String, String>, k: &str) -> Option<&'a str> {
    env.get(k).map(String::as_str)
}

/// srun steps: typed GPUs get their architecture's Plan; two GPUs the
/// lowest common one; a step without GPUs nothing; the user's own value is
/// kept.
fn srun_steps_get_the_plan_of_their_gpus(c: &Cluster) {
    let gres = std::fs::read_to_string(c.path("gres.conf")).unwrap();
    assert!(
        gres.contains("Name=gpu Type=sm_86 File=/dev/nvidia1"),
        "{gres}"
    );

    // The snapshot away: what the step gets comes from gpuarchd's
    // SlurmPlan, through gpuarchctl, which the TaskProlog runs then.
    let snap = c.node.path("run/inventory.json");
    let kept = c.node.path("inventory.kept");
    std::fs::rename(&snap, &kept).unwrap();
    let (env, _) = c.srun_env(&["--gres=gpu:sm_86:1"]);
    std::fs::rename(&kept, &snap).unwrap();
    assert_eq!(get(&env, "SLURM_STEP_GPUS"), Some("1"), "{env:?}");
    assert_eq!(
        get(&env, "TORCH_CUDA_ARCH_LIST"),
        Some("8.6"),
        "{env:?}\n{}",
        c.logs()
    );
    assert_eq!(get(&env, "GPUARCH_DTYPE"), Some("bfloat16"));
    assert_eq!(get(&env, "CUDA_DEVICE_ORDER"), Some("PCI_BUS_ID"));

    let (env, _) = c.srun_env(&["--gres=gpu:sm_75:1"]);
    assert_eq!(get(&env, "TORCH_CUDA_ARCH_LIST"), Some("7.5"), "{env:?}");
    assert_eq!(get(&env, "GPUARCH_ATTN_IMPLEMENTATION"), Some("sdpa"));

    let (env, _) = c.srun_env(&["--gres=gpu:2"]);
    assert_eq!(get(&env, "SLURM_STEP_GPUS"), Some("0,1"));
    assert_eq!(
        get(&env, "TORCH_CUDA_ARCH_LIST"),
        Some("7.5;8.6"),
        "{env:?}"
    );
    assert_eq!(get(&env, "GPUARCH_DTYPE"), Some("float16"));

    let (env, _) = c.srun_env(&[]);
    assert!(
        env.keys()
            .all(|k| !k.starts_with("GPUARCH_") && k != "TORCH_CUDA_ARCH_LIST"),
        "a step without GPUs got {env:?}"
    );

    let (env, _) = c.srun_env(&[
        "--gres=gpu:sm_86:1",
        "--export=ALL,TORCH_CUDA_ARCH_LIST=9.0",
    ]);
    assert_eq!(
        get(&env, "TORCH_CUDA_ARCH_LIST"),
        Some("9.0"),
        "the user's own value"
    );
    assert_eq!(get(&env, "GPUARCH_DTYPE"), Some("bfloat16"));

    // The task's venv, first on the PATH srun passes on: the TaskProlog
    // reads it (no flash-attn in it, so none is asked for on the 3090),
    // and reads it again for the next task (flash-attn added).
    let venv = c.path("job/.venv");
    let bin = job_venv(&venv, &[("torch", "2.7.1"), ("transformers", "4.57.1")]);
    let export = format!(
        "--export=ALL,PATH={}:/usr/bin:/bin,VIRTUAL_ENV={}",
        bin.display(),
        venv.display()
    );
    let (env, _) = c.srun_env(&["--gres=gpu:sm_86:1", &export]);
    assert_eq!(
        get(&env, "GPUARCH_ATTN_IMPLEMENTATION"),
        Some("sdpa"),
        "{env:?}\n{}",
        c.logs()
    );
    job_venv(&venv, &[("flash-attn", "2.7.4.post1")]);
    let (env, _) = c.srun_env(&["--gres=gpu:sm_86:1", &export]);
    assert_eq!(
        get(&env, "GPUARCH_ATTN_IMPLEMENTATION"),
        Some("flash_attention_2")
    );
}

/// A batch job: its steps see SLURM_JOB_GPUS, and the same Plan.
fn sbatch_jobs_get_the_same_plan(c: &Cluster) {
    let out = c.path("batch.out");
    let script = c.path("job.sh");
    std::fs::write(&script, "#!/bin/sh\nenv\n").unwrap();
    let o = c
        .cmd("sbatch")
        .args(["--wait", "--gres=gpu:sm_86:1", "-o"])
        .arg(&out)
        .arg(&script)
        .output()
        .unwrap();
    assert!(o.status.success(), "sbatch: {o:?}\n{}", c.logs());
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text.lines().any(|l| l == "SLURM_JOB_GPUS=1"), "{text}");
    assert!(
        text.lines().any(|l| l == "TORCH_CUDA_ARCH_LIST=8.6"),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l == "GPUARCH_DTYPE=bfloat16"),
        "{text}"
    );
}

/// gpuarchd down: the TaskProlog plans from its snapshot and the job runs;
/// with no snapshot either, the job still runs, with nothing added.
fn jobs_run_when_gpuarchd_is_down(c: &mut Cluster) {
    c.node.stop();
    let (env, _) = c.srun_env(&["--gres=gpu:sm_86:1"]);
    assert_eq!(
        get(&env, "TORCH_CUDA_ARCH_LIST"),
        Some("8.6"),
        "from the snapshot: {env:?}"
    );
    let snap = c.node.path("run/inventory.json");
    let kept = c.node.path("inventory.kept");
    std::fs::rename(&snap, &kept).unwrap();
    let t0 = std::time::Instant::now();
    let (env, _) = c.srun_env(&["--gres=gpu:sm_86:1"]);
    assert!(t0.elapsed() < Duration::from_secs(30));
    assert_eq!(get(&env, "TORCH_CUDA_ARCH_LIST"), None, "{env:?}");
    assert_eq!(get(&env, "SLURM_STEP_GPUS"), Some("1"));
    std::fs::rename(&kept, &snap).unwrap();
    c.node.start(&[]);
}
