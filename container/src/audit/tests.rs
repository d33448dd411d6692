//! Unit tests of the start-time audit: requests, kept audits, notes and
//! refusals, on the RTX 2080 Ti + RTX 3090 pair of seed 000.

use std::path::PathBuf;

use gpuarch_core::arch::ComputeCapability;
use gpuarch_core::audit::Binary;
use gpuarch_core::select::AssignedGpu;

use super::*;

const KEY: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fn gpu(index: u32, name: &str, cap: (u8, u8)) -> AssignedGpu {
    AssignedGpu {
        index,
        mig: None,
        uuid: format!("GPU-{index}"),
        name: name.into(),
        compute_capability: ComputeCapability::new(cap.0, cap.1),
        pci_bus_id: format!("00000000:0{index}:00.0"),
    }
}

fn plan(gpus: &[u32]) -> Plan {
    let all = [
        gpu(0, "NVIDIA GeForce RTX 2080 Ti", (7, 5)),
        gpu(1, "NVIDIA GeForce RTX 3090", (8, 6)),
    ];
    Plan {
        gpus: gpus.iter().map(|i| all[*i as usize].clone()).collect(),
        ..Plan::default()
    }
}

fn view() -> ContainerView {
    let mut v = ContainerView::with_env([
        ("PATH", "/opt/venv/bin:/usr/bin"),
        ("HOME", "/home/u"),
        ("SECRET_TOKEN", "not for gpuarchd"),
    ]);
    v.user = Some((1000, 1000));
    v.software.image_key = Some(KEY.into());
    v
}

fn cfg(dir: &std::path::Path) -> AuditConfig {
    std::fs::create_dir_all(dir.join("requests")).unwrap();
    AuditConfig {
        dir: Some(dir.to_owned()),
        ..AuditConfig::default()
    }
}

fn xformers_sm75() -> ImageAudit {
    ImageAudit {
        schema: SCHEMA,
        binaries: vec![Binary {
            path: "/usr/local/lib/python3.12/dist-packages/xformers/_C.so".into(),
            owner: "xformers 0.0.29".into(),
            size: 1,
            code: vec!["sm_75".into()],
        }],
        ..ImageAudit::default()
    }
}

#[test]
fn a_new_image_asks_once_with_only_the_variables_the_audit_reads() {
    let d = tempfile::tempdir().unwrap();
    let c = cfg(d.path());
    let rootfs = PathBuf::from("/run/containerd/rootfs");
    let j = at_start(
        &c,
        &plan(&[1]),
        &view(),
        Some(&Source::Rootfs(rootfs.clone())),
        None,
    );
    assert!(j.refuse.is_none());
    assert_eq!(
        j.notes,
        [
            "the image's CUDA binaries are not audited yet: asked gpuarchd; later starts are judged by it"
        ]
    );
    let req: Request =
        serde_json::from_slice(&std::fs::read(d.path().join("requests").join(KEY)).unwrap())
            .unwrap();
    assert_eq!(req.source(), Source::Rootfs(rootfs.clone()));
    assert_eq!(req.user, Some((1000, 1000)));
    assert_eq!(
        req.env,
        [
            ("PATH".to_owned(), "/opt/venv/bin:/usr/bin".to_owned()),
            ("HOME".to_owned(), "/home/u".to_owned())
        ]
    );
    // A second start before the audit: the request stands, unchanged.
    let other = Source::Layers(vec![PathBuf::from("/elsewhere")]);
    at_start(&c, &plan(&[1]), &view(), Some(&other), None);
    let again: Request =
        serde_json::from_slice(&std::fs::read(d.path().join("requests").join(KEY)).unwrap())
            .unwrap();
    assert_eq!(again.source(), Source::Rootfs(rootfs));
}

