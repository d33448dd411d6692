//! The image audit's record: the CUDA binaries an image carries and the
//! GPU code in each, as `gpuarchctl audit` prints it and gpuarchd keeps it
//! per image. Judging it needs no inspector, only [`crate::arch`]: the
//! hook reads a kept audit and notes what an assigned GPU cannot run.

use serde::{Deserialize, Serialize};

use crate::arch::{ComputeCapability, CudaVersion, Placement, Specificity, Target, placement};

/// The record's format; a reader skips another.
pub const SCHEMA: u32 = 1;

/// One audited image (or directory).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageAudit {
    pub schema: u32,
    /// The binaries holding GPU code, in the order found.
    pub binaries: Vec<Binary>,
    /// Where it looked: the Python environments' sites, the library path
    /// and cache directories that were there.
    pub read: Vec<String>,
    /// What it could not read, and why (an environment, a file).
    pub unread: Vec<String>,
    /// Why it stopped before the end (a bound), if it did: the binaries
    /// listed are then some of the image's, not all.
    pub stopped: Option<String>,
    /// The names the engine gave the image at the start that asked for
    /// this audit (CRI's image reference and name), for a scheduler's
    /// question by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<String>,
    /// Candidate files opened, bytes of them mapped, and how long it took.
    pub files: u64,
    pub bytes: u64,
    pub millis: u64,
}

/// How the audit names the owner of a binary found in a directory of the
/// library path: this, then the directory (`library path /usr/lib`).
pub const LIBRARY_PATH_OWNER: &str = "library path ";
/// The owners of binaries found in kernel caches: Hugging Face's hub
/// cache, its `kernels` cache, FlashInfer's cubin cache.
pub const CACHE_OWNERS: [&str; 3] = [
    "Hugging Face hub cache",
    "Hugging Face kernels cache",
    "FlashInfer cubin cache",
];

/// A file with GPU code.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binary {
    /// Its path inside the image.
    pub path: String,
    /// What installed it: a distribution (`xformers 0.0.29`), or where it
    /// was found (`library path /usr/local/cuda/lib64`).
    pub owner: String,
    pub size: u64,
    /// The SASS and PTX it carries, each target once (`sm_75`,
    /// `compute_80`).
    pub code: Vec<String>,
}

impl Binary {
    /// The targets, those this build does not know left out.
    pub fn targets(&self) -> Vec<Target> {
        self.code
            .iter()
            .filter_map(|t| Target::parse(t).ok())
            .collect()
    }

    /// Whether a Python distribution installed it (its owner is `Name
    /// Version`), rather than a directory holding many makers' files (the
    /// library path, a kernel cache).
    pub fn of_distribution(&self) -> bool {
        !self.owner.starts_with(LIBRARY_PATH_OWNER) && !CACHE_OWNERS.contains(&self.owner.as_str())
    }

    /// Where it runs on a GPU of `cap`.
    pub fn placement(&self, cap: ComputeCapability, driver: Option<CudaVersion>) -> Placement {
        placement(self.targets(), cap, driver)
    }
}

/// A file name that may hold GPU code: a shared library, a cubin, a
/// fatbin, PTX.
pub fn candidate(name: &str) -> bool {
    name.ends_with(".so")
        || name.contains(".so.")
        || name.ends_with(".cubin")
        || name.ends_with(".fatbin")
        || name.ends_with(".ptx")
}

/// The `TORCH_CUDA_ARCH_LIST` a rebuild for GPUs of `caps` takes: each
/// capability once, in order, `;`-separated (`7.5;8.6`).
pub fn rebuild_list(caps: impl IntoIterator<Item = ComputeCapability>) -> String {
    let caps: std::collections::BTreeSet<ComputeCapability> = caps.into_iter().collect();
    caps.iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(";")
}

