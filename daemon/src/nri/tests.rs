//! The NRI plugin against a runtime of its own (the `fake-runtime`
//! feature's): registration, the Plan per container, strict and
//! fail-open, reconnection.
#![allow(clippy::unwrap_used)]

use super::fake_runtime::{FakeRuntime, container};
use super::*;
use gpuarch_core::config::Config;
use gpuarch_core::snapshot::Snapshot;
use std::collections::HashMap;

fn shared(dir: &std::path::Path, strict: bool) -> Arc<Shared> {
    let mut cfg = Config {
        strict,
        ..Config::default()
    };
    cfg.nri.enable = true;
    cfg.nri.socket = dir.join("nri.sock");
    cfg.nri.containerd = dir.join("containerd.sock");
    cfg.nri.crio_config = dir.join("crio.conf");
    cfg.nri.storage_conf = dir.join("storage.conf");
    cfg.hook.record_dir = dir.join("records");
    cfg.hook.image_cache = dir.join("images");
    cfg.kernels.mount_root = dir.join("kernels");
    cfg.jit_cache.dir = dir.join("jit");
    let s = Shared::new(
        cfg,
        dir.join("inventory.json"),
        dir.join("config.yaml"),
        false,
    );
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/2080ti-3090.json"
    );
    s.refreshed(Snapshot::from_json(&std::fs::read(fixture).unwrap()).unwrap());
    Arc::new(s)
}

fn env(resp: &proto::nri::CreateContainerResponse) -> HashMap<String, String> {
    resp.adjust
        .env
        .iter()
        .map(|kv| (kv.key.clone(), kv.value.clone()))
        .collect()
}

/// The probe's leak: a peer at the NRI socket that never registers
/// gpuarchd, and claims a 4 MiB frame it never sends. Each failed
/// session must close its connection (and so end its tasks).
#[tokio::test]
async fn a_peer_that_never_registers_leaves_no_connection_behind() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let s = shared(dir.path(), false);
    let cfg = s.config().nri.clone();
    let listener = tokio::net::UnixListener::bind(&cfg.socket).unwrap();
    let rounds = 2;
    let peer = tokio::spawn(async move {
        let mut closed = 0;
        for _ in 0..rounds {
            let (mut c, _) = listener.accept().await.unwrap();
            let mut h = Vec::new();
            h.extend(mux::PLUGIN_SERVICE.to_be_bytes());
            h.extend(mux::MAX_FRAME.to_be_bytes());
            h.push(0);
            c.write_all(&h).await.unwrap();
            // Whatever gpuarchd sends (its registration), then its close.
            let mut buf = [0u8; 4096];
            loop {
                match tokio::time::timeout(Duration::from_secs(20), c.read(&mut buf)).await {
                    Ok(Ok(0)) => {
                        closed += 1;
                        break;
                    }
                    Ok(Ok(_)) => {}
                    _ => break,
                }
            }
        }
        closed
    });
    let (_tx, mut stop) = watch::channel(false);
    for _ in 0..rounds {
        let e = session(&s, &cfg, &mut stop).await.unwrap_err();
        assert!(
            matches!(e, SessionError::NoAnswer(_) | SessionError::Refused { .. }),
            "{e}"
        );
    }
    assert_eq!(
        peer.await.unwrap(),
        rounds,
        "each failed session's connection closed"
    );
}

#[tokio::test]
async fn a_pod_gets_its_plan_and_the_containers_own_value_wins() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("records")).unwrap();
    let s = shared(dir.path(), false);
    let rt = FakeRuntime::bind(&s.config().nri.socket).unwrap();
    let (_stop_tx, stop) = watch::channel(false);
    tokio::spawn(run(s.clone(), stop));
    let p = rt.accept().await.unwrap();
    assert_eq!(p.registered.plugin_name, "gpuarch");
    assert_eq!(p.registered.plugin_idx, "50");
    assert_eq!(p.events, 1 << 3, "CreateContainer alone");

    let (pod, c) = container(&["NVIDIA_VISIBLE_DEVICES=1"], &[]);
    let got = env(&p.create(&pod, &c).await.unwrap());
    assert_eq!(got["TORCH_CUDA_ARCH_LIST"], "8.6");
    assert_eq!(got["GPUARCH_DTYPE"], "bfloat16");
    let records: Vec<_> = std::fs::read_dir(dir.path().join("records"))
        .unwrap()
        .collect();
    assert_eq!(records.len(), 1, "a record for gpuarchctl why");
    // A runtime other than containerd (CRI-O): the image is not read,
    // the record says why and where it would be.
    let record = std::fs::read_to_string(records[0].as_ref().unwrap().path()).unwrap();
    assert!(
        record.contains("not read: fake-runtime keeps its images where gpuarchd does not")
            && record.contains("runtime handler gpuarch"),
        "{record}"
    );

    let (pod, c) = container(&[], &[("/dev/nvidia0", 195, 0)]);
    assert_eq!(
        env(&p.create(&pod, &c).await.unwrap())["TORCH_CUDA_ARCH_LIST"],
        "7.5"
    );

    let (pod, c) = container(
        &["NVIDIA_VISIBLE_DEVICES=1", "TORCH_CUDA_ARCH_LIST=8.0"],
        &[],
    );
    let got = env(&p.create(&pod, &c).await.unwrap());
    assert!(!got.contains_key("TORCH_CUDA_ARCH_LIST"), "{got:?}");
    assert_eq!(got["GPUARCH_DTYPE"], "bfloat16");

    // CDI devices as NRI lists them (no device node yet).
    let (pod, mut c) = container(&[], &[]);
    let mut cdi = proto::nri::CDIDevice::new();
    cdi.name = "nvidia.com/gpu=0".to_owned();
    c.CDI_devices.push(cdi);
    assert_eq!(
        env(&p.create(&pod, &c).await.unwrap())["TORCH_CUDA_ARCH_LIST"],
        "7.5"
    );

    // No GPU, GPUARCH_DISABLE, the gpuarch handler: no adjustment.
    for (env_, handler) in [
        (vec![], ""),
        (vec!["NVIDIA_VISIBLE_DEVICES=1", "GPUARCH_DISABLE=1"], ""),
        (vec!["NVIDIA_VISIBLE_DEVICES=1"], "gpuarch"),
    ] {
        let (mut pod, c) = container(&env_, &[]);
        pod.runtime_handler = handler.to_owned();
        let resp = p.create(&pod, &c).await.unwrap();
        assert!(resp.adjust.is_none(), "{env_:?} {handler:?}: {resp:?}");
    }
}

