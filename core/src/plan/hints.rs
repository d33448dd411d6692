//! The values of the consumers' variables for a container's GPUs:
//! `TORCH_CUDA_ARCH_LIST` and the other arch lists, built for the image's
//! toolkit and for the releases of each consumer it holds (xformers,
//! flash-attn, DeepSpeed); the dtype and attention hints; and the notes
//! that say why.

use std::collections::BTreeSet;

use crate::arch::{ComputeCapability, CudaVersion};
use crate::features::Feature;
use crate::oci::ContainerView;
use crate::select::AssignedGpu;
use crate::software::{self, Dist, Software, TorchNames};
use crate::toolkit::{self, Toolkit};

use super::EnvVar;

/// The hints for GPUs of these capabilities, given in CUDA order, for an
/// image nothing is known of.
pub fn hints(caps: &[ComputeCapability]) -> Vec<(EnvVar, String)> {
    hints_for(caps, None, &Software::default()).0
}

/// One entry of `TORCH_CUDA_ARCH_LIST`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct TorchEntry {
    cap: ComputeCapability,
    /// `9.0a`: arch-specific SASS.
    arch_specific: bool,
    /// `+PTX` too.
    ptx: bool,
}

impl std::fmt::Display for TorchEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.cap)?;
        if self.arch_specific {
            f.write_str("a")?;
        }
        if self.ptx {
            f.write_str("+PTX")?;
        }
        Ok(())
    }
}

