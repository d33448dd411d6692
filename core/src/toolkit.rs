//! The container's own CUDA toolkit: which real architectures (`sm_XY`)
//! each CUDA release's compilers accept, and so which target that toolkit
//! can build for each GPU.
//!
//! A GPU's exact capability is the right entry of `TORCH_CUDA_ARCH_LIST`
//! only when the toolkit in the container knows it: nvcc 12.8 stops at
//! sm_120, so a GB10 (12.1) under it needs `12.0`, whose SASS runs on 12.1.
//! The table below is NVIDIA's, release by release (the CUDA toolkit release
//! notes: what each release added and dropped), and each release's row is
//! what that release's NVRTC answers to `nvrtcGetSupportedArchs`
//! (scripts/consumers asks NVRTC 11.8, 12.0, 12.8, 12.9, 13.0, 13.3, 13.4
//! and 13.5 from NVIDIA's wheels); a toolkit newer than the table's last change
//! is taken to accept what that last one does.

use crate::arch::{ComputeCapability, CudaVersion};
use crate::oci::ContainerView;

const fn cc(major: u8, minor: u8) -> ComputeCapability {
    ComputeCapability::new(major, minor)
}

const fn cuda(major: u16, minor: u16) -> CudaVersion {
    CudaVersion::new(major, minor)
}

/// The oldest toolkit the table covers.
pub const OLDEST: CudaVersion = cuda(10, 0);

/// Each architecture: the first toolkit that accepts it and the first that
/// no longer does (None: still accepted).
const TABLE: &[(ComputeCapability, CudaVersion, Option<CudaVersion>)] = &[
    (cc(3, 5), cuda(10, 0), Some(cuda(12, 0))),
    (cc(3, 7), cuda(10, 0), Some(cuda(12, 0))),
    (cc(5, 0), cuda(10, 0), Some(cuda(13, 0))),
    (cc(5, 2), cuda(10, 0), Some(cuda(13, 0))),
    (cc(5, 3), cuda(10, 0), Some(cuda(13, 0))),
    (cc(6, 0), cuda(10, 0), Some(cuda(13, 0))),
    (cc(6, 1), cuda(10, 0), Some(cuda(13, 0))),
    (cc(6, 2), cuda(10, 0), Some(cuda(13, 0))),
    (cc(7, 0), cuda(10, 0), Some(cuda(13, 0))),
    (cc(7, 2), cuda(10, 0), Some(cuda(13, 0))),
    (cc(7, 5), cuda(10, 0), None),
    (cc(8, 0), cuda(11, 0), None),
    (cc(8, 6), cuda(11, 1), None),
    (cc(8, 7), cuda(11, 4), None),
    // In NVRTC from 13.0 (not 12.9); no GPU of 8.8 is in KNOWN yet.
    (cc(8, 8), cuda(13, 0), None),
    (cc(8, 9), cuda(11, 8), None),
    (cc(9, 0), cuda(11, 8), None),
    (cc(10, 0), cuda(12, 8), None),
    // Thor: sm_101 until CUDA 13.0 renamed it sm_110 (see [`alias`]).
    (cc(10, 1), cuda(12, 8), Some(cuda(13, 0))),
    (cc(10, 3), cuda(12, 9), None),
    // In NVRTC from 13.4 (not 13.3); torch 2.15 knows it, KNOWN does not yet.
    (cc(10, 7), cuda(13, 4), None),
    (cc(11, 0), cuda(13, 0), None),
    (cc(12, 0), cuda(12, 8), None),
    (cc(12, 1), cuda(12, 9), None),
];

/// Every toolkit release where the table changes, oldest first: the
/// releases worth testing against.
pub fn releases() -> Vec<CudaVersion> {
    let mut v: Vec<CudaVersion> = TABLE
        .iter()
        .flat_map(|(_, since, until)| [Some(*since), *until])
        .flatten()
        .collect();
    v.sort();
    v.dedup();
    v
}

/// Whether toolkit `cuda`'s compilers accept `sm_XY` of `cap`.
pub fn accepts(cuda: CudaVersion, cap: ComputeCapability) -> bool {
    TABLE
        .iter()
        .any(|(c, since, until)| *c == cap && cuda >= *since && until.is_none_or(|u| cuda < u))
}

