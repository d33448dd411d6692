//! Unit tests of `core/src/arch.rs`.

use super::*;

fn cc(s: &str) -> ComputeCapability {
    ComputeCapability::parse_reported(s).expect(s)
}

fn t(s: &str) -> Target {
    Target::parse(s).expect(s)
}

/// Regression: fuzz target `arch` found `compute_a` followed by
/// Unicode whitespace (trimmed) panicking on a slice of the untrimmed
/// token (fuzz/artifacts/arch/crash-8ce986b0...).
#[test]
fn trailing_unicode_whitespace_after_a_prefix_is_an_error() {
    for s in [
        "compute_a\t\u{85}\u{85}\u{85}",
        "sm_\u{85}",
        " sm_a\u{2003}",
    ] {
        let e = Target::parse(s).unwrap_err().to_string();
        assert!(e.contains("missing digits after"), "{s:?}: {e}");
        assert!(ArchList::parse(s).is_err(), "{s:?}");
    }
}

#[test]
fn every_spelling_parses_to_the_same_target() {
    assert_eq!(t("7.5"), t("sm_75"));
    assert_eq!(t("10.0"), t("sm_100"));
    assert_eq!(t("9.0a"), t("sm_90a"));
    assert_eq!(t("10.0f"), t("sm_100f"));
    assert_eq!(t("compute_86").kind, CodeKind::Ptx);
    assert_eq!(t("compute_86").cap, cc("8.6"));
    assert_eq!(t("sm_90a").spec, Specificity::ArchSpecific);
    assert_eq!(t("sm_120f").to_string(), "sm_120f");
    assert_eq!(t("compute_90a").to_string(), "compute_90a");
}

#[test]
fn plus_ptx_adds_the_virtual_target() {
    let l = ArchList::parse("8.6+PTX").unwrap();
    let ts: Vec<_> = l.targets().map(|t| t.to_string()).collect();
    assert_eq!(ts, ["sm_86", "compute_86"]);
    assert_eq!(l.to_string(), "8.6+PTX");
}

#[test]
fn lists_split_on_semicolons_and_whitespace() {
    let a = ArchList::parse("7.5;8.6").unwrap();
    assert_eq!(a, ArchList::parse("7.5 8.6").unwrap());
    assert_eq!(a, ArchList::parse("  8.6 ;\t7.5 ").unwrap());
    assert_eq!(a, ArchList::parse("sm_86 sm_75 8.6").unwrap());
    assert_eq!(a.to_string(), "7.5;8.6");
}

#[test]
fn named_arches_expand_as_pytorch_reads_them() {
    let cases = [
        ("Turing", "7.5+PTX"),
        ("Ampere", "8.0;8.6+PTX"),
        ("Ada", "8.9+PTX"),
        ("Hopper", "9.0+PTX"),
        ("Blackwell", "10.0;10.3;12.0;12.1+PTX"),
        ("Ampere+Tegra", "8.7"),
        ("Turing;Ampere", "7.5+PTX;8.0;8.6+PTX"),
        ("hopper 8.0", "8.0;9.0+PTX"),
    ];
    for (input, want) in cases {
        assert_eq!(ArchList::parse(input).unwrap().to_string(), want, "{input}");
    }
}

#[test]
fn bad_tokens_are_named_in_the_error() {
    let cases = [
        ("8.x", "'8.x'"),
        ("sm_", "missing digits after 'sm_'"),
        ("compute_", "missing digits after 'compute_'"),
        ("99.99", "'99.99'"),
        ("99.9", "unknown compute capability '99.9'"),
        ("8.1", "unknown compute capability '8.1'"),
        ("7.5a", "7.5 has no 'a' variant"),
        ("9.0f", "9.0 has no 'f' variant"),
        ("sm_8x", "'sm_8x'"),
        ("Amperes", "'Amperes'"),
        ("sm_86+PTX", "'+PTX' goes after a capability"),
        ("7.5;8.x;8.6", "'8.x'"),
        ("0.5", "major version must be at least 1"),
    ];
    for (input, want) in cases {
        let err = ArchList::parse(input).expect_err(input).to_string();
        assert!(err.contains(want), "{input}: {err}");
    }
}

