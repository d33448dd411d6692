//! The store's registry tier against a real registry (Debian's
//! docker-registry, distribution 2.8, on 127.0.0.1): one node builds and
//! pushes, another pulls the same set with no build; a tampered blob and an
//! artifact whose cubin is for another arch are refused and recorded; a
//! stopped or silent registry costs a local build, not a wait.
//!
//! Needs docker-registry and the NVRTC wheels (`scripts/test` installs both).

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use gpuarch_core::arch::Target;
use gpuarch_core::config::RemoteConfig;
use gpuarch_kernels::build::{Builder, Fetch};
use gpuarch_kernels::remote::Remote;
use gpuarch_kernels::spec::{self, Package};
use gpuarch_kernels::store::{Entry, Store};
use gpuarch_registry::OciRemote;
use gpuarch_tests::registry::Registry;
use gpuarch_tests::{cuda_dir, which, workspace_root};

fn remote(repository: String, push: bool, pull_timeout_ms: u64) -> Box<dyn Remote> {
    Box::new(
        OciRemote::new(&RemoteConfig {
            repository,
            push,
            credentials: None,
            plain_http: true,
            ca_file: None,
            pull_timeout_ms,
        })
        .unwrap(),
    )
}

fn node(store: &Path, cuda: &Path, r: Box<dyn Remote>) -> Builder {
    Builder::new(
        Store::open(store, 1 << 30).unwrap(),
        vec![cuda.to_owned()],
        Duration::from_secs(600),
    )
    .with_remote(r)
}

fn packages() -> BTreeMap<String, Package> {
    let (pkgs, errors) = spec::discover(&[workspace_root().join("kernels/packages")]);
    assert!(errors.is_empty(), "{errors:?}");
    pkgs
}

/// Resolve (building or pulling) `pkg` for `arch`: the entry, and whether
/// it came from the registry.
fn serve(b: &Builder, pkg: &Package, arch: &str) -> (Entry, bool) {
    let r = b.resolve(pkg, Target::parse(arch).unwrap(), Fetch::Build);
    let (e, _) = r
        .served
        .unwrap_or_else(|| panic!("{} {arch}: {:?} {:?}", pkg.name(), r.error, r.unavailable));
    let pulled = e.manifest.origin.is_some();
    (e, pulled)
}

const ARCHS: [&str; 3] = ["sm_75", "sm_86", "sm_90"];

