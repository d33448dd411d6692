//! The Plan: what a container gets, and why.

use std::collections::BTreeSet;

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

use crate::arch::ComputeCapability;
use crate::config::EnvConfig;
pub use crate::env::EnvVar;
use crate::features::Feature;
use crate::oci::ContainerView;
use crate::select::{self, AssignedGpu, Selection, Source};
use crate::snapshot::Snapshot;
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
    plan_with(view, cfg, || select::select(view, inv))
}

/// Plan for an explicit device list (`0,1`, UUIDs, `N:M`, `all`), with the
/// container env of `view` (empty for "what would these GPUs get?").
pub fn plan_request(list: &str, view: &ContainerView, inv: &Snapshot, cfg: &EnvConfig) -> Plan {
    plan_with(view, cfg, || select::select_request(list, view, inv))
}

/// Opt-outs first (selection is not even looked at), then the selection.
fn plan_with(view: &ContainerView, cfg: &EnvConfig, select: impl FnOnce() -> Selection) -> Plan {
    if let Some(why) = opted_out(view) {
        return Plan {
            notes: vec![why],
            ..Plan::default()
        };
    }
    plan_selection(select(), view, cfg)
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

/// The hints for GPUs of these capabilities, given in CUDA order, with
/// arch lists of their exact capabilities.
pub fn hints(caps: &[ComputeCapability]) -> Vec<(EnvVar, String)> {
    hints_for(caps, None).0
}

/// The arch lists' entries for toolkit `tk`: for torch, per GPU the best
/// target `tk` builds that runs there ([`toolkit::best`]); for FlashInfer,
/// which adds an arch-specific suffix to each entry itself (so only the
/// GPU's own architecture runs), the GPU's own architecture when `tk`
/// builds it, else nothing. Each entry that is not the GPU's own
/// capability has a note.
fn arch_lists(
    distinct: &BTreeSet<ComputeCapability>,
    tk: &Toolkit,
    notes: &mut Vec<String>,
) -> (Option<String>, Option<String>) {
    use std::collections::BTreeMap;
    let v = tk.version;
    let from = format!("CUDA {v} ({})", tk.source);
    // Entry -> whether as PTX too.
    let mut torch: BTreeMap<ComputeCapability, bool> = BTreeMap::new();
    let mut flashinfer = Vec::new();
    for &cap in distinct {
        match toolkit::best(cap, v) {
            toolkit::Build::Exact(c) => {
                torch.entry(c).or_insert(false);
                flashinfer.push(c);
                if c != cap {
                    notes.push(format!(
                        "{from} names the architecture of {cap} sm_{}: the arch lists say {c}",
                        c.digits()
                    ));
                }
            }
            toolkit::Build::Family(c) => {
                torch.entry(c).or_insert(false);
                notes.push(format!(
                    "{from} cannot build sm_{}: TORCH_CUDA_ARCH_LIST has {c} for {cap} (its SASS runs there), and FLASHINFER_CUDA_ARCH_LIST leaves {cap} out (FlashInfer builds arch-specific code, which runs only on its own architecture)",
                    cap.digits()
                ));
            }
            toolkit::Build::Ptx(c) => {
                *torch.entry(c).or_insert(true) = true;
                notes.push(format!(
                    "{from} cannot build for {cap} or its family: TORCH_CUDA_ARCH_LIST has {c}+PTX, which the driver JIT-compiles there, and FLASHINFER_CUDA_ARCH_LIST leaves {cap} out"
                ));
            }
            toolkit::Build::None => notes.push(format!(
                "{from} builds nothing that runs on {cap}: both arch lists leave it out"
            )),
        }
    }
    let torch: Vec<String> = torch
        .into_iter()
        .map(|(c, ptx)| {
            if ptx {
                format!("{c}+PTX")
            } else {
                c.to_string()
            }
        })
        .collect();
    flashinfer.sort();
    flashinfer.dedup();
    let flashinfer: Vec<String> = flashinfer.iter().map(ToString::to_string).collect();
    let some = |v: Vec<String>, sep: &str| (!v.is_empty()).then(|| v.join(sep));
    (some(torch, ";"), some(flashinfer, " "))
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

/// `FLASH_ATTN_CUDA_ARCHS` (flash-attn's build; `80;90`): per GPU the one
/// of [`FLASH_ATTN_ARCHS`] whose SASS runs there, which toolkit `tk` (when
/// known) builds. None, with a note, when a GPU has none: below 8.0
/// FlashAttention-2 does not run at all, and flash-attn's default (all
/// four) is left to say so.
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
        let fits = FLASH_ATTN_ARCHS
            .iter()
            .filter(|(a, _)| a.major == cap.major && a.minor <= cap.minor)
            .max_by_key(|(a, _)| *a);
        match (fits, tk) {
            (None, _) => {
                notes.push(format!(
                    "{var} not set: flash-attn builds sm_80, sm_90, sm_100 and sm_120 only, and none runs on {cap}"
                ));
                return None;
            }
            (Some((a, Some((ma, mi)))), Some(tk))
                if tk.version < crate::arch::CudaVersion::new(*ma, *mi) =>
            {
                notes.push(format!(
                    "{var} not set: flash-attn builds sm_{} for {cap} only with CUDA {ma}.{mi} or newer, and the container's is {}",
                    a.digits(),
                    tk.version
                ));
                return None;
            }
            (Some((a, _)), _) => {
                picked.insert(*a);
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

/// [`hints`], the arch lists built for toolkit `tk` when it is known, and
/// the notes that explain them. A list with no entry left is not set.
pub fn hints_for(
    caps: &[ComputeCapability],
    tk: Option<&Toolkit>,
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
    let (torch, flashinfer) = match tk.filter(|tk| tk.version >= toolkit::OLDEST) {
        Some(tk) => arch_lists(&distinct, tk, &mut notes),
        // No toolkit known (or one older than the table): each GPU's own
        // capability.
        None => {
            if let Some(tk) = tk {
                notes.push(format!(
                    "CUDA {} ({}) is older than gpuarch's table of toolkits (CUDA {} on): the arch lists name each GPU's own capability",
                    tk.version,
                    tk.source,
                    toolkit::OLDEST
                ));
            }
            (
                Some(join(&mut distinct.iter(), ";")),
                Some(join(&mut distinct.iter(), " ")),
            )
        }
    };
    for (var, list) in [
        (EnvVar::TorchCudaArchList, &torch),
        (EnvVar::FlashinferCudaArchList, &flashinfer),
    ] {
        if list.is_none() {
            notes.push(format!(
                "{var} not set: the container's toolkit builds for none of its GPUs"
            ));
        }
    }
    let flag = |f: Feature| if f.supported_on_all(caps) { "1" } else { "0" };
    let bf16 = Feature::Bf16.supported_on_all(caps);
    let min = distinct.first().copied().unwrap_or(caps[0]);
    let mut env = Vec::new();
    if let Some(t) = torch {
        env.push((EnvVar::TorchCudaArchList, t));
    }
    if let Some(f) = flashinfer {
        env.push((EnvVar::FlashinferCudaArchList, f));
    }
    if let Some(f) = flash_attn_archs(&distinct, tk, &mut notes) {
        env.push((EnvVar::FlashAttnCudaArchs, f));
    }
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
            if Feature::FlashAttention2.supported_on_all(caps) {
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

fn plan_selection(sel: Selection, view: &ContainerView, cfg: &EnvConfig) -> Plan {
    let Selection {
        source,
        gpus,
        mut notes,
    } = sel;
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
        };
    }
    notes.push(format!(
        "assigned from {src}, in CUDA order: {}",
        gpus.iter()
            .map(AssignedGpu::label)
            .collect::<Vec<_>>()
            .join(", ")
    ));

    let caps: Vec<ComputeCapability> = gpus.iter().map(|g| g.compute_capability).collect();
    let tk = toolkit::of_container(view, cfg.cuda_version, &mut notes);
    if let Some(tk) = &tk {
        notes.push(format!(
            "the container's toolkit: CUDA {} (from {}); arch lists are built for it",
            tk.version, tk.source
        ));
    }
    let (hinted, why_lists) = hints_for(&caps, tk.as_ref());
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
            EnvVar::AttnImplementation => {
                Some(feature_note(var, &value, Feature::FlashAttention2, &gpus))
            }
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
    Plan {
        source,
        gpus,
        env,
        notes,
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

    #[test]
    fn arch_lists_are_built_for_the_containers_own_toolkit() {
        let h = blackwell_host();
        let run = |env: &[(&str, &str)], cfg: &EnvConfig| {
            let p = plan(&ContainerView::with_env(env.to_vec()), &h, cfg);
            let get = |k: &str| p.env_get(k).map(str::to_owned);
            (
                get("TORCH_CUDA_ARCH_LIST"),
                get("FLASHINFER_CUDA_ARCH_LIST"),
                p.notes.join("\n"),
            )
        };
        // The case: GB10 under CUDA 12.8.
        let (torch, fi, notes) = run(
            &[("NVIDIA_VISIBLE_DEVICES", "0"), ("CUDA_VERSION", "12.8.1")],
            &cfg(),
        );
        assert_eq!(torch.as_deref(), Some("12.0"));
        assert_eq!(fi, None, "FlashInfer's 12.0a would not run on 12.1");
        assert!(
            notes.contains(
                "the container's toolkit: CUDA 12.8 (from CUDA_VERSION in the container)"
            ) && notes.contains("cannot build sm_121: TORCH_CUDA_ARCH_LIST has 12.0 for 12.1"),
            "{notes}"
        );
        assert!(
            notes.contains("FLASHINFER_CUDA_ARCH_LIST not set"),
            "{notes}"
        );
        // Unknown toolkit: today's exact output, and no toolkit note.
        let (torch, fi, notes) = run(&[("NVIDIA_VISIBLE_DEVICES", "0,1,2")], &cfg());
        assert_eq!(torch.as_deref(), Some("10.3;11.0;12.1"));
        assert_eq!(fi.as_deref(), Some("10.3 11.0 12.1"));
        assert!(!notes.contains("toolkit"), "{notes}");
        // 12.9: all exact but Thor, which it calls sm_101.
        let (torch, fi, _) = run(
            &[
                ("NVIDIA_VISIBLE_DEVICES", "0,1,2"),
                ("CUDA_VERSION", "12.9.0"),
            ],
            &cfg(),
        );
        assert_eq!(torch.as_deref(), Some("10.1;10.3;12.1"));
        assert_eq!(fi.as_deref(), Some("10.1 10.3 12.1"));
        // 12.8: B300 by sm_100 SASS; 12.6: Hopper's PTX for all three.
        let (torch, fi, _) = run(
            &[
                ("NVIDIA_VISIBLE_DEVICES", "0,1,2"),
                ("CUDA_VERSION", "12.8"),
            ],
            &cfg(),
        );
        assert_eq!(torch.as_deref(), Some("10.0;10.1;12.0"));
        assert_eq!(fi.as_deref(), Some("10.1"));
        let (torch, fi, notes) = run(
            &[
                ("NVIDIA_VISIBLE_DEVICES", "0,1,2"),
                ("NVIDIA_REQUIRE_CUDA", "cuda>=12.6 brand=tesla,driver>=470"),
            ],
            &cfg(),
        );
        assert_eq!(torch.as_deref(), Some("9.0+PTX"));
        assert_eq!(fi, None);
        assert!(
            notes.contains("9.0+PTX, which the driver JIT-compiles there"),
            "{notes}"
        );
        // CUDA 13 dropped Volta: left out, the rest kept; from the config.
        let with_default = EnvConfig {
            cuda_version: Some(crate::arch::CudaVersion::new(13, 0)),
            ..EnvConfig::default()
        };
        let (torch, fi, notes) = run(&[("NVIDIA_VISIBLE_DEVICES", "2,3")], &with_default);
        assert_eq!(torch.as_deref(), Some("11.0"));
        assert_eq!(fi.as_deref(), Some("11.0"));
        assert!(notes.contains("builds nothing that runs on 7.0"), "{notes}");
        assert!(
            notes.contains("from env.cuda_version in the config"),
            "{notes}"
        );
        let (torch, fi, notes) = run(&[("NVIDIA_VISIBLE_DEVICES", "3")], &with_default);
        assert_eq!((torch, fi), (None, None));
        assert!(notes.contains("TORCH_CUDA_ARCH_LIST not set"), "{notes}");
        // flash-attn's list: only when every GPU runs one of its four.
        let fa = |env: &[(&str, &str)]| {
            plan(&ContainerView::with_env(env.to_vec()), &h, &cfg())
                .env_get("FLASH_ATTN_CUDA_ARCHS")
                .map(str::to_owned)
        };
        assert_eq!(
            fa(&[("NVIDIA_VISIBLE_DEVICES", "0,1")]).as_deref(),
            Some("100;120")
        );
        assert_eq!(
            fa(&[("NVIDIA_VISIBLE_DEVICES", "2")]),
            None,
            "Thor: none of 80/90/100/120"
        );
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
        // The container's own list still wins.
        let (torch, _, _) = run(
            &[
                ("NVIDIA_VISIBLE_DEVICES", "0"),
                ("CUDA_VERSION", "12.8.1"),
                ("TORCH_CUDA_ARCH_LIST", "12.0+PTX"),
            ],
            &cfg(),
        );
        assert_eq!(torch, None);
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
