//! Unit tests of `core/src/select.rs`.

use super::*;
use crate::oci::DeviceNode;
use crate::snapshot::MigDevice;

pub(crate) fn dev(index: u32, minor: u32, uuid: &str, name: &str, cc: &str, bus: u8) -> Device {
    Device {
        index,
        minor,
        uuid: uuid.to_owned(),
        name: name.to_owned(),
        compute_capability: ComputeCapability::parse_reported(cc).unwrap(),
        pci_bus_id: format!("00000000:{bus:02X}:00.0"),
        memory_bytes: 1 << 30,
        brand: None,
        mig: vec![],
    }
}

/// 2080 Ti at index 0 (minor 1) and 3090 at index 1 (minor 0), plus an A100
/// with two MIG devices at index 2: minors differ from indexes on purpose.
pub(crate) fn host() -> Snapshot {
    let mut a100 = dev(2, 2, "GPU-cccc", "NVIDIA A100-SXM4-40GB", "8.0", 0x41);
    a100.mig = vec![
        MigDevice {
            index: 0,
            uuid: "MIG-aaaa".into(),
            name: "NVIDIA A100-SXM4-40GB MIG 3g.20gb".into(),
            memory_bytes: 1 << 30,
        },
        MigDevice {
            index: 1,
            uuid: "MIG-bbbb".into(),
            name: "NVIDIA A100-SXM4-40GB MIG 1g.5gb".into(),
            memory_bytes: 1 << 30,
        },
    ];
    Snapshot {
        schema: 1,
        source: "test".into(),
        generated_at: "2026-11-21T12:00:00Z".into(),
        driver_version: "580.95.05".into(),
        cuda_driver_version: "13.0".into(),
        stale: false,
        devices: vec![
            dev(0, 1, "GPU-aaaa", "NVIDIA GeForce RTX 2080 Ti", "7.5", 0x01),
            dev(1, 0, "GPU-bbbb", "NVIDIA GeForce RTX 3090", "8.6", 0x21),
            a100,
        ],
    }
}

fn env(pairs: &[(&str, &str)]) -> ContainerView {
    ContainerView::with_env(pairs.iter().copied())
}

fn uuids(s: &Selection) -> Vec<&str> {
    s.gpus.iter().map(|g| g.uuid.as_str()).collect()
}

#[test]
fn nvidia_visible_devices_forms() {
    let inv = host();
    let cases: &[(&str, &[&str])] = &[
        ("all", &["GPU-aaaa", "GPU-bbbb", "GPU-cccc"]),
        ("0", &["GPU-aaaa"]),
        ("1,0", &["GPU-aaaa", "GPU-bbbb"]),
        ("GPU-bbbb", &["GPU-bbbb"]),
        ("2:1", &["MIG-bbbb"]),
        ("MIG-aaaa,1", &["GPU-bbbb", "MIG-aaaa"]),
        ("0,0, 0", &["GPU-aaaa"]),
        ("none", &[]),
        ("void", &[]),
        ("", &[]),
    ];
    for (value, want) in cases {
        let s = select(&env(&[("NVIDIA_VISIBLE_DEVICES", value)]), &inv);
        assert_eq!(s.source, Some(Source::NvidiaVisibleDevices), "{value}");
        assert_eq!(uuids(&s), *want, "{value}: {:?}", s.notes);
    }
}

#[test]
fn unknown_devices_are_notes_not_panics() {
    let inv = host();
    let cases: &[(&str, &str)] = &[
        (
            "7",
            "no GPU with index 7 on this host (indexes here: 0, 1, 2)",
        ),
        ("GPU-ffff", "no GPU with UUID \"GPU-ffff\""),
        ("MIG-ffff", "no MIG device with UUID"),
        ("0:0", "GPU 0 has no MIG devices"),
        ("2:5", "GPU 2 has no MIG device 5"),
        ("x:y", "is not a MIG device name"),
        ("-1", "is not an index"),
        ("bogus", "is not an index, a UUID"),
        ("99999999999999999999", "is not an index"),
    ];
    for (value, want) in cases {
        let s = select(&env(&[("NVIDIA_VISIBLE_DEVICES", value)]), &inv);
        assert!(s.gpus.is_empty(), "{value}");
        assert!(
            s.notes.iter().any(|n| n.contains(want)),
            "{value}: {:?}",
            s.notes
        );
    }
    let s = select(&env(&[("NVIDIA_VISIBLE_DEVICES", "1,7")]), &inv);
    assert_eq!(uuids(&s), ["GPU-bbbb"]);
}

