//! Properties of the Plan and the arch-list syntax over generated inputs.

use gpuarch_core::arch::{ArchList, CodeKind, ComputeCapability, KNOWN, Specificity, Target};
use gpuarch_core::config::EnvConfig;
use gpuarch_core::features::Feature;
use gpuarch_core::oci::ContainerView;
use gpuarch_core::plan;
use gpuarch_core::snapshot::{Device, Snapshot};
use gpuarch_core::software;
use proptest::prelude::*;

fn known_cap() -> impl Strategy<Value = ComputeCapability> {
    prop::sample::select(KNOWN.iter().map(|(c, _)| *c).collect::<Vec<_>>())
}

fn host(caps: &[ComputeCapability]) -> Snapshot {
    Snapshot {
        schema: 1,
        source: "proptest".into(),
        generated_at: "2026-11-21T12:00:00Z".into(),
        driver_version: "580.95.05".into(),
        cuda_driver_version: "13.0".into(),
        stale: false,
        devices: caps
            .iter()
            .zip(0u32..)
            .map(|(c, i)| Device {
                index: i,
                minor: i,
                uuid: format!("GPU-{i:08x}"),
                name: format!("gpu {i}"),
                compute_capability: *c,
                pci_bus_id: format!("00000000:{:02X}:00.0", i + 1),
                memory_bytes: 1 << 34,
                brand: None,
                mig: vec![],
            })
            .collect(),
    }
}

fn target() -> impl Strategy<Value = Target> {
    (known_cap(), 0..3u8, any::<bool>()).prop_filter_map("variant exists", |(cap, s, ptx)| {
        let spec = match s {
            0 => Specificity::Generic,
            1 if cap.has_arch_specific() => Specificity::ArchSpecific,
            2 if cap.has_family_specific() => Specificity::FamilySpecific,
            _ => return None,
        };
        let kind = if ptx { CodeKind::Ptx } else { CodeKind::Sass };
        Some(Target { cap, spec, kind })
    })
}

fn all_gpus() -> ContainerView {
    ContainerView::with_env([("NVIDIA_VISIBLE_DEVICES", "all")])
}

/// An image read, holding the newest torch of the table (as its
/// `PYTORCH_VERSION` says), which names every known capability, and no
/// other consumer: no DeepSpeed that cannot parse `10.0`, no xformers
/// that needs `9.0a`.
fn newest_torch() -> ContainerView {
    let mut view = ContainerView::with_env([
        ("NVIDIA_VISIBLE_DEVICES", "all"),
        ("PYTORCH_VERSION", "2.15.0"),
    ]);
    view.software.read = vec!["/usr/local/lib/python3.12/dist-packages".into()];
    view
}

/// Where a Hopper is among the GPUs and the image was not read, an
/// xformers (which needs `9.0a`) and a DeepSpeed (which rejects it) may
/// both be there: `TORCH_CUDA_ARCH_LIST` is left unset, as both take it,
/// and the note says so. Some(the test's result) in that case.
fn unset_for_a_hopper(
    p: &plan::Plan,
    caps: &[ComputeCapability],
) -> Option<Result<(), TestCaseError>> {
    if !caps.contains(&ComputeCapability::new(9, 0)) {
        return None;
    }
    Some((|| {
        prop_assert_eq!(p.env_get("TORCH_CUDA_ARCH_LIST"), None);
        prop_assert!(
            p.notes
                .iter()
                .any(|n| n.starts_with("TORCH_CUDA_ARCH_LIST not set: ")),
            "{:?}",
            p.notes
        );
        Ok(())
    })())
}

