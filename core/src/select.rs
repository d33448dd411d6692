//! Which GPUs a container was given.
//!
//! Sources, first match wins:
//! 1. CDI requests in annotations (`cdi.k8s.io/*` = `nvidia.com/gpu=0,...`);
//! 2. `linux.devices` entries `/dev/nvidiaN` (N is the NVML minor number);
//! 3. `NVIDIA_VISIBLE_DEVICES`.
//!
//! The GPUs a source names are what the container can see; CUDA enumerates
//! them in PCI bus order (gpuarch sets `CUDA_DEVICE_ORDER=PCI_BUS_ID`), and
//! `CUDA_VISIBLE_DEVICES`, if set, then narrows and reorders that list the way
//! the CUDA runtime does: indexes relative to the visible list or UUID
//! prefixes, stopping at the first entry that names no visible GPU.
//!
//! Nothing here panics on what a container's owner wrote: every entry that
//! names no GPU of the host becomes a note.

use serde::Serialize;

use crate::arch::ComputeCapability;
use crate::oci::ContainerView;
use crate::snapshot::{Device, Snapshot};

/// Where the assignment came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    Cdi,
    DeviceNodes,
    NvidiaVisibleDevices,
    /// An explicit list from a caller (`gpuarchctl plan --devices`, D-Bus `Plan`).
    Request,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Source::Cdi => "CDI annotations",
            Source::DeviceNodes => "/dev/nvidiaN device nodes",
            Source::NvidiaVisibleDevices => "NVIDIA_VISIBLE_DEVICES",
            Source::Request => "the requested device list",
        })
    }
}

/// One GPU (or MIG device) a container was given.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AssignedGpu {
    /// NVML index of the physical GPU.
    pub index: u32,
    /// MIG device index on that GPU, for a MIG device.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mig: Option<u32>,
    /// `GPU-...`, or `MIG-...` for a MIG device.
    pub uuid: String,
    pub name: String,
    pub compute_capability: ComputeCapability,
    pub pci_bus_id: String,
}

impl AssignedGpu {
    fn whole(d: &Device) -> Self {
        Self {
            index: d.index,
            mig: None,
            uuid: d.uuid.clone(),
            name: d.name.clone(),
            compute_capability: d.compute_capability,
            pci_bus_id: d.pci_bus_id.clone(),
        }
    }

    /// `GPU 1 (NVIDIA GeForce RTX 3090, 8.6)` or `MIG 0:1 (..., 8.0)`.
    pub fn label(&self) -> String {
        match self.mig {
            None => format!(
                "GPU {} ({}, {})",
                self.index, self.name, self.compute_capability
            ),
            Some(m) => format!(
                "MIG {}:{} ({}, {})",
                self.index, m, self.name, self.compute_capability
            ),
        }
    }
}

/// The outcome of selection: the GPUs in CUDA order and why.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selection {
    /// The source that decided, or `None` when the container asked for no GPU.
    pub source: Option<Source>,
    pub gpus: Vec<AssignedGpu>,
    pub notes: Vec<String>,
    /// Each device name of the request that names no GPU of this host (also
    /// in `notes`): what `strict: true` refuses to start a container over.
    pub unresolved: Vec<String>,
}

/// Entries longer than this are shortened in notes.
const NOTE_TOKEN_MAX: usize = 80;

/// A token as it appears in a note: quoted, shortened, control characters escaped.
fn shown(token: &str) -> String {
    let mut s: String = token.chars().take(NOTE_TOKEN_MAX).collect();
    if s.len() < token.len() {
        s.push_str("...");
    }
    format!("{:?}", s)
}

/// Why a device name names no device of this host. Names are shown quoted
/// and cut to a readable length.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceNameError {
    #[error("empty device name")]
    Empty,
    #[error("{0} holds a comma: give one device per entry")]
    Comma(String),
    #[error("no GPU with index {index} on this host ({known})")]
    NoIndex { index: u32, known: String },
    #[error("{0} is not a MIG device name (GPU:MIG)")]
    NotMig(String),
    #[error("GPU {0} has no MIG devices (MIG is not enabled)")]
    MigOff(u32),
    #[error("GPU {gpu} has no MIG device {mig}")]
    NoMig { gpu: u32, mig: u32 },
    #[error("no GPU with UUID {0} on this host")]
    NoGpuUuid(String),
    #[error("no MIG device with UUID {0} on this host")]
    NoMigUuid(String),
    #[error("{0} is not an index, a UUID, GPU:MIG or 'all'")]
    Unreadable(String),
}

