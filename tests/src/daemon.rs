//! A private system bus with gpuarchd on it, for the daemon's tests and
//! benchmark: a real `dbus-daemon` configured like the system bus (deny by
//! default, holes punched by `packaging/dbus/io.gpuarch1.conf`), the fake
//! NVML behind the real nvml-wrapper, and a real sd_notify socket.
//!
//! Test support: a failed unwrap here is a failed test.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use gpuarch_core::snapshot::Snapshot;

use crate::{artifacts, fixture, workspace_root};

/// Which bus policy the private bus runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Policy {
    /// The shipped io.gpuarch1.conf, as installed.
    Shipped,
    /// The shipped file, then a rule letting anyone call anything on
    /// io.gpuarch1: only the daemon's own check stands.
    Open,
}

/// A private system bus, a gpuarchd on it, and the files they use.
#[derive(Debug)]
pub struct Node {
    dir: tempfile::TempDir,
    bus: Child,
    pub address: String,
    pub daemon: Option<Child>,
    /// After [`Node::handover`]: the gpuarchd that took over, a child of
    /// this process only as its subreaper.
    pub successor: Option<i32>,
    notify: UnixDatagram,
    /// Every sd_notify datagram received so far.
    pub notes: Vec<String>,
    /// The capability bounding set gpuarchd starts with (`setpriv
    /// --bounding-set`, as `CapabilityBoundingSet=` of the unit); `None`:
    /// the test's own (root's, all).
    pub bounding_set: Option<String>,
}

/// The unit's `CapabilityBoundingSet=`, as setpriv spells it.
pub fn unit_bounding_set() -> String {
    let unit = std::fs::read_to_string(workspace_root().join("systemd/gpuarchd.service")).unwrap();
    let caps: Vec<String> = unit
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .unwrap_or_default()
        .split_whitespace()
        .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase()))
        .collect();
    std::iter::once("-all".to_owned())
        .chain(caps)
        .collect::<Vec<_>>()
        .join(",")
}

fn bus_config(dir: &Path, policy: Policy) -> String {
    let shipped = workspace_root().join("packaging/dbus/io.gpuarch1.conf");
    let open = if policy == Policy::Open {
        r#"<policy context="default"><allow send_destination="io.gpuarch1"/></policy>"#
    } else {
        ""
    };
    format!(
        r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path={dir}/bus</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <deny own="*"/>
    <deny send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_requested_reply="true" send_type="method_return"/>
    <allow send_requested_reply="true" send_type="error"/>
    <allow receive_type="method_call"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
    <allow receive_type="signal"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Introspectable"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Properties"/>
  </policy>
  <include>{shipped}</include>
  {open}
</busconfig>
"#,
        dir = dir.display(),
        shipped = shipped.display(),
    )
}