/// The arch lists' entries, for toolkit `tk` (when known) and the
/// consumers of `sw`.
///
/// For torch, per GPU the best target that the toolkit builds, that runs
/// there and that every torch the image may hold names
/// ([`toolkit::best_where`]); `9.0a` for a Hopper where xformers (whose
/// FlashAttention 3 needs it) is present and DeepSpeed (whose parser
/// rejects it) is not.
///
/// For FlashInfer, the GPU's own architecture with the suffix FlashInfer's
/// newest release gives it (`a` from 9.0, `f` for 12.0 under CUDA 12.9 on),
/// written out: releases before 0.6.7 use the list verbatim, and those
/// from it take a written suffix as it is and would otherwise raise at
/// import for 12.x under a CUDA older than 12.9. Arch-specific code runs on
/// its own architecture only, so a GPU the toolkit does not build exactly
/// is left out.
///
/// Each entry that is not the GPU's own capability has a note. The torch
/// list is None where it is left unset on purpose ([`xformers_hopper`]).
fn arch_lists(
    distinct: &BTreeSet<ComputeCapability>,
    tk: Option<&Toolkit>,
    sw: &Software,
    notes: &mut Vec<String>,
) -> (Option<Vec<TorchEntry>>, Vec<String>) {
    let torch_names = TorchNames::of(sw);
    let builds = |c: ComputeCapability| tk.is_none_or(|t| toolkit::accepts(t.version, c));
    let from = tk.map(|t| format!("CUDA {} ({})", t.version, t.source));
    let mut torch: Vec<TorchEntry> = Vec::new();
    let mut flashinfer = Vec::new();
    let native_ok = deepspeed_parses_two_digits(sw);
    // The notes of the torch list, said only where it is set; and why it
    // is not, where a DeepSpeed would cost a GPU its native code.
    let mut torch_notes = Vec::new();
    let mut costs_native: Option<String> = None;
    for &cap in distinct {
        let named = tk.map_or(cap, |t| toolkit::alias(cap, t.version));
        if let Some(from) = &from
            && named != cap
        {
            notes.push(format!(
                "{from} names the architecture of {cap} sm_{}",
                named.digits()
            ));
        }
        let entry = |cap, ptx| TorchEntry {
            cap,
            arch_specific: false,
            ptx,
        };
        // The names the list may use for this GPU: where a DeepSpeed that
        // parses less than torch may be there, only those every torch
        // takes, whichever torch the image holds.
        let pick =
            |n: &TorchNames| toolkit::best_where(cap, named, |c| builds(c) && n.accepts(c, false));
        let (torch_names, taker) = if native_ok {
            let names = torch_names.for_gpu(named);
            let who = names.who();
            (names, who)
        } else {
            let safe = TorchNames::every();
            // What torch itself would take here: where that is newer code
            // than a name the DeepSpeed parses, no list serves both, and
            // unset serves both (torch builds the GPUs it sees).
            if costs_native.is_none()
                && let Some(own) = sass(pick(&torch_names.for_gpu(named)))
                && sass(pick(&safe)).is_none_or(|s| s < own)
            {
                costs_native = Some(format!(
                    "TORCH_CUDA_ARCH_LIST not set: a DeepSpeed may be in the image (its absence is not proven, or its release is before {}), whose op builder cannot parse {own}, torch's SASS for {cap}; a list it parses would give {cap} older code than torch builds unset. Unset, torch builds the GPUs it sees and DeepSpeed its own default",
                    software::DEEPSPEED_TWO_DIGIT
                ));
            }
            if named.major >= 10 {
                torch_notes.push(format!(
                    "TORCH_CUDA_ARCH_LIST does not name {named}: a DeepSpeed may be in the image (its absence is not proven, or its release is before {}), and those releases' op builder cannot parse a two-digit major",
                    software::DEEPSPEED_TWO_DIGIT
                ));
            }
            let who = match torch_names.release {
                Some(_) => "a DeepSpeed that may be in the image".to_owned(),
                None => torch_names.who(),
            };
            (safe, who)
        };
        // Why the torch entry is not the GPU's own name.
        let why = match (&from, builds(named)) {
            (Some(from), false) => format!("{from} cannot build sm_{}", named.digits()),
            _ => format!("{taker} does not take {named}"),
        };
        match pick(&torch_names) {
            toolkit::Build::Exact(c) => torch.push(entry(c, false)),
            toolkit::Build::Family(c) => {
                torch.push(entry(c, false));
                torch_notes.push(format!(
                    "{why}: TORCH_CUDA_ARCH_LIST has {c} for {cap} (its SASS runs there)"
                ));
            }
            toolkit::Build::Ptx(c) => {
                torch.push(entry(c, true));
                torch_notes.push(format!(
                    "{why}: TORCH_CUDA_ARCH_LIST has {c}+PTX for {cap}, which the driver JIT-compiles there"
                ));
            }
            toolkit::Build::None => torch_notes.push(format!(
                "{why}, and nothing that runs on {cap} is both built and taken: TORCH_CUDA_ARCH_LIST leaves it out"
            )),
        }
        if builds(named) {
            flashinfer.push((
                named,
                match (named.major, named.minor) {
                    (0..=8, _) => named.to_string(),
                    (12, 0) if tk.is_some_and(|t| t.version >= CudaVersion::new(12, 9)) => {
                        "12.0f".to_owned()
                    }
                    _ => format!("{named}a"),
                },
            ));
        } else if let Some(from) = &from {
            notes.push(format!(
                "{from} cannot build sm_{}a: FLASHINFER_CUDA_ARCH_LIST leaves {cap} out (FlashInfer builds arch-specific code, which runs only on its own architecture)",
                named.digits()
            ));
        }
    }
    if let Some(why) = costs_native {
        notes.push(why);
        let flashinfer = flashinfer.into_iter().map(|(_, e)| e).collect();
        return (None, flashinfer);
    }
    notes.append(&mut torch_notes);
    let unset = xformers_hopper(&mut torch, tk, sw, &torch_names, notes);
    torch.sort();
    torch.dedup_by(|b, a| {
        let same = a.cap == b.cap && a.arch_specific == b.arch_specific;
        if same {
            a.ptx |= b.ptx;
        }
        same
    });
    flashinfer.sort();
    flashinfer.dedup();
    let flashinfer = flashinfer.into_iter().map(|(_, e)| e).collect();
    ((!unset).then_some(torch), flashinfer)
}

