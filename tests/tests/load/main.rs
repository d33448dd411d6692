//! Load: 50 containers started at once through `gpuarch-runtime` in front of
//! runc, and through podman with the shipped precreate hook, on the 2080 Ti
//! and 3090 while gpuarchd pre-warms kernel packages with NVRTC. Every
//! container must get exactly its own Plan and its own kernel builds, and
//! none may fail. Each round starts, at the same moment, the same 50
//! containers without gpuarch (and, for runc, with gpuarch configured
//! without kernel packages), so the start time gpuarch adds is measured
//! under the very same load.
//!
//! The figures in docs/BENCHMARKS.md come from the release binaries:
//! `sudo GPUARCH_TEST_PROFILE=release cargo test -p gpuarch-tests --test load
//! -- --nocapture` (CI runs it so, after the package step built them;
//! `cargo test --release` gives the same binaries and a release harness).

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use gpuarch_tests::containers::{SCRIPT, Scene, Seen, make_rootfs};
use gpuarch_tests::daemon::{Node, Policy, kernels_yaml};
use gpuarch_tests::{need_containers, which, workspace_root};

mod batch;
use batch::{Run, UP, batch};

/// Containers per batch.
const N: usize = 50;
/// Rounds of each way of starting containers.
const RUNC_ROUNDS: usize = 6;
const PODMAN_ROUNDS: usize = 2;

/// What a container is given and what it must see: the hints, and for each
/// of its GPUs (in container order) the host index and the arch of the
/// only builds that may serve it.
struct Want {
    env: &'static [&'static str],
    hints: Option<(&'static str, &'static str, &'static str)>,
    gpus: &'static [(u64, &'static str)],
}

/// Container `i` gets `WANTS[i % 5]`: neighbours in a batch differ.
const WANTS: [Want; 5] = [
    Want {
        env: &["NVIDIA_VISIBLE_DEVICES=0"],
        hints: Some(("7.5", "float16", "sdpa")),
        gpus: &[(0, "sm_75")],
    },
    Want {
        env: &["NVIDIA_VISIBLE_DEVICES=1"],
        hints: Some(("8.6", "bfloat16", "flash_attention_2")),
        gpus: &[(1, "sm_86")],
    },
    Want {
        env: &["NVIDIA_VISIBLE_DEVICES=0,1"],
        hints: Some(("7.5;8.6", "float16", "sdpa")),
        gpus: &[(0, "sm_75"), (1, "sm_86")],
    },
    Want {
        env: &["NVIDIA_VISIBLE_DEVICES=0,1", "CUDA_VISIBLE_DEVICES=1"],
        hints: Some(("8.6", "bfloat16", "flash_attention_2")),
        gpus: &[(1, "sm_86")],
    },
    Want {
        env: &["NVIDIA_VISIBLE_DEVICES=none"],
        hints: None,
        gpus: &[],
    },
];

/// Container `i`'s env: its selection and its number.
fn env_of(i: usize) -> Vec<String> {
    let mut env: Vec<String> = WANTS[i % WANTS.len()]
        .env
        .iter()
        .map(|e| (*e).to_owned())
        .collect();
    env.push(format!("LOAD_ID={i}"));
    env
}

/// Archs pre-warmed beside the containers, one job each. None of them runs
/// on a 7.5 or an 8.6 GPU, so they never change what a container may be
/// given.
const EXTRA_ARCHS: [&str; 14] = [
    "8.9", "9.0", "5.0", "12.0", "6.1", "10.0", "8.7", "5.2", "6.0", "10.3", "6.2", "5.3", "12.1",
    "10.1",
];

/// Pre-warm jobs, one arch after another, until told to stop or out of
/// archs; says whether it still had work when asked to stop.
struct Prewarm {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<String>>,
}