#[test]
fn huge_values_are_shortened_in_notes() {
    let big = "x".repeat(64 * 1024);
    let s = select(&env(&[("NVIDIA_VISIBLE_DEVICES", &big)]), &host());
    assert!(s.gpus.is_empty());
    assert!(s.notes.iter().all(|n| n.len() < 300), "{:?}", s.notes);
}

#[test]
fn device_nodes_are_matched_by_minor_number() {
    let mut v = ContainerView {
        devices: vec![
            DeviceNode::path("/dev/nvidiactl"),
            DeviceNode::path("/dev/nvidia-uvm"),
            DeviceNode::path("/dev/nvidia0"),
        ],
        ..ContainerView::default()
    };
    let s = select(&v, &host());
    assert_eq!(s.source, Some(Source::DeviceNodes));
    // minor 0 is the 3090 (index 1), not index 0
    assert_eq!(uuids(&s), ["GPU-bbbb"]);

    v.devices.push(DeviceNode::path("/dev/nvidia9"));
    let s = select(&v, &host());
    assert_eq!(uuids(&s), ["GPU-bbbb"]);
    assert!(
        s.notes[0].contains("no GPU with minor number 9"),
        "{:?}",
        s.notes
    );
}

#[test]
fn a_node_is_the_gpu_its_number_names_whatever_its_path() {
    let node = |path: &str, major: u32, minor: u32| DeviceNode {
        path: path.into(),
        char_number: Some((major, minor)),
    };
    // docker run --device /dev/nvidia1:/dev/nvidia0: minor 1 is the
    // 2080 Ti (GPU-aaaa), whatever the path inside says.
    let v = ContainerView {
        devices: vec![
            node("/dev/nvidia0", 195, 1),
            node("/dev/nvidiactl", 195, 255),
        ],
        ..ContainerView::default()
    };
    let s = select(&v, &host());
    assert_eq!(s.source, Some(Source::DeviceNodes));
    assert_eq!(uuids(&s), ["GPU-aaaa"]);
    // Another driver's device under an NVIDIA-looking name is no GPU.
    let v = ContainerView {
        devices: vec![
            node("/dev/nvidia0", 10, 0),
            node("/dev/nvidia-modeset", 195, 254),
        ],
        ..ContainerView::default()
    };
    assert_eq!(select(&v, &host()).source, None);
}

#[test]
fn control_nodes_alone_are_no_request() {
    let v = ContainerView {
        devices: vec![
            DeviceNode::path("/dev/nvidiactl"),
            DeviceNode::path("/dev/nvidia-caps/nvidia-cap1"),
        ],
        ..ContainerView::default()
    };
    let s = select(&v, &host());
    assert_eq!(s.source, None);
    assert!(s.gpus.is_empty());
}

#[test]
fn thousands_of_bad_names_make_a_few_notes() {
    let inv = crate::snapshot::Snapshot::from_json(include_bytes!(
        "../../../tests/fixtures/2080ti-3090.json"
    ))
    .unwrap();
    let list = format!("1,{}", "../x,".repeat(10_000));
    let s = select_request(&list, &ContainerView::default(), &inv);
    assert_eq!(s.gpus.len(), 1);
    assert_eq!(s.notes.len(), MAX_NOTES);
    assert_eq!(
        s.notes.last().map(String::as_str),
        Some("... and 9985 more notes like these, not shown")
    );
}