/// A dbus-daemon on `conf`, and its address without the server's guid (as
/// the real system bus's is written), so that clients reach a restarted one.
fn spawn_bus(conf: &Path) -> (Child, String) {
    let mut bus = Command::new("dbus-daemon")
        .arg(format!("--config-file={}", conf.display()))
        .args(["--nofork", "--print-address"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut address = String::new();
    BufReader::new(bus.stdout.take().unwrap())
        .read_line(&mut address)
        .unwrap();
    assert!(address.starts_with("unix:"), "dbus-daemon said {address:?}");
    let address = address
        .trim()
        .split(',')
        .filter(|kv| !kv.starts_with("guid="))
        .collect::<Vec<_>>()
        .join(",");
    (bus, address)
}

impl Node {
    pub fn new(topology: &str, policy: Policy) -> Self {
        Self::new_in(&std::env::temp_dir(), topology, policy)
    }

    /// [`Node::new`] with its directory under `parent` (one another mount
    /// namespace shares, as the engines' is).
    pub fn new_in(parent: &Path, topology: &str, policy: Policy) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("gpuarchd-")
            .tempdir_in(parent)
            .unwrap();
        // Other users (nobody) must reach the bus socket and run gpuarchctl.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::copy(fixture(topology), dir.path().join("topology.json")).unwrap();
        // Defaults, but the kernel cache stays inside the test's directory.
        std::fs::write(
            dir.path().join("config.yaml"),
            kernels_yaml(dir.path(), &[], None),
        )
        .unwrap();
        std::fs::copy(&artifacts().gpuarchctl, dir.path().join("gpuarchctl")).unwrap();
        let conf = dir.path().join("bus.conf");
        std::fs::write(&conf, bus_config(dir.path(), policy)).unwrap();
        let (bus, address) = spawn_bus(&conf);
        let notify = UnixDatagram::bind(dir.path().join("notify")).unwrap();
        Node {
            dir,
            bus,
            address,
            daemon: None,
            successor: None,
            notify,
            notes: Vec::new(),
            bounding_set: None,
        }
    }

    /// A node on the 2080 Ti + 3090 whose gpuarchd builds the sample kernel
    /// packages with the NVRTC in `cuda`; `extra` adds `kernels:` keys.
    pub fn with_kernels(cuda: &Path, extra: &str) -> Self {
        let node = Node::new("2080ti-3090", Policy::Shipped);
        let pkgs = workspace_root().join("kernels/packages");
        let mut yaml = kernels_yaml(&node.path(""), &[&pkgs], Some(cuda));
        yaml.push_str(extra);
        std::fs::write(node.path("config.yaml"), yaml).unwrap();
        node
    }

    /// `yaml` followed by this node's private `kernels:` paths, so that a
    /// test's config never leaves gpuarchd on the host's /var/cache/gpuarch
    /// or /run/gpuarch (its line numbers stay as written).
    pub fn private_config(&self, yaml: &str) -> String {
        format!("{yaml}{}", kernels_yaml(&self.path(""), &[], None))
    }

    /// Stop the bus under the daemon, as a dbus-daemon restart would.
    pub fn kill_bus(&mut self) {
        let _ = self.bus.kill();
        let _ = self.bus.wait();
    }

    /// Start the bus again at the same address (after [`Node::kill_bus`]).
    pub fn restart_bus(&mut self) {
        let (bus, address) = spawn_bus(&self.path("bus.conf"));
        assert_eq!(address, self.address);
        self.bus = bus;
    }

    /// The dbus-daemon's process id.
    pub fn bus_pid(&self) -> u32 {
        self.bus.id()
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn daemon_cmd(&self) -> Command {
        self.daemon_cmd_via(&[])
    }

    /// gpuarchd run through `prefix` (`nsenter --mount=... --`), else as
    /// [`Node::daemon_cmd`].
    pub fn daemon_cmd_via(&self, prefix: &[std::ffi::OsString]) -> Command {
        let mut c = match (&self.bounding_set, prefix.split_first()) {
            (None, Some((program, args))) => {
                let mut c = Command::new(program);
                c.args(args).arg(&artifacts().gpuarchd);
                c
            }
            (None, None) => Command::new(&artifacts().gpuarchd),
            (Some(set), _) => {
                let mut c = Command::new("setpriv");
                c.arg(format!("--bounding-set={set}"))
                    .arg("--inh-caps=-all")
                    .arg("--")
                    .arg(&artifacts().gpuarchd);
                c
            }
        };
        c.arg("--nvml-lib")
            .arg(&artifacts().fake_nvml)
            .arg("--snapshot")
            .arg(self.path("run/inventory.json"))
            .arg("--config")
            .arg(self.path("config.yaml"))
            .arg("-v")
            .env("DBUS_SYSTEM_BUS_ADDRESS", &self.address)
            .env("FAKE_NVML_TOPOLOGY", self.path("topology.json"))
            .env("NOTIFY_SOCKET", self.path("notify"))
            .env_remove("GPUARCH_CONFIG")
            .env_remove("JOURNAL_STREAM")
            .env_remove("RUST_LOG");
        c
    }

    /// Start gpuarchd and wait for READY=1; the time it took.
    pub fn start(&mut self, env: &[(&str, &str)]) -> Duration {
        self.start_via(&[], env)
    }

    /// [`Node::start`], gpuarchd run through `prefix`
    /// ([`Node::daemon_cmd_via`]).
    pub fn start_via(&mut self, prefix: &[std::ffi::OsString], env: &[(&str, &str)]) -> Duration {
        let log = std::fs::File::create(self.path("daemon.log")).unwrap();
        self.notes.clear();
        let t0 = Instant::now();
        let mut cmd = self.daemon_cmd_via(prefix);
        cmd.envs(env.iter().copied()).stderr(log);
        self.daemon = Some(cmd.spawn().unwrap());
        self.wait_note("READY=1", Duration::from_secs(10));
        t0.elapsed()
    }

    /// Wait for a datagram containing `what`; all are kept in `notes`.
    pub fn wait_note(&mut self, what: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        let mut buf = [0u8; 4096];
        while !self.notes.iter().any(|n| n.contains(what)) {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "no {what} within {limit:?}; got {:?}; log:\n{}",
                self.notes,
                self.log()
            );
            self.notify.set_read_timeout(Some(left)).unwrap();
            if let Ok(n) = self.notify.recv(&mut buf) {
                self.notes
                    .push(String::from_utf8_lossy(&buf[..n]).into_owned());
            }
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.path("daemon.log")).unwrap_or_default()
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot::from_json(&std::fs::read(self.path("run/inventory.json")).unwrap()).unwrap()
    }

    /// SIGTERM; the exit status and how long it took.
    pub fn stop(&mut self) -> (std::process::ExitStatus, Duration) {
        let t0 = Instant::now();
        if let Some(pid) = self.successor.take() {
            signal(pid, nix::sys::signal::Signal::SIGTERM);
            return (wait_pid(pid), t0.elapsed());
        }
        let mut child = self.daemon.take().unwrap();
        signal(child.id() as i32, nix::sys::signal::Signal::SIGTERM);
        let status = child.wait().unwrap();
        (status, t0.elapsed())
    }

    /// The running gpuarchd's pid.
    pub fn pid(&self) -> i32 {
        self.daemon
            .as_ref()
            .map(|c| c.id() as i32)
            .or(self.successor)
            .expect("gpuarchd is not running")
    }

    /// SIGUSR2, as the package's upgrade sends it: gpuarchd starts its
    /// successor, which says `MAINPID=` once registered with NRI and takes
    /// the bus name; the old one then exits. Returns the old one's exit
    /// status; the successor is the running gpuarchd from then on.
    pub fn handover(&mut self) -> std::process::ExitStatus {
        // The successor is the old gpuarchd's child: made this process's
        // when the old one exits, so that it can be waited for.
        // SAFETY: prctl with plain integer arguments.
        let r = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
        assert_eq!(r, 0, "PR_SET_CHILD_SUBREAPER");
        let old = self.pid();
        self.notes.clear();
        signal(old, nix::sys::signal::Signal::SIGUSR2);
        self.wait_note("MAINPID=", Duration::from_secs(10));
        let successor: i32 = self
            .notes
            .iter()
            .flat_map(|n| n.lines())
            .find_map(|l| l.strip_prefix("MAINPID="))
            .and_then(|p| p.parse().ok())
            .expect("MAINPID=<pid>");
        assert_ne!(successor, old, "{:?}", self.notes);
        let status = match self.daemon.take() {
            Some(mut c) => c.wait().unwrap(),
            None => wait_pid(old),
        };
        self.successor = Some(successor);
        status
    }

    /// gpuarchctl as root, or as nobody with `groups` (setpriv).
    pub fn ctl(&self, as_nobody: Option<&[u32]>, args: &[&str]) -> Output {
        self.ctl_cmd(as_nobody, args).output().unwrap()
    }

    /// The command [`Node::ctl`] runs, to spawn it.
    pub fn ctl_cmd(&self, as_nobody: Option<&[u32]>, args: &[&str]) -> Command {
        let ctl = self.path("gpuarchctl");
        let mut cmd = match as_nobody {
            None => Command::new(&ctl),
            Some(groups) => {
                let mut c = Command::new("setpriv");
                c.args(["--reuid=65534", "--regid=65534"]);
                if groups.is_empty() {
                    c.arg("--clear-groups");
                } else {
                    let list: Vec<String> = groups.iter().map(u32::to_string).collect();
                    c.arg(format!("--groups={}", list.join(",")));
                }
                c.arg("--").arg(&ctl);
                c
            }
        };
        cmd.args(args)
            .env("DBUS_SYSTEM_BUS_ADDRESS", &self.address)
            // The node's config, never the host's /etc/gpuarch.
            .env("GPUARCH_CONFIG", self.path("config.yaml"))
            .env_remove("GPUARCH_INVENTORY");
        cmd
    }

    pub fn rewrite_topology(&self, f: impl FnOnce(&mut Snapshot)) {
        let mut s =
            Snapshot::from_json(&std::fs::read(self.path("topology.json")).unwrap()).unwrap();
        f(&mut s);
        std::fs::write(self.path("topology.json"), s.to_json_pretty()).unwrap();
    }

    /// Does anyone own io.gpuarch1 on this bus now?
    pub fn name_owned(&self) -> bool {
        block_on(async {
            let conn = self.conn().await;
            zbus::fdo::DBusProxy::new(&conn)
                .await
                .unwrap()
                .name_has_owner("io.gpuarch1".try_into().unwrap())
                .await
                .unwrap()
        })
    }

    pub async fn conn(&self) -> zbus::Connection {
        zbus::connection::Builder::address(self.address.as_str())
            .build()
            .await
            .unwrap()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            let _ = d.kill();
            let _ = d.wait();
        }
        if let Some(pid) = self.successor.take() {
            signal(pid, nix::sys::signal::Signal::SIGKILL);
            wait_pid(pid);
        }
        let _ = self.bus.kill();
        let _ = self.bus.wait();
    }
}

fn signal(pid: i32, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig)
        .unwrap_or_else(|e| panic!("{sig} to {pid}: {e}"));
}

/// Wait for `pid`, a child of this process or an orphan it reaps.
fn wait_pid(pid: i32) -> std::process::ExitStatus {
    use std::os::unix::process::ExitStatusExt;
    let mut status = 0;
    // SAFETY: a plain syscall with a pointer to a live local.
    let r = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(r, pid, "waitpid {pid}: {}", std::io::Error::last_os_error());
    std::process::ExitStatus::from_raw(status)
}

pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// A `kernels:` config section with every path under `dir`.
pub fn kernels_yaml(dir: &Path, package_dirs: &[&Path], cuda: Option<&Path>) -> String {
    let list = |v: Vec<String>| format!("[{}]", v.join(", "));
    format!(
        "kernels:\n  package_dirs: {}\n  cache_dir: {d}/cache\n  mount_root: {d}/kernels\n  spool_dir: {d}/spool\n  view_dir: {d}/views\n  cuda_dirs: {}\n",
        list(
            package_dirs
                .iter()
                .map(|p| p.display().to_string())
                .collect()
        ),
        list(cuda.iter().map(|p| p.display().to_string()).collect()),
        d = dir.display(),
    )
}
