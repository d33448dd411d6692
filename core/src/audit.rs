//! The image audit's record: the CUDA binaries an image carries and the
//! GPU code in each, as `gpuarchctl audit` prints it and gpuarchd keeps it
//! per image. Judging it needs no inspector, only [`crate::arch`]: the
//! hook reads a kept audit and notes what an assigned GPU cannot run.

use serde::{Deserialize, Serialize};

use crate::arch::{ComputeCapability, CudaVersion, Placement, Target, placement};

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

/// What a GPU of `cap` cannot run of `audit`, one line each, naming the
/// file, its owner and the GPU (`gpu`, as the caller shows it), and the
/// list to rebuild with (`archs`: every assigned GPU's capability).
/// Binaries that run only by PTX JIT get a line too, saying so.
pub fn findings(
    audit: &ImageAudit,
    gpu: &str,
    cap: ComputeCapability,
    driver: Option<CudaVersion>,
    archs: &str,
) -> (Vec<String>, Vec<String>) {
    let mut cannot = Vec::new();
    let mut jit = Vec::new();
    for b in &audit.binaries {
        match b.placement(cap, driver) {
            Placement::Sass(_) => {}
            Placement::Jit(t) => jit.push(format!(
                "{} {:?} carries no SASS for {gpu}: it runs by PTX JIT from {t}, compiled by the driver at its first load (seconds to minutes for a large library; CUDA_CACHE_PATH keeps it)",
                b.owner, b.path
            )),
            Placement::No(_) => cannot.push(format!(
                "{} {:?} carries only {}: {gpu} cannot run it; rebuild with TORCH_CUDA_ARCH_LIST=\"{archs}\"",
                b.owner,
                b.path,
                b.code.join(", ")
            )),
        }
    }
    (cannot, jit)
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
        let (no, jit) = findings(&a, "GPU 0", ComputeCapability::new(7, 5), None, "7.5;8.6");
        assert!(no.is_empty() && jit.is_empty(), "{no:?} {jit:?}");
        let (no, _) = findings(
            &a,
            "GPU 1 (RTX 3090, 8.6)",
            ComputeCapability::new(8, 6),
            None,
            "7.5;8.6",
        );
        assert_eq!(
            no,
            [
                "xformers 0.0.29 \"/usr/local/lib/python3.12/dist-packages/xformers/_C.so\" carries only sm_75: GPU 1 (RTX 3090, 8.6) cannot run it; rebuild with TORCH_CUDA_ARCH_LIST=\"7.5;8.6\""
            ]
        );
    }

    #[test]
    fn ptx_alone_is_a_jit_finding_and_an_unknown_target_is_left_out() {
        let mut a = xformers_sm75();
        a.binaries[0].code = vec!["compute_80".into(), "sm_999".into()];
        let (no, jit) = findings(&a, "GPU 0", ComputeCapability::new(9, 0), None, "9.0");
        assert!(no.is_empty(), "{no:?}");
        assert_eq!(jit.len(), 1);
        assert!(jit[0].contains("PTX JIT from compute_80"), "{}", jit[0]);
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