/// Resolve one device name as NVIDIA's tools spell them: `all`, an index,
/// `N:M` (MIG device M of GPU N), `GPU-<uuid>` or `MIG-<uuid>`.
fn resolve(token: &str, inv: &Snapshot) -> Result<Vec<AssignedGpu>, DeviceNameError> {
    let t = token.trim();
    if t == "all" {
        return Ok(inv.devices.iter().map(AssignedGpu::whole).collect());
    }
    let indexes = || {
        let mut v: Vec<u32> = inv.devices.iter().map(|d| d.index).collect();
        v.sort_unstable();
        match v.as_slice() {
            [] => "this host has no GPU".to_owned(),
            v => format!(
                "indexes here: {}",
                v.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
            ),
        }
    };
    if let Ok(i) = t.parse::<u32>()
        && t.bytes().all(|b| b.is_ascii_digit())
    {
        return inv
            .device_by_index(i)
            .map(|d| vec![AssignedGpu::whole(d)])
            .ok_or_else(|| DeviceNameError::NoIndex {
                index: i,
                known: indexes(),
            });
    }
    if let Some((g, m)) = t.split_once(':') {
        let (Ok(g), Ok(m)) = (g.parse::<u32>(), m.parse::<u32>()) else {
            return Err(DeviceNameError::NotMig(shown(t)));
        };
        let d = inv
            .device_by_index(g)
            .ok_or_else(|| DeviceNameError::NoIndex {
                index: g,
                known: indexes(),
            })?;
        let mig = d
            .mig
            .iter()
            .find(|x| x.index == m)
            .ok_or(if d.mig.is_empty() {
                DeviceNameError::MigOff(g)
            } else {
                DeviceNameError::NoMig { gpu: g, mig: m }
            })?;
        return Ok(vec![mig_gpu(d, mig)]);
    }
    if t.starts_with("GPU-") {
        return inv
            .devices
            .iter()
            .find(|d| d.uuid == t)
            .map(|d| vec![AssignedGpu::whole(d)])
            .ok_or_else(|| DeviceNameError::NoGpuUuid(shown(t)));
    }
    if t.starts_with("MIG-") {
        for d in &inv.devices {
            if let Some(m) = d.mig.iter().find(|m| m.uuid == t) {
                return Ok(vec![mig_gpu(d, m)]);
            }
        }
        return Err(DeviceNameError::NoMigUuid(shown(t)));
    }
    Err(DeviceNameError::Unreadable(shown(t)))
}

fn mig_gpu(d: &Device, m: &crate::snapshot::MigDevice) -> AssignedGpu {
    AssignedGpu {
        index: d.index,
        mig: Some(m.index),
        uuid: m.uuid.clone(),
        name: m.name.clone(),
        compute_capability: d.compute_capability,
        pci_bus_id: d.pci_bus_id.clone(),
    }
}

/// Add resolved GPUs, dropping ones already present.
fn extend_distinct(into: &mut Vec<AssignedGpu>, more: Vec<AssignedGpu>) {
    for g in more {
        if !into.iter().any(|x| x.uuid == g.uuid) {
            into.push(g);
        }
    }
}

/// Resolve a comma-separated list of device names, noting each that fails.
fn resolve_list(
    list: &str,
    what: &str,
    inv: &Snapshot,
    gpus: &mut Vec<AssignedGpu>,
    notes: &mut Notes,
) {
    for token in list.split(',') {
        if token.trim().is_empty() {
            continue;
        }
        match resolve(token, inv) {
            Ok(found) => extend_distinct(gpus, found),
            Err(why) => notes.unresolved(format!("{what} entry {}: {why}", shown(token.trim()))),
        }
    }
}

/// A selection's notes, and which of them are device names that name no
/// GPU here.
#[derive(Default)]
struct Notes {
    notes: Vec<String>,
    unresolved: Vec<String>,
}

impl Notes {
    fn push(&mut self, note: String) {
        self.notes.push(note);
    }

    fn unresolved(&mut self, why: String) {
        self.notes.push(format!("{why}; ignored"));
        self.unresolved.push(why);
    }
}