#[tokio::test]
async fn strict_refuses_through_the_runtime_and_a_flood_is_answered_in_time() {
    let dir = tempfile::tempdir().unwrap();
    let s = shared(dir.path(), true);
    let rt = FakeRuntime::bind(&s.config().nri.socket).unwrap();
    let (_stop_tx, stop) = watch::channel(false);
    tokio::spawn(run(s.clone(), stop));
    let p = rt.accept().await.unwrap();
    let (pod, c) = container(
        &["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_REQUIRE_ARCH=arch>=8.0"],
        &[],
    );
    let e = p.create(&pod, &c).await.unwrap_err().to_string();
    assert!(
        e.contains("NVIDIA_REQUIRE_ARCH") && e.contains("2080 Ti"),
        "{e}"
    );

    // A pod author's flood, 3 MiB of requirement terms under ttrpc's
    // 4 MiB message, without strict: a note, and an answer well inside
    // NRI's 2 s.
    let mut cfg = (*s.config()).clone();
    cfg.strict = false;
    s.set_config(cfg);
    let term = "arch>=7.0,".repeat(300_000);
    let flood: Vec<String> = vec![
        format!("NVIDIA_REQUIRE_X={term}arch>=7.0"),
        "NVIDIA_VISIBLE_DEVICES=1".to_owned(),
    ];
    let flood: Vec<&str> = flood.iter().map(String::as_str).collect();
    let (pod, c) = container(&flood, &[]);
    let t = Instant::now();
    let resp = p.create(&pod, &c).await.unwrap();
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    assert_eq!(env(&resp)["TORCH_CUDA_ARCH_LIST"], "8.6");
}

/// The time from `since` until the fake runtime's next plugin has
/// registered.
async fn registered_after(
    rt: &FakeRuntime,
    since: Instant,
) -> (Duration, super::fake_runtime::Plugin) {
    let p = rt.accept().await.unwrap();
    (since.elapsed(), p)
}

/// gpuarchd registers again whenever the runtime comes back, at once
/// however long it was gone (the socket's directory is watched, not
/// polled), and after a peer that talks nonsense. A stop (a restart or an
/// upgrade) ends the session and the loop at once: they waited out a 1 s
/// retry timer, and every GPU pod of that second started unplanned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpuarchd_registers_again_after_the_runtime_goes_or_talks_nonsense() {
    let dir = tempfile::tempdir().unwrap();
    let s = shared(dir.path(), false);
    let sock = s.config().nri.socket.clone();
    let (stop_tx, stop) = watch::channel(false);
    let task = tokio::spawn(run(s.clone(), stop));
    // Nothing listens for 1.5 s: the backoff has grown to its 1 s.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let t = Instant::now();
    let rt = FakeRuntime::bind(&sock).unwrap();
    let (took, p) = registered_after(&rt, t).await;
    assert!(
        took < Duration::from_millis(100),
        "registered {took:?} after the socket appeared"
    );
    drop(p);
    // A runtime restart: gone 1.2 s, then a new socket at the same path.
    drop(rt);
    std::fs::remove_file(&sock).unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let t = Instant::now();
    let rt = FakeRuntime::bind(&sock).unwrap();
    let (took, p) = registered_after(&rt, t).await;
    assert!(
        took < Duration::from_millis(100),
        "registered {took:?} after the socket came back"
    );
    let (pod, c) = container(&["NVIDIA_VISIBLE_DEVICES=1"], &[]);
    assert_eq!(
        env(&p.create(&pod, &c).await.unwrap())["TORCH_CUDA_ARCH_LIST"],
        "8.6"
    );
    drop(p);
    // A peer that answers the registration with garbage, then a frame
    // over NRI's limit: gpuarchd drops it and comes back.
    drop(rt);
    std::fs::remove_file(&sock).unwrap();
    let l = tokio::net::UnixListener::bind(&sock).unwrap();
    let (mut bad, _) = l.accept().await.unwrap();
    use tokio::io::AsyncWriteExt;
    bad.write_all(&[
        0, 0, 0, 2, 0, 0, 0, 12, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1, 9, 9, 1, 2,
    ])
    .await
    .unwrap();
    bad.write_all(&[0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff])
        .await
        .unwrap();
    drop(l);
    std::fs::remove_file(&sock).unwrap();
    let rt = FakeRuntime::bind(&sock).unwrap();
    let p = rt.accept().await.unwrap();
    assert_eq!(
        env(&p.create(&pod, &c).await.unwrap())["TORCH_CUDA_ARCH_LIST"],
        "8.6"
    );
    // The stop, while registered.
    let t = Instant::now();
    stop_tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap();
    let took = t.elapsed();
    assert!(
        took < Duration::from_millis(100),
        "the NRI loop ended {took:?} after the stop"
    );
    assert!(p.sync().await.is_err(), "the session is closed");
}

