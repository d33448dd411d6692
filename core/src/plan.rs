//! The Plan: what a container gets, and why.

use std::collections::BTreeSet;

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

use crate::arch::ComputeCapability;
use crate::arch::CudaVersion;
use crate::config::EnvConfig;
pub use crate::env::EnvVar;
use crate::features::Feature;
use crate::nvrequire;
use crate::oci::{ContainerView, Names};
use crate::select::{self, AssignedGpu, Selection, Source};
use crate::snapshot::Snapshot;
use crate::software::{self, Dist, Software, TorchNames};
use crate::toolkit::{self, Toolkit};

/// What a container gets.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// Where the GPU assignment came from; `None` when nothing was requested
    /// or gpuarch was switched off for this container.
    pub source: Option<Source>,
    /// The assigned GPUs in CUDA order.
    pub gpus: Vec<AssignedGpu>,
    /// Variables to set, in injection order. Values the container already
    /// sets are not here unless the config says to override them.
    #[serde(serialize_with = "as_map")]
    pub env: Vec<(String, String)>,
    /// One line per decision, for logs and `gpuarchctl plan`.
    pub notes: Vec<String>,
    /// Why `strict: true` refuses to start this container: a device name
    /// that names no GPU here, or an `NVIDIA_REQUIRE_*` an assigned GPU
    /// does not meet. Each is in `notes` too; without `strict` the
    /// container starts.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub blocking: Vec<String>,
    /// What the engine calls the container, where its config says.
    #[serde(skip_serializing_if = "Names::is_empty")]
    pub container: Names,
    /// The mounts gpuarch added to the config (kernel packages, the JIT
    /// cache); filled by the hook and the shim, which add them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<AddedMount>,
}

/// A mount gpuarch added: where in the container, from where on the host.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct AddedMount {
    pub destination: String,
    pub source: String,
}

fn as_map<S: Serializer>(env: &[(String, String)], s: S) -> Result<S::Ok, S::Error> {
    let mut m = s.serialize_map(Some(env.len()))?;
    for (k, v) in env {
        m.serialize_entry(k, v)?;
    }
    m.end()
}

impl Plan {
    /// True when the container is left exactly as it was.
    pub fn is_noop(&self) -> bool {
        self.env.is_empty()
    }

    /// Add `GPUARCH_KERNELS_DIR=dir` because kernel packages are mounted
    /// there (see [`Plan::add_mounted`]).
    pub fn add_kernels_dir(&mut self, dir: &str, view: &ContainerView, cfg: &EnvConfig) {
        self.add_mounted(EnvVar::KernelsDir, dir, "kernels are mounted", view, cfg);
    }

    /// Add `var=value` because something was mounted for it (`what`), under
    /// the same rules as every other variable: not when the config disables
    /// it, not over the container's own value unless the config overrides.
    /// Returns whether it was added (or is already there).
    pub fn add_mounted(
        &mut self,
        var: EnvVar,
        value: &str,
        what: &str,
        view: &ContainerView,
        cfg: &EnvConfig,
    ) -> bool {
        if self.is_noop() {
            return false;
        }
        if self.env_get(var.name()).is_some() {
            return true;
        }
        if cfg.disable.contains(&var) {
            self.notes.push(format!(
                "{var} not set: disabled in the config (env.disable)"
            ));
            return false;
        }
        match view.env_get(var.name()) {
            Some(theirs) if !cfg.override_existing => {
                self.notes.push(format!(
                    "{var} left as the container sets it ({theirs:?}; {what}: {value:?})"
                ));
                return false;
            }
            Some(theirs) => self.notes.push(format!(
                "{var} overrides the container's {theirs:?} (env.override is on)"
            )),
            None => {}
        }
        self.env.push((var.name().to_owned(), value.to_owned()));
        true
    }