/// Select the GPUs of a container from its config and the host inventory.
pub fn select(view: &ContainerView, inv: &Snapshot) -> Selection {
    let mut notes = Notes::default();
    let mut gpus = Vec::new();
    let source = select_source(view, inv, &mut gpus, &mut notes);
    finish(source, gpus, notes, view)
}

/// Select GPUs from an explicit list (`0,1`, UUIDs, `N:M`, `all`), as a
/// scheduler asks "what would a container on these GPUs get?".
pub fn select_request(list: &str, view: &ContainerView, inv: &Snapshot) -> Selection {
    let mut notes = Notes::default();
    let mut gpus = Vec::new();
    resolve_list(list, "requested device", inv, &mut gpus, &mut notes);
    finish(Some(Source::Request), gpus, notes, view)
}

/// Check one entry of an explicit device list strictly: it must name a
/// device of this host (`all`, an index, `N:M`, a GPU or MIG UUID). For
/// callers such as the D-Bus `Plan`, where a wrong name is the caller's
/// mistake to be told about, not a note to skip past.
pub fn check_request_entry(entry: &str, inv: &Snapshot) -> Result<(), DeviceNameError> {
    resolve_entry(entry, inv).map(|_| ())
}

/// The devices one strict entry names ([`check_request_entry`]).
fn resolve_entry(entry: &str, inv: &Snapshot) -> Result<Vec<AssignedGpu>, DeviceNameError> {
    let t = entry.trim();
    if t.is_empty() {
        return Err(DeviceNameError::Empty);
    }
    if t.contains(',') {
        return Err(DeviceNameError::Comma(shown(t)));
    }
    resolve(t, inv)
}

/// Select GPUs from device names each of which must name a device of this
/// host ([`check_request_entry`]): the devices resolved once, in CUDA
/// order; or the first entry that names none, and why.
pub fn select_devices<'a>(
    devices: &[&'a str],
    inv: &Snapshot,
) -> Result<Selection, (&'a str, DeviceNameError)> {
    let mut gpus = Vec::new();
    for d in devices {
        extend_distinct(&mut gpus, resolve_entry(d, inv).map_err(|e| (*d, e))?);
    }
    Ok(finish(
        Some(Source::Request),
        gpus,
        Notes::default(),
        &ContainerView::default(),
    ))
}

/// The character major of /dev/nvidiaN, nvidiactl and nvidia-modeset.
const NVIDIA_MAJOR: u32 = 195;

fn select_source(
    view: &ContainerView,
    inv: &Snapshot,
    gpus: &mut Vec<AssignedGpu>,
    notes: &mut Notes,
) -> Option<Source> {
    // 1. CDI annotations.
    let mut cdi = false;
    for (key, value) in &view.annotations {
        if !key.starts_with("cdi.k8s.io/") {
            continue;
        }
        for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            match name.split_once('=') {
                Some(("nvidia.com/gpu", dev)) => {
                    cdi = true;
                    match resolve(dev, inv) {
                        Ok(found) => extend_distinct(gpus, found),
                        Err(why) => notes.unresolved(format!(
                            "CDI device {} (annotation {}): {why}",
                            shown(name),
                            shown(key)
                        )),
                    }
                }
                _ => notes.push(format!(
                    "CDI device {} (annotation {}) is not an nvidia.com/gpu device; ignored",
                    shown(name),
                    shown(key)
                )),
            }
        }
    }
    if cdi {
        return Some(Source::Cdi);
    }

    // 2. /dev/nvidiaN device nodes: by their real number where the config
    // gives it (NVIDIA's major is 195; 254 and 255 are nvidia-modeset and
    // nvidiactl), else by the number in the path.
    let mut nodes = false;
    for node in &view.devices {
        let minor = match node.char_number {
            Some((NVIDIA_MAJOR, m)) if m < 254 => m,
            Some(_) => continue, // nvidiactl, nvidia-uvm, nvidia-caps, other devices
            None => {
                let Some(n) = node.path.strip_prefix("/dev/nvidia") else {
                    continue;
                };
                if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
                    continue; // nvidiactl, nvidia-uvm, nvidia-caps/...
                }
                match n.parse::<u32>() {
                    Ok(m) => m,
                    Err(_) => {
                        nodes = true;
                        notes.unresolved(format!(
                            "device node {}: no GPU with that minor number on this host",
                            shown(&node.path)
                        ));
                        continue;
                    }
                }
            }
        };
        nodes = true;
        match inv.device_by_minor(minor) {
            Some(d) => extend_distinct(gpus, vec![AssignedGpu::whole(d)]),
            None => notes.unresolved(format!(
                "device node {} (minor {minor}): no GPU with minor number {minor} on this host",
                shown(&node.path)
            )),
        }
    }
    if nodes {
        return Some(Source::DeviceNodes);
    }

    // 3. NVIDIA_VISIBLE_DEVICES.
    let nvd = view.env_get("NVIDIA_VISIBLE_DEVICES")?;
    match nvd.trim() {
        "" | "void" => notes.push(format!(
            "NVIDIA_VISIBLE_DEVICES={}: the NVIDIA runtime treats this as no GPU request",
            shown(nvd)
        )),
        "none" => {
            notes.push("NVIDIA_VISIBLE_DEVICES=none: driver libraries only, no GPU".to_owned())
        }
        list => resolve_list(list, "NVIDIA_VISIBLE_DEVICES", inv, gpus, notes),
    }
    Some(Source::NvidiaVisibleDevices)
}

