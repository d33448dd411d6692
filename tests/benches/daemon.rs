//! gpuarchd under load, on a private dbus-daemon with the fake NVML:
//!
//! - `Plan` calls per second from one client and from eight, each against
//!   `org.freedesktop.DBus.Peer.Ping` to the same daemon in the same run (the
//!   cheapest round trip the bus allows: the ratio is what `Plan` itself
//!   costs over the bus);
//! - gpuarchd's resident memory when idle and after the load;
//! - time from exec to `READY=1`, against exec to exit of
//!   `gpuarchd --check-config` (the cost of starting the process at all).
//!
//! Run as root (the shipped bus policy lets only root own io.gpuarch1):
//! `cargo bench -p gpuarch-tests --bench daemon`.

#![allow(clippy::unwrap_used)] // a benchmark: a failed unwrap is a failed run

use std::time::{Duration, Instant};

use gpuarch_gpucheck::bus;
use gpuarch_tests::artifacts;
use gpuarch_tests::daemon::{Node, Policy, block_on};

const CALLS: usize = 4000;
const CLIENTS: usize = 8;

#[derive(Clone, Copy)]
enum Call {
    Ping,
    Plan,
}

async fn one(conn: &zbus::Connection, call: Call) {
    match call {
        Call::Ping => bus::ping(conn).await.unwrap(),
        Call::Plan => {
            let env = bus::plan(conn, &["0", "1"]).await.unwrap();
            assert_eq!(env["TORCH_CUDA_ARCH_LIST"], "7.5;8.6");
        }
    }
}

/// Calls per second from `clients` connections, each on its own thread,
/// `calls` calls each.
fn rate(node: &Node, call: Call, clients: usize, calls: usize) -> f64 {
    let address = node.address.clone();
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(clients + 1));
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let address = address.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                block_on(async {
                    let conn = zbus::connection::Builder::address(address.as_str())
                        .build()
                        .await
                        .unwrap();
                    one(&conn, call).await; // warm the connection
                    barrier.wait();
                    for _ in 0..calls {
                        one(&conn, call).await;
                    }
                })
            })
        })
        .collect();
    barrier.wait();
    let t0 = Instant::now();
    for t in threads {
        t.join().unwrap();
    }
    (clients * calls) as f64 / t0.elapsed().as_secs_f64()
}

/// CPU time a process has used (user + system).
fn cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the parenthesised command name; utime and stime are the
    // 14th and 15th fields of the line, in clock ticks.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<u64> = rest
        .split(' ')
        .skip(11)
        .take(2)
        .map(|x| x.parse().unwrap())
        .collect();
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .unwrap()
        .unwrap() as u64;
    Duration::from_micros((f[0] + f[1]) * 1_000_000 / hz)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    gpuarch_tests::skip_unless!(gpuarch_testkit::unless_root(
        "(only root may own io.gpuarch1 under the shipped policy)"
    ));
    let mut node = Node::new("2080ti-3090", Policy::Shipped);
    node.start(&[]);
    let pid = node.daemon.as_ref().unwrap().id();
    std::thread::sleep(Duration::from_millis(300));
    let idle = gpuarch_tests::proc_status_kib(pid, "VmRSS");

    // ABBA order so drift on a noisy machine hits both sides alike.
    let mut ping1 = 0.0;
    let mut plan1 = 0.0;
    for order in [[Call::Ping, Call::Plan], [Call::Plan, Call::Ping]] {
        for c in order {
            let r = rate(&node, c, 1, CALLS / 2);
            match c {
                Call::Ping => ping1 += r / 2.0,
                Call::Plan => plan1 += r / 2.0,
            }
        }
    }
    let ping8 = rate(&node, Call::Ping, CLIENTS, CALLS / CLIENTS);
    let (d0, b0) = (cpu(pid), cpu(node.bus_pid()));
    let plan8 = rate(&node, Call::Plan, CLIENTS, CALLS / CLIENTS);
    let per_call = |t: Duration| t.as_secs_f64() * 1e6 / (CALLS / CLIENTS * CLIENTS) as f64;
    let (d_us, b_us) = (per_call(cpu(pid) - d0), per_call(cpu(node.bus_pid()) - b0));
    let loaded = gpuarch_tests::proc_status_kib(pid, "VmRSS");
    println!(
        "Plan over D-Bus, 1 client:  {plan1:>8.0} calls/s (Ping {ping1:.0}/s; Plan/Ping time ratio {:.2}x)",
        ping1 / plan1
    );
    println!(
        "Plan over D-Bus, {CLIENTS} clients: {plan8:>8.0} calls/s (Ping {ping8:.0}/s; ratio {:.2}x)",
        ping8 / plan8
    );
    println!(
        "CPU per Plan call ({CLIENTS} clients): gpuarchd {d_us:.0} us, dbus-daemon {b_us:.0} us (the bus relays every call and reply)"
    );
    println!(
        "gpuarchd RSS: idle {:.1} MiB, after the load {:.1} MiB",
        idle as f64 / 1024.0,
        loaded as f64 / 1024.0
    );

    let mut ready = Vec::new();
    let mut check = Vec::new();
    for _ in 0..15 {
        node.stop();
        ready.push(node.start(&[]));
        let t0 = Instant::now();
        let st = std::process::Command::new(&artifacts().gpuarchd)
            .args(["--check-config", "/dev/null"])
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(st.success());
        check.push(t0.elapsed());
    }
    let (ready, check) = (median(ready), median(check));
    println!(
        "exec to READY=1: median {:.1} ms over 15 starts (exec to exit of --check-config {:.1} ms; ratio {:.1}x)",
        ready.as_secs_f64() * 1e3,
        check.as_secs_f64() * 1e3,
        ready.as_secs_f64() / check.as_secs_f64()
    );
}
