//! NRI under churn: pods all at once, a stalled gpuarchd, a stream of
//! pods across a restart, a containerd restart and a handover; each GPU
//! pod planned right or not at all, none failed, none planned twice.

use std::path::Path;
use std::time::{Duration, Instant};

use super::{REGISTERED, Stack, cri, logged_at};
use gpuarch_tests::stack::{self, IMAGE};

/// Names for a batch of `n` pods.
fn batch_names(what: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("{what}{i}-{}", std::process::id()))
        .collect()
}

/// What pod `i` of a batch asks for (GPU 0, 1, 1, none, ...), and the
/// TORCH_CUDA_ARCH_LIST it must get when planned.
fn batch_want(i: usize) -> Option<(&'static str, &'static str)> {
    match i % 4 {
        0 => Some(("0", "7.5")),
        1 | 2 => Some(("1", "8.6")),
        _ => None,
    }
}

/// Pods `names`, the i-th asking what [`batch_want`] says, started
/// `spacing` apart and all in flight together, while `meanwhile` runs on
/// this thread; each one's outcome.
fn pods_batch(
    containerd: &stack::Containerd,
    pods: &Path,
    names: &[String],
    spacing: Duration,
    meanwhile: impl FnOnce(),
) -> Vec<Result<(), String>> {
    std::thread::scope(|scope| {
        // The pods are started from a thread of their own, so that
        // `meanwhile` runs while they are.
        let starter = scope.spawn(move || {
            let mut handles = Vec::new();
            for (i, name) in names.iter().enumerate() {
                handles.push(std::thread::spawn({
                    let (sock, pods, name) =
                        (containerd.sock.clone(), pods.to_owned(), name.clone());
                    move || {
                        let envs: Vec<(&str, &str)> = batch_want(i)
                            .map(|(g, _)| ("NVIDIA_VISIBLE_DEVICES", g))
                            .into_iter()
                            .collect();
                        let pod = cri::Pod {
                            sock: &sock,
                            pods: &pods,
                            image: IMAGE,
                            name: &name,
                            handler: "",
                            envs: &envs,
                            annotations: &[],
                            devices: &[],
                        };
                        tokio::runtime::Builder::new_current_thread()
                            .enable_all()
                            .build()
                            .unwrap()
                            .block_on(pod.run("env > /out/env"))
                    }
                }));
                if !spacing.is_zero() {
                    std::thread::sleep(spacing);
                }
            }
            handles
        });
        meanwhile();
        starter
            .join()
            .unwrap()
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect()
    })
}

/// Every pod of the batch created; a GPU pod planned for its own GPU or
/// not at all, a CPU pod never. How many GPU pods were planned.
fn judge_batch(s: &Stack, names: &[String], runs: Vec<Result<(), String>>) -> usize {
    let mut planned = 0;
    for (i, (name, r)) in names.iter().zip(runs).enumerate() {
        r.unwrap_or_else(|e| panic!("{name} failed: {e}"));
        let env = s.out(name, "env");
        let got = cri::var(&env, "TORCH_CUDA_ARCH_LIST");
        match (batch_want(i), got.as_deref()) {
            (Some((_, want)), Some(got)) => {
                assert_eq!(got, want, "{name}: {env}\n{}", s.lines_of(name));
                planned += 1;
            }
            (Some(_), None) => {}
            (None, got) => assert_eq!(got, None, "{name}, a CPU pod: {env}"),
        }
    }
    planned
}

/// Per container of the handover's pods, from gpuarchd's log: how many
/// times a gpuarchd was asked about it, and how many planned it.
fn asked_of_both(log: &str) -> std::collections::HashMap<&str, (usize, usize)> {
    let mut asked: std::collections::HashMap<&str, (usize, usize)> = Default::default();
    for l in log.lines().filter(|l| l.contains("pod=default/handover")) {
        let Some(id) = l
            .split("container=")
            .nth(1)
            .and_then(|r| r.split(' ').next())
        else {
            continue;
        };
        let e = asked.entry(id).or_default();
        if l.contains(" device nodes, ") {
            e.0 += 1;
        } else if l.contains(" TORCH_CUDA_ARCH_LIST=") {
            e.1 += 1;
        }
    }
    asked
}

