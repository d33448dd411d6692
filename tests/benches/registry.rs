//! What the registry tier (`kernels.remote`) saves a node: for a heavy
//! package (the load test's, about 1.6 s of NVRTC per build on a 2-core
//! VM), a pull into an empty store against a build there, taken in one run
//! with the two interleaved (these machines are noisy):
//!
//! - cold pull: a new client (new connection) into an empty store;
//! - warm pull: a client that has pulled before, into another empty store;
//! - fan-out: five stores pulling at once from one registry, against five
//!   stores building at once.
//!
//! Every pull is checked as in production (digests, sha256, the
//! inspector). The registry is Debian's docker-registry on 127.0.0.1.
//! Run: `cargo bench -p gpuarch-tests --bench registry` (`RUNS=N` rounds,
//! default 3).

#![allow(clippy::unwrap_used)] // a benchmark: a failed unwrap is a failed run

use std::path::Path;
use std::time::{Duration, Instant};

use gpuarch_core::arch::Target;
use gpuarch_core::config::RemoteConfig;
use gpuarch_kernels::build::{Builder, Fetch};
use gpuarch_kernels::spec::{self, Package};
use gpuarch_kernels::store::Store;
use gpuarch_registry::OciRemote;
use gpuarch_tests::registry::Registry;

fn builder(store: &Path, cuda: &Path, repo: Option<&str>, push: bool) -> Builder {
    let b = Builder::new(
        Store::open(store, 1 << 30).unwrap(),
        vec![cuda.to_owned()],
        Duration::from_secs(600),
    );
    match repo {
        None => b,
        Some(r) => b.with_remote(Box::new(
            OciRemote::new(&RemoteConfig {
                repository: r.to_owned(),
                push,
                credentials: None,
                plain_http: true,
                ca_file: None,
                pull_timeout_ms: 60_000,
            })
            .unwrap(),
        )),
    }
}

/// Serve `pkg` for sm_86 into `b`'s store; whether it was pulled.
fn serve(b: &Builder, pkg: &Package) -> bool {
    let r = b.resolve(pkg, Target::parse("sm_86").unwrap(), Fetch::Build);
    let (e, built) = r
        .served
        .unwrap_or_else(|| panic!("{:?} {:?}", r.error, r.unavailable));
    assert!(built, "served from a store that should be empty");
    e.manifest.origin.is_some()
}

fn timed(f: impl FnOnce()) -> Duration {
    let t = Instant::now();
    f();
    t.elapsed()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let Some(cuda) = gpuarch_tests::cuda_dir() else {
        return;
    };
    if gpuarch_tests::which("docker-registry").is_none() {
        gpuarch_tests::skip("docker-registry is not installed");
        return;
    }
    let runs: usize = std::env::var("RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let tmp = tempfile::tempdir().unwrap();
    gpuarch_tests::heavy_packages(&tmp.path().join("pkgs"), 1);
    let (pkgs, errors) = spec::discover(&[tmp.path().join("pkgs")]);
    assert!(errors.is_empty(), "{errors:?}");
    let pkg = &pkgs["heavy0"];
    let reg = Registry::start();
    let repo = format!("{}/gpuarch/kernels", reg.host());
    let mut n = 0;
    let mut fresh = || {
        n += 1;
        tmp.path().join(format!("store{n}"))
    };

    // One node builds and pushes.
    assert!(!serve(&builder(&fresh(), &cuda, Some(&repo), true), pkg));
    let warm_store = fresh();
    let warm = builder(&warm_store, &cuda, Some(&repo), false);
    assert!(serve(&warm, pkg));

    let (mut build, mut cold, mut hot, mut build5, mut pull5) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..runs {
        let mut one = |which: u8| match which {
            0 => build.push(timed(|| {
                assert!(!serve(&builder(&fresh(), &cuda, None, false), pkg))
            })),
            1 => {
                let b = builder(&fresh(), &cuda, Some(&repo), false);
                cold.push(timed(|| assert!(serve(&b, pkg))));
            }
            _ => {
                // The client that pulled before, into its store emptied.
                empty(&warm_store);
                hot.push(timed(|| assert!(serve(&warm, pkg))));
            }
        };
        let order: [u8; 3] = if round % 2 == 0 { [0, 1, 2] } else { [2, 1, 0] };
        for w in order {
            one(w);
        }
        let five = |remote: bool, fresh: &mut dyn FnMut() -> std::path::PathBuf| {
            let nodes: Vec<Builder> = (0..5)
                .map(|_| builder(&fresh(), &cuda, remote.then_some(repo.as_str()), false))
                .collect();
            timed(|| {
                std::thread::scope(|s| {
                    for b in &nodes {
                        s.spawn(move || assert_eq!(serve(b, pkg), remote));
                    }
                });
            })
        };
        if round % 2 == 0 {
            build5.push(five(false, &mut fresh));
            pull5.push(five(true, &mut fresh));
        } else {
            pull5.push(five(true, &mut fresh));
            build5.push(five(false, &mut fresh));
        }
    }
    let (b, c, h, b5, p5) = (
        median(build),
        median(cold),
        median(hot),
        median(build5),
        median(pull5),
    );
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let against = |what: &str, d: Duration, of: &str, base: Duration| {
        println!(
            "  {what:<20} {:8.1} ms   {:.3} of {of} ({:.0}x faster)",
            ms(d),
            ms(d) / ms(base),
            ms(base) / ms(d)
        );
    };
    println!("heavy package, sm_86, {runs} rounds, medians:");
    println!("  local build          {:8.1} ms", ms(b));
    against("cold pull", c, "a build", b);
    against("warm pull", h, "a build", b);
    println!("  5 local builds       {:8.1} ms", ms(b5));
    against("5 pulls at once", p5, "5 builds", b5);
}

/// Remove every entry of the store at `root`, as if it were new.
fn empty(root: &Path) {
    let objects = root.join("objects");
    std::fs::remove_dir_all(&objects).unwrap();
    std::fs::create_dir_all(&objects).unwrap();
}