impl Prewarm {
    fn start(node: &Node) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let cmds: Vec<Command> = EXTRA_ARCHS
            .iter()
            .map(|a| node.ctl_cmd(None, &["prewarm", "--arch", a]))
            .collect();
        let st = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut failed = Vec::new();
            for mut c in cmds {
                if st.load(Ordering::SeqCst) {
                    return failed;
                }
                let o = c.output().unwrap();
                if !o.status.success() {
                    failed.push(String::from_utf8_lossy(&o.stderr).into_owned());
                }
            }
            failed
        });
        Prewarm { stop, thread }
    }

    /// Still building: not out of archs (it stops early only once
    /// [`Prewarm::finish`] asks it to).
    fn busy(&self) -> bool {
        !self.thread.is_finished()
    }

    /// Stop after the job in flight; every job must have been served.
    fn finish(self, node: &Node) {
        self.stop.store(true, Ordering::SeqCst);
        let failed = self.thread.join().unwrap();
        assert!(failed.is_empty(), "pre-warm: {failed:?}\n{}", node.log());
    }
}

/// How a container was started.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    /// Without gpuarch: the baseline.
    Plain,
    /// With gpuarch, kernel packages and all.
    Gpuarch,
    /// With gpuarch configured without kernel packages: the Plan alone.
    PlanOnly,
}

/// Container `i` saw its own number, and: started plain, nothing of
/// gpuarch; with gpuarch, its own Plan and, of the kernel packages, whole
/// views holding only builds for its own GPUs.
fn verify(what: &str, i: usize, kind: Kind, seen: &Seen, uuids: &[String]) {
    let ctx = || format!("{what}, {kind:?} container {i}");
    assert!(
        seen.out.status.success(),
        "{}: failed: {:?}\n{}",
        ctx(),
        seen.out.status,
        seen.stderr()
    );
    assert_eq!(
        seen.get("LOAD_ID"),
        Some(i.to_string().as_str()),
        "{}: not its own output",
        ctx()
    );
    let want = &WANTS[i % WANTS.len()];
    let hints = if kind == Kind::Plain {
        None
    } else {
        want.hints
    };
    let Some((arch, dtype, attn)) = hints else {
        seen.untouched();
        assert!(
            seen.manifests().is_empty() && seen.files().trim().is_empty(),
            "{}: kernels without a GPU: {}",
            ctx(),
            seen.kernels
        );
        return;
    };
    assert_eq!(
        seen.hints(),
        (Some(arch), Some(dtype), Some(attn)),
        "{}",
        ctx()
    );
    let files = seen.files();
    if kind == Kind::PlanOnly {
        assert!(files.trim().is_empty(), "{}: {files}", ctx());
    }
    // All its packages through one read-only mount, the container's view.
    if !files.trim().is_empty() {
        assert_eq!(seen.kernel_mounts, ["/opt/gpuarch/kernels"], "{}", ctx());
        assert!(seen.kernel_mounts_writable.is_empty(), "{}", ctx());
    }
    assert!(!files.contains("WRITABLE"), "{}: {files}", ctx());
    for f in files.lines().filter(|l| !l.is_empty()) {
        // /opt/gpuarch/kernels/PKG/manifest.json or .../PKG/ARCH/FILE
        let parts: Vec<&str> = f.split('/').collect();
        let ok = match parts[..] {
            [_, _, _, _, _, "manifest.json"] => true,
            [_, _, _, _, _, build, _] => want.gpus.iter().any(|(_, a)| *a == build),
            _ => false,
        };
        assert!(ok, "{}: {f} is not for its GPUs", ctx());
    }
    for (pkg, m) in seen.manifests() {
        let gpus = m["gpus"].as_array().unwrap();
        assert_eq!(gpus.len(), want.gpus.len(), "{}: {pkg}: {m}", ctx());
        for (k, (g, (host, arch))) in gpus.iter().zip(want.gpus).enumerate() {
            assert_eq!(g["index"], k as u64, "{}: {pkg}: {m}", ctx());
            assert_eq!(g["host_index"], *host, "{}: {pkg}: {m}", ctx());
            assert_eq!(g["uuid"], uuids[*host as usize], "{}: {pkg}: {m}", ctx());
            // A GPU whose build is not published yet is a miss; a served
            // one names its own arch, and its files are all there.
            if g.get("missing").is_some() {
                continue;
            }
            assert_eq!(g["arch"], *arch, "{}: {pkg}: {m}", ctx());
            for f in g["files"].as_array().unwrap() {
                let path = format!("/opt/gpuarch/kernels/{pkg}/{}", f.as_str().unwrap());
                assert!(
                    files.lines().any(|l| l == path),
                    "{}: {path} in the manifest but not in the container",
                    ctx()
                );
            }
        }
    }
}

