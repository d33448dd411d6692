//! The software in a container's image that reads gpuarch's variables, and
//! what each release of it accepts.
//!
//! A value is right for a container only if every consumer in its image
//! takes it: torch's `cpp_extension` raises on an arch name its release does
//! not know (`10.1` is a Thor under CUDA 12.x to torch 2.7 and 2.8, and
//! unknown to 2.9 on), and DeepSpeed's op builder raises on an
//! arch-specific name (`9.0a`). The hook reads which releases an image
//! carries (the `*.dist-info` directories of its Python environments, and
//! `PYTORCH_VERSION` in its env); the Plan then picks names those releases
//! take, and where nothing is known, names every release in the table takes.
//!
//! The tables here are each release's own code, transcribed; CI
//! (scripts/consumers) checks them against that code release by release.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::arch::ComputeCapability;
use crate::env::EnvVar;

/// The consumers gpuarch knows, by their distribution names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dist {
    Torch,
    #[serde(rename = "flashinfer-python")]
    FlashInfer,
    Xformers,
    #[serde(rename = "deepspeed")]
    DeepSpeed,
    #[serde(rename = "flash-attn")]
    FlashAttn,
    Vllm,
    Sglang,
    Bitsandbytes,
    Accelerate,
}

impl Dist {
    pub const ALL: [Dist; 9] = [
        Dist::Torch,
        Dist::FlashInfer,
        Dist::Xformers,
        Dist::DeepSpeed,
        Dist::FlashAttn,
        Dist::Vllm,
        Dist::Sglang,
        Dist::Bitsandbytes,
        Dist::Accelerate,
    ];

    /// The distribution's name as PyPI spells it.
    pub fn name(self) -> &'static str {
        match self {
            Dist::Torch => "torch",
            Dist::FlashInfer => "flashinfer-python",
            Dist::Xformers => "xformers",
            Dist::DeepSpeed => "deepspeed",
            Dist::FlashAttn => "flash-attn",
            Dist::Vllm => "vllm",
            Dist::Sglang => "sglang",
            Dist::Bitsandbytes => "bitsandbytes",
            Dist::Accelerate => "accelerate",
        }
    }

    /// The distribution a name stands for, compared as Python packaging
    /// does (case, and runs of `-`, `_`, `.`, do not matter).
    pub fn from_name(name: &str) -> Option<Self> {
        let want = normalize(name);
        Self::ALL.into_iter().find(|d| normalize(d.name()) == want)
    }
}

impl fmt::Display for Dist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// PEP 503's normal form of a distribution name.
pub fn normalize(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut sep = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            sep = true;
            continue;
        }
        if sep && !out.is_empty() {
            out.push('-');
        }
        sep = false;
        out.push(c.to_ascii_lowercase());
    }
    out
}

/// A release's first three numbers (`2.9.1+cu128` is 2.9.1, `2.8.0a0+5228`
/// is 2.8.0, `0.6.7.post3` is 0.6.7). What follows them (pre-release,
/// local label) never changes what a release's parser accepts in the tables
/// here, except that a pre-release of 2.8 is taken as 2.8, as NGC's builds
/// of a torch not yet released are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Release {
    pub major: u16,
    pub minor: u16,
    pub patch: u16,
}

impl Release {
    pub const fn new(major: u16, minor: u16, patch: u16) -> Self {
        Self {
            major,
            minor,
            patch,
        }
    }

    /// A version as Python packaging writes it. None for what does not
    /// start with two numbers.
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim();
        // An epoch (`1!2.0`) is not used by any consumer here.
        if s.contains('!') || s.len() > 128 {
            return None;
        }
        let mut nums = [0u16; 3];
        let mut count = 0;
        for part in s.split('.') {
            let digits = part.bytes().take_while(u8::is_ascii_digit).count();
            if digits == 0 || digits > 5 || count == 3 {
                break;
            }
            nums[count] = part[..digits].parse().ok()?;
            count += 1;
            if digits < part.len() {
                break;
            }
        }
        (count >= 2).then(|| Self::new(nums[0], nums[1], nums[2]))
    }
}