    pub fn env_get(&self, name: &str) -> Option<&str> {
        self.env
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

fn truthy(v: &str) -> bool {
    matches!(
        v.trim().to_ascii_lowercase().as_str(),
        "1" | "true" | "yes" | "on"
    )
}

/// Why gpuarch leaves this container alone, if the container opted out.
fn opted_out(view: &ContainerView) -> Option<String> {
    if let Some(v) = view.env_get("GPUARCH_DISABLE")
        && truthy(v)
    {
        return Some(format!(
            "GPUARCH_DISABLE={v} in the container env: nothing changes"
        ));
    }
    if let Some(v) = view.annotations.get("io.gpuarch.disable")
        && truthy(v)
    {
        return Some(format!(
            "annotation io.gpuarch.disable={v}: nothing changes"
        ));
    }
    None
}

/// Plan a container from its config and the host inventory.
pub fn plan(view: &ContainerView, inv: &Snapshot, cfg: &EnvConfig) -> Plan {
    plan_with(view, inv, cfg, || select::select(view, inv))
}

/// Plan for an explicit device list (`0,1`, UUIDs, `N:M`, `all`), with the
/// container env of `view` (empty for "what would these GPUs get?").
pub fn plan_request(list: &str, view: &ContainerView, inv: &Snapshot, cfg: &EnvConfig) -> Plan {
    plan_with(view, inv, cfg, || select::select_request(list, view, inv))
}

/// Opt-outs first (selection is not even looked at), then the selection.
fn plan_with(
    view: &ContainerView,
    inv: &Snapshot,
    cfg: &EnvConfig,
    select: impl FnOnce() -> Selection,
) -> Plan {
    let mut plan = match opted_out(view) {
        Some(why) => Plan {
            notes: vec![why],
            ..Plan::default()
        },
        None => plan_selection(select(), view, inv, cfg),
    };
    plan.container = view.names.clone();
    plan
}

/// Most entries [`plan_devices`] takes: more than any node's GPUs and MIG
/// devices.
pub const MAX_PLAN_DEVICES: usize = 1024;
/// Longest device name [`plan_devices`] takes (a MIG UUID is 40 bytes).
pub const MAX_DEVICE_NAME: usize = 256;

/// An explicit device list that names something other than this host's
/// devices.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceListError {
    #[error("{0} devices given; a Plan takes at most {MAX_PLAN_DEVICES}")]
    TooMany(usize),
    #[error("a device name of {0} bytes; at most {MAX_DEVICE_NAME}")]
    TooLong(usize),
    #[error("device {name:?}: {source}")]
    Unknown {
        name: String,
        #[source]
        source: select::DeviceNameError,
    },
}

/// The Plan for an explicit device list, one device per entry, each of
/// which must name a device of `inv` (where [`plan_request`] notes and
/// skips a bad entry, as a container's env is taken). What gpuarchd's
/// `Plan` answers.
pub fn plan_devices(
    devices: &[&str],
    inv: &Snapshot,
    cfg: &EnvConfig,
) -> Result<Plan, DeviceListError> {
    if devices.len() > MAX_PLAN_DEVICES {
        return Err(DeviceListError::TooMany(devices.len()));
    }
    if let Some(d) = devices.iter().find(|d| d.len() > MAX_DEVICE_NAME) {
        return Err(DeviceListError::TooLong(d.len()));
    }
    for d in devices {
        select::check_request_entry(d, inv).map_err(|source| DeviceListError::Unknown {
            name: (*d).to_owned(),
            source,
        })?;
    }
    Ok(plan_request(
        &devices.join(","),
        &ContainerView::with_env(Vec::<(String, String)>::new()),
        inv,
        cfg,
    ))
}

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
/// Each entry that is not the GPU's own capability has a note.
fn arch_lists(
    distinct: &BTreeSet<ComputeCapability>,
    tk: Option<&Toolkit>,
    sw: &Software,
    notes: &mut Vec<String>,
) -> (Vec<TorchEntry>, Vec<String>) {
    let torch_names = TorchNames::of(sw);
    let builds = |c: ComputeCapability| tk.is_none_or(|t| toolkit::accepts(t.version, c));
    let from = tk.map(|t| format!("CUDA {} ({})", t.version, t.source));
    let mut torch: Vec<TorchEntry> = Vec::new();
    let mut flashinfer = Vec::new();
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
        // Why the torch entry is not the GPU's own name.
        let why = match (&from, builds(named)) {
            (Some(from), false) => format!("{from} cannot build sm_{}", named.digits()),
            _ => format!("{} does not take {named}", torch_names.who()),
        };
        let entry = |cap, ptx| TorchEntry {
            cap,
            arch_specific: false,
            ptx,
        };
        match toolkit::best_where(cap, named, |c| builds(c) && torch_names.accepts(c, false)) {
            toolkit::Build::Exact(c) => torch.push(entry(c, false)),
            toolkit::Build::Family(c) => {
                torch.push(entry(c, false));
                notes.push(format!(
                    "{why}: TORCH_CUDA_ARCH_LIST has {c} for {cap} (its SASS runs there)"
                ));
            }
            toolkit::Build::Ptx(c) => {
                torch.push(entry(c, true));
                notes.push(format!(
                    "{why}: TORCH_CUDA_ARCH_LIST has {c}+PTX for {cap}, which the driver JIT-compiles there"
                ));
            }
            toolkit::Build::None => notes.push(format!(
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
    xformers_hopper(&mut torch, tk, sw, &torch_names, notes);
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
    (torch, flashinfer.into_iter().map(|(_, e)| e).collect())
}

/// xformers builds its FlashAttention 3 kernels with wgmma only for `9.0a`
/// in `TORCH_CUDA_ARCH_LIST` (else those paths compile to a trap), and
/// DeepSpeed's op builder raises on that name (`int('0a')`): a Hopper's
/// `9.0` becomes `9.0a` where xformers is in the image and DeepSpeed is
/// not, and the note says which way it went.
fn xformers_hopper(
    torch: &mut [TorchEntry],
    tk: Option<&Toolkit>,
    sw: &Software,
    torch_names: &TorchNames,
    notes: &mut Vec<String>,
) {
    let hopper = ComputeCapability::new(9, 0);
    let Some(e) = torch.iter_mut().find(|e| e.cap == hopper && !e.ptx) else {
        return;
    };
    let Some(x) = sw.get(Dist::Xformers) else {
        return;
    };
    if let Some(ds) = sw.get(Dist::DeepSpeed) {
        notes.push(format!(
            "TORCH_CUDA_ARCH_LIST has 9.0, not 9.0a: DeepSpeed {ds} in the image rejects 9.0a, so xformers {x} built here would trap in its FlashAttention 3 paths (its prebuilt wheels are not affected)"
        ));
        return;
    }
    // sm_90a came with CUDA 12.0.
    if tk.is_some_and(|t| t.version < CudaVersion::new(12, 0)) || !torch_names.accepts(hopper, true)
    {
        return;
    }
    e.arch_specific = true;
    notes.push(format!(
        "TORCH_CUDA_ARCH_LIST has 9.0a: xformers {x} in the image builds FlashAttention 3 with wgmma only for it, and no DeepSpeed is there to reject it"
    ));
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
/// under every name toolkits give it (a Thor is 10.1 to CUDA 12 and 11.0
/// to CUDA 13, so sm_100 SASS runs on it under one and not the other: none).
fn flash_attn_fit(cap: ComputeCapability) -> Option<(ComputeCapability, Option<(u16, u16)>)> {
    let names = [
        toolkit::alias(cap, CudaVersion::new(12, 0)),
        toolkit::alias(cap, CudaVersion::new(13, 0)),
    ];
    let fit = |n: ComputeCapability| {
        FLASH_ATTN_ARCHS
            .iter()
            .filter(|(a, _)| a.major == n.major && a.minor <= n.minor)
            .max_by_key(|(a, _)| *a)
            .copied()
    };
    let first = fit(names[0])?;
    names
        .iter()
        .all(|n| fit(*n) == Some(first))
        .then_some(first)
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
                    if toolkit::is_tegra(toolkit::alias(cap, CudaVersion::new(12, 0))) {
                        " under every name CUDA gives it"
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
    for (var, empty) in [
        (EnvVar::TorchCudaArchList, torch.is_empty()),
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
            if flash_attention_2_runs(caps) {
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
fn feature_note(var: EnvVar, value: &str, f: Feature, gpus: &[AssignedGpu]) -> String {
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
fn attn_note(value: &str, gpus: &[AssignedGpu]) -> String {
    let var = EnvVar::AttnImplementation;
    let f = Feature::FlashAttention2;
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
fn software_note(sw: &Software, view: &ContainerView) -> String {
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
    if sw.was_read() && sw.read.iter().all(|r| r.starts_with('(')) {
        // Read, and no environment there: "(no Python environment)".
        format!(
            "the image's consumers: {found}{from_env} {}",
            sw.read.join(", ")
        )
    } else if sw.was_read() {
        format!(
            "the image's consumers: {found}{from_env}, read from {}",
            sw.read.join(", ")
        )
    } else if env {
        format!("the image's consumers: {found}{from_env}; its Python environments were not read")
    } else {
        "the image's consumers are not known (its Python environments were not read): the arch lists suit every release in gpuarch's tables".to_owned()
    }
}

/// Check the image's `NVIDIA_REQUIRE_*` on each assigned GPU; a note for
/// each that one does not meet (also `blocking`), or one that all are met.
fn requirements(
    view: &ContainerView,
    inv: &Snapshot,
    gpus: &[AssignedGpu],
    notes: &mut Vec<String>,
    blocking: &mut Vec<String>,
) {
    let reqs = nvrequire::of_env(view.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    if reqs.is_empty() {
        return;
    }
    let known = |v: &str| Some(v.to_owned()).filter(|v| !v.is_empty());
    let (cuda, driver) = (known(&inv.cuda_driver_version), known(&inv.driver_version));
    let mut unmet_count = 0usize;
    for g in gpus {
        let arch = g.compute_capability.to_string();
        let brand = inv
            .devices
            .iter()
            .find(|d| d.index == g.index)
            .and_then(|d| d.brand.as_deref());
        let facts = nvrequire::Facts {
            cuda: cuda.as_deref(),
            driver: driver.as_deref(),
            arch: Some(&arch),
            brand,
        };
        for r in &reqs {
            if let Err(unmet) = nvrequire::check(&r.expr, &facts) {
                unmet_count += 1;
                if unmet_count >= select::MAX_NOTES {
                    continue;
                }
                let value: String = r.expr.chars().take(120).collect();
                let why = format!("{}={value:?} is not met on {}: {unmet}", r.var, g.label());
                notes.push(format!(
                    "{why} (NVIDIA's legacy runtime refuses this start; its CDI mode does not check)"
                ));
                blocking.push(why);
            }
        }
    }
    if unmet_count >= select::MAX_NOTES {
        let more = unmet_count - (select::MAX_NOTES - 1);
        let line = format!("... and {more} more requirements not met, not shown");
        notes.push(line.clone());
        blocking.push(line);
    }
    if unmet_count == 0 {
        let vars: Vec<&str> = reqs.iter().map(|r| r.var.as_str()).collect();
        notes.push(format!(
            "the image's requirements ({}) are met on every assigned GPU",
            vars.join(", ")
        ));
    }
}

fn plan_selection(sel: Selection, view: &ContainerView, inv: &Snapshot, cfg: &EnvConfig) -> Plan {
    let Selection {
        source,
        gpus,
        mut notes,
        unresolved,
    } = sel;
    let mut blocking = unresolved;
    let Some(src) = source else {
        notes.push(
            "no GPU requested (no CDI annotation, no /dev/nvidiaN device, no NVIDIA_VISIBLE_DEVICES): nothing changes"
                .to_owned(),
        );
        return Plan {
            source,
            gpus,
            env: Vec::new(),
            notes,
            blocking,
            ..Plan::default()
        };
    };
    if gpus.is_empty() {
        notes.push(format!(
            "no GPU of this host assigned (from {src}): nothing changes"
        ));
        return Plan {
            source,
            gpus,
            env: Vec::new(),
            notes,
            blocking,
            ..Plan::default()
        };
    }
    notes.push(format!(
        "assigned from {src}, in CUDA order: {}",
        gpus.iter()
            .map(AssignedGpu::label)
            .collect::<Vec<_>>()
            .join(", ")
    ));

    requirements(view, inv, &gpus, &mut notes, &mut blocking);
    let caps: Vec<ComputeCapability> = gpus.iter().map(|g| g.compute_capability).collect();
    let tk = toolkit::of_container(view, cfg.cuda_version, &mut notes);
    if let Some(tk) = &tk {
        notes.push(format!(
            "the container's toolkit: CUDA {} (from {}); arch lists are built for it",
            tk.version, tk.source
        ));
    }
    let sw = view.software_known();
    notes.push(software_note(&sw, view));
    let (hinted, why_lists) = hints_for(&caps, tk.as_ref(), &sw);
    notes.extend(why_lists);
    let mut env = Vec::new();
    for (var, value) in hinted {
        if var.opt_in() && !cfg.enable.contains(&var) {
            continue;
        }
        let why = match var {
            EnvVar::Dtype | EnvVar::AccelerateMixedPrecision => {
                Some(feature_note(var, &value, Feature::Bf16, &gpus))
            }
            EnvVar::AttnImplementation => Some(attn_note(&value, &gpus)),
            EnvVar::Tf32 => Some(feature_note(var, &value, Feature::Tf32, &gpus)),
            EnvVar::Fp8 => Some(feature_note(var, &value, Feature::Fp8, &gpus)),
            _ => None,
        };
        if cfg.disable.contains(&var) {
            notes.push(format!(
                "{var} not set: disabled in the config (env.disable)"
            ));
            continue;
        }
        match view.env_get(var.name()) {
            Some(theirs) if !cfg.override_existing => {
                notes.push(format!(
                    "{var} left as the container sets it ({theirs:?}; gpuarch would set {value:?}; env.override in the config replaces it)"
                ));
                if var == EnvVar::CudaDeviceOrder && theirs != "PCI_BUS_ID" {
                    notes.push(
                        "CUDA_DEVICE_ORDER is not PCI_BUS_ID: CUDA may number the GPUs differently from GPUARCH_COMPUTE_CAPABILITIES"
                            .to_owned(),
                    );
                }
                continue;
            }
            Some(theirs) => notes.push(format!(
                "{var} overrides the container's {theirs:?} (env.override is on)"
            )),
            None => {}
        }
        if let Some(why) = why {
            notes.push(why);
        }
        env.push((var.name().to_owned(), value));
    }
    // DeepSpeed's ops are switched off for the torch list gpuarch sets;
    // under the container's own list they are its business.
    if !env
        .iter()
        .any(|(k, _)| k == EnvVar::TorchCudaArchList.name())
    {
        env.retain(|(k, _)| !k.starts_with("DS_BUILD_"));
    }
    Plan {
        source,
        gpus,
        env,
        notes,
        blocking,
        ..Plan::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::select::tests::host;

    fn nvd(value: &str) -> ContainerView {
        ContainerView::with_env([("NVIDIA_VISIBLE_DEVICES", value)])
    }

    fn cfg() -> EnvConfig {
        EnvConfig::default()
    }

    /// A GB10 (12.1) beside a B300 (10.3) and a Thor (11.0), in images of
    /// several toolkits: the arch lists are what each toolkit can build.
    fn blackwell_host() -> Snapshot {
        use crate::select::tests::dev;
        let mut h = host();
        h.devices = vec![
            dev(0, 0, "GPU-gb10", "NVIDIA GB10", "12.1", 0x01),
            dev(1, 1, "GPU-b300", "NVIDIA B300 SXM6 AC", "10.3", 0x21),
            dev(2, 2, "GPU-thor", "NVIDIA Thor", "11.0", 0x41),
            dev(3, 3, "GPU-v100", "Tesla V100-SXM2-16GB", "7.0", 0x61),
        ];
        h
    }

    /// The arch lists, FLASH_ATTN_CUDA_ARCHS and the notes for a container
    /// of `blackwell_host` with env `env` (CUDA_VERSION, PYTORCH_VERSION).
    fn lists(env: &[(&str, &str)], cfg: &EnvConfig) -> [Option<String>; 3] {
        let p = plan(
            &ContainerView::with_env(env.to_vec()),
            &blackwell_host(),
            cfg,
        );
        let get = |k: &str| p.env_get(k).map(str::to_owned);
        [
            get("TORCH_CUDA_ARCH_LIST"),
            get("FLASHINFER_CUDA_ARCH_LIST"),
            Some(p.notes.join("\n")),
        ]
    }

    /// `NVIDIA_REQUIRE_*` per assigned GPU: a term one GPU fails is a
    /// note naming the term and the GPU, and blocking; an image whose
    /// requirements hold gets one note and nothing blocking.
    #[test]
    fn image_requirements_are_checked_on_each_assigned_gpu() {
        let mut h = host();
        h.devices[0].brand = Some("geforce".into());
        h.devices[1].brand = Some("geforce".into());
        h.devices[2].brand = Some("nvidia".into());
        let on = |h: &Snapshot, env: &[(&str, &str)]| {
            plan(&ContainerView::with_env(env.to_vec()), h, &cfg())
        };
        let p = |env: &[(&str, &str)]| on(&h, env);
        // arch>=8.0 holds on the 3090 and the A100 MIG device, not the 2080 Ti.
        let r = p(&[
            ("NVIDIA_VISIBLE_DEVICES", "0,1,MIG-aaaa"),
            ("NVIDIA_REQUIRE_ARCH", "arch>=8.0"),
        ]);
        assert_eq!(
            r.blocking,
            [
                "NVIDIA_REQUIRE_ARCH=\"arch>=8.0\" is not met on GPU 0 (NVIDIA GeForce RTX 2080 Ti, 7.5): \"arch>=8.0\" fails"
            ]
        );
        assert!(
            r.notes
                .iter()
                .any(|n| n.starts_with(&r.blocking[0]) && n.contains("legacy runtime refuses"))
        );
        assert!(!r.is_noop(), "without strict the Plan still applies");
        // NGC's form: the first alternative fails on a 13.0 driver, the
        // brand alternative holds only for a Tesla.
        let ngc = "cuda>=13.1 brand=tesla,driver>=580,driver<581";
        let r = p(&[
            ("NVIDIA_VISIBLE_DEVICES", "1"),
            ("NVIDIA_REQUIRE_CUDA", ngc),
        ]);
        assert_eq!(r.blocking.len(), 1);
        assert!(
            r.blocking[0].ends_with("every alternative fails (\"cuda>=13.1\", \"brand=tesla\")"),
            "{:?}",
            r.blocking
        );
        let mut tesla = h.clone();
        tesla.devices[1].brand = Some("tesla".into());
        let r = on(
            &tesla,
            &[
                ("NVIDIA_VISIBLE_DEVICES", "1"),
                ("NVIDIA_REQUIRE_CUDA", ngc),
            ],
        );
        assert!(r.blocking.is_empty(), "{:?}", r.blocking);
        assert!(
            r.notes.iter().any(|n| n
                == "the image's requirements (NVIDIA_REQUIRE_CUDA) are met on every assigned GPU")
        );
        // Legacy CUDA_VERSION; and NVIDIA_DISABLE_REQUIRE turns all off.
        let r = p(&[("NVIDIA_VISIBLE_DEVICES", "0"), ("CUDA_VERSION", "13.2.0")]);
        assert!(
            r.blocking[0].starts_with("CUDA_VERSION=\"cuda>=13.2\" is not met on GPU 0"),
            "{:?}",
            r.blocking
        );
        let r = p(&[
            ("NVIDIA_VISIBLE_DEVICES", "0"),
            ("CUDA_VERSION", "13.2.0"),
            ("NVIDIA_DISABLE_REQUIRE", "1"),
        ]);
        assert!(r.blocking.is_empty());
        // A term NVIDIA cannot read.
        let r = p(&[
            ("NVIDIA_VISIBLE_DEVICES", "1"),
            ("NVIDIA_REQUIRE_CUDA", "cuda==13.0"),
        ]);
        assert!(r.blocking[0].ends_with("\"cuda==13.0\" is not a term NVIDIA's runtime can read"));
    }

    /// A hostile image: 16 MiB of requirement variables (the most an OCI
    /// config holds), each failing on each of 4 GPUs, costs a bounded walk
    /// and a bounded Plan.
    #[test]
    fn a_flood_of_requirements_is_a_bounded_plan() {
        let h = host();
        // Every term is read before the last one fails.
        let long = format!("{},cuda>=99", "arch>=1,".repeat(500));
        let mut env: Vec<(String, String)> = vec![("NVIDIA_VISIBLE_DEVICES".into(), "all".into())];
        let n = (crate::oci::MAX_CONFIG_BYTES as usize) / (long.len() + 24);
        env.extend((0..n).map(|i| (format!("NVIDIA_REQUIRE_X{i}"), long.clone())));
        env.push(("NVIDIA_REQUIRE_BIG".into(), "cuda>=1 ".repeat(10_000)));
        let t = std::time::Instant::now();
        let p = plan(&ContainerView::with_env(env), &h, &cfg());
        let took = t.elapsed();
        assert_eq!(p.blocking.len(), crate::select::MAX_NOTES);
        assert!(
            p.blocking
                .last()
                .unwrap()
                .contains("more requirements not met")
        );
        assert!(p.notes.len() < 64, "{}", p.notes.len());
        assert!(p.blocking.iter().all(|b| b.len() < 400));
        // Over 4 KiB: not walked, reported unreadable.
        let r = plan(
            &ContainerView::with_env([
                ("NVIDIA_VISIBLE_DEVICES", "1"),
                ("NVIDIA_REQUIRE_BIG", &"cuda>=1 ".repeat(10_000)),
            ]),
            &h,
            &cfg(),
        );
        assert!(
            r.blocking[0].contains("not a term NVIDIA's runtime can read"),
            "{:?}",
            r.blocking
        );
        // Measured: 0.2 s in release, 4 s in a debug build, for the 16 MiB
        // walked on each of 3 GPUs; the bound leaves a loaded CI room.
        let bound = if cfg!(debug_assertions) { 60 } else { 3 };
        assert!(took < std::time::Duration::from_secs(bound), "{took:?}");
    }

    /// A device name that names no GPU of this host blocks (strict refuses
    /// it); the GPUs that were found are still planned.
    #[test]
    fn device_names_of_no_gpu_here_block() {
        let h = host();
        let r = plan(&nvd("7"), &h, &cfg());
        assert_eq!(r.blocking.len(), 1, "{:?}", r.notes);
        assert!(
            r.blocking[0].starts_with("NVIDIA_VISIBLE_DEVICES entry \"7\""),
            "{:?}",
            r.blocking
        );
        assert!(r.is_noop());
        let r = plan(&nvd("1,GPU-nope"), &h, &cfg());
        assert_eq!(r.gpus.len(), 1);
        assert!(r.blocking[0].contains("\"GPU-nope\""));
        assert!(!r.is_noop());
        assert!(plan(&nvd("all"), &h, &cfg()).blocking.is_empty());
        // Thousands of bad names: a bounded reason.
        let many: Vec<String> = (100..5100).map(|i| i.to_string()).collect();
        let r = plan(&nvd(&many.join(",")), &h, &cfg());
        assert_eq!(r.blocking.len(), crate::select::MAX_NOTES);
        assert!(r.blocking.last().unwrap().contains("more device names"));
    }

    #[test]
    fn arch_lists_are_built_for_the_containers_own_toolkit_and_torch() {
        let nvd = |d: &'static str| ("NVIDIA_VISIBLE_DEVICES", d);
        let torch = |v: &'static str| ("PYTORCH_VERSION", v);
        let cuda = |v: &'static str| ("CUDA_VERSION", v);
        // (env, torch list, FlashInfer list, notes each case must have)
        type Case<'a> = (
            &'a [(&'a str, &'a str)],
            Option<&'a str>,
            Option<&'a str>,
            &'a [&'a str],
        );
        let cases: &[Case] = &[
            // The GB10 case: 12.8 builds sm_120, whose SASS runs on 12.1,
            // and torch 2.7 names it; FlashInfer's 12.1a is not built.
            (
                &[nvd("0"), cuda("12.8.1"), torch("2.7.1")],
                Some("12.0"),
                None,
                &[
                    "the container's toolkit: CUDA 12.8 (from CUDA_VERSION in the container)",
                    "cannot build sm_121: TORCH_CUDA_ARCH_LIST has 12.0 for 12.1",
                    "FLASHINFER_CUDA_ARCH_LIST not set",
                    "the image's consumers: torch 2.7.1 (torch from PYTORCH_VERSION)",
                ],
            ),
            // No torch known: a name torch 2.4 takes too, as PTX.
            (
                &[nvd("0"), cuda("12.8.1")],
                Some("9.0+PTX"),
                None,
                &[
                    "TORCH_CUDA_ARCH_LIST has 9.0+PTX for 12.1",
                    "the image's consumers are not known",
                ],
            ),
            (
                &[nvd("0,1,2"), torch("2.15.0")],
                Some("10.3;11.0;12.1"),
                Some("10.3a 11.0a 12.1a"),
                &[],
            ),
            (
                &[nvd("0,1,2")],
                Some("9.0+PTX"),
                Some("10.3a 11.0a 12.1a"),
                &["every torch from 2.4.0 (the image's is not known) does not take 10.3"],
            ),
            // 12.9 names Thor sm_101: torch 2.8 takes that name...
            (
                &[nvd("0,1,2"), cuda("12.9.0"), torch("2.8.0")],
                Some("10.1;10.3;12.1"),
                Some("10.1a 10.3a 12.1a"),
                &[
                    "CUDA 12.9 (CUDA_VERSION in the container) names the architecture of 11.0 sm_101",
                ],
            ),
            // ...torch 2.9 does not: sm_100 with its PTX, which runs on Thor
            // whichever name its driver gives it.
            (
                &[nvd("2"), cuda("12.9.0"), torch("2.9.1")],
                Some("10.0+PTX"),
                Some("10.1a"),
                &[
                    "torch 2.9.1 in the image does not take 10.1: TORCH_CUDA_ARCH_LIST has 10.0+PTX for 11.0",
                ],
            ),
            (
                &[nvd("0,1,2"), cuda("12.8"), torch("2.7.1")],
                Some("10.0;10.1;12.0"),
                Some("10.1a"),
                &[
                    "cannot build sm_103: TORCH_CUDA_ARCH_LIST has 10.0 for 10.3 (its SASS runs there)",
                ],
            ),
            (
                &[
                    nvd("0,1,2"),
                    ("NVIDIA_REQUIRE_CUDA", "cuda>=12.6 brand=tesla,driver>=470"),
                    torch("2.6.0"),
                ],
                Some("9.0+PTX"),
                None,
                &["9.0+PTX for 12.1, which the driver JIT-compiles there"],
            ),
            // The container's own list still wins.
            (
                &[
                    nvd("0"),
                    cuda("12.8.1"),
                    ("TORCH_CUDA_ARCH_LIST", "12.0+PTX"),
                ],
                None,
                None,
                &["TORCH_CUDA_ARCH_LIST left as the container sets it"],
            ),
        ];
        for (env, want_torch, want_fi, want_notes) in cases {
            let [torch, fi, notes] = lists(env, &cfg());
            let notes = notes.unwrap();
            assert_eq!(torch.as_deref(), *want_torch, "{env:?}\n{notes}");
            assert_eq!(fi.as_deref(), *want_fi, "{env:?}\n{notes}");
            for n in *want_notes {
                assert!(notes.contains(n), "{env:?}: no {n:?} in\n{notes}");
            }
        }
        // CUDA 13 dropped Volta: left out, the rest kept; from the config.
        let with_default = EnvConfig {
            cuda_version: Some(crate::arch::CudaVersion::new(13, 0)),
            ..EnvConfig::default()
        };
        let [torch, fi, notes] = lists(&[nvd("2,3"), torch("2.9.1")], &with_default);
        let notes = notes.unwrap();
        assert_eq!(
            (torch.as_deref(), fi.as_deref()),
            (Some("11.0"), Some("11.0a"))
        );
        assert!(
            notes.contains("nothing that runs on 7.0 is both built and taken"),
            "{notes}"
        );
        assert!(
            notes.contains("from env.cuda_version in the config"),
            "{notes}"
        );
        let [torch, fi, notes] = lists(&[nvd("3")], &with_default);
        assert_eq!((torch, fi), (None, None));
        assert!(notes.unwrap().contains("TORCH_CUDA_ARCH_LIST not set"));
    }

    #[test]
    fn flash_attention_hints_agree_with_what_flash_attn_builds() {
        let h = blackwell_host();
        let on = |h: &Snapshot, env: &[(&str, &str)]| {
            plan(&ContainerView::with_env(env.to_vec()), h, &cfg())
        };
        let p = |env: &[(&str, &str)]| on(&h, env);
        let fa = |env: &[(&str, &str)]| p(env).env_get("FLASH_ATTN_CUDA_ARCHS").map(str::to_owned);
        assert_eq!(
            fa(&[("NVIDIA_VISIBLE_DEVICES", "0,1")]).as_deref(),
            Some("100;120")
        );
        // Thor: sm_100's SASS runs on it as 10.1 (CUDA 12) and not as 11.0
        // (CUDA 13), so under neither name; nor FlashAttention-2 hinted.
        for cuda in ["12.9", "13.0"] {
            let plan = p(&[("NVIDIA_VISIBLE_DEVICES", "2"), ("CUDA_VERSION", cuda)]);
            assert_eq!(plan.env_get("FLASH_ATTN_CUDA_ARCHS"), None, "{cuda}");
            assert_eq!(
                plan.env_get("GPUARCH_ATTN_IMPLEMENTATION"),
                Some("sdpa"),
                "{cuda}"
            );
            let notes = plan.notes.join("\n");
            assert!(
                notes.contains("none runs on 11.0 under every name CUDA gives it")
                    && notes.contains("GPUARCH_ATTN_IMPLEMENTATION=sdpa: flash-attn builds nothing that runs on GPU 2 (NVIDIA Thor, 11.0)"),
                "{notes}"
            );
        }
        assert_eq!(
            fa(&[("NVIDIA_VISIBLE_DEVICES", "0,3")]),
            None,
            "Volta: no FA2"
        );
        assert_eq!(
            fa(&[("NVIDIA_VISIBLE_DEVICES", "0"), ("CUDA_VERSION", "12.6.3")]),
            None,
            "sm_120 needs CUDA 12.8 in flash-attn's build"
        );
        let p = plan(&nvd("1,2"), &super::tests::host(), &cfg());
        assert_eq!(
            p.env_get("FLASH_ATTN_CUDA_ARCHS"),
            Some("80"),
            "8.6 and 8.0: 80 once"
        );
    }

    /// A node of one GPU of capability `cc`, in an image holding `dists`.
    fn one_gpu(cc: &str, dists: &[(Dist, &str)], read: bool) -> Plan {
        use crate::select::tests::dev;
        let mut h = host();
        h.devices = vec![dev(0, 0, "GPU-x", "NVIDIA GPU", cc, 0x01)];
        let mut v = nvd("0");
        for (d, r) in dists {
            v.software
                .dists
                .insert(*d, crate::software::Release::parse(r).unwrap());
        }
        if read {
            v.software
                .read
                .push("/usr/lib/python3/dist-packages".into());
        }
        plan(&v, &h, &cfg())
    }

    #[test]
    fn xformers_gets_9_0a_on_hopper_unless_deepspeed_would_reject_it() {
        let p = one_gpu(
            "9.0",
            &[(Dist::Xformers, "0.0.33"), (Dist::Torch, "2.9.1")],
            true,
        );
        assert_eq!(p.env_get("TORCH_CUDA_ARCH_LIST"), Some("9.0a"));
        assert!(
            p.notes
                .iter()
                .any(|n| n.contains("xformers 0.0.33 in the image builds FlashAttention 3")),
            "{:?}",
            p.notes
        );
        let p = one_gpu(
            "9.0",
            &[
                (Dist::Xformers, "0.0.33"),
                (Dist::DeepSpeed, "0.19.8"),
                (Dist::Torch, "2.9.1"),
            ],
            true,
        );
        assert_eq!(p.env_get("TORCH_CUDA_ARCH_LIST"), Some("9.0"));
        assert!(
            p.notes
                .iter()
                .any(|n| n.contains("DeepSpeed 0.19.8 in the image rejects 9.0a")),
            "{:?}",
            p.notes
        );
        // Without xformers, or not on a Hopper: as ever.
        assert_eq!(
            one_gpu("9.0", &[], true).env_get("TORCH_CUDA_ARCH_LIST"),
            Some("9.0")
        );
        let p = one_gpu("8.6", &[(Dist::Xformers, "0.0.33")], true);
        assert_eq!(p.env_get("TORCH_CUDA_ARCH_LIST"), Some("8.6"));
    }

    #[test]
    fn deepspeed_ops_that_cannot_run_are_switched_off() {
        let ds = |p: &Plan| -> Vec<String> {
            p.env
                .iter()
                .filter(|(k, _)| k.starts_with("DS_BUILD_"))
                .map(|(k, v)| format!("{k}={v}"))
                .collect()
        };
        // A Turing: the three ops that keep 8.0 and newer only, where
        // DeepSpeed is present or the image was not read.
        let want = [
            "DS_BUILD_FP_QUANTIZER=0",
            "DS_BUILD_CUTLASS_OPS=0",
            "DS_BUILD_RAGGED_DEVICE_OPS=0",
        ];
        assert_eq!(
            ds(&one_gpu("7.5", &[(Dist::DeepSpeed, "0.19.8")], true)),
            want
        );
        assert_eq!(ds(&one_gpu("7.5", &[], false)), want);
        assert_eq!(
            ds(&one_gpu("7.5", &[], true)),
            Vec::<String>::new(),
            "read, no DeepSpeed"
        );
        // A Pascal: the one for 7.0 too.
        assert_eq!(ds(&one_gpu("6.1", &[], false)).len(), 4);
        assert!(ds(&one_gpu("8.6", &[], false)).is_empty());
        // Under the container's own list, nothing of DeepSpeed's.
        let mut h = host();
        h.devices.truncate(1);
        let v = ContainerView::with_env([
            ("NVIDIA_VISIBLE_DEVICES", "0"),
            ("TORCH_CUDA_ARCH_LIST", "7.5"),
        ]);
        assert!(ds(&plan(&v, &h, &cfg())).is_empty());
    }

    #[test]
    fn turing_beside_ampere_gets_the_lowest_common_hints() {
        let p = plan(&nvd("0,1"), &host(), &cfg());
        let want = [
            ("TORCH_CUDA_ARCH_LIST", "7.5;8.6"),
            ("FLASHINFER_CUDA_ARCH_LIST", "7.5 8.6"),
            ("CUDA_DEVICE_ORDER", "PCI_BUS_ID"),
            ("GPUARCH_COMPUTE_CAPABILITIES", "7.5,8.6"),
            ("GPUARCH_MIN_COMPUTE_CAPABILITY", "7.5"),
            ("GPUARCH_DTYPE", "float16"),
            ("GPUARCH_ATTN_IMPLEMENTATION", "sdpa"),
            ("GPUARCH_TF32", "0"),
            ("GPUARCH_FP8", "0"),
        ];
        let got: Vec<(&str, &str)> = p
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(got, want);
        assert!(
            p.notes.iter().any(|n| n.contains("GPUARCH_DTYPE=float16")
                && n.contains("GPU 0 (NVIDIA GeForce RTX 2080 Ti, 7.5) lacks it")),
            "{:?}",
            p.notes
        );
    }

    #[test]
    fn the_3090_alone_gets_bf16_and_flash_attention_2() {
        let p = plan(&nvd("1"), &host(), &cfg());
        assert_eq!(p.env_get("TORCH_CUDA_ARCH_LIST"), Some("8.6"));
        assert_eq!(p.env_get("GPUARCH_DTYPE"), Some("bfloat16"));
        assert_eq!(
            p.env_get("GPUARCH_ATTN_IMPLEMENTATION"),
            Some("flash_attention_2")
        );
        assert_eq!(p.env_get("GPUARCH_TF32"), Some("1"));
        assert_eq!(p.env_get("GPUARCH_FP8"), Some("0"));
        assert!(
            p.notes
                .iter()
                .any(|n| n.contains("every assigned GPU has bf16"))
        );
    }

    #[test]
    fn capabilities_follow_cuda_order_and_the_arch_list_is_sorted() {
        let v = ContainerView::with_env([
            ("NVIDIA_VISIBLE_DEVICES", "all"),
            ("CUDA_VISIBLE_DEVICES", "2,0,1"),
        ]);
        let p = plan(&v, &host(), &cfg());
        assert_eq!(
            p.env_get("GPUARCH_COMPUTE_CAPABILITIES"),
            Some("8.0,7.5,8.6")
        );
        assert_eq!(p.env_get("TORCH_CUDA_ARCH_LIST"), Some("7.5;8.0;8.6"));
    }

    #[test]
    fn mig_devices_take_their_parents_capability() {
        let p = plan(&nvd("MIG-bbbb"), &host(), &cfg());
        assert_eq!(p.env_get("TORCH_CUDA_ARCH_LIST"), Some("8.0"));
        assert_eq!(p.gpus[0].mig, Some(1));
    }

    #[test]
    fn container_values_win_unless_override() {
        let v = ContainerView::with_env([
            ("NVIDIA_VISIBLE_DEVICES", "0,1"),
            ("TORCH_CUDA_ARCH_LIST", "8.0"),
            ("CUDA_DEVICE_ORDER", "FASTEST_FIRST"),
        ]);
        let p = plan(&v, &host(), &cfg());
        assert_eq!(p.env_get("TORCH_CUDA_ARCH_LIST"), None);
        assert_eq!(p.env_get("CUDA_DEVICE_ORDER"), None);
        assert_eq!(p.env_get("GPUARCH_DTYPE"), Some("float16"));
        assert!(
            p.notes
                .iter()
                .any(|n| n.contains("TORCH_CUDA_ARCH_LIST left as the container sets it (\"8.0\""))
        );
        assert!(
            p.notes
                .iter()
                .any(|n| n.contains("may number the GPUs differently"))
        );

        let over = EnvConfig {
            override_existing: true,
            ..cfg()
        };
        let p = plan(&v, &host(), &over);
        assert_eq!(p.env_get("TORCH_CUDA_ARCH_LIST"), Some("7.5;8.6"));
        assert!(
            p.notes
                .iter()
                .any(|n| n.contains("overrides the container's \"8.0\""))
        );
    }

    #[test]
    fn accelerates_mixed_precision_only_when_the_config_enables_it() {
        assert_eq!(
            plan(&nvd("0,1"), &host(), &cfg()).env_get("ACCELERATE_MIXED_PRECISION"),
            None
        );
        let on = EnvConfig {
            enable: [EnvVar::AccelerateMixedPrecision].into(),
            ..cfg()
        };
        let p = plan(&nvd("0,1"), &host(), &on);
        assert_eq!(p.env_get("ACCELERATE_MIXED_PRECISION"), Some("fp16"));
        assert!(
            p.notes
                .iter()
                .any(|n| n.starts_with("ACCELERATE_MIXED_PRECISION=fp16: bf16 needs")),
            "{:?}",
            p.notes
        );
        let p = plan(&nvd("1"), &host(), &on);
        assert_eq!(p.env_get("ACCELERATE_MIXED_PRECISION"), Some("bf16"));
        // The container's own choice stays.
        let mine = ContainerView::with_env([
            ("NVIDIA_VISIBLE_DEVICES", "1"),
            ("ACCELERATE_MIXED_PRECISION", "no"),
        ]);
        assert_eq!(
            plan(&mine, &host(), &on).env_get("ACCELERATE_MIXED_PRECISION"),
            None
        );
    }

    #[test]
    fn the_config_switches_variables_off() {
        let c = EnvConfig {
            disable: [EnvVar::Fp8, EnvVar::CudaDeviceOrder].into(),
            ..cfg()
        };
        let p = plan(&nvd("1"), &host(), &c);
        assert_eq!(p.env_get("GPUARCH_FP8"), None);
        assert_eq!(p.env_get("CUDA_DEVICE_ORDER"), None);
        // The 3090: FLASH_ATTN_CUDA_ARCHS too, sm_80's SASS running on 8.6.
        assert_eq!(p.env_get("FLASH_ATTN_CUDA_ARCHS"), Some("80"));
        assert_eq!(p.env.len(), 8);
        assert!(
            p.notes
                .iter()
                .any(|n| n == "GPUARCH_FP8 not set: disabled in the config (env.disable)")
        );
    }

    #[test]
    fn opt_outs_change_nothing() {
        let v =
            ContainerView::with_env([("NVIDIA_VISIBLE_DEVICES", "all"), ("GPUARCH_DISABLE", "1")]);
        let p = plan(&v, &host(), &cfg());
        assert!(p.is_noop() && p.gpus.is_empty());
        assert!(p.notes[0].contains("GPUARCH_DISABLE=1"));

        let mut v = nvd("all");
        v.annotations
            .insert("io.gpuarch.disable".into(), "true".into());
        let p = plan(&v, &host(), &cfg());
        assert!(p.is_noop());
        assert!(p.notes[0].contains("io.gpuarch.disable"));

        // "0" is not an opt-out.
        let v =
            ContainerView::with_env([("NVIDIA_VISIBLE_DEVICES", "all"), ("GPUARCH_DISABLE", "0")]);
        assert!(!plan(&v, &host(), &cfg()).is_noop());
    }

    #[test]
    fn no_gpu_means_no_change() {
        for v in [ContainerView::default(), nvd("none"), nvd("void"), nvd("7")] {
            let p = plan(&v, &host(), &cfg());
            assert!(p.is_noop(), "{v:?}");
            assert!(
                p.notes.last().unwrap().contains("nothing changes"),
                "{:?}",
                p.notes
            );
        }
    }

    #[test]
    fn fp8_needs_every_gpu_at_8_9() {
        assert_eq!(
            hints(&[ComputeCapability::new(8, 9), ComputeCapability::new(9, 0)])
                .iter()
                .find(|(v, _)| *v == EnvVar::Fp8)
                .map(|(_, x)| x.as_str()),
            Some("1")
        );
    }

    #[test]
    fn plan_serialises_env_as_an_ordered_object() {
        let p = plan(&nvd("1"), &host(), &cfg());
        let j = serde_json::to_string(&p).unwrap();
        let t = j.find("TORCH_CUDA_ARCH_LIST").unwrap();
        let f = j.find("GPUARCH_FP8").unwrap();
        assert!(t < f, "{j}");
        assert!(j.contains("\"source\":\"nvidia_visible_devices\""), "{j}");
    }
}
