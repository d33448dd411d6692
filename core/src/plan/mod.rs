//! The Plan: what a container gets, and why. Here: the Plan, where the
//! GPUs come from, and the image's requirements; the values of the
//! consumers' variables for those GPUs, toolkit and software are made in
//! `hints`.

mod hints;

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

use crate::arch::ComputeCapability;
use crate::config::EnvConfig;
pub use crate::env::EnvVar;
use crate::features::Feature;
use crate::nvrequire;
use crate::oci::{ContainerView, Names};
use crate::select::{self, AssignedGpu, Selection, Source};
use crate::snapshot::Snapshot;
use crate::toolkit;

use hints::{attn_note, feature_note, software_note};
pub use hints::{hints, hints_for};

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
    #[error("device {name:?}: {error}")]
    Unknown {
        name: String,
        error: select::DeviceNameError,
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
    plan_devices_for(devices, &ContainerView::default(), inv, cfg)
}

/// [`plan_devices`] for the process of `view`, its env and what its
/// environments hold: a Slurm task's, whose GPUs Slurm lists.
pub fn plan_devices_for(
    devices: &[&str],
    view: &ContainerView,
    inv: &Snapshot,
    cfg: &EnvConfig,
) -> Result<Plan, DeviceListError> {
    if devices.len() > MAX_PLAN_DEVICES {
        return Err(DeviceListError::TooMany(devices.len()));
    }
    if let Some(d) = devices.iter().find(|d| d.len() > MAX_DEVICE_NAME) {
        return Err(DeviceListError::TooLong(d.len()));
    }
    // Each name resolved once, and what it resolved to planned: nothing
    // joined into a list to be parsed again.
    let selection =
        select::select_devices(devices, inv).map_err(|(name, error)| DeviceListError::Unknown {
            name: name.to_owned(),
            error,
        })?;
    Ok(plan_with(view, inv, cfg, || selection))
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
            EnvVar::AttnImplementation => Some(attn_note(&value, &gpus, &sw)),
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
mod tests;
