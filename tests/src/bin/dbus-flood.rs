//! A hostile D-Bus client for the abuse tests: one connection to the bus at
//! `$DBUS_SYSTEM_BUS_ADDRESS`, `WORKERS` calls in flight at once for
//! `SECONDS`, each call one of the `MODE`'s. Prints one line:
//! `calls=N ok=N max_ms=N err:<name>=N ...`.
//!
//! Modes: `reads` (Plan, Match, ListDevices, ListKernels, properties),
//! `disk-reads` (ListKernels and UsedBytes, the reads that touch the disk),
//! `privileged` (Reload, Prewarm, GarbageCollect, Verify), `huge-plan:N`
//! (Plan with N entries), `huge-match:N` (Match with an N-byte requirement),
//! `huge-slurm:N` (SlurmPlan with an N-byte list of ranges),
//! `huge-prewarm:N` (Prewarm with N packages), `admin` (ListDevices and a
//! Ping, on the admins' name `io.gpuarch1.Admin` instead).
//!
//! usage: dbus-flood MODE WORKERS SECONDS

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Default)]
struct Tally {
    calls: u64,
    ok: u64,
    max: Duration,
    errors: BTreeMap<String, u64>,
}

/// (interface, member, body) of the call number `i` of `mode`.
enum Body {
    None,
    Strings(Vec<String>),
    Str(String),
    TwoLists(Vec<String>, Vec<String>),
    Prop(&'static str, &'static str),
}

/// The bus name the calls of `mode` go to.
fn dest_of(mode: &str) -> &'static str {
    match mode {
        "admin" => "io.gpuarch1.Admin",
        _ => "io.gpuarch1",
    }
}

fn call_of(mode: &str, i: u64) -> (&'static str, &'static str, Body) {
    let (kind, n) = mode.split_once(':').unwrap_or((mode, "0"));
    let n: usize = n.parse().unwrap_or(0);
    let inv = "io.gpuarch1.Inventory";
    let kc = "io.gpuarch1.KernelCache";
    match kind {
        "reads" => match i % 6 {
            0 => (inv, "Plan", Body::Strings(vec!["0".into(), "1".into()])),
            1 => (inv, "Match", Body::Str("arch>=8.0,feature=bf16".into())),
            2 => (inv, "ListDevices", Body::None),
            3 => (kc, "ListKernels", Body::None),
            4 => (
                "org.freedesktop.DBus.Properties",
                "Get",
                Body::Prop(kc, "UsedBytes"),
            ),
            _ => (inv, "Plan", Body::Strings(vec!["all".into()])),
        },
        "disk-reads" => match i % 2 {
            0 => (kc, "ListKernels", Body::None),
            _ => (
                "org.freedesktop.DBus.Properties",
                "Get",
                Body::Prop(kc, "UsedBytes"),
            ),
        },
        "privileged" => match i % 4 {
            0 => ("io.gpuarch1.Daemon", "Reload", Body::None),
            1 => (
                kc,
                "Prewarm",
                Body::TwoLists(Vec::new(), vec!["8.6".into()]),
            ),
            2 => (kc, "GarbageCollect", Body::None),
            _ => (kc, "Verify", Body::None),
        },
        "admin" => match i % 2 {
            0 => (inv, "ListDevices", Body::None),
            _ => ("org.freedesktop.DBus.Peer", "Ping", Body::None),
        },
        "huge-plan" => (inv, "Plan", Body::Strings(vec!["0".into(); n])),
        "huge-match" => (inv, "Match", Body::Str("arch>=8.0,".repeat(n / 10))),
        "huge-slurm" => (inv, "SlurmPlan", Body::Str("0-1024,".repeat(n / 7))),
        "huge-prewarm" => (
            kc,
            "Prewarm",
            Body::TwoLists(vec!["saxpy".into(); n], Vec::new()),
        ),
        other => panic!("unknown mode {other:?}"),
    }
}

async fn one(conn: &zbus::Connection, mode: &str, i: u64) -> Result<(), zbus::Error> {
    let (iface, member, body) = call_of(mode, i);
    let dest = Some(dest_of(mode));
    let path = "/io/gpuarch1";
    let r = match body {
        Body::None => conn.call_method(dest, path, Some(iface), member, &()).await,
        Body::Strings(v) => {
            conn.call_method(dest, path, Some(iface), member, &(v,))
                .await
        }
        Body::Str(s) => {
            conn.call_method(dest, path, Some(iface), member, &(s,))
                .await
        }
        Body::TwoLists(a, b) => {
            conn.call_method(dest, path, Some(iface), member, &(a, b))
                .await
        }
        Body::Prop(i, p) => {
            conn.call_method(dest, path, Some(iface), member, &(i, p))
                .await
        }
    };
    r.map(|_| ())
}

/// How a failed call is tallied: the D-Bus error's name, or the client's
/// own failure.
fn tally_name(e: &zbus::Error) -> String {
    match e {
        zbus::Error::MethodError(name, _, _) => name.to_string(),
        // Refused by the bus itself (its policy or limits).
        zbus::Error::FDO(e) => zbus::DBusError::name(e.as_ref()).to_string(),
        e => format!("client: {e}"),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [mode, workers, seconds] = args.as_slice() else {
        eprintln!("usage: dbus-flood MODE WORKERS SECONDS");
        std::process::exit(2);
    };
    let workers: usize = workers.parse().expect("WORKERS");
    let until = Instant::now() + Duration::from_secs_f64(seconds.parse().expect("SECONDS"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let tally = Arc::new(Mutex::new(Tally::default()));
    rt.block_on(async {
        let address = std::env::var("DBUS_SYSTEM_BUS_ADDRESS").expect("DBUS_SYSTEM_BUS_ADDRESS");
        let conn = zbus::connection::Builder::address(address.as_str())
            .method_timeout(Duration::from_secs(60))
            .build()
            .await
            .expect("connect");
        let mut set = tokio::task::JoinSet::new();
        for w in 0..workers {
            let conn = conn.clone();
            let mode = mode.clone();
            let tally = tally.clone();
            set.spawn(async move {
                let mut i = w as u64;
                while Instant::now() < until {
                    let t0 = Instant::now();
                    let r = one(&conn, &mode, i).await;
                    let took = t0.elapsed();
                    let mut t = tally.lock().expect("tally");
                    t.calls += 1;
                    t.max = t.max.max(took);
                    match r {
                        Ok(()) => t.ok += 1,
                        Err(e) => *t.errors.entry(tally_name(&e)).or_default() += 1,
                    }
                    i += workers as u64;
                }
            });
        }
        while set.join_next().await.is_some() {}
    });
    let t = tally.lock().expect("tally");
    let mut line = format!("calls={} ok={} max_ms={}", t.calls, t.ok, t.max.as_millis());
    for (name, n) in &t.errors {
        line.push_str(&format!(" err:{}={n}", name.replace(' ', "_")));
    }
    println!("{line}");
}