impl fmt::Display for Release {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl Serialize for Release {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Release {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).ok_or_else(|| serde::de::Error::custom(format!("not a version: {s:?}")))
    }
}

/// The name and version in a `*.dist-info` (or `*.egg-info`) directory's
/// name, for the consumers of [`Dist`]: `torch-2.9.1+cu128.dist-info`,
/// `flashinfer_python-0.7.1.dist-info`, `deepspeed-0.19.8-py3.12.egg-info`.
pub fn dist_info(entry: &str) -> Option<(Dist, Release)> {
    let stem = entry
        .strip_suffix(".dist-info")
        .or_else(|| entry.strip_suffix(".egg-info"))?;
    let (name, rest) = stem.split_once('-')?;
    let version = rest.split('-').next()?;
    Some((Dist::from_name(name)?, Release::parse(version)?))
}

/// What is known of an image's consumers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Software {
    /// The consumers found and their releases.
    pub dists: BTreeMap<Dist, Release>,
    /// Where the image's Python environments were read (`/usr/lib/python3.12/
    /// site-packages`, ...); empty when the image was not read, so nothing
    /// is known of what is absent.
    #[serde(default)]
    pub read: Vec<String>,
    /// The environments the image's interpreters would import from that
    /// were not read, each with why (`/opt/x/bin/python3: no lib/python3.*
    /// under /opt/x`). Where one is, a consumer not found may still be
    /// there: its absence is not proven.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unread: Vec<String>,
    /// The exact versions, as their `.dist-info` directories name them, of
    /// the distributions a prebuilt library is gated on
    /// (`crate::library`: `flashinfer-python`, `flashinfer-cubin`), by
    /// PEP 503 name. A library is served only for its reader's very version.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub exact: BTreeMap<String, String>,
    /// What identifies the environments read (their paths, inodes and
    /// times: the image read's cache key), where they were read: the name
    /// of the image's kept audit (`audit.dir`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_key: Option<String>,
}

/// What [`Software::read`] holds for an image read and found to have no
/// Python environment.
pub const NO_PYTHON: &str = "(no Python environment)";

/// The variable that NVIDIA's and PyTorch's images set to their torch
/// release.
pub const PYTORCH_VERSION: &str = "PYTORCH_VERSION";

impl Software {
    /// Whether some of the image's Python environments were read.
    pub fn was_read(&self) -> bool {
        !self.read.is_empty()
    }

    /// Whether every environment the image's interpreters would import
    /// from was read, so a consumer not in [`Software::dists`] is known to
    /// be absent.
    pub fn absence_proven(&self) -> bool {
        self.was_read() && self.unread.is_empty()
    }

    /// Whether the image was read and holds no Python environment at all
    /// (then nothing in it reads a Python hint; what it installs at start
    /// decides).
    pub fn no_python(&self) -> bool {
        self.read.len() == 1 && self.read[0] == NO_PYTHON && self.unread.is_empty()
    }

    /// Whether `d` is known to be absent from Python environments the image
    /// has (not merely from an image with no Python at all).
    pub fn lacks(&self, d: Dist) -> bool {
        !self.may_have(d) && !self.no_python()
    }

    pub fn get(&self, d: Dist) -> Option<Release> {
        self.dists.get(&d).copied()
    }

    /// Whether `d` is, or may be, in the image: found, or its absence not
    /// proven.
    pub fn may_have(&self, d: Dist) -> bool {
        !self.absence_proven() || self.dists.contains_key(&d)
    }

    /// Add what the image's env says (`PYTORCH_VERSION`) of a consumer not
    /// found on disk; the notes say what was taken from where.
    pub fn with_env(mut self, env_get: impl Fn(&str) -> Option<String>) -> Self {
        if !self.dists.contains_key(&Dist::Torch)
            && let Some(r) = env_get(PYTORCH_VERSION).and_then(|v| Release::parse(&v))
        {
            self.dists.insert(Dist::Torch, r);
        }
        self
    }
}