/// The SASS a build choice gives a GPU (its own, or its family's); None
/// for PTX or nothing.
fn sass(b: toolkit::Build) -> Option<ComputeCapability> {
    match b {
        toolkit::Build::Exact(c) | toolkit::Build::Family(c) => Some(c),
        toolkit::Build::Ptx(_) | toolkit::Build::None => None,
    }
}

/// Whether every DeepSpeed the image may hold parses a two-digit major
/// (`10.0`) in `TORCH_CUDA_ARCH_LIST`: none is there, or the one there is
/// new enough and every environment was read (one not read may hold
/// another). Releases 0.12 to 0.15 read `10.0` as major `1`, minor `.`,
/// and an ahead-of-time build raises, where unset it builds.
fn deepspeed_parses_two_digits(sw: &Software) -> bool {
    match sw.get(Dist::DeepSpeed) {
        Some(r) => r >= software::DEEPSPEED_TWO_DIGIT && sw.absence_proven(),
        None => !sw.may_have(Dist::DeepSpeed),
    }
}

/// xformers builds its FlashAttention 3 kernels with wgmma only for `9.0a`
/// in `TORCH_CUDA_ARCH_LIST` (else those paths compile to a trap), and
/// DeepSpeed's op builder raises on that name (`int('0a')`): a Hopper's
/// `9.0` becomes `9.0a` where xformers is in the image and DeepSpeed is
/// not. Where a DeepSpeed is there too, or may be, no list serves both,
/// and unset serves both (xformers' own default has `9.0a`, DeepSpeed's
/// the GPUs it sees): true, the list is to be left unset. The note says
/// which way it went.
fn xformers_hopper(
    torch: &mut [TorchEntry],
    tk: Option<&Toolkit>,
    sw: &Software,
    torch_names: &TorchNames,
    notes: &mut Vec<String>,
) -> bool {
    let hopper = ComputeCapability::new(9, 0);
    if !torch.iter().any(|e| e.cap == hopper && !e.ptx) {
        return false;
    }
    // Before CUDA 12.0 there is no sm_90a, and xformers builds no
    // FlashAttention 3: plain 9.0 costs it nothing.
    if tk.is_some_and(|t| t.version < CudaVersion::new(12, 0)) {
        return false;
    }
    // An xformers not known is one that may be there: its own default
    // builds 9.0a all the same.
    let x = match sw.get(Dist::Xformers) {
        Some(x) => format!("xformers {x}"),
        None if sw.may_have(Dist::Xformers) => "an xformers, which may be in the image,".to_owned(),
        None => return false,
    };
    let deepspeed = match sw.get(Dist::DeepSpeed) {
        Some(ds) => Some(format!("DeepSpeed {ds} in the image rejects 9.0a")),
        None if sw.may_have(Dist::DeepSpeed) => Some(
            "not every environment of the image was read, so a DeepSpeed (which rejects 9.0a) may be there".to_owned(),
        ),
        None => None,
    };
    if let Some(why) = deepspeed {
        notes.push(format!(
            "TORCH_CUDA_ARCH_LIST not set: {why}, and {x} built with 9.0 would trap in its FlashAttention 3 paths on {hopper}; unset, each builds its own default (xformers 9.0a, DeepSpeed and torch the GPUs they see)"
        ));
        return true;
    }
    if !torch_names.accepts(hopper, true) {
        return false;
    }
    for e in torch.iter_mut().filter(|e| e.cap == hopper && !e.ptx) {
        e.arch_specific = true;
    }
    notes.push(format!(
        "TORCH_CUDA_ARCH_LIST has 9.0a: {x} in the image builds FlashAttention 3 with wgmma only for it, and no DeepSpeed is there to reject it"
    ));
    false
}