#[test]
fn empty_entries_are_errors() {
    assert_eq!(ArchList::parse(""), Err(ArchError::EmptyList));
    assert_eq!(ArchList::parse("  "), Err(ArchError::EmptyList));
    assert!(matches!(
        ArchList::parse("7.5;;8.6"),
        Err(ArchError::EmptyEntry { position: 2, .. })
    ));
    assert!(matches!(
        ArchList::parse("7.5;"),
        Err(ArchError::EmptyEntry { position: 2, .. })
    ));
    assert!(matches!(
        ArchList::parse(";7.5"),
        Err(ArchError::EmptyEntry { position: 1, .. })
    ));
}

#[test]
fn reported_capabilities_may_be_newer_than_the_table() {
    assert_eq!(cc("13.2"), ComputeCapability::new(13, 2));
    assert!(!cc("13.2").is_known());
    assert!(ComputeCapability::parse_reported("13.22").is_err());
    assert!(ComputeCapability::parse_reported("100.0").is_err());
    assert!(ComputeCapability::parse_reported("8").is_err());
}

#[test]
fn capabilities_order_numerically() {
    assert!(cc("10.0") > cc("9.0"));
    assert!(cc("8.9") > cc("8.6"));
    assert!(cc("12.0") > cc("10.3"));
}

#[test]
fn cuda_versions() {
    assert_eq!(CudaVersion::from_nvml(13000), Some(CudaVersion::new(13, 0)));
    assert_eq!(CudaVersion::from_nvml(12040), Some(CudaVersion::new(12, 4)));
    assert_eq!(CudaVersion::from_nvml(-1), None);
    assert_eq!(CudaVersion::parse("12.8").unwrap().to_string(), "12.8");
    assert!(CudaVersion::parse("12").is_err());
    assert!(CudaVersion::parse("12.x").is_err());
    assert!(CudaVersion::new(12, 10) > CudaVersion::new(12, 9));
}

/// Devices every compatibility case is checked on: desktop GPUs and
/// integrated (Tegra) ones, Xavier (7.2), Orin (8.7) and Thor (10.1 to a
/// CUDA 12 driver, 11.0 to a CUDA 13 one).
const DEVICES: [&str; 13] = [
    "7.2", "7.5", "8.0", "8.6", "8.7", "8.9", "9.0", "10.0", "10.1", "10.3", "11.0", "12.0", "12.1",
];

/// Target -> the devices (of `DEVICES`) it runs on. SASS never crosses
/// desktop and Tegra; PTX JIT-compiles on any capability at least its own.
const TABLE: &[(&str, &[&str])] = &[
    ("sm_72", &["7.2"]),
    ("sm_75", &["7.5"]),
    ("sm_80", &["8.0", "8.6", "8.9"]),
    ("sm_86", &["8.6", "8.9"]),
    ("sm_87", &["8.7"]),
    ("sm_89", &["8.9"]),
    ("sm_90", &["9.0"]),
    ("sm_90a", &["9.0"]),
    ("sm_100", &["10.0", "10.3"]),
    ("sm_100a", &["10.0"]),
    ("sm_100f", &["10.0", "10.3"]),
    ("sm_101", &["10.1"]),
    ("sm_103", &["10.3"]),
    ("sm_103f", &["10.3"]),
    ("sm_110", &["11.0"]),
    ("sm_120", &["12.0", "12.1"]),
    (
        "compute_75",
        &[
            "7.5", "8.0", "8.6", "8.7", "8.9", "9.0", "10.0", "10.1", "10.3", "11.0", "12.0",
            "12.1",
        ],
    ),
    (
        "compute_80",
        &[
            "8.0", "8.6", "8.7", "8.9", "9.0", "10.0", "10.1", "10.3", "11.0", "12.0", "12.1",
        ],
    ),
    (
        "compute_86",
        &[
            "8.6", "8.7", "8.9", "9.0", "10.0", "10.1", "10.3", "11.0", "12.0", "12.1",
        ],
    ),
    (
        "compute_89",
        &["8.9", "9.0", "10.0", "10.1", "10.3", "11.0", "12.0", "12.1"],
    ),
    (
        "compute_90",
        &["9.0", "10.0", "10.1", "10.3", "11.0", "12.0", "12.1"],
    ),
    ("compute_90a", &["9.0"]),
    (
        "compute_100",
        &["10.0", "10.1", "10.3", "11.0", "12.0", "12.1"],
    ),
    ("compute_100f", &["10.0", "10.3"]),
    ("compute_100a", &["10.0"]),
    ("compute_120", &["12.0", "12.1"]),
];