/// Each torch release's `supported_arches` in `torch/utils/cpp_extension.py`
/// (`_get_cuda_arch_flags`), from the first release with that list: the
/// names `TORCH_CUDA_ARCH_LIST` may hold, each also with `+PTX`. Any other
/// name raises `ValueError: Unknown CUDA arch`.
const TORCH: &[(Release, &[&str])] = &[
    (
        Release::new(2, 4, 0),
        &[
            "3.5", "3.7", "5.0", "5.2", "5.3", "6.0", "6.1", "6.2", "7.0", "7.2", "7.5", "8.0",
            "8.6", "8.7", "8.9", "9.0", "9.0a",
        ],
    ),
    (
        Release::new(2, 6, 0),
        &[
            "3.5", "3.7", "5.0", "5.2", "5.3", "6.0", "6.1", "6.2", "7.0", "7.2", "7.5", "8.0",
            "8.6", "8.7", "8.9", "9.0", "9.0a", "10.0",
        ],
    ),
    (
        Release::new(2, 7, 0),
        &[
            "3.5", "3.7", "5.0", "5.2", "5.3", "6.0", "6.1", "6.2", "7.0", "7.2", "7.5", "8.0",
            "8.6", "8.7", "8.9", "9.0", "9.0a", "10.0", "10.0a", "10.1", "10.1a", "12.0", "12.0a",
        ],
    ),
    (
        Release::new(2, 8, 0),
        &[
            "3.5", "3.7", "5.0", "5.2", "5.3", "6.0", "6.1", "6.2", "7.0", "7.2", "7.5", "8.0",
            "8.6", "8.7", "8.9", "9.0", "9.0a", "10.0", "10.0a", "10.1", "10.1a", "10.3", "10.3a",
            "12.0", "12.0a", "12.1", "12.1a",
        ],
    ),
    (
        Release::new(2, 9, 0),
        &[
            "3.5", "3.7", "5.0", "5.2", "5.3", "6.0", "6.1", "6.2", "7.0", "7.2", "7.5", "8.0",
            "8.6", "8.7", "8.9", "9.0", "9.0a", "10.0", "10.0a", "11.0", "11.0a", "10.3", "10.3a",
            "12.0", "12.0a", "12.1", "12.1a",
        ],
    ),
    (
        Release::new(2, 14, 0),
        &[
            "3.5", "3.7", "5.0", "5.2", "5.3", "6.0", "6.1", "6.2", "7.0", "7.2", "7.5", "8.0",
            "8.6", "8.7", "8.9", "9.0", "9.0a", "10.0", "10.0a", "11.0", "11.0a", "10.3", "10.3a",
            "10.7", "10.7a", "12.0", "12.0a", "12.1", "12.1a",
        ],
    ),
];

/// The oldest torch the table covers.
pub const TORCH_OLDEST: Release = TORCH[0].0;

/// The releases where torch's list changes, oldest first.
pub fn torch_releases() -> impl Iterator<Item = Release> {
    TORCH.iter().map(|(r, _)| *r)
}

/// The arch names torch `release` takes in `TORCH_CUDA_ARCH_LIST` (without
/// `+PTX`). A release newer than the table is taken to take what the
/// newest does; one older, what the oldest does but its arch-specific
/// names, which came and went with releases before the table.
pub fn torch_names(release: Release) -> Vec<&'static str> {
    match TORCH.iter().rev().find(|(r, _)| *r <= release) {
        Some((_, names)) => names.to_vec(),
        None => TORCH[0]
            .1
            .iter()
            .copied()
            .filter(|n| !n.ends_with('a'))
            .collect(),
    }
}