/// Whether `b`, of which a GPU of `cap` runs nothing, is built only for
/// other GPUs than `cap`, as packages build a backend they choose by the
/// GPU's capability (xformers' FlashAttention-3 from 8.0, vLLM's Hopper
/// and SM100 kernels, bitsandbytes' library per CUDA runtime): its
/// distribution has another binary that runs on `cap` (the package is
/// built for this GPU; `widest` is its one with the most targets),
/// and `b` is
/// - built for newer GPUs alone: each target newer than `cap`, or for one
///   architecture or family (`sm_90a`, `sm_100f`); or
/// - built for fewer GPUs than that binary: its targets are some of
///   that one's. A build narrows one library's list only for a backend.
///
/// Code built for older GPUs alone beside nothing that covers `cap` (the
/// seed case: an xformers whose `_C.so` carries only `sm_75`, on an 8.6)
/// is neither, nor is a distribution none of whose code runs on `cap`.
/// Targets alone cannot tell a gated backend from a library launched on
/// any GPU: torch 2.12's `libtorch_cuda_linalg.so` (sm_80 and up, beside
/// a `libtorch_cuda.so` with sm_75) looks like a backend, and nothing we
/// know of gates it. So such code is said, never refused: a refusal is
/// for what fails for certain.
fn for_other_gpus(widest: Option<&Binary>, b: &Binary, cap: ComputeCapability) -> bool {
    let targets = b.targets();
    let Some(o) = widest else {
        return false;
    };
    if targets.is_empty() || o.path == b.path {
        return false;
    }
    let newer = targets
        .iter()
        .all(|t| t.cap > cap || t.spec != Specificity::Generic);
    newer || (o.code.len() > b.code.len() && b.code.iter().all(|c| o.code.contains(c)))
}

/// Where a binary runs on one GPU, code built only for other GPUs
/// (`for_other_gpus`) apart, as it fails nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Judged {
    Is(Placement),
    Other,
}

impl Judged {
    /// The verdict as `gpuarchctl audit --json` names it.
    pub fn runs(&self) -> &'static str {
        match self {
            Judged::Is(Placement::Sass(_)) => "sass",
            Judged::Is(Placement::Jit(_)) => "jit",
            Judged::Is(Placement::No(_)) => "no",
            Judged::Other => "other_gpus",
        }
    }
}

impl std::fmt::Display for Judged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Judged::Is(p) => p.fmt(f),
            Judged::Other => f.write_str(
                "built only for other GPUs (each target newer or for one architecture, or fewer than the package's own): a backend packages launch only where it runs; launched here anyway, it fails",
            ),
        }
    }
}

/// Where each binary of `audit` runs on a GPU of `cap`, in order. Each
/// placement is worked out once, and each distribution's widest binary
/// that runs found in the same pass, so that judging an image costs in
/// proportion to its binaries, however many a hostile one lists.
pub fn verdicts(
    audit: &ImageAudit,
    cap: ComputeCapability,
    driver: Option<CudaVersion>,
) -> Vec<Judged> {
    let placed: Vec<Placement> = audit
        .binaries
        .iter()
        .map(|b| b.placement(cap, driver))
        .collect();
    let mut widest: std::collections::HashMap<&str, &Binary> = std::collections::HashMap::new();
    for (b, p) in audit.binaries.iter().zip(&placed) {
        if !b.of_distribution() || matches!(p, Placement::No(_)) {
            continue;
        }
        let e = widest.entry(b.owner.as_str()).or_insert(b);
        if b.code.len() > e.code.len() {
            *e = b;
        }
    }
    audit
        .binaries
        .iter()
        .zip(placed)
        .map(|(b, p)| match p {
            Placement::No(_) if for_other_gpus(widest.get(b.owner.as_str()).copied(), b, cap) => {
                Judged::Other
            }
            p => Judged::Is(p),
        })
        .collect()
}

/// What of an image a GPU does not run from SASS, one line per binary.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Findings {
    /// Binaries it cannot run that were meant for it: the start fails
    /// where the package launches one.
    pub cannot: Vec<String>,
    /// Binaries it runs only by PTX JIT.
    pub jit: Vec<String>,
    /// Binaries built only for other GPUs (`for_other_gpus`), which a
    /// package that gates them never launches on it: said, never a
    /// refusal.
    pub other: Vec<String>,
}