#[test]
fn desktop_sass_on_a_tegra_gpu_is_refused_and_says_why() {
    let v = t("sm_86").check(cc("8.7"), None, None);
    assert!(!v.runs);
    assert!(
        v.reason
            .contains("never across desktop and Tegra (8.7 is an integrated Tegra GPU's)"),
        "{}",
        v.reason
    );
    let v = t("sm_100f").check(cc("10.1"), None, None);
    assert!(
        !v.runs && v.reason.contains("10.1 is an integrated Tegra GPU's"),
        "{}",
        v.reason
    );
    // Tegra SASS on a desktop GPU of its major.
    let v = t("sm_72").check(cc("7.5"), None, None);
    assert!(
        !v.runs && v.reason.contains("7.2 is an integrated Tegra GPU's"),
        "{}",
        v.reason
    );
    // The plain rule's reason is unchanged where Tegra does not decide.
    let v = t("sm_86").check(cc("8.0"), None, None);
    assert!(!v.reason.contains("Tegra"), "{}", v.reason);
}

#[test]
fn compatibility_table() {
    for (target, runs_on) in TABLE {
        let target = t(target);
        for dev in DEVICES {
            let v = target.check(cc(dev), None, None);
            assert_eq!(
                v.runs,
                runs_on.contains(&dev),
                "{target} on {dev}: {}",
                v.reason
            );
            assert_eq!(v.jit, target.kind == CodeKind::Ptx);
        }
    }
}

#[test]
fn ptx_needs_a_driver_at_least_as_new_as_its_toolkit() {
    let ptx = t("compute_80");
    let old = ptx.check(
        cc("8.6"),
        Some(CudaVersion::new(12, 2)),
        Some(CudaVersion::new(12, 8)),
    );
    assert!(!old.runs);
    assert!(old.reason.contains("CUDA 12.8"), "{}", old.reason);
    let new = ptx.check(
        cc("8.6"),
        Some(CudaVersion::new(13, 0)),
        Some(CudaVersion::new(12, 8)),
    );
    assert!(new.runs);
    let unknown = ptx.check(cc("8.6"), Some(CudaVersion::new(13, 0)), None);
    assert!(unknown.runs && unknown.reason.contains("not given"));
    // A driver version never makes SASS run where its rule forbids.
    assert!(
        !t("sm_80")
            .check(cc("9.0"), Some(CudaVersion::new(13, 0)), None)
            .runs
    );
}

#[test]
fn a_fatbin_runs_if_any_target_fits() {
    let l = ArchList::parse("7.5;8.0").unwrap();
    assert!(l.runs_on(cc("8.6"), None));
    assert!(!l.runs_on(cc("9.0"), None));
    assert!(ArchList::parse("8.0+PTX").unwrap().runs_on(cc("9.0"), None));
}

#[test]
fn serde_uses_the_dotted_form() {
    let json = serde_json::to_string(&cc("8.6")).unwrap();
    assert_eq!(json, "\"8.6\"");
    let back: ComputeCapability = serde_json::from_str("\"12.0\"").unwrap();
    assert_eq!(back, cc("12.0"));
    assert!(serde_json::from_str::<ComputeCapability>("\"8.x\"").is_err());
}