/// The SASS that each torch release's own wheels carry, over all of its
/// CUDA builds (x86_64 and aarch64), from the first release with that
/// list: pytorch's `.ci/manywheel/build_cuda.sh`. They carry no PTX a
/// newer major could JIT-compile: on a GPU of a major none of them has,
/// torch's own kernels do not run ("sm_120 is not compatible with the
/// current PyTorch installation", then "no kernel image is available":
/// pytorch/pytorch#150733, #167244), whatever `TORCH_CUDA_ARCH_LIST` says.
const TORCH_WHEELS: &[(Release, &[&str])] = &[
    (
        Release::new(2, 4, 0),
        &["3.7", "5.0", "6.0", "7.0", "7.5", "8.0", "8.6", "9.0"],
    ),
    (
        Release::new(2, 7, 0),
        &[
            "3.7", "5.0", "6.0", "7.0", "7.5", "8.0", "8.6", "9.0", "10.0", "12.0",
        ],
    ),
    (
        Release::new(2, 9, 0),
        &[
            "5.0", "6.0", "7.0", "7.5", "8.0", "8.6", "9.0", "10.0", "11.0", "12.0",
        ],
    ),
];

/// Whether torch `release`'s own kernels run on a GPU that its toolkit
/// calls `cap`: its wheels carry SASS that runs there
/// ([`ComputeCapability::sass_runs_on`]). On an integrated (Tegra) GPU,
/// which runs no desktop SASS, torch is NVIDIA's build for the chip
/// (JetPack's wheels), with the chip's own SASS: a release runs there
/// where it takes the chip's name.
pub fn torch_runs_on(release: Release, cap: ComputeCapability) -> bool {
    if cap.is_tegra() {
        return torch_names(release).contains(&cap.to_string().as_str());
    }
    let Some((_, sass)) = TORCH_WHEELS.iter().rev().find(|(r, _)| *r <= release) else {
        return true;
    };
    sass.iter()
        .filter_map(|n| ComputeCapability::parse_reported(n).ok())
        .any(|s| s.sass_runs_on(cap))
}

/// Which torch releases a Plan's `TORCH_CUDA_ARCH_LIST` must suit: the
/// image's, when known; else, for each GPU, every release of the table
/// whose own kernels run there ([`TorchNames::for_gpu`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TorchNames {
    /// The image's release, if known.
    pub release: Option<Release>,
    names: Vec<&'static str>,
    /// Where not known: the oldest release these suit (later than the
    /// table's oldest for a GPU whose older releases' kernels do not run,
    /// [`TorchNames::for_gpu`]).
    runs_from: Option<Release>,
}

impl TorchNames {
    pub fn of(sw: &Software) -> Self {
        match sw.get(Dist::Torch) {
            Some(r) => Self {
                release: Some(r),
                names: torch_names(r),
                runs_from: None,
            },
            None => Self::every(),
        }
    }

    /// The names every torch of the table takes, whatever the image's is:
    /// what another reader of the list that parses less (DeepSpeed before
    /// 0.16.9) is sure to parse as torch does.
    pub fn every() -> Self {
        Self::common(torch_releases()).unwrap_or_else(|| Self {
            release: None,
            names: Vec::new(),
            runs_from: None,
        })
    }

    /// The names every one of `releases` takes; None for no release.
    fn common(mut releases: impl Iterator<Item = Release>) -> Option<Self> {
        let first = releases.next()?;
        let mut names = torch_names(first);
        for r in releases {
            let theirs = torch_names(r);
            names.retain(|n| theirs.contains(n));
        }
        Some(Self {
            release: None,
            names,
            runs_from: Some(first),
        })
    }

    /// The names for a GPU that toolkits call `named`. Where the image's
    /// torch is not known: those of every release in the table whose own
    /// wheels run on that GPU ([`torch_runs_on`]). A torch whose kernels
    /// cannot run there fails with the variable unset as with it set, so
    /// suiting it would only cost the others their native code: a B200
    /// gets `10.0`, which torch 2.4 and 2.5 reject, and their wheels hold
    /// nothing for sm_100 either.
    pub fn for_gpu(&self, named: ComputeCapability) -> Self {
        if self.release.is_some() {
            return self.clone();
        }
        Self::common(torch_releases().filter(|r| torch_runs_on(*r, named)))
            .unwrap_or_else(|| self.clone())
    }