/// What flash-attn's build compiles for, each with the first CUDA it does
/// so under: its setup.py knows exactly these entries of
/// `FLASH_ATTN_CUDA_ARCHS` (`"86"` is ignored) and skips one the toolkit is
/// too old for.
const FLASH_ATTN_ARCHS: [(ComputeCapability, Option<(u16, u16)>); 4] = [
    (ComputeCapability::new(8, 0), None),
    (ComputeCapability::new(9, 0), Some((11, 8))),
    (ComputeCapability::new(10, 0), Some((12, 8))),
    (ComputeCapability::new(12, 0), Some((12, 8))),
];

/// The entry of [`FLASH_ATTN_ARCHS`] whose SASS runs on a GPU of `cap`
/// ([`ComputeCapability::sass_runs_on`]): none on an integrated (Tegra)
/// GPU, whose own SASS flash-attn does not build.
fn flash_attn_fit(cap: ComputeCapability) -> Option<(ComputeCapability, Option<(u16, u16)>)> {
    FLASH_ATTN_ARCHS
        .iter()
        .filter(|(a, _)| a.sass_runs_on(cap))
        .max_by_key(|(a, _)| *a)
        .copied()
}

/// Whether FlashAttention-2 would run on every GPU but the image's
/// environments, all read, hold no flash-attn to run it.
fn flash_attn_missing(caps: &[ComputeCapability], sw: &Software) -> bool {
    flash_attention_2_runs(caps) && sw.lacks(Dist::FlashAttn)
}

/// Whether FlashAttention-2 runs on every GPU: the capability it needs,
/// and a flash-attn build that runs there.
fn flash_attention_2_runs(caps: &[ComputeCapability]) -> bool {
    Feature::FlashAttention2.supported_on_all(caps)
        && caps.iter().all(|c| flash_attn_fit(*c).is_some())
}

/// `FLASH_ATTN_CUDA_ARCHS` (flash-attn's build; `80;90`): per GPU the one
/// of [`FLASH_ATTN_ARCHS`] whose SASS runs there ([`flash_attn_fit`]),
/// which toolkit `tk` (when known) builds. None, with a note, when a GPU
/// has none: below 8.0 FlashAttention-2 does not run at all, and
/// flash-attn's default (all four) is left to say so.
fn flash_attn_archs(
    distinct: &BTreeSet<ComputeCapability>,
    tk: Option<&Toolkit>,
    notes: &mut Vec<String>,
) -> Option<String> {
    let var = EnvVar::FlashAttnCudaArchs;
    let mut picked = BTreeSet::new();
    for &cap in distinct {
        if !Feature::FlashAttention2.supported_on(cap) {
            notes.push(format!(
                "{var} not set: FlashAttention-2 needs 8.0, and {cap} is below it"
            ));
            return None;
        }
        match (flash_attn_fit(cap), tk) {
            (None, _) => {
                notes.push(format!(
                    "{var} not set: flash-attn builds sm_80, sm_90, sm_100 and sm_120 only, and none runs on {cap}{}",
                    if cap.is_tegra() {
                        " (an integrated Tegra GPU: desktop SASS does not run there)"
                    } else {
                        ""
                    }
                ));
                return None;
            }
            (Some((a, Some((ma, mi)))), Some(tk)) if tk.version < CudaVersion::new(ma, mi) => {
                notes.push(format!(
                    "{var} not set: flash-attn builds sm_{} for {cap} only with CUDA {ma}.{mi} or newer, and the container's is {}",
                    a.digits(),
                    tk.version
                ));
                return None;
            }
            (Some((a, _)), _) => {
                picked.insert(a);
            }
        }
    }
    Some(
        picked
            .iter()
            .map(|a| a.digits())
            .collect::<Vec<_>>()
            .join(";"),
    )
}