fn finish(
    source: Option<Source>,
    mut gpus: Vec<AssignedGpu>,
    notes: Notes,
    view: &ContainerView,
) -> Selection {
    let Notes {
        mut notes,
        mut unresolved,
    } = notes;
    cap(&mut unresolved, "device names like these");
    // What the container can see, in the order CUDA enumerates it.
    gpus.sort_by(|a, b| (&a.pci_bus_id, a.mig).cmp(&(&b.pci_bus_id, b.mig)));
    if !gpus.is_empty()
        && let Some(cvd) = view.env_get("CUDA_VISIBLE_DEVICES")
    {
        gpus = narrow(&gpus, cvd, &mut notes);
    }
    cap(&mut notes, "notes like these, not shown");
    Selection {
        source,
        gpus,
        notes,
        unresolved,
    }
}

/// Most notes a selection keeps: a container listing thousands of bad
/// device names gets a log of a few lines, not one line per name.
pub const MAX_NOTES: usize = 16;

/// Keep at most [`MAX_NOTES`] of `lines`, the last saying how many more
/// `like` these were left out.
fn cap(lines: &mut Vec<String>, like: &str) {
    if lines.len() > MAX_NOTES {
        let more = lines.len() - (MAX_NOTES - 1);
        lines.truncate(MAX_NOTES - 1);
        lines.push(format!("... and {more} more {like}"));
    }
}

/// Apply `CUDA_VISIBLE_DEVICES` to the visible list as the CUDA runtime does.
fn narrow(visible: &[AssignedGpu], cvd: &str, notes: &mut Vec<String>) -> Vec<AssignedGpu> {
    let mut out: Vec<AssignedGpu> = Vec::new();
    if cvd.trim().is_empty() {
        notes.push("CUDA_VISIBLE_DEVICES is empty: CUDA sees no GPU".to_owned());
        return out;
    }
    for token in cvd.split(',').map(str::trim) {
        let found = if let Ok(i) = token.parse::<i64>() {
            usize::try_from(i)
                .ok()
                .and_then(|i| visible.get(i))
                .ok_or_else(|| {
                    format!(
                        "index {i} is not among the container's {} visible GPU(s)",
                        visible.len()
                    )
                })
        } else if token.starts_with("GPU-") || token.starts_with("MIG-") {
            let matches: Vec<&AssignedGpu> = visible
                .iter()
                .filter(|g| g.uuid.starts_with(token))
                .collect();
            match matches.as_slice() {
                [one] => Ok(*one),
                [] => Err("names no GPU visible to the container".to_owned()),
                _ => Err("is a prefix of more than one visible GPU's UUID".to_owned()),
            }
        } else {
            Err("is not an index or a UUID".to_owned())
        };
        match found {
            Ok(g) if out.iter().any(|x| x.uuid == g.uuid) => notes.push(format!(
                "CUDA_VISIBLE_DEVICES entry {} repeats {}; ignored",
                shown(token),
                g.label()
            )),
            Ok(g) => out.push(g.clone()),
            Err(why) => {
                notes.push(format!(
                    "CUDA_VISIBLE_DEVICES entry {}: {why}; CUDA ignores it and every entry after it",
                    shown(token)
                ));
                break;
            }
        }
    }
    if out.is_empty() {
        notes.push("CUDA_VISIBLE_DEVICES leaves CUDA no GPU".to_owned());
    }
    out
}

#[cfg(test)]
pub(crate) mod tests;