    /// Whether `cap` (arch-specific with `a`) is a name these take.
    pub fn accepts(&self, cap: ComputeCapability, arch_specific: bool) -> bool {
        let name = if arch_specific {
            format!("{cap}a")
        } else {
            cap.to_string()
        };
        self.names.contains(&name.as_str())
    }

    /// Who these names are for, for notes.
    pub fn who(&self) -> String {
        match self.release {
            Some(r) => format!("torch {r} in the image"),
            None => match self.runs_from {
                Some(r) if r > TORCH_OLDEST => format!(
                    "every torch from {r} (the image's is not known; older ones have no kernels for this GPU)"
                ),
                _ => format!(
                    "every torch from {} (the image's is not known)",
                    TORCH_OLDEST
                ),
            },
        }
    }
}

/// The first DeepSpeed release checked (scripts/consumers, each minor's
/// last patch) whose op builder parses a two-digit major such as `10.0`:
/// 0.12.6 to 0.15.4 index the name's characters and raise.
pub const DEEPSPEED_TWO_DIGIT: Release = Release::new(0, 16, 9);

/// DeepSpeed's ops whose builders keep only some architectures of
/// `TORCH_CUDA_ARCH_LIST` (`filter_ccs` in `op_builder/*.py`): the
/// variable that switches each off in an ahead-of-time build, and the
/// oldest major it keeps. An op left with nothing raises `Unable to load
/// ... no compute capabilities remaining after filtering`, which aborts a
/// `DS_BUILD_OPS=1` install.
pub const DEEPSPEED_OPS: [(EnvVar, u8); 7] = [
    (EnvVar::DsBuildFpQuantizer, 8),
    (EnvVar::DsBuildCutlassOps, 8),
    (EnvVar::DsBuildRaggedDeviceOps, 8),
    (EnvVar::DsBuildEvoformerAttn, 7),
    (EnvVar::DsBuildInferenceCoreOps, 6),
    (EnvVar::DsBuildRaggedOps, 6),
    (EnvVar::DsBuildTransformerInference, 6),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_read_as_packaging_writes_them() {
        let r = |s| Release::parse(s);
        assert_eq!(r("2.9.1+cu128"), Some(Release::new(2, 9, 1)));
        assert_eq!(r("2.8.0a0+5228986c39.nv25.6"), Some(Release::new(2, 8, 0)));
        assert_eq!(r("0.6.7.post3"), Some(Release::new(0, 6, 7)));
        assert_eq!(r("0.0.33.post2"), Some(Release::new(0, 0, 33)));
        assert_eq!(r("2.10"), Some(Release::new(2, 10, 0)));
        assert_eq!(r("2.10rc1"), Some(Release::new(2, 10, 0)));
        for bad in ["", "2", "v2.9", "1!2.0", "x.y", "99999999.1", ".1.2"] {
            assert_eq!(r(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn dist_info_names_give_the_consumer_and_its_release() {
        assert_eq!(
            dist_info("torch-2.9.1+cu128.dist-info"),
            Some((Dist::Torch, Release::new(2, 9, 1)))
        );
        assert_eq!(
            dist_info("flashinfer_python-0.7.1.dist-info"),
            Some((Dist::FlashInfer, Release::new(0, 7, 1)))
        );
        assert_eq!(
            dist_info("Flash_Attn-2.8.3.dist-info"),
            Some((Dist::FlashAttn, Release::new(2, 8, 3)))
        );
        assert_eq!(
            dist_info("deepspeed-0.19.8-py3.12.egg-info"),
            Some((Dist::DeepSpeed, Release::new(0, 19, 8)))
        );
        for other in [
            "numpy-2.1.0.dist-info",
            "torch",
            "torch-2.9.1.dist-info.bak",
            "torchvision-0.24.0.dist-info",
            "torch-.dist-info",
        ] {
            assert_eq!(dist_info(other), None, "{other}");
        }
    }

    #[test]
    fn torch_names_follow_each_release() {
        let has = |r: Release, n: &str| torch_names(r).contains(&n);
        assert!(!has(Release::new(2, 5, 1), "10.0"));
        assert!(has(Release::new(2, 6, 0), "10.0"));
        assert!(has(Release::new(2, 8, 0), "10.1") && !has(Release::new(2, 8, 0), "11.0"));
        assert!(!has(Release::new(2, 9, 1), "10.1") && has(Release::new(2, 9, 1), "11.0"));
        assert!(has(Release::new(2, 15, 0), "10.7"));
        assert!(has(Release::new(3, 0, 0), "10.7"), "newer: as the newest");
        assert!(has(Release::new(2, 1, 0), "9.0") && !has(Release::new(2, 1, 0), "9.0a"));
        // Unknown: what every release takes, so no Blackwell name at all.
        let any = TorchNames::of(&Software::default());
        assert!(any.accepts(ComputeCapability::new(9, 0), true));
        assert!(!any.accepts(ComputeCapability::new(10, 0), false));
        let sw = Software::default().with_env(|k| (k == PYTORCH_VERSION).then(|| "2.7.0a0".into()));
        let t = TorchNames::of(&sw);
        assert!(t.accepts(ComputeCapability::new(10, 1), false));
        assert!(t.who().contains("torch 2.7.0 in the image"), "{}", t.who());
    }

    #[test]
    fn torchs_own_wheels_run_on_blackwell_from_2_7_and_on_thor_from_2_9() {
        let c = ComputeCapability::new;
        let r = Release::new;
        assert!(!torch_runs_on(r(2, 6, 0), c(10, 0)));
        assert!(torch_runs_on(r(2, 7, 1), c(10, 0)));
        assert!(
            torch_runs_on(r(2, 7, 1), c(10, 3)),
            "sm_100 SASS runs on 10.3"
        );
        assert!(torch_runs_on(r(2, 7, 1), c(12, 1)));
        assert!(!torch_runs_on(r(2, 8, 0), c(11, 0)));
        assert!(torch_runs_on(r(2, 9, 1), c(11, 0)));
        assert!(
            torch_runs_on(r(2, 4, 1), c(8, 9)),
            "8.6 SASS runs on an Ada"
        );
        // A Tegra GPU runs no desktop SASS: torch there is NVIDIA's build
        // for the chip, of a release that takes its name.
        assert!(torch_runs_on(r(2, 4, 1), c(8, 7)), "Orin");
        assert!(torch_runs_on(r(2, 7, 1), c(10, 1)), "Thor to CUDA 12");
        assert!(
            !torch_runs_on(r(2, 9, 1), c(10, 1)),
            "2.9 calls Thor 11.0, and sm_100 does not run on it"
        );
        // Not known: per GPU, the releases whose kernels run there.
        let any = TorchNames::of(&Software::default());
        assert!(!any.accepts(c(10, 0), false));
        let b200 = any.for_gpu(c(10, 0));
        assert!(b200.accepts(c(10, 0), false));
        assert!(
            b200.who().contains("every torch from 2.7.0"),
            "{}",
            b200.who()
        );
        assert!(
            !any.for_gpu(c(10, 3)).accepts(c(10, 3), false),
            "2.7 rejects 10.3"
        );
        assert!(any.for_gpu(c(11, 0)).accepts(c(11, 0), false));
        // Known: that release's, whatever its wheels run on.
        let t25 = TorchNames::of(&Software::default().with_env(|_| Some("2.5.1".into())));
        assert!(!t25.for_gpu(c(10, 0)).accepts(c(10, 0), false));
    }

    #[test]
    fn software_serialises_by_distribution_name() {
        let mut sw = Software::default();
        sw.dists.insert(Dist::FlashInfer, Release::new(0, 7, 1));
        sw.read.push("/usr/lib/python3/dist-packages".into());
        let j = serde_json::to_string(&sw).unwrap();
        assert!(j.contains("\"flashinfer-python\":\"0.7.1\""), "{j}");
        assert_eq!(serde_json::from_str::<Software>(&j).unwrap(), sw);
    }
}