/// `DS_BUILD_<OP>=0` for each DeepSpeed op whose builder keeps none of the
/// torch list's architectures ([`software::DEEPSPEED_OPS`]), where
/// DeepSpeed is or may be in the image: that op would abort an
/// ahead-of-time build, and it cannot run on these GPUs anyway.
fn deepspeed_ops(
    torch: &[TorchEntry],
    sw: &Software,
    notes: &mut Vec<String>,
) -> Vec<(EnvVar, String)> {
    let Some(top) = torch.iter().map(|e| e.cap.major).max() else {
        return Vec::new();
    };
    if !sw.may_have(Dist::DeepSpeed) {
        return Vec::new();
    }
    software::DEEPSPEED_OPS
        .into_iter()
        .filter(|(_, min)| top < *min)
        .map(|(var, min)| {
            notes.push(format!(
                "{var}=0: that DeepSpeed op builds for {min}.0 and newer only, and no assigned GPU is (it would abort an ahead-of-time build)"
            ));
            (var, "0".to_owned())
        })
        .collect()
}

/// [`hints`], the arch lists built for toolkit `tk` when it is known and
/// for the consumers of `sw`, and the notes that explain them. A list with
/// no entry left is not set.
pub fn hints_for(
    caps: &[ComputeCapability],
    tk: Option<&Toolkit>,
    sw: &Software,
) -> (Vec<(EnvVar, String)>, Vec<String>) {
    let mut notes = Vec::new();
    if caps.is_empty() {
        return (Vec::new(), notes);
    }
    let distinct: BTreeSet<ComputeCapability> = caps.iter().copied().collect();
    let join = |it: &mut dyn Iterator<Item = &ComputeCapability>, sep: &str| {
        it.map(ComputeCapability::to_string)
            .collect::<Vec<_>>()
            .join(sep)
    };
    if let Some(tk) = tk.filter(|tk| tk.version < toolkit::OLDEST) {
        notes.push(format!(
            "CUDA {} ({}) is older than gpuarch's table of toolkits (CUDA {} on): the arch lists are built as for an unknown toolkit",
            tk.version,
            tk.source,
            toolkit::OLDEST
        ));
    }
    let tk = tk.filter(|tk| tk.version >= toolkit::OLDEST);
    let (torch, flashinfer) = arch_lists(&distinct, tk, sw, &mut notes);
    // Left unset on purpose (xformers beside DeepSpeed): said already.
    let torch_unset = torch.is_none();
    let torch = torch.unwrap_or_default();
    for (var, empty) in [
        (EnvVar::TorchCudaArchList, torch.is_empty() && !torch_unset),
        (EnvVar::FlashinferCudaArchList, flashinfer.is_empty()),
    ] {
        if empty {
            notes.push(format!(
                "{var} not set: nothing the container's toolkit and consumers build runs on its GPUs"
            ));
        }
    }
    let flag = |f: Feature| if f.supported_on_all(caps) { "1" } else { "0" };
    let bf16 = Feature::Bf16.supported_on_all(caps);
    let min = distinct.first().copied().unwrap_or(caps[0]);
    let mut env = Vec::new();
    if !torch.is_empty() {
        let list: Vec<String> = torch.iter().map(ToString::to_string).collect();
        env.push((EnvVar::TorchCudaArchList, list.join(";")));
    }
    if !flashinfer.is_empty() {
        env.push((EnvVar::FlashinferCudaArchList, flashinfer.join(" ")));
    }
    if let Some(f) = flash_attn_archs(&distinct, tk, &mut notes) {
        env.push((EnvVar::FlashAttnCudaArchs, f));
    }
    env.extend(deepspeed_ops(&torch, sw, &mut notes));
    env.extend([
        (EnvVar::CudaDeviceOrder, "PCI_BUS_ID".to_owned()),
        (EnvVar::ComputeCapabilities, join(&mut caps.iter(), ",")),
        (EnvVar::MinComputeCapability, min.to_string()),
        (
            EnvVar::Dtype,
            if bf16 { "bfloat16" } else { "float16" }.to_owned(),
        ),
        (
            EnvVar::AttnImplementation,
            if flash_attention_2_runs(caps) && !flash_attn_missing(caps, sw) {
                "flash_attention_2"
            } else {
                "sdpa"
            }
            .to_owned(),
        ),
        (EnvVar::Tf32, flag(Feature::Tf32).to_owned()),
        (EnvVar::Fp8, flag(Feature::Fp8).to_owned()),
        // accelerate's names for the same choice as GPUARCH_DTYPE.
        (
            EnvVar::AccelerateMixedPrecision,
            if bf16 { "bf16" } else { "fp16" }.to_owned(),
        ),
    ]);
    (env, notes)
}