/// The architectures toolkit `cuda` accepts, ascending.
pub fn accepted(cuda: CudaVersion) -> Vec<ComputeCapability> {
    TABLE
        .iter()
        .map(|(c, _, _)| *c)
        .filter(|c| accepts(cuda, *c))
        .collect()
}

/// The name toolkit `cuda` gives a GPU's architecture. Thor reports 11.0
/// under a CUDA 13 driver; toolkits before 13.0 call the same chip sm_101.
pub fn alias(device: ComputeCapability, cuda: CudaVersion) -> ComputeCapability {
    match (device.major, device.minor) {
        (11, 0) if cuda < CudaVersion::new(13, 0) => cc(10, 1),
        (10, 1) if cuda >= CudaVersion::new(13, 0) => cc(11, 0),
        _ => device,
    }
}

/// What toolkit `cuda` can build that runs on a GPU, best first: its own
/// SASS; else the newest SASS of its family the toolkit accepts (SASS runs
/// on its major with a higher minor); else the newest older architecture
/// as PTX, JIT-compiled by the driver; else nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Build {
    /// The GPU's own architecture (as the toolkit names it, [`alias`]).
    Exact(ComputeCapability),
    /// SASS of an older minor of the same major.
    Family(ComputeCapability),
    /// PTX of an older architecture.
    Ptx(ComputeCapability),
    /// The toolkit builds nothing that runs on this GPU.
    None,
}

pub fn best(device: ComputeCapability, cuda: CudaVersion) -> Build {
    best_where(device, alias(device, cuda), |c| accepts(cuda, c))
}

/// Every architecture the table knows, ascending.
pub fn archs() -> impl Iterator<Item = ComputeCapability> {
    let mut v: Vec<ComputeCapability> = TABLE.iter().map(|(c, _, _)| *c).collect();
    v.sort();
    v.into_iter()
}

/// [`best`] among the architectures `ok` takes (what a toolkit builds and
/// a consumer names), for a GPU that reports `device` and that the
/// toolkit calls `named`. SASS of an older minor runs only on the major
/// the GPU reports, and never across desktop and Tegra
/// ([`ComputeCapability::sass_runs_on`]): a Thor does not run the sm_100
/// that a CUDA 12 toolkit, which calls it sm_101, would build as its
/// family, nor an Orin sm_86, so that is PTX, which JIT-compiles there.
pub fn best_where(
    device: ComputeCapability,
    named: ComputeCapability,
    ok: impl Fn(ComputeCapability) -> bool,
) -> Build {
    if ok(named) {
        return Build::Exact(named);
    }
    // Another GPU's substitute is never an integrated (Tegra) chip's
    // architecture: an Ada (8.9) under CUDA 11.4 gets 8.6, not Orin's 8.7.
    let known: Vec<ComputeCapability> = archs().filter(|c| !c.is_tegra() && ok(*c)).collect();
    if let Some(c) = known
        .iter()
        .rev()
        .find(|c| c.major == named.major && c.minor < named.minor)
    {
        return if c.sass_runs_on(device) {
            Build::Family(*c)
        } else {
            Build::Ptx(*c)
        };
    }
    match known.iter().rev().find(|c| **c < named && **c <= device) {
        Some(c) => Build::Ptx(*c),
        None => Build::None,
    }
}

/// Where the container's toolkit version was learnt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// The container's `CUDA_VERSION` (NVIDIA's images and most framework
    /// images set it: `12.8.1`).
    CudaVersionEnv,
    /// `cuda>=X.Y` in the container's `NVIDIA_REQUIRE_CUDA`.
    NvidiaRequireCuda,
    /// Annotation `io.gpuarch.cuda-version`.
    Annotation,
    /// `env.cuda_version` in gpuarch's config.
    Config,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Source::CudaVersionEnv => "CUDA_VERSION in the container",
            Source::NvidiaRequireCuda => "NVIDIA_REQUIRE_CUDA in the container",
            Source::Annotation => "annotation io.gpuarch.cuda-version",
            Source::Config => "env.cuda_version in the config",
        })
    }
}

/// The container's toolkit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Toolkit {
    pub version: CudaVersion,
    pub source: Source,
}