/// Pods made by kubelet's calls all at once, GPU and CPU; and across a
/// restart of containerd, a stream of them, with gpuarchd's registration
/// timed from the socket's return.
pub(super) fn churn(s: &mut Stack, suite: &str) {
    // All at once: each planned for its own GPU, the CPU pods untouched,
    // none failed.
    let t = Instant::now();
    let names = batch_names("burst", 48);
    let runs = pods_batch(&s.containerd, &s.pods, &names, Duration::ZERO, || {});
    eprintln!("{suite}: {} pods at once in {:?}", names.len(), t.elapsed());
    let planned = judge_batch(s, &names, runs);
    assert_eq!(planned, 36, "every GPU pod planned");

    // gpuarchd stalled for 1.5 s (SIGSTOP) while pods are created: NRI
    // holds them (CPU pods too) until it answers, inside its 2 s.
    let pid = nix::unistd::Pid::from_raw(s.node.daemon.as_ref().unwrap().id() as i32);
    let names = batch_names("stall", 8);
    let runs = pods_batch(&s.containerd, &s.pods, &names, Duration::ZERO, || {
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    });
    let planned = judge_batch(s, &names, runs);
    eprintln!("{suite}: gpuarchd stopped 1.5 s: {planned} of 6 GPU pods planned, none failed");

    // A stream of pods, one every 50 ms, across a restart of gpuarchd (as
    // systemctl restart or a package upgrade does it): none fails, none is
    // planned wrong; those of the gap start unplanned.
    let names = batch_names("stream", 24);
    let node = &mut s.node;
    let runs = pods_batch(
        &s.containerd,
        &s.pods,
        &names,
        Duration::from_millis(50),
        || {
            std::thread::sleep(Duration::from_millis(300));
            node.stop();
            node.start(&[]);
        },
    );
    s.wait_log(REGISTERED, 1);
    let planned = judge_batch(s, &names, runs);
    eprintln!(
        "{suite}: pods started 50 ms apart across a gpuarchd restart: {planned} of 18 GPU pods planned"
    );
    assert!(
        18 - planned <= 3,
        "{} GPU pods unplanned across a restart",
        18 - planned
    );

    // containerd restarts: gpuarchd registers again as soon as its NRI
    // socket is back, and pods get the Plan.
    s.containerd.restart();
    s.wait_log(REGISTERED, 2);
    let back = std::fs::metadata(&s.containerd.nri_sock)
        .and_then(|m| m.created().or_else(|_| m.modified()))
        .unwrap();
    // gpuarchd's part is its connection: the registration's answer is
    // containerd's, which may still be starting when its socket appears.
    let log = s.node.log();
    let line = log
        .lines()
        .filter(|l| l.contains(REGISTERED))
        .nth(1)
        .unwrap();
    let registered = logged_at(line).duration_since(back).unwrap_or_default();
    let connected = log
        .lines()
        .filter(|l| l.contains("NRI: connected to") && logged_at(l) >= back)
        .map(|l| logged_at(l).duration_since(back).unwrap_or_default())
        .next()
        .unwrap_or_else(|| panic!("no connection after the socket came back:\n{log}"));
    eprintln!(
        "{suite}: containerd's NRI socket back; gpuarchd connected {connected:?} and was registered {registered:?} after"
    );
    assert!(
        connected < Duration::from_millis(100),
        "connected {connected:?} after the socket came back"
    );
    let (_, env) = s.pod("", &[("NVIDIA_VISIBLE_DEVICES", "1")], &[]);
    assert_eq!(
        cri::var(&env.unwrap(), "TORCH_CUDA_ARCH_LIST").as_deref(),
        Some("8.6")
    );

    // The same stream across a handover (SIGUSR2, as the package's upgrade
    // sends it): the successor registers before the old gpuarchd leaves,
    // and the two never plan the same container, so every GPU pod is
    // planned and none fails. The bus is held (SIGSTOP) until two pods
    // were asked of both: the successor, registered, waits that long to
    // take the bus name.
    let names = batch_names("handover", 24);
    let node = &mut s.node;
    let bus = nix::unistd::Pid::from_raw(node.bus_pid() as i32);
    let log_file = node.path("daemon.log");
    let mut old = None;
    let runs = pods_batch(
        &s.containerd,
        &s.pods,
        &names,
        Duration::from_millis(50),
        || {
            std::thread::sleep(Duration::from_millis(300));
            nix::sys::signal::kill(bus, nix::sys::signal::Signal::SIGSTOP).unwrap();
            // Held until two pods were asked of both, or 5 s.
            let cont = std::thread::spawn(move || {
                let t = Instant::now();
                while t.elapsed() < Duration::from_secs(5) {
                    let log = std::fs::read_to_string(&log_file).unwrap_or_default();
                    if asked_of_both(&log)
                        .values()
                        .filter(|&&(a, _)| a > 1)
                        .count()
                        >= 2
                    {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                nix::sys::signal::kill(bus, nix::sys::signal::Signal::SIGCONT).unwrap();
            });
            old = Some(node.handover());
            cont.join().unwrap();
        },
    );
    let old = old.unwrap();
    assert!(old.success(), "the old gpuarchd: {old:?}\n{}", s.node.log());
    let planned = judge_batch(s, &names, runs);
    let log = s.node.log();
    // Of the pods both gpuarchds were asked about, none was planned twice:
    // the second sees the first one's adjustment (and plans nothing over
    // what is set), or finds the container claimed.
    let asked = asked_of_both(&log);
    assert!(
        asked.values().all(|&(_, plans)| plans <= 1),
        "a container planned twice: {asked:?}\n{log}"
    );
    let claimed = asked.values().filter(|&&(asks, _)| asks > 1).count();
    // The successor was registered before the old gpuarchd left NRI.
    let lines: Vec<&str> = log.lines().collect();
    let at = |what: &str| {
        lines
            .iter()
            .rposition(|l| l.contains(what))
            .unwrap_or_else(|| panic!("no {what:?} in the log:\n{log}"))
    };
    let (registered, handed) = (at(REGISTERED), at("; handing over"));
    assert!(
        registered < handed,
        "the successor registered after the old one left:\n{log}"
    );
    assert!(claimed > 0, "no pod was asked of both gpuarchds:\n{log}");
    eprintln!(
        "{suite}: pods started 50 ms apart across a handover: {planned} of 18 GPU pods planned, \
         {claimed} asked of both gpuarchds and planned once"
    );
    assert_eq!(planned, 18, "GPU pods unplanned across a handover\n{log}");
}