#[test]
fn builds_are_shared_and_a_wrong_or_absent_registry_costs_a_local_build() {
    gpuarch_tests::skip_unless!(
        which("docker-registry")
            .map_or(Some("docker-registry is not installed".to_owned()), |_| {
                None
            })
    );
    let Some(cuda) = cuda_dir() else {
        return;
    };
    let mut reg = Registry::start();
    let repo = format!("{}/gpuarch/kernels", reg.host());
    let pkgs = packages();
    let tmp = tempfile::tempdir().unwrap();

    // Node A builds every sample for three archs and pushes each build.
    let a = node(
        &tmp.path().join("a"),
        &cuda,
        remote(repo.clone(), true, 20_000),
    );
    let mut built = BTreeMap::new();
    for arch in ARCHS {
        for p in pkgs.values() {
            let (e, pulled) = serve(&a, p, arch);
            assert!(
                !pulled,
                "{} {arch}: node A pulled from an empty registry",
                p.name()
            );
            built.insert((p.name().to_owned(), arch), e);
        }
    }

    // Node B pre-warms the same set: every entry pulled, none built, and
    // the same files.
    let b = node(
        &tmp.path().join("b"),
        &cuda,
        remote(repo.clone(), false, 20_000),
    );
    for ((name, arch), ea) in &built {
        let (eb, pulled) = serve(&b, &pkgs[name], arch);
        assert!(pulled, "{name} {arch}: node B built instead of pulling");
        let origin = eb.manifest.origin.as_deref().unwrap();
        assert!(origin.starts_with(&format!("{repo}@sha256:")), "{origin}");
        assert_eq!(eb.manifest.key, ea.manifest.key);
        assert_eq!(eb.manifest.files, ea.manifest.files, "{name} {arch}");
        assert_eq!(eb.manifest.toolkit, ea.manifest.toolkit);
    }
    assert!(b.store.remote_refusals().is_empty());

    // A blob changed in the registry's storage: refused for its digest,
    // recorded, and built here.
    let saxpy86 = &built[&("saxpy".to_owned(), "sm_86")];
    let cubin = &saxpy86.manifest.files["saxpy.cubin"];
    let blob = reg.blob_path(&format!("sha256:{}", cubin.sha256));
    let mut bytes = std::fs::read(&blob).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&blob, &bytes).unwrap();
    let c = node(
        &tmp.path().join("c"),
        &cuda,
        remote(repo.clone(), false, 20_000),
    );
    let (e, pulled) = serve(&c, &pkgs["saxpy"], "sm_86");
    assert!(!pulled, "a tampered blob was served");
    assert_eq!(
        e.manifest.files["saxpy.cubin"].sha256, cubin.sha256,
        "the local build differs"
    );
    let refused = c.store.remote_refusals();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0].0, saxpy86.manifest.key);
    assert!(refused[0].1.contains("digest"), "{refused:?}");

    // A well-formed artifact under the sm_86 key whose cubin is sm_75's:
    // every digest matches, the inspector does not.
    let r75 = &built[&("rmsnorm".to_owned(), "sm_75")];
    let r86 = &built[&("rmsnorm".to_owned(), "sm_86")];
    let forged = tmp.path().join("forged").join(&r86.manifest.key);
    std::fs::create_dir_all(&forged).unwrap();
    for name in r75.manifest.files.keys() {
        std::fs::copy(r75.dir.join(name), forged.join(name)).unwrap();
    }
    let mut m = r75.manifest.clone();
    m.key = r86.manifest.key.clone();
    m.arch = "sm_86".into();
    m.variant = r86.manifest.variant.clone();
    m.dtype = r86.manifest.dtype.clone();
    m.exports = r86.manifest.exports.clone();
    std::fs::write(
        forged.join("manifest.json"),
        serde_json::to_vec(&m).unwrap(),
    )
    .unwrap();
    let forger = remote(repo.clone(), true, 20_000);
    forger
        .push(&Entry {
            dir: forged.clone(),
            manifest: m,
            bytes: 0,
        })
        .unwrap();
    let (e, pulled) = serve(&c, &pkgs["rmsnorm"], "sm_86");
    assert!(!pulled, "an sm_75 cubin was served for sm_86");
    assert_eq!(e.manifest.arch, "sm_86");
    let refused: BTreeMap<_, _> = c.store.remote_refusals().into_iter().collect();
    let why = &refused[&r86.manifest.key];
    assert!(
        why.contains("inspection") && why.contains("sm_75") && why.contains("sm_86"),
        "{why}"
    );
    // Both stay recorded, and are not pulled again.
    assert_eq!(refused.len(), 2);

    // The registry stops: a node builds at once.
    reg.stop();
    let d = node(
        &tmp.path().join("d"),
        &cuda,
        remote(repo.clone(), true, 20_000),
    );
    let t0 = Instant::now();
    let (_, pulled) = serve(&d, &pkgs["saxpy"], "sm_75");
    assert!(!pulled);
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    assert!(
        d.store.remote_refusals().is_empty(),
        "an outage is no refusal"
    );
}

/// A registry that accepts connections and never answers costs the pull
/// budget, then the build runs here.
#[test]
fn a_silent_registry_costs_the_pull_budget_then_a_local_build() {
    let Some(cuda) = cuda_dir() else {
        return;
    };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let held = std::thread::spawn(move || {
        let mut conns = Vec::new();
        for c in listener.incoming().take(4) {
            conns.push(c);
        }
        std::thread::sleep(Duration::from_secs(30));
    });
    let tmp = tempfile::tempdir().unwrap();
    let b = node(
        tmp.path(),
        &cuda,
        remote(format!("127.0.0.1:{port}/gpuarch/kernels"), false, 400),
    );
    let pkgs = packages();
    let t0 = Instant::now();
    let (_, pulled) = serve(&b, &pkgs["saxpy"], "sm_86");
    let took = t0.elapsed();
    assert!(!pulled);
    assert!(
        took >= Duration::from_millis(400),
        "{took:?}: the budget was not waited"
    );
    assert!(took < Duration::from_secs(8), "{took:?}");
    drop(held);
}