/// Why a feature is or is not hinted, naming the first GPU that lacks it.
pub(super) fn feature_note(var: EnvVar, value: &str, f: Feature, gpus: &[AssignedGpu]) -> String {
    match gpus.iter().find(|g| !f.supported_on(g.compute_capability)) {
        None => format!("{var}={value}: every assigned GPU has {f} ({})", f.gate()),
        Some(g) => format!(
            "{var}={value}: {f} needs {}, and {} lacks it",
            f.gate(),
            g.label()
        ),
    }
}

/// `GPUARCH_ATTN_IMPLEMENTATION`'s note: [`feature_note`], and the GPU
/// that no flash-attn build runs on where FlashAttention-2's capability is
/// not what keeps it out.
pub(super) fn attn_note(value: &str, gpus: &[AssignedGpu], sw: &Software) -> String {
    let var = EnvVar::AttnImplementation;
    let f = Feature::FlashAttention2;
    let caps: Vec<ComputeCapability> = gpus.iter().map(|g| g.compute_capability).collect();
    if flash_attn_missing(&caps, sw) {
        return format!(
            "{var}={value}: FlashAttention-2 runs on every assigned GPU, but the image has no flash-attn (read from {})",
            sw.read.join(", ")
        );
    }
    match gpus
        .iter()
        .find(|g| flash_attn_fit(g.compute_capability).is_none())
    {
        Some(g) if f.supported_on_all(&[g.compute_capability]) => format!(
            "{var}={value}: flash-attn builds nothing that runs on {} (sm_80, sm_90, sm_100 and sm_120 only)",
            g.label()
        ),
        _ => feature_note(var, value, f, gpus),
    }
}

/// What the Plan knows of the image's consumers, and from where.
pub(super) fn software_note(sw: &Software, view: &ContainerView) -> String {
    let found: Vec<String> = sw.dists.iter().map(|(d, r)| format!("{d} {r}")).collect();
    let env = sw.get(Dist::Torch).is_some() && !view.software.dists.contains_key(&Dist::Torch);
    let found = if found.is_empty() {
        "none of gpuarch's consumers".to_owned()
    } else {
        found.join(", ")
    };
    let from_env = if env {
        format!(" (torch from {})", software::PYTORCH_VERSION)
    } else {
        String::new()
    };
    let unread = if sw.unread.is_empty() {
        String::new()
    } else {
        format!(
            "; not read, so a consumer not found may still be there: {}",
            sw.unread.join("; ")
        )
    };
    if sw.was_read() && sw.read.iter().all(|r| r.starts_with('(')) && unread.is_empty() {
        // Read, and no environment there: "(no Python environment)".
        format!(
            "the image's consumers: {found}{from_env} {}",
            sw.read.join(", ")
        )
    } else if sw.was_read() {
        format!(
            "the image's consumers: {found}{from_env}, read from {}{unread}",
            sw.read.join(", ")
        )
    } else if env {
        format!("the image's consumers: {found}{from_env}; its Python environments were not read")
    } else {
        "the image's consumers are not known (its Python environments were not read): the arch lists suit every release in gpuarch's tables".to_owned()
    }
}