/// Each kind's start figure over the rounds of two measures: the median
/// round's ratio (with an even count, the mean of the middle two).
fn pooled(first: &[Added], again: &[Added]) -> Vec<Added> {
    first
        .iter()
        .zip(again)
        .map(|(a, b)| {
            let mut r: Vec<f64> = a.rounds.iter().chain(&b.rounds).copied().collect();
            r.sort_by(f64::total_cmp);
            let mid = r.len() / 2;
            let m = if r.len().is_multiple_of(2) {
                (r[mid - 1] + r[mid]) / 2.0
            } else {
                r[mid]
            };
            eprintln!(
                "  {:?}: {:+.1}% added, the median of both measures' {} rounds",
                a.kind,
                100.0 * (m - 1.0),
                r.len()
            );
            Added {
                start: m - 1.0,
                rounds: r,
                ..b.clone()
            }
        })
        .collect()
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// The rounds of one way of starting containers: in each, `N` containers
/// of each kind, all started at once.
struct Tally {
    kinds: Vec<Kind>,
    /// Per kind, per round, each container's time from its command's start
    /// to its first line.
    up: Vec<Vec<Vec<Duration>>>,
    /// Per kind, each container's CPU time, all rounds together.
    cpu: Vec<Vec<Duration>>,
    /// Per round, the time until the last container exited.
    walls: Vec<Duration>,
    /// Rounds that ended with the pre-warm still running.
    during_prewarm: usize,
}

/// What one kind added to the baseline kind's start, as fractions.
#[derive(Clone, Debug)]
struct Added {
    kind: Kind,
    /// Start time: the geometric mean over rounds of the ratio of the two
    /// kinds' median starts in the same round.
    start: f64,
    /// CPU time per container: the ratio of the two kinds' medians over
    /// all rounds.
    cpu: f64,
    /// Each round's ratio of the two kinds' median starts.
    rounds: Vec<f64>,
}

impl Tally {
    /// Print the figures; return what each kind after the first added to
    /// the first.
    fn report(&mut self, what: &str) -> Vec<Added> {
        let rounds = self.walls.len();
        let mut medians: Vec<Vec<Duration>> = self
            .up
            .iter_mut()
            .map(|k| k.iter_mut().map(|r| median(r)).collect())
            .collect();
        let base = medians.remove(0);
        let mut cpu: Vec<Duration> = self.cpu.iter_mut().map(|c| median(c)).collect();
        let base_cpu = cpu.remove(0);
        eprintln!(
            "{what}: {rounds} rounds (after one not counted) of {N} containers of each of {:?}, \
             all at once ({} ended during the pre-warm, the last exit after {:.2?} in the median \
             round); {:?}: start {:.1?} (median of round medians; per round {}), CPU {:.1?} \
             (median)",
            self.kinds,
            self.during_prewarm,
            median(&mut self.walls),
            self.kinds[0],
            median(&mut base.clone()),
            base.iter()
                .map(|d| format!("{d:.2?}"))
                .collect::<Vec<_>>()
                .join(" "),
            base_cpu,
        );
        medians
            .iter()
            .zip(&self.kinds[1..])
            .zip(cpu)
            .map(|((m, &kind), cpu)| {
                let ratios: Vec<f64> = m
                    .iter()
                    .zip(&base)
                    .map(|(a, b)| a.div_duration_f64(*b))
                    .collect();
                let added = Added {
                    kind,
                    start: (ratios.iter().map(|r| r.ln()).sum::<f64>() / rounds as f64).exp()
                        - 1.0,
                    cpu: cpu.div_duration_f64(base_cpu) - 1.0,
                    rounds: ratios.clone(),
                };
                eprintln!(
                    "  {kind:?}: start {:.1?}, {:+.1}% added (per round {}); CPU {cpu:.1?}, {:+.1}% added",
                    median(&mut m.clone()),
                    100.0 * added.start,
                    ratios
                        .iter()
                        .map(|r| format!("{:+.1}%", 100.0 * (r - 1.0)))
                        .collect::<Vec<_>>()
                        .join(" "),
                    100.0 * added.cpu,
                );
                added
            })
            .collect()
    }
}

/// Run `rounds` rounds of `N` containers of each of `kinds`, started at
/// once, after one more round that is not counted (the first round of a
/// run is the slowest: caches are cold and the pre-warm is starting), and
/// interleaved so that every kind sees the same load; `make(i, kind)`
/// builds container `i`'s command. Every container of every round is
/// verified.
fn measure(
    what: &str,
    rounds: usize,
    kinds: &[Kind],
    prewarm: &Prewarm,
    uuids: &[String],
    make: impl Fn(usize, Kind) -> Command,
) -> Tally {
    let mut t = Tally {
        kinds: kinds.to_vec(),
        up: vec![Vec::new(); kinds.len()],
        cpu: vec![Vec::new(); kinds.len()],
        walls: Vec::new(),
        during_prewarm: 0,
    };
    for round in 0..=rounds {
        // Container i of each kind starts next to the others' i; which
        // goes first turns with i (and with the round), so every kind
        // starts as often first as last in every round. (Turning it only
        // by round made one round's ratio swing by 20% either way.)
        let slots: Vec<(usize, usize)> = (0..N)
            .flat_map(|i| (0..kinds.len()).map(move |j| (i, (i + round + j) % kinds.len())))
            .collect();
        let cmds = slots.iter().map(|&(i, k)| make(i, kinds[k])).collect();
        let (wall, runs) = batch(cmds);
        let mut ups = vec![Vec::new(); kinds.len()];
        let mut cpus = vec![Vec::new(); kinds.len()];
        for (&(i, k), Run { up, cpu, out }) in slots.iter().zip(runs) {
            assert!(
                out.stdout.starts_with(format!("{UP}\n").as_bytes()),
                "{what}, {:?} container {i}: {out:?}",
                kinds[k]
            );
            verify(what, i, kinds[k], &Seen::parse(out), uuids);
            ups[k].push(up);
            cpus[k].push(cpu);
        }
        if round == 0 {
            continue;
        }
        if prewarm.busy() {
            t.during_prewarm += 1;
        }
        for (k, (u, c)) in ups.into_iter().zip(cpus).enumerate() {
            t.up[k].push(u);
            t.cpu[k].extend(c);
        }
        t.walls.push(wall);
    }
    t
}

/// The target: gpuarch-runtime in front of runc adds under
/// 10% to a container's start.
const TARGET: f64 = 0.10;

/// Added start time allowed: a guard against regressions, not the target.
/// With 150 containers and NVRTC builds on two cores, one round's ratio
/// still swings by 10% or more either way, so the geometric mean of six
/// is only good to a few percent; the figures in docs/BENCHMARKS.md are
/// that mean over several runs.
const START_GUARD: f64 = 0.25;

/// The target, held on the steadier measure: on a saturated machine a
/// container's start follows the CPU time it takes, and that of each
/// container is counted exactly. Only release binaries (what a host runs
/// and `scripts/test` tests here) are held to it; a debug build plans more
/// slowly. The harness's own profile does not count: its CPU time is no
/// container's.
fn cpu_allowed() -> f64 {
    if gpuarch_tests::artifacts_profile() == "dev" {
        0.20
    } else {
        TARGET
    }
}

/// A tmpfs mounted over a directory for as long as it lives.
struct Over(PathBuf);

impl Over {
    fn new(dir: &Path) -> Self {
        use nix::mount::{MsFlags, mount};
        mount(
            Some("tmpfs"),
            dir,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some("mode=0700"),
        )
        .unwrap_or_else(|e| panic!("mount a tmpfs on {}: {e}", dir.display()));
        Over(dir.to_owned())
    }
}

impl Drop for Over {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// A tmpfs, mounted on a fresh directory for as long as it lives (the
/// mount goes before the directory: fields drop in order).
struct Tmpfs {
    _mount: Over,
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        Tmpfs {
            _mount: Over::new(dir.path()),
            dir,
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// Container `i` of `kind`'s own rootfs, as an engine gives each
/// container its own: made on first use, kept for the next round.
fn rootfs_of(s: &Scene, kind: Kind, i: usize) -> PathBuf {
    let r = s.path().join(format!("rootfs-{kind:?}-{i}"));
    if !r.exists() {
        make_rootfs(&r);
    }
    r
}

#[test]
fn fifty_containers_at_once_each_get_their_own_plan() {
    need_containers!("runc", "podman", "dbus-daemon");
    let Some(cuda) = gpuarch_tests::cuda_dir() else {
        return;
    };
    eprintln!(
        "load: gpuarch's binaries from profile {}",
        gpuarch_tests::artifacts_profile()
    );
    let mut node = Node::new("2080ti-3090", Policy::Shipped);
    let heavy = node.path("heavy-packages");
    gpuarch_tests::heavy_packages(&heavy, 3);
    let samples = workspace_root().join("kernels/packages");
    let yaml = kernels_yaml(&node.path(""), &[&samples, &heavy], Some(&cuda));
    std::fs::write(node.path("config.yaml"), &yaml).unwrap();
    // Pre-warms the host's archs at start; more archs are asked for below.
    node.start(&[]);
    let uuids: Vec<String> = node
        .snapshot()
        .devices
        .into_iter()
        .map(|d| d.uuid)
        .collect();

    let mut s = Scene::new();
    // The hook's and the shim's own writes (their log, the Plan records,
    // the image read's cache) on a tmpfs, as a host keeps them
    // (/run/gpuarch; the log in the journal): on this machine's ext4 they
    // wait behind the journal commits of what was written just before (a
    // CI run's release build and fuzzing), which no host's start pays.
    let _scene = Over::new(s.path());
    make_rootfs(&s.path().join("rootfs"));
    // Bundles on a tmpfs, where engines keep them (containerd and Docker
    // under /run/containerd, CRI-O under /run/containers). On this
    // machine's ext4 the shim's atomic rewrite of config.json (a new file
    // renamed over the old) costs about 0.4 ms more, and waits behind the
    // journal commits of the builds the daemon writes meanwhile (see
    // docs/BENCHMARKS.md).
    let bundles = Tmpfs::new();
    s.bundles = Some(bundles.path().to_owned());
    // Each container has a rootfs of its own, and, as under Docker and
    // Kubernetes, no mount on /run.
    s.run_tmpfs = false;
    // The usual probe, after a first line that marks the process running.
    s.probe = Box::leak(format!("echo {UP}; {SCRIPT}").into_boxed_str());
    // The daemon's snapshot, as on a host, not a fixture.
    s.inventory = Some(node.path("run/inventory.json"));
    let runc_path = which("runc").unwrap();
    s.config_yaml = "kernels:\n  mount_root: /nonexistent/gpuarch-kernels\n".into();
    let plan_only = s.path().join("plan-only.yaml");
    std::fs::rename(s.config_file(Some(&runc_path)), &plan_only).unwrap();
    s.config_yaml = yaml;
    let config = s.config_file(Some(&runc_path));
    let hooks = s.podman_hooks();
    let no_hooks = s.path().join("no-hooks");
    std::fs::create_dir_all(&no_hooks).unwrap();

    let prewarm = Prewarm::start(&node);
    // runc, plain or with gpuarch-runtime in front. The shim rewrites a
    // bundle's config.json, so each container gets a fresh bundle.
    let runc_kinds = [Kind::Plain, Kind::Gpuarch, Kind::PlanOnly];
    let runc_cmd = |i, kind| {
        let env = env_of(i);
        let env: Vec<&str> = env.iter().map(String::as_str).collect();
        let bundle = s.bundle_on(&rootfs_of(&s, kind, i), "runc", &env, None);
        let cfg = if kind == Kind::PlanOnly {
            &plan_only
        } else {
            &config
        };
        s.bundle_cmd("runc", &bundle, kind != Kind::Plain, cfg)
    };
    let measure_runc = || measure("runc", RUNC_ROUNDS, &runc_kinds, &prewarm, &uuids, runc_cmd);
    let mut runc = measure_runc();
    // podman, with the shipped hooks.d file or an empty hooks dir.
    let podman_kinds = [Kind::Plain, Kind::Gpuarch];
    let podman_cmd = |i, kind| {
        let args: Vec<String> = env_of(i)
            .into_iter()
            .flat_map(|e| ["-e".to_owned(), e])
            .collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let dir = if kind == Kind::Plain {
            &no_hooks
        } else {
            &hooks
        };
        s.podman_cmd(dir, &rootfs_of(&s, kind, i), &args)
    };
    let measure_podman = || {
        measure(
            "podman",
            PODMAN_ROUNDS,
            &podman_kinds,
            &prewarm,
            &uuids,
            podman_cmd,
        )
    };
    let mut podman = measure_podman();

    let runc_added = runc.report("runc behind gpuarch-runtime");
    let podman_added = podman.report("podman with the precreate hook");
    assert_eq!(
        runc.during_prewarm + podman.during_prewarm,
        RUNC_ROUNDS + PODMAN_ROUNDS,
        "the pre-warm ran out before the containers did"
    );
    // The start guard, on a figure that swings by tens of percent from
    // round to round: a way of starting over it is measured again, all
    // its rounds, and fails only if it is over again. A real regression
    // of that size is there both times; one bad stretch of this machine
    // (a CI run once saw its rounds climb +23%, -9%, +21%, +30%, +43%,
    // +71% while the CPU each container took stayed within 6%) is not.
    // Measured again, a way of starting is judged on the median round of
    // both measures: a round or a few that a stretch of the machine slowed
    // (one CI run's second measure had a round at +126% among five from
    // +1.6% to +50%) move it no more than any other round does.
    let over = |added: &[Added]| added.iter().any(|a| a.start >= START_GUARD);
    let runc_start = if over(&runc_added) {
        eprintln!("runc: a start figure over the guard; measuring again");
        let again = measure_runc().report("runc behind gpuarch-runtime, again");
        pooled(&runc_added, &again)
    } else {
        runc_added.clone()
    };
    let podman_start = if over(&podman_added) {
        eprintln!("podman: a start figure over the guard; measuring again");
        let again = measure_podman().report("podman with the precreate hook, again");
        pooled(&podman_added, &again)
    } else {
        podman_added
    };
    prewarm.finish(&node);
    let all = runc_start.iter().map(|a| ("runc", a));
    for (what, a) in all.chain(podman_start.iter().map(|a| ("podman", a))) {
        assert!(
            a.start < START_GUARD,
            "{what}, {:?}: gpuarch added {:.1}% to a container's start, over {:.0}%, measured twice",
            a.kind,
            100.0 * a.start,
            100.0 * START_GUARD
        );
    }
    // The case held to the target: the shim in front of runc, no kernel packages.
    // Kernel packages add runc's work for their mounts (about 0.2 ms of CPU
    // each, a container of two GPUs gets three per package); podman's CPU
    // time leaves out conmon's and the runtime's, which podman does not wait
    // for, so it is reported, not held.
    let plan_only = runc_added
        .iter()
        .find(|a| a.kind == Kind::PlanOnly)
        .unwrap();
    assert!(
        plan_only.cpu < cpu_allowed(),
        "gpuarch-runtime added {:.1}% to a runc container's CPU time, over {:.0}%",
        100.0 * plan_only.cpu,
        100.0 * cpu_allowed()
    );
    let (status, _) = node.stop();
    assert!(status.success(), "{status:?}\n{}", node.log());
}

/// Two measures judged together: the median of all their rounds, one slow
/// stretch (a round at +126%) moving it no more than any round.
#[test]
fn a_figure_measured_twice_is_the_median_of_both_measures_rounds() {
    let added = |rounds: &[f64]| Added {
        kind: Kind::PlanOnly,
        start: 0.0,
        cpu: 0.05,
        rounds: rounds.to_vec(),
    };
    let p = pooled(&[added(&[1.1, 1.3, 2.26])], &[added(&[1.2, 1.0, 1.05])]);
    assert!((p[0].start - 0.15).abs() < 1e-9, "{p:?}");
    assert_eq!(p[0].rounds.len(), 6);
    assert_eq!(p[0].kind, Kind::PlanOnly);
}