proptest! {
    #[test]
    fn torch_arch_list_is_sorted_distinct_and_parses_back(
        caps in prop::collection::vec(known_cap(), 1..9)
    ) {
        let p = plan::plan(&newest_torch(), &host(&caps), &EnvConfig::default());
        let list = p.env_get("TORCH_CUDA_ARCH_LIST").expect("set for any GPU");
        let entries: Vec<ComputeCapability> = list
            .split(';')
            .map(|s| {
                let s = s.strip_suffix("+PTX").unwrap_or(s);
                ComputeCapability::parse_known(s).expect("each entry is a capability")
            })
            .collect();
        prop_assert!(entries.windows(2).all(|w| w[0] < w[1]), "sorted and distinct: {}", list);
        let mut want: Vec<_> = caps.clone();
        want.sort();
        want.dedup();
        // Each GPU's own capability; a Thor that reports 10.1 (a driver
        // before CUDA 13) by compute_100, which the driver JIT-compiles
        // there: torch 2.9 on no longer names 10.1, the toolkit such a
        // driver runs does not build sm_110, and sm_100 does not run on
        // a Tegra GPU.
        let thor = ComputeCapability::new(10, 1);
        let b200 = ComputeCapability::new(10, 0);
        let mut torch_want: Vec<_> = want
            .iter()
            .map(|c| if *c == thor { b200 } else { *c })
            .collect();
        torch_want.sort();
        torch_want.dedup();
        prop_assert_eq!(&entries, &torch_want);
        // The parser reads it back as SASS for exactly those capabilities,
        // and Thor's PTX.
        let parsed = ArchList::parse(list).expect("parses");
        let ptx = want.contains(&thor).then(|| Target::ptx(b200));
        prop_assert_eq!(
            parsed,
            ArchList::new(torch_want.iter().map(|c| Target::sass(*c)).chain(ptx))
        );
        // FlashInfer's: the same, arch-specific from Hopper on.
        let fi: Vec<String> = want
            .iter()
            .map(|c| if c.major >= 9 { format!("{c}a") } else { c.to_string() })
            .collect();
        let fi = fi.join(" ");
        prop_assert_eq!(p.env_get("FLASHINFER_CUDA_ARCH_LIST"), Some(fi.as_str()));
    }

    #[test]
    fn with_torch_unknown_every_entry_is_one_every_torch_takes(
        caps in prop::collection::vec(known_cap(), 1..9)
    ) {
        let p = plan::plan(&all_gpus(), &host(&caps), &EnvConfig::default());
        // A GPU of a two-digit major: every torch whose own kernels run
        // there builds it SASS unset, which a DeepSpeed that may be there
        // cannot parse, and a name it parses gives PTX: no list serves
        // both, unset does.
        if caps.iter().any(|c| c.major >= 10) {
            prop_assert_eq!(p.env_get("TORCH_CUDA_ARCH_LIST"), None);
            prop_assert!(
                p.notes.iter().any(|n| n.starts_with("TORCH_CUDA_ARCH_LIST not set: a DeepSpeed may be in the image")),
                "{:?}", p.notes
            );
            return Ok(());
        }
        if let Some(why) = unset_for_a_hopper(&p, &caps) {
            return why;
        }
        let list = p.env_get("TORCH_CUDA_ARCH_LIST").expect("set for any other GPU");
        for release in software::torch_releases() {
            let names = software::torch_names(release);
            for entry in list.split(';') {
                let name = entry.trim_end_matches("+PTX");
                prop_assert!(names.contains(&name), "torch {} rejects {} of {}", release, entry, list);
            }
        }
        // Each GPU runs something of it: its SASS family, or PTX no newer.
        let parsed = ArchList::parse(list).expect("parses");
        for c in &caps {
            prop_assert!(
                parsed.targets().any(|t| (t.kind == CodeKind::Sass && t.cap.major == c.major && t.cap.minor <= c.minor)
                    || (t.kind == CodeKind::Ptx && t.cap <= *c)),
                "nothing of {} runs on {}", list, c
            );
        }
    }

    #[test]
    fn bf16_and_flash_attention_only_when_every_gpu_has_them(
        caps in prop::collection::vec(known_cap(), 1..9)
    ) {
        let p = plan::plan(&all_gpus(), &host(&caps), &EnvConfig::default());
        // Written out, not read from the gate table: bf16 needs 8.0 or newer.
        let all_bf16 = caps.iter().all(|c| c.major >= 8);
        prop_assert_eq!(p.env_get("GPUARCH_DTYPE") == Some("bfloat16"), all_bf16);
        prop_assert_eq!(p.env_get("GPUARCH_DTYPE") == Some("float16"), !all_bf16);
        // FlashAttention-2 needs 8.0 and a flash-attn build that runs
        // there, which an Orin (8.7) or a Thor (10.1 or 11.0, by its
        // driver) has not: desktop SASS does not run on a Tegra GPU.
        let tegra = [
            ComputeCapability::new(8, 7),
            ComputeCapability::new(10, 1),
            ComputeCapability::new(11, 0),
        ];
        prop_assert_eq!(
            p.env_get("GPUARCH_ATTN_IMPLEMENTATION") == Some("flash_attention_2"),
            caps.iter().all(|c| Feature::FlashAttention2.supported_on(*c) && !tegra.contains(c))
        );
        prop_assert_eq!(
            p.env_get("GPUARCH_FP8") == Some("1"),
            caps.iter().all(|c| *c >= ComputeCapability::new(8, 9))
        );
        let min = caps.iter().min().map(ToString::to_string);
        prop_assert_eq!(p.env_get("GPUARCH_MIN_COMPUTE_CAPABILITY"), min.as_deref());
    }

    #[test]
    fn arch_lists_round_trip_through_their_canonical_form(
        targets in prop::collection::btree_set(target(), 1..12)
    ) {
        let list = ArchList::new(targets);
        let text = list.to_string();
        prop_assert_eq!(ArchList::parse(&text).expect("canonical form parses"), list);
    }

    #[test]
    fn the_parser_never_panics(s in "\\PC{0,40}") {
        let _ = ArchList::parse(&s);
    }
}