#[test]
fn an_nri_start_asks_for_the_audit_of_its_layers() {
    let d = tempfile::tempdir().unwrap();
    let c = cfg(d.path());
    let layers = ["/s/8/fs", "/s/3/fs"].map(PathBuf::from).to_vec();
    at_start(
        &c,
        &plan(&[1]),
        &view(),
        Some(&Source::Layers(layers.clone())),
        None,
    );
    let bytes = std::fs::read(d.path().join("requests").join(KEY)).unwrap();
    let req: Request = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(req.source(), Source::Layers(layers));
    assert_eq!(req.rootfs, PathBuf::new());
    // A request as an earlier hook wrote it (no layers) reads as a rootfs.
    let old: Request = serde_json::from_str(r#"{"rootfs":"/r","env":[],"user":null}"#).unwrap();
    assert_eq!(old.source(), Source::Rootfs(PathBuf::from("/r")));
}

#[test]
fn a_kept_audit_notes_what_an_assigned_gpu_cannot_run_and_refuses_when_asked() {
    let d = tempfile::tempdir().unwrap();
    let mut c = cfg(d.path());
    std::fs::write(
        d.path().join(format!("{KEY}.json")),
        serde_json::to_vec(&xformers_sm75()).unwrap(),
    )
    .unwrap();
    // GPU 0 (the 2080 Ti) runs it: nothing to say.
    let j = at_start(&c, &plan(&[0]), &view(), None, None);
    assert!(j.notes.is_empty() && j.refuse.is_none(), "{j:?}");
    // GPU 1 (the 3090), and both: the note names file, owner, GPU, list.
    let j = at_start(&c, &plan(&[0, 1]), &view(), None, None);
    assert_eq!(
        j.notes,
        [
            "xformers 0.0.29 \"/usr/local/lib/python3.12/dist-packages/xformers/_C.so\" carries only sm_75: GPU 1 (NVIDIA GeForce RTX 3090, 8.6) cannot run it; rebuild with TORCH_CUDA_ARCH_LIST=\"7.5;8.6\""
        ]
    );
    assert!(j.refuse.is_none());
    c.refuse = true;
    let j = at_start(&c, &plan(&[1]), &view(), None, None);
    let why = j.refuse.unwrap();
    assert!(why.starts_with("audit.refuse: xformers 0.0.29"), "{why}");
    assert!(
        why.contains("GPU 1 (NVIDIA GeForce RTX 3090, 8.6) cannot run it"),
        "{why}"
    );
    // No request is left for an image already audited.
    assert!(!d.path().join("requests").join(KEY).exists());
}

#[test]
fn a_wait_budget_takes_an_audit_that_lands_within_it() {
    let d = tempfile::tempdir().unwrap();
    let mut c = cfg(d.path());
    c.wait_ms = 2000;
    c.refuse = true;
    let entry = d.path().join(format!("{KEY}.json"));
    let body = serde_json::to_vec(&xformers_sm75()).unwrap();
    let writer = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let tmp = entry.with_extension("tmp");
        std::fs::write(&tmp, body).unwrap();
        std::fs::rename(tmp, entry).unwrap();
    });
    let j = at_start(
        &c,
        &plan(&[1]),
        &view(),
        Some(&Source::Rootfs("/r".into())),
        None,
    );
    writer.join().unwrap();
    assert!(j.refuse.is_some(), "{j:?}");
    // Past the budget the start goes on, and says so.
    let d = tempfile::tempdir().unwrap();
    let mut c = cfg(d.path());
    c.wait_ms = 30;
    let j = at_start(
        &c,
        &plan(&[1]),
        &view(),
        Some(&Source::Rootfs("/r".into())),
        None,
    );
    assert!(j.notes[0].contains("waited 30 ms"), "{j:?}");
}

#[test]
fn a_hostile_or_broken_entry_is_a_note_never_a_refusal() {
    let d = tempfile::tempdir().unwrap();
    let mut c = cfg(d.path());
    c.refuse = true;
    let entry = d.path().join(format!("{KEY}.json"));
    // A link is not followed.
    let target = d.path().join("elsewhere.json");
    std::fs::write(&target, serde_json::to_vec(&xformers_sm75()).unwrap()).unwrap();
    std::os::unix::fs::symlink(&target, &entry).unwrap();
    let j = at_start(&c, &plan(&[1]), &view(), None, None);
    assert!(
        j.refuse.is_none() && j.notes[0].contains("not read"),
        "{j:?}"
    );
    std::fs::remove_file(&entry).unwrap();
    // Not JSON; another schema; larger than read.
    for body in [b"{not json".to_vec(), br#"{"schema":9,"binaries":[],"read":[],"unread":[],"stopped":null,"files":0,"bytes":0,"millis":0}"#.to_vec(), vec![b' '; (MAX_AUDIT + 10) as usize]] {
        std::fs::write(&entry, body).unwrap();
        let j = at_start(&c, &plan(&[1]), &view(), None, None);
        assert!(j.refuse.is_none() && j.notes.len() == 1 && j.notes[0].contains("not read"), "{j:?}");
    }
    // A key that is not the image read's form is never a path.
    let mut v = view();
    v.software.image_key = Some("../../etc/passwd".into());
    let j = at_start(
        &c,
        &plan(&[1]),
        &v,
        Some(&Source::Rootfs("/r".into())),
        None,
    );
    assert!(j.notes.is_empty() && j.refuse.is_none());
}
