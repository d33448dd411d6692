//! A real single-node Slurm (Debian's slurmctld, slurmd, srun, sbatch and
//! munged) on private ports and directories, for tests/tests/slurm.rs: the
//! node's gres.conf written by `gpuarchctl slurm gres`, the shipped
//! TaskProlog program, and gpuarchd on the fake NVML and a private bus.
//!
//! slurmd waits for each gres.conf `File=` to exist, and gpuarch writes
//! `/dev/nvidiaN`. This machine has no GPU, and the tests never make device
//! nodes in the host's `/dev`: slurmd (and so every job step) runs in a
//! mount namespace of its own whose `/dev` is a tmpfs holding the host's
//! usual nodes, bound from the real ones, and stand-in `nvidiaN` nodes
//! (`mknod c 195 N`).
//!
//! Test support: a failed unwrap here is a failed test.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use crate::daemon::{Node, Policy};
use crate::{artifacts, cannot_run, workspace_root};

/// What a Slurm test needs.
/// With an engine root (`GPUARCH_ENGINES`), Slurm's daemons and clients
/// are the root's, run inside it; munged stays the host's (the protocol
/// on its socket is the same).
pub fn missing() -> Option<String> {
    match crate::roots::engine_root() {
        Err(why) => Some(why),
        Ok(None) => cannot_run(
            "to start munged, slurmctld and slurmd",
            &[
                "munged",
                "slurmctld",
                "slurmd",
                "srun",
                "sbatch",
                "sinfo",
                "unshare",
                "dbus-daemon",
            ],
        ),
        Ok(Some(root)) => cannot_run(
            "to start munged beside the root's Slurm",
            &["munged", "unshare", "dbus-daemon"],
        )
        .or_else(|| {
            ["usr/sbin/slurmctld", "usr/sbin/slurmd", "usr/bin/srun"]
                .iter()
                .find(|p| !root.join(p).exists())
                .map(|p| format!("the engine root {} has no /{p}", root.display()))
        }),
    }
}

/// `argv`, from the engine root when one is set (with `shared` at their
/// own paths), else from the host.
fn slurm_command(shared: &[&Path], argv: &[&str]) -> Command {
    match crate::roots::engine_root().ok().flatten() {
        Some(root) => {
            let mut all = shared.to_vec();
            let ws = workspace_root();
            all.push(&ws);
            crate::roots::command_in(&root, &all, argv)
        }
        None => {
            let mut c = Command::new(argv[0]);
            c.args(&argv[1..]);
            c
        }
    }
}

/// munged, slurmctld, slurmd and gpuarchd, stopped when dropped.
#[derive(Debug)]
pub struct Cluster {
    pub node: Node,
    pub dir: tempfile::TempDir,
    pub name: String,
    node_dir: PathBuf,
    munged: Option<Child>,
    ctld: Option<Child>,
    slurmd: Option<Child>,
}

fn spawn(cmd: &mut Command, log: &Path) -> Child {
    let out = std::fs::File::create(log).unwrap();
    cmd.stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap()
}