#[test]
fn cdi_annotations_come_first() {
    let mut v = env(&[("NVIDIA_VISIBLE_DEVICES", "0")]);
    v.devices = vec![DeviceNode::path("/dev/nvidia1")];
    v.annotations
        .insert("cdi.k8s.io/gpu".into(), "nvidia.com/gpu=GPU-bbbb".into());
    let s = select(&v, &host());
    assert_eq!(s.source, Some(Source::Cdi));
    assert_eq!(uuids(&s), ["GPU-bbbb"]);

    v.annotations
        .insert("cdi.k8s.io/all".into(), "nvidia.com/gpu=all".into());
    assert_eq!(uuids(&select(&v, &host())).len(), 3);
}

#[test]
fn non_gpu_cdi_devices_fall_through_to_the_next_source() {
    let mut v = ContainerView::default();
    v.annotations
        .insert("cdi.k8s.io/net".into(), "vendor.com/nic=eth1".into());
    v.devices = vec![DeviceNode::path("/dev/nvidia1")];
    let s = select(&v, &host());
    assert_eq!(s.source, Some(Source::DeviceNodes));
    assert_eq!(uuids(&s), ["GPU-aaaa"]);
    assert!(s.notes[0].contains("not an nvidia.com/gpu device"));
}

#[test]
fn device_nodes_beat_nvidia_visible_devices() {
    let mut v = env(&[("NVIDIA_VISIBLE_DEVICES", "all")]);
    v.devices = vec![DeviceNode::path("/dev/nvidia1")];
    assert_eq!(uuids(&select(&v, &host())), ["GPU-aaaa"]);
}

#[test]
fn no_source_is_no_request() {
    let s = select(&env(&[("PATH", "/bin")]), &host());
    assert_eq!(s.source, None);
    assert!(s.gpus.is_empty());
}

#[test]
fn cuda_visible_devices_narrows_and_orders() {
    let inv = host();
    let cases: &[(&str, &[&str])] = &[
        ("1", &["GPU-bbbb"]),
        ("1,0", &["GPU-bbbb", "GPU-aaaa"]),
        ("GPU-bb", &["GPU-bbbb"]),
        ("0,5,1", &["GPU-aaaa"]),
        ("1,1,0", &["GPU-bbbb", "GPU-aaaa"]),
        ("-1", &[]),
        ("", &[]),
        ("GPU-", &[]),
        ("GPU-cccc", &[]),
    ];
    for (cvd, want) in cases {
        let v = env(&[
            ("NVIDIA_VISIBLE_DEVICES", "0,1"),
            ("CUDA_VISIBLE_DEVICES", cvd),
        ]);
        let s = select(&v, &inv);
        assert_eq!(
            uuids(&s),
            *want,
            "CUDA_VISIBLE_DEVICES={cvd}: {:?}",
            s.notes
        );
    }
    let v = env(&[
        ("NVIDIA_VISIBLE_DEVICES", "0,1"),
        ("CUDA_VISIBLE_DEVICES", "0,5,1"),
    ]);
    let s = select(&v, &inv);
    assert!(
        s.notes
            .iter()
            .any(|n| n.contains("\"5\"") && n.contains("every entry after it")),
        "{:?}",
        s.notes
    );
}

#[test]
fn request_lists_resolve_like_nvidia_visible_devices() {
    let s = select_request("GPU-bbbb,0", &ContainerView::default(), &host());
    assert_eq!(s.source, Some(Source::Request));
    assert_eq!(uuids(&s), ["GPU-aaaa", "GPU-bbbb"]);
}

#[test]
fn strict_request_entries_name_the_problem() {
    let inv = host();
    for ok in ["0", "all", "GPU-bbbb", "2:1", "MIG-aaaa", " 1 "] {
        assert_eq!(check_request_entry(ok, &inv), Ok(()), "{ok}");
    }
    for (bad, want) in [
        ("7", "no GPU with index 7"),
        ("", "empty device name"),
        ("0,1", "one device per entry"),
        ("GPU-ffff", "no GPU with UUID"),
        ("bogus", "is not an index"),
    ] {
        let e = check_request_entry(bad, &inv).unwrap_err();
        assert!(e.to_string().contains(want), "{bad}: {e}");
    }
}