/// What a GPU of `cap` cannot run of `audit`, one line each, naming the
/// file, its owner and the GPU (`gpu`, as the caller shows it), and the
/// list to rebuild with (`archs`: every assigned GPU's capability).
/// Binaries that run only by PTX JIT, and those built only for other
/// GPUs, get a line too, saying so.
pub fn findings(
    audit: &ImageAudit,
    gpu: &str,
    cap: ComputeCapability,
    driver: Option<CudaVersion>,
    archs: &str,
) -> Findings {
    let mut f = Findings::default();
    for (b, judged) in audit.binaries.iter().zip(verdicts(audit, cap, driver)) {
        match judged {
            Judged::Is(Placement::Sass(_)) => {}
            Judged::Is(Placement::Jit(t)) => f.jit.push(format!(
                "{} {:?} carries no SASS for {gpu}: it runs by PTX JIT from {t}, compiled by the driver at its first load (seconds to minutes for a large library; CUDA_CACHE_PATH keeps it)",
                b.owner, b.path
            )),
            Judged::Other => f.other.push(format!(
                "{} {:?} carries only {}, built for other GPUs than {gpu} (each target newer or for one architecture, or fewer than the package's own): packages ship such code as a backend they launch only where it runs (xformers' FlashAttention-3, vLLM's Hopper and SM100 kernels); launched on {gpu} anyway, it fails. Not refused",
                b.owner,
                b.path,
                b.code.join(", ")
            )),
            Judged::Is(Placement::No(_)) => f.cannot.push(format!(
                "{} {:?} carries only {}: {gpu} cannot run it; rebuild with TORCH_CUDA_ARCH_LIST=\"{archs}\"",
                b.owner,
                b.path,
                b.code.join(", ")
            )),
        }
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xformers_sm75() -> ImageAudit {
        ImageAudit {
            schema: SCHEMA,
            binaries: vec![Binary {
                path: "/usr/local/lib/python3.12/dist-packages/xformers/_C.so".into(),
                owner: "xformers 0.0.29".into(),
                size: 1 << 20,
                code: vec!["sm_75".into()],
            }],
            ..Default::default()
        }
    }

    #[test]
    fn an_sm75_only_library_runs_on_the_2080ti_and_not_on_the_3090() {
        let a = xformers_sm75();
        let f = findings(&a, "GPU 0", ComputeCapability::new(7, 5), None, "7.5;8.6");
        assert_eq!(f, Findings::default());
        let f = findings(
            &a,
            "GPU 1 (RTX 3090, 8.6)",
            ComputeCapability::new(8, 6),
            None,
            "7.5;8.6",
        );
        assert!(f.other.is_empty(), "{f:?}");
        assert_eq!(
            f.cannot,
            [
                "xformers 0.0.29 \"/usr/local/lib/python3.12/dist-packages/xformers/_C.so\" carries only sm_75: GPU 1 (RTX 3090, 8.6) cannot run it; rebuild with TORCH_CUDA_ARCH_LIST=\"7.5;8.6\""
            ]
        );
    }

    #[test]
    fn ptx_alone_is_a_jit_finding_and_an_unknown_target_is_left_out() {
        let mut a = xformers_sm75();
        a.binaries[0].code = vec!["compute_80".into(), "sm_999".into()];
        let f = findings(&a, "GPU 0", ComputeCapability::new(9, 0), None, "9.0");
        assert!(f.cannot.is_empty() && f.other.is_empty(), "{f:?}");
        assert_eq!(f.jit.len(), 1);
        assert!(f.jit[0].contains("PTX JIT from compute_80"), "{}", f.jit[0]);
    }

    /// xformers 0.0.34's FlashAttention-3 library and vLLM 0.33's
    /// narrower libraries (their targets as cuobjdump lists them), against
    /// libraries built without the GPU.
    #[test]
    fn code_only_for_other_gpus_is_said_apart_from_code_that_fails() {
        let bin = |path: &str, owner: &str, code: &[&str]| Binary {
            path: path.into(),
            owner: owner.into(),
            size: 1,
            code: code.iter().map(|c| (*c).to_owned()).collect(),
        };
        let cc = ComputeCapability::new;
        let counts = |a: &ImageAudit, cap| {
            let f = findings(a, "GPU 0", cap, None, "x");
            (f.cannot.len(), f.other.len())
        };
        let x = "xformers 0.0.34";
        let main = bin("/x/_C.so", x, &["compute_80", "sm_75", "sm_80", "sm_90a"]);
        let fa3 = bin("/x/fa3/_C.so", x, &["compute_80", "sm_80", "sm_90a"]);
        let xformers = ImageAudit {
            binaries: vec![main, fa3.clone()],
            ..Default::default()
        };
        // The 2080 Ti runs xformers' own library, and never launches its
        // FlashAttention-3 (xformers asks for 8.0 first).
        assert_eq!(counts(&xformers, cc(7, 5)), (0, 1));
        let f = findings(&xformers, "GPU 0", cc(7, 5), None, "7.5");
        assert!(
            f.other[0].contains("built for other GPUs than GPU 0"),
            "{f:?}"
        );
        // Alone, a package none of whose code runs here is not usable here.
        let alone = ImageAudit {
            binaries: vec![fa3],
            ..Default::default()
        };
        assert_eq!(counts(&alone, cc(7, 5)), (1, 0));
        // vLLM 0.33 on a 12.0 and an 8.0: its SM100 and Hopper libraries
        // are narrower than its main one, or for newer GPUs; the same code
        // in the library path, or in a distribution of its own, is not.
        let v = "vllm 0.33.0";
        let vllm = |extra: Vec<Binary>| {
            let mut b = vec![
                bin(
                    "/v/_C.so",
                    v,
                    &[
                        "compute_90",
                        "sm_100",
                        "sm_120",
                        "sm_75",
                        "sm_80",
                        "sm_90",
                        "sm_90a",
                    ],
                ),
                bin("/v/_deepselect_C.so", v, &["sm_100"]),
                bin("/v/_flashmla_C.so", v, &["sm_100", "sm_90a"]),
                bin("/v/_vllm_fa3_C.so", v, &["sm_90a"]),
            ];
            b.extend(extra);
            ImageAudit {
                binaries: b,
                ..Default::default()
            }
        };
        assert_eq!(counts(&vllm(vec![]), cc(12, 0)), (0, 3));
        assert_eq!(counts(&vllm(vec![]), cc(8, 0)), (0, 3));
        let a = vllm(vec![
            bin("/usr/lib/libk.so", "library path /usr/lib", &["sm_100"]),
            bin("/d/k.so", "deepgemm 2.0", &["sm_100"]),
        ]);
        let f = findings(&a, "GPU 0", cc(12, 0), None, "12.0");
        assert_eq!((f.cannot.len(), f.other.len()), (2, 3), "{f:?}");
        assert!(f.cannot[0].starts_with("library path /usr/lib"), "{f:?}");
        assert!(f.cannot[1].starts_with("deepgemm 2.0"), "{f:?}");
        // A Volta (7.0): vLLM 0.33 has no build for it, nothing runs.
        assert_eq!(counts(&vllm(vec![]), cc(7, 0)), (4, 0));
        // The seed case beside a FlashAttention-3 the 3090 runs: its
        // sm_75-only `_C.so` is built for an older GPU, no subset of it,
        // and fails.
        let seed = ImageAudit {
            binaries: vec![
                bin("/x/_C.so", "xformers 0.0.29", &["sm_75"]),
                bin(
                    "/x/fa3/_C.so",
                    "xformers 0.0.29",
                    &["compute_80", "sm_80", "sm_90a"],
                ),
            ],
            ..Default::default()
        };
        assert_eq!(counts(&seed, cc(8, 6)), (1, 0));
    }

    /// A hostile image listing 80,000 binaries of one distribution (what
    /// 8 MiB of kept audit holds), half of them runnable: judged in one
    /// pass per GPU, not one per pair.
    #[test]
    fn judging_many_binaries_costs_in_proportion_to_them() {
        let binaries = (0..80_000)
            .map(|i| Binary {
                path: format!("/p/{i}.so"),
                owner: "p 1".into(),
                size: 1,
                code: vec![if i % 2 == 0 { "sm_75" } else { "sm_86" }.into()],
            })
            .collect();
        let a = ImageAudit {
            binaries,
            ..Default::default()
        };
        let t = std::time::Instant::now();
        let f = findings(&a, "GPU 0", ComputeCapability::new(7, 5), None, "7.5");
        assert_eq!((f.cannot.len(), f.other.len()), (0, 40_000));
        assert!(
            t.elapsed() < std::time::Duration::from_secs(5),
            "{:?}",
            t.elapsed()
        );
    }

    #[test]
    fn the_rebuild_list_names_each_capability_once_in_order() {
        let caps = [(8, 6), (7, 5), (8, 6)].map(|(a, b)| ComputeCapability::new(a, b));
        assert_eq!(rebuild_list(caps), "7.5;8.6");
    }

    #[test]
    fn candidates_are_libraries_cubins_fatbins_and_ptx() {
        for n in [
            "_C.so",
            "libcublas.so.13.1.0.3",
            "k.cubin",
            "k.fatbin",
            "k.ptx",
        ] {
            assert!(candidate(n), "{n}");
        }
        for n in ["METADATA", "x.py", "libfoo.a", "sonar.txt"] {
            assert!(!candidate(n), "{n}");
        }
    }
}