/// A containerd whose snapshot service never answers (gpuarchd's call
/// gives up at 500 ms), under a runtime that waits 400 ms for a plugin:
/// the watchdog answers at three quarters of that, without an adjustment
/// (refused under strict), before the runtime would drop gpuarchd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mute_containerd_is_answered_by_the_watchdog_in_time() {
    assert_eq!(answer_within(2000), ANSWER_WITHIN);
    assert_eq!(answer_within(0), ANSWER_WITHIN);
    assert_eq!(answer_within(-1), ANSWER_WITHIN);
    let limit = answer_within(400);
    assert_eq!(limit, Duration::from_millis(300));
    let dir = tempfile::tempdir().unwrap();
    let s = shared(dir.path(), false);
    let mut cfg = (*s.config()).clone();
    // Accepts and holds every connection, answers nothing.
    let mute = tokio::net::UnixListener::bind(&cfg.nri.containerd).unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((c, _)) = mute.accept().await {
            held.push(c);
        }
    });
    let rt = FakeRuntime::bind_as(&cfg.nri.socket, "containerd")
        .unwrap()
        .waiting(Duration::from_millis(400));
    let (stop_tx, stop) = watch::channel(false);
    let task = tokio::spawn(run(s.clone(), stop));
    let p = rt.accept().await.unwrap();
    let (pod, c) = container(&["NVIDIA_VISIBLE_DEVICES=1"], &[]);
    let t = Instant::now();
    let resp = p.create(&pod, &c).await.unwrap();
    let took = t.elapsed();
    assert!(env(&resp).is_empty(), "{:?}", env(&resp));
    assert!(
        took >= limit && took < Duration::from_millis(400),
        "answered after {took:?}"
    );
    cfg.strict = true;
    s.set_config(cfg);
    let e = p.create(&pod, &c).await.unwrap_err().to_string();
    assert!(e.contains("not planned within 300ms"), "{e}");
    stop_tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap();
}

/// During a handover (claiming on) a container the other gpuarchd claimed
/// first gets no adjustment from this one, and one it did not is claimed
/// and planned; with one gpuarchd (claiming off, the usual case) the
/// claims file is neither read nor written.
#[tokio::test]
async fn during_a_handover_a_container_the_other_gpuarchd_claimed_is_left_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = shared(dir.path(), false);
    let rt = FakeRuntime::bind(&s.config().nri.socket).unwrap();
    let (_stop_tx, stop) = watch::channel(false);
    tokio::spawn(run(s.clone(), stop));
    let p = rt.accept().await.unwrap();
    let (pod, c) = container(&["NVIDIA_VISIBLE_DEVICES=1"], &[]);
    let file = claims::path_beside(&s.snapshot_path);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let other = format!("{now} 1 {}\n", c.id);
    std::fs::write(&file, &other).unwrap();

    let got = env(&p.create(&pod, &c).await.unwrap());
    assert_eq!(got["TORCH_CUDA_ARCH_LIST"], "8.6");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), other);

    s.set_claiming(true);
    assert!(env(&p.create(&pod, &c).await.unwrap()).is_empty());
    let (pod, mut mine) = container(&["NVIDIA_VISIBLE_DEVICES=0"], &[]);
    mine.id = "fedcba9876543210".repeat(4);
    let got = env(&p.create(&pod, &mine).await.unwrap());
    assert_eq!(got["TORCH_CUDA_ARCH_LIST"], "7.5");
    let kept = std::fs::read_to_string(&file).unwrap();
    assert!(
        kept.lines()
            .any(|l| l.ends_with(&format!(" {} {}", std::process::id(), mine.id))),
        "{kept}"
    );
}