impl Cluster {
    /// Start everything on the `topology` fixture; `None` (said through
    /// [`crate::skip`]) where this machine cannot.
    pub fn start(topology: &str) -> Option<Cluster> {
        if let Some(why) = missing() {
            crate::skip(&why);
            return None;
        }
        let mut node = Node::new(topology, Policy::Shipped);
        node.start(&[]);
        let dir = tempfile::Builder::new()
            .prefix("gpuarch-slurm-")
            .tempdir()
            .unwrap();
        let d = dir.path();
        for sub in ["munge", "state", "spool", "log"] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        let name = nix::unistd::gethostname()
            .unwrap()
            .to_string_lossy()
            .split('.')
            .next()
            .unwrap()
            .to_owned();

        // munge, on a socket of its own.
        let key = d.join("munge/munge.key");
        std::fs::write(
            &key,
            (0..1024).map(|i| (i * 7 + 3) as u8).collect::<Vec<u8>>(),
        )
        .unwrap();
        std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        let sock = d.join("munge/sock");
        let munged = spawn(
            Command::new("munged")
                .arg("--foreground")
                .arg("--force")
                .arg(format!("--socket={}", sock.display()))
                .arg(format!("--key-file={}", key.display()))
                .arg(format!("--log-file={}", d.join("log/munged.log").display()))
                .arg(format!("--pid-file={}", d.join("munge/pid").display()))
                .arg(format!("--seed-file={}", d.join("munge/seed").display())),
            &d.join("log/munged.out"),
        );
        wait(|| sock.exists(), "munged's socket");

        // gres.conf as gpuarchctl writes it, from gpuarchd.
        let gres = d.join("gres.conf");
        let o = node.ctl(
            None,
            &[
                "slurm",
                "gres",
                "--node",
                &name,
                "--write",
                gres.to_str().unwrap(),
            ],
        );
        assert!(o.status.success(), "gpuarchctl slurm gres: {o:?}");
        let conf = std::fs::read_to_string(&gres).unwrap();
        let slurm_line = conf
            .lines()
            .find_map(|l| l.strip_prefix("# slurm.conf: "))
            .expect("the slurm.conf comment")
            .to_owned();
        let minors: Vec<u32> = conf
            .lines()
            .filter_map(|l| l.rsplit_once("File=/dev/nvidia"))
            .map(|(_, n)| n.parse().unwrap())
            .collect();

        // The config the TaskProlog reads names gpuarchd's snapshot.
        let prolog_config = d.join("gpuarch.yaml");
        std::fs::write(
            &prolog_config,
            format!(
                "daemon:\n  snapshot: {}\n",
                node.path("run/inventory.json").display()
            ),
        )
        .unwrap();
        // The shipped TaskProlog program, beside the node's gpuarchctl
        // (which it runs when the snapshot gives no Plan).
        let shipped = node.path("gpuarch-slurm-task-prolog");
        std::fs::copy(&artifacts().slurm_task_prolog, &shipped).unwrap();
        // slurm.conf names a program without arguments or env: a wrapper
        // points it at this bus and config.
        let prolog = d.join("task-prolog");
        std::fs::write(
            &prolog,
            format!(
                "#!/bin/sh\nDBUS_SYSTEM_BUS_ADDRESS={} GPUARCH_CONFIG={} exec {}\n",
                node.address,
                prolog_config.display(),
                shipped.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&prolog, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();

        let port = 20000 + (std::process::id() % 5000) * 2;
        // Addresses, not the host's name: an engine root's /etc/hosts has
        // only localhost.
        let conf = format!(
            "ClusterName=gpuarch\nSlurmctldHost={name}(127.0.0.1)\nSlurmctldPort={port}\nSlurmdPort={}\n\
             AuthType=auth/munge\nAuthInfo=socket={sock}\nCredType=cred/munge\n\
             SlurmUser=root\nSlurmdUser=root\nStateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool\n\
             SlurmctldPidFile={d}/ctld.pid\nSlurmdPidFile={d}/slurmd.pid\n\
             SlurmctldLogFile={d}/log/slurmctld.log\nSlurmdLogFile={d}/log/slurmd.log\n\
             ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nSelectType=select/cons_tres\n\
             GresTypes=gpu\nMpiDefault=none\nReturnToService=2\nSchedulerType=sched/builtin\n\
             JobCompType=jobcomp/none\nAccountingStorageType=accounting_storage/none\n\
             TaskProlog={prolog}\n\
             {slurm_line} NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN\n\
             PartitionName=debug Nodes={name} Default=YES MaxTime=INFINITE State=UP\n",
            port + 1,
            sock = sock.display(),
            d = d.display(),
            prolog = prolog.display(),
        );
        std::fs::write(d.join("slurm.conf"), conf).unwrap();
        let slurm_conf = d.join("slurm.conf");
        let node_dir = node.path("");
        let shared = [d, node_dir.as_path()];
        let conf_arg = slurm_conf.to_str().unwrap();
        let ctld = spawn(
            slurm_command(&shared, &["slurmctld", "-D", "-f", conf_arg])
                .env("SLURM_CONF", &slurm_conf),
            &d.join("log/slurmctld.out"),
        );
        // slurmd in a mount namespace whose /dev has stand-in GPU nodes.
        let olddev = d.join("olddev");
        std::fs::create_dir_all(&olddev).unwrap();
        let mut script = format!(
            "set -e; mount --rbind /dev {old}; mount -t tmpfs -o mode=755 tmpfs /dev; \
             for n in null zero full random urandom tty ptmx; do touch /dev/$n; mount --bind {old}/$n /dev/$n; done; \
             for n in pts shm mqueue; do mkdir -p /dev/$n; mount --rbind {old}/$n /dev/$n 2>/dev/null || true; done; ",
            old = olddev.display()
        );
        for m in &minors {
            script.push_str(&format!("mknod /dev/nvidia{m} c 195 {m}; "));
        }
        script.push_str(&format!(
            "exec slurmd -D -f {conf} -N {name}",
            conf = slurm_conf.display()
        ));
        let unshare = ["unshare", "--mount", "--propagation", "private"];
        let argv = ["sh", "-c", &script];
        let slurmd = spawn(
            match crate::roots::engine_root().ok().flatten() {
                // The root is entered in a mount namespace of its own.
                Some(_) => slurm_command(&shared, &argv),
                None => slurm_command(&[], &[&unshare[..], &argv[..]].concat()),
            }
            .env("SLURM_CONF", &slurm_conf),
            &d.join("log/slurmd.out"),
        );
        let c = Cluster {
            node,
            dir,
            name,
            node_dir,
            munged: Some(munged),
            ctld: Some(ctld),
            slurmd: Some(slurmd),
        };
        let t0 = Instant::now();
        loop {
            let o = c.cmd("sinfo").args(["-h", "-o", "%T"]).output().unwrap();
            let state = String::from_utf8_lossy(&o.stdout).trim().to_owned();
            if state == "idle" {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "the node is {state:?}, not idle: {}",
                c.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        let v = c.cmd("sinfo").arg("-V").output().unwrap();
        eprintln!("slurm: {}", String::from_utf8_lossy(&v.stdout).trim());
        Some(c)
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// A Slurm client command for this cluster, with an environment of
    /// its own (no gpuarch variables, no bus address: what a job gets
    /// comes from the TaskProlog alone).
    pub fn cmd(&self, program: &str) -> Command {
        // In the root too, the command starts in the cluster's directory
        // (sbatch gives the job its working directory).
        let mut c = match crate::roots::engine_root().ok().flatten() {
            Some(root) => crate::roots::command_in_dir(
                &root,
                &[self.dir.path(), &self.node_dir, &workspace_root()],
                self.dir.path(),
                program.as_ref(),
            ),
            None => Command::new(program),
        };
        c.env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
            .env("SLURM_CONF", self.path("slurm.conf"))
            .current_dir(self.dir.path());
        c
    }

    /// `srun ARGS env`: the step's environment, and the whole output.
    pub fn srun_env(&self, args: &[&str]) -> (std::collections::BTreeMap<String, String>, Output) {
        let o = self.cmd("srun").args(args).arg("env").output().unwrap();
        assert!(o.status.success(), "srun {args:?}: {o:?}\n{}", self.logs());
        let env = String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        (env, o)
    }

    /// The daemons' logs, for failure messages.
    pub fn logs(&self) -> String {
        [
            "log/slurmctld.log",
            "log/slurmd.log",
            "log/slurmd.out",
            "log/munged.out",
        ]
        .iter()
        .map(|f| {
            let t = std::fs::read_to_string(self.path(f)).unwrap_or_default();
            let tail: Vec<&str> = t.lines().rev().take(15).collect();
            format!(
                "== {f}\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
    }
}

fn wait(mut ok: impl FnMut() -> bool, what: &str) {
    let t0 = Instant::now();
    while !ok() {
        assert!(t0.elapsed() < Duration::from_secs(20), "no {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for c in [self.slurmd.take(), self.ctld.take(), self.munged.take()]
            .into_iter()
            .flatten()
        {
            let mut c = c;
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(5) {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A job's venv at `dir` holding `dists` (name, version), as `python -m
/// venv` and pip lay one out; its `bin`, to put first on a task's `PATH`.
pub fn job_venv(dir: &Path, dists: &[(&str, &str)]) -> PathBuf {
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    std::fs::write(
        dir.join("pyvenv.cfg"),
        "home = /usr/bin\ninclude-system-site-packages = false\n",
    )
    .unwrap();
    let python = dir.join("bin/python3");
    if !python.is_symlink() {
        std::os::unix::fs::symlink("/usr/bin/python3", python).unwrap();
    }
    let site = dir.join("lib/python3.12/site-packages");
    for (name, v) in dists {
        crate::stack::dist_info(&site, name, v);
    }
    dir.join("bin")
}