/// The annotation naming a container's toolkit.
pub const ANNOTATION: &str = "io.gpuarch.cuda-version";

/// A toolkit version as images and users write it (`12.8.1`, `12.8`,
/// `v12.8`): its first two numbers.
pub fn parse_version(s: &str) -> Option<CudaVersion> {
    let s = s.trim().trim_start_matches(['v', 'V']);
    let mut parts = s.split('.');
    let num = |p: Option<&str>| -> Option<u16> {
        let p = p?;
        if p.is_empty() || p.len() > 3 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        p.parse().ok()
    };
    let (major, minor) = (num(parts.next())?, num(parts.next())?);
    if parts.any(|p| !p.bytes().all(|b| b.is_ascii_digit())) {
        return None;
    }
    Some(CudaVersion::new(major, minor))
}

/// The container's toolkit, from the first of: `CUDA_VERSION`, the
/// `cuda>=` term of `NVIDIA_REQUIRE_CUDA`, the annotation, the config's
/// default. A value that is not a version is passed over with a note.
pub fn of_container(
    view: &ContainerView,
    default: Option<CudaVersion>,
    notes: &mut Vec<String>,
) -> Option<Toolkit> {
    let mut found =
        |raw: Option<&str>, source: Source, pick: &dyn Fn(&str) -> Option<CudaVersion>| {
            let raw = raw?;
            match pick(raw) {
                Some(version) => Some(Toolkit { version, source }),
                None => {
                    notes.push(format!(
                        "{source} is {raw:?}, not a CUDA version: passed over"
                    ));
                    None
                }
            }
        };
    found(
        view.env_get("CUDA_VERSION"),
        Source::CudaVersionEnv,
        &parse_version,
    )
    .or_else(|| {
        found(
            view.env_get("NVIDIA_REQUIRE_CUDA"),
            Source::NvidiaRequireCuda,
            &|v| {
                v.split_whitespace()
                    .find_map(|t| t.strip_prefix("cuda>="))
                    .and_then(parse_version)
            },
        )
    })
    .or_else(|| {
        found(
            view.annotations.get(ANNOTATION).map(String::as_str),
            Source::Annotation,
            &parse_version,
        )
    })
    .or_else(|| {
        default.map(|version| Toolkit {
            version,
            source: Source::Config,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> CudaVersion {
        CudaVersion::parse(s).unwrap()
    }

    fn c(s: &str) -> ComputeCapability {
        ComputeCapability::parse_reported(s).unwrap()
    }

    #[test]
    fn each_gpu_gets_the_best_target_its_toolkit_builds() {
        // GB10 under 12.8: sm_120 SASS runs on 12.1.
        assert_eq!(best(c("12.1"), v("12.8")), Build::Family(c("12.0")));
        assert_eq!(best(c("12.1"), v("12.9")), Build::Exact(c("12.1")));
        // Thor: sm_101 before CUDA 13, sm_110 from it.
        assert_eq!(best(c("11.0"), v("12.9")), Build::Exact(c("10.1")));
        assert_eq!(best(c("11.0"), v("13.0")), Build::Exact(c("11.0")));
        assert_eq!(best(c("10.1"), v("13.0")), Build::Exact(c("11.0")));
        // B300 before 12.9; a 5090 before 12.8: PTX of Hopper.
        assert_eq!(best(c("10.3"), v("12.8")), Build::Family(c("10.0")));
        assert_eq!(best(c("12.0"), v("12.6")), Build::Ptx(c("9.0")));
        assert_eq!(best(c("10.0"), v("11.8")), Build::Ptx(c("9.0")));
        // CUDA 13 dropped Volta and older: nothing runs.
        assert_eq!(best(c("7.0"), v("13.0")), Build::None);
        assert_eq!(best(c("6.1"), v("12.4")), Build::Exact(c("6.1")));
        assert_eq!(best(c("8.6"), v("11.0")), Build::Family(c("8.0")));
        // Never a Tegra chip's architecture for another GPU, nor a
        // desktop one's SASS for a Tegra chip: its PTX.
        assert_eq!(best(c("8.7"), v("11.2")), Build::Ptx(c("8.6")));
        assert_eq!(
            best_where(c("10.1"), c("10.1"), |x| x != c("10.1")
                && accepts(v("12.9"), x)),
            Build::Ptx(c("10.0")),
            "a Thor reporting 10.1 where sm_101 is not taken"
        );
        assert_eq!(best(c("8.9"), v("11.4")), Build::Family(c("8.6")));
        assert_eq!(best(c("8.7"), v("11.4")), Build::Exact(c("8.7")));
        assert_eq!(best(c("9.0"), v("11.4")), Build::Ptx(c("8.6")));
        // Newer than the table: as its last release.
        assert_eq!(best(c("12.1"), v("13.5")), Build::Exact(c("12.1")));
    }

    #[test]
    fn what_nvrtc_added_after_the_release_notes() {
        // sm_107 from NVRTC 13.4: before it, sm_103 SASS of its family.
        assert_eq!(best(c("10.7"), v("13.3")), Build::Family(c("10.3")));
        assert_eq!(best(c("10.7"), v("13.4")), Build::Exact(c("10.7")));
        assert_eq!(best(c("10.7"), v("13.5")), Build::Exact(c("10.7")));
        // sm_88 from 13.0; 12.9 builds 8.6 SASS for it.
        assert_eq!(best(c("8.8"), v("12.9")), Build::Family(c("8.6")));
        assert_eq!(best(c("8.8"), v("13.0")), Build::Exact(c("8.8")));
        assert!(releases().contains(&v("13.4")));
    }

    #[test]
    fn every_known_capability_is_in_the_table_and_releases_are_its_changes() {
        for (cap, _) in crate::arch::KNOWN {
            assert!(
                TABLE.iter().any(|(c, _, _)| c == cap),
                "{cap} is not in the toolkit table"
            );
        }
        let r = releases();
        assert_eq!(r.first(), Some(&OLDEST));
        assert!(r.contains(&v("12.8")) && r.contains(&v("13.0")), "{r:?}");
    }

    #[test]
    fn the_toolkit_comes_from_the_first_source_that_names_one() {
        let view = |env: &[(&str, &str)], ann: Option<&str>| {
            let mut v = ContainerView::with_env(
                env.iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect::<Vec<_>>(),
            );
            if let Some(a) = ann {
                v.annotations.insert(ANNOTATION.to_owned(), a.to_owned());
            }
            v
        };
        let mut notes = Vec::new();
        let got = |v: &ContainerView, d: Option<CudaVersion>, notes: &mut Vec<String>| {
            of_container(v, d, notes).map(|t| (t.version.to_string(), t.source))
        };
        assert_eq!(
            got(&view(&[("CUDA_VERSION", "12.8.1")], None), None, &mut notes),
            Some(("12.8".into(), Source::CudaVersionEnv))
        );
        let require = "cuda>=12.4 brand=tesla,driver>=470,driver<471 brand=unknown,driver>=470";
        assert_eq!(
            got(
                &view(&[("NVIDIA_REQUIRE_CUDA", require)], Some("11.0")),
                None,
                &mut notes
            ),
            Some(("12.4".into(), Source::NvidiaRequireCuda))
        );
        assert_eq!(
            got(&view(&[], Some("13.0")), Some(v("12.6")), &mut notes),
            Some(("13.0".into(), Source::Annotation))
        );
        assert_eq!(
            got(&view(&[], None), Some(v("12.6")), &mut notes),
            Some(("12.6".into(), Source::Config))
        );
        assert!(notes.is_empty(), "{notes:?}");
        assert_eq!(got(&view(&[], None), None, &mut notes), None);
        // Not a version: passed over, said.
        assert_eq!(
            got(
                &view(
                    &[
                        ("CUDA_VERSION", "latest"),
                        ("NVIDIA_REQUIRE_CUDA", "cuda>=12.1")
                    ],
                    None
                ),
                None,
                &mut notes
            ),
            Some(("12.1".into(), Source::NvidiaRequireCuda))
        );
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].contains("\"latest\", not a CUDA version"),
            "{notes:?}"
        );
        for bad in ["", "12", "12.x", "1234.5", "12.8.1-rc", "12..8"] {
            assert_eq!(parse_version(bad), None, "{bad:?}");
        }
    }
}
