//! `io.gpuarch1.Inventory`: the GPUs of this node and what they can run,
//! open to everyone.

use std::sync::Arc;

use gpuarch_core::snapshot::Snapshot;
use gpuarch_core::{plan, requirement};
use gpuarch_wire::dbus::{DeviceRecord, Env};
use zbus::message::Header;
use zbus::object_server::SignalEmitter;
use zbus::{fdo, interface};

use super::admission::{Admission, READ_WORK, blocking};
use super::usec;
use crate::state::Shared;

fn no_inventory(shared: &Shared) -> fdo::Error {
    let why = shared
        .inventory()
        .last_error
        .unwrap_or_else(|| "the first NVML read has not finished".to_owned());
    fdo::Error::Failed(format!(
        "no GPU inventory yet: NVML has not answered since gpuarchd started ({why})"
    ))
}

fn current(shared: &Shared) -> fdo::Result<Arc<Snapshot>> {
    shared.snapshot().ok_or_else(|| no_inventory(shared))
}

/// `io.gpuarch1.Inventory`.
#[derive(Debug)]
pub struct Inventory {
    pub shared: Arc<Shared>,
}

/// The GPUs of this node and what they can run.
#[interface(name = "io.gpuarch1.Inventory", spawn = false)]
impl Inventory {
    /// One dictionary per GPU, in index order: index (u), minor (u), uuid,
    /// name, compute_capability ("8.6"), arch ("Ampere", "" if unknown),
    /// pci_bus_id, memory_bytes (t), features (as: bf16, tf32, fp8,
    /// flash_attention_2, flash_attention_3, flashinfer), mig (aa{sv}:
    /// index, uuid, name, memory_bytes), brand (NVML's, as `tesla`; absent
    /// where NVML does not say).
    #[zbus(out_args("devices"))]
    fn list_devices(&self) -> fdo::Result<Vec<DeviceRecord>> {
        Ok(current(&self.shared)?
            .devices
            .iter()
            .map(DeviceRecord::from)
            .collect())
    }

    /// What a container on these GPUs gets: the variables gpuarch would
    /// inject and one note per decision. Devices as NVIDIA_VISIBLE_DEVICES
    /// names them, one per entry: "0", "GPU-<uuid>", "0:1", "MIG-<uuid>",
    /// "all". An entry naming no device here is an InvalidArgs error, as
    /// are more than 1024 entries or one longer than 256 bytes.
    #[zbus(out_args("env", "notes"))]
    // The return type is written out: the macro makes a tuple's members
    // separate out args (`a{ss}` env, `as` notes), an alias one struct.
    fn plan(&self, devices: Vec<&str>) -> fdo::Result<(Env, Vec<String>)> {
        let snap = current(&self.shared)?;
        let p = plan::plan_devices(&devices, &snap, &self.shared.config().env)
            .map_err(|e| fdo::Error::InvalidArgs(e.to_string()))?;
        Ok((p.env.into_iter().collect(), p.notes))
    }

    /// Whether the image runs on these GPUs, from the audit gpuarchd keeps
    /// of it (audit.dir; made at the image's first start on this node):
    /// `image` is a name the engine gave it (CRI's image reference or
    /// name) or its key; devices as for Plan. A JSON report: image, key,
    /// runs (false when a GPU cannot run one of its binaries), binaries,
    /// stopped, and per GPU the binaries it cannot run and those it runs
    /// only by PTX JIT. FileNotFound when this node has no audit of it;
    /// InvalidArgs for an image over 1024 bytes or devices as Plan refuses
    /// them; LimitsExceeded as for ListKernels.
    #[zbus(out_args("report"))]
    async fn audit_image(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        image: &str,
        devices: Vec<&str>,
    ) -> fdo::Result<String> {
        if image.len() > 1024 {
            return Err(fdo::Error::InvalidArgs(format!(
                "AuditImage: an image of {} bytes (at most 1024)",
                image.len()
            )));
        }
        let snap = current(&self.shared)?;
        let plan = plan::plan_devices(&devices, &snap, &self.shared.config().env)
            .map_err(|e| fdo::Error::InvalidArgs(e.to_string()))?;
        let _admitted = Admission::take(Some(&hdr), "AuditImage")?;
        let cfg = self.shared.config().audit.clone();
        let name = image.to_owned();
        let found = blocking(&READ_WORK, move || {
            gpuarch_container::audit::find(&cfg, &name)
        })
        .await?
        .map_err(|e| fdo::Error::Failed(e.to_string()))?;
        let Some((key, audit)) = found else {
            return Err(fdo::Error::FileNotFound(format!(
                "AuditImage: no audit of {image} on this node (an image is audited at its first start here)"
            )));
        };
        let driver = gpuarch_core::arch::CudaVersion::parse(&snap.cuda_driver_version).ok();
        Ok(gpuarch_container::audit::report(image, &key, &audit, &plan, driver).to_string())
    }

    /// gres.conf lines for this node: one "Name=gpu Type=sm_XY
    /// File=/dev/nvidiaN" per GPU in minor order, after comments with the
    /// node's slurm.conf Gres= and Features=. Failed for a node with MIG.
    #[zbus(out_args("gres_conf"))]
    fn slurm_gres(&self) -> fdo::Result<String> {
        let snap = current(&self.shared)?;
        let node = gpuarch_core::slurm::short_name(
            &nix::unistd::gethostname()
                .map(|h| h.to_string_lossy().into_owned())
                .unwrap_or_default(),
        );
        gpuarch_core::slurm::gres_conf(&snap, &node).map_err(|e| fdo::Error::Failed(e.to_string()))
    }

    /// Plan for a Slurm job step: `gpus` as SLURM_STEP_GPUS says them
    /// (indices in gres.conf order, which gpuarch writes in minor order;
    /// "0,2-3"). An index the node has not is an InvalidArgs error, as is
    /// a list longer than 4096 bytes.
    #[zbus(out_args("env", "notes"))]
    fn slurm_plan(&self, gpus: &str) -> fdo::Result<(Env, Vec<String>)> {
        // parse_list refuses a list over 4 KiB before reading it.
        let snap = current(&self.shared)?;
        let p = gpuarch_core::slurm::plan(gpus, &snap, &self.shared.config().env)
            .map_err(|e| fdo::Error::InvalidArgs(e.to_string()))?;
        Ok((p.env.into_iter().collect(), p.notes))
    }

    /// UUIDs of the GPUs meeting every comma-joined term of the requirement:
    /// arch>=X.Y, arch>X.Y, arch<=X.Y, arch<X.Y, arch=X.Y, arch!=X.Y,
    /// feature=NAME. A bad term is an InvalidArgs error naming it; so is a
    /// requirement longer than 4096 bytes.
    #[zbus(name = "Match", out_args("uuids"))]
    fn match_devices(&self, requirement: &str) -> fdo::Result<Vec<String>> {
        let snap = current(&self.shared)?;
        requirement::match_uuids(requirement, &snap)
            .map_err(|e| fdo::Error::InvalidArgs(e.to_string()))
    }

    /// Compute capability of each GPU, in index order.
    #[zbus(property)]
    fn compute_capabilities(&self) -> Vec<String> {
        self.shared.snapshot().map_or_else(Vec::new, |s| {
            s.devices
                .iter()
                .map(|d| d.compute_capability.to_string())
                .collect()
        })
    }

    /// The NVIDIA driver's version ("" before the first NVML read).
    #[zbus(property)]
    fn driver_version(&self) -> String {
        self.shared
            .snapshot()
            .map(|s| s.driver_version.clone())
            .unwrap_or_default()
    }

    /// The CUDA version the driver supports, MAJOR.MINOR.
    #[zbus(property)]
    fn cuda_driver_version(&self) -> String {
        self.shared
            .snapshot()
            .map(|s| s.cuda_driver_version.clone())
            .unwrap_or_default()
    }

    /// True while the last refresh failed and the inventory served is the
    /// last good one.
    #[zbus(property)]
    fn stale(&self) -> bool {
        self.shared.snapshot().is_some_and(|s| s.stale)
    }

    /// What the inventory served was read from: "nvml" ("" before the first
    /// read).
    #[zbus(property)]
    fn source(&self) -> String {
        self.shared
            .snapshot()
            .map(|s| s.source.clone())
            .unwrap_or_default()
    }

    /// When the inventory served was read and last changed (RFC 3339).
    #[zbus(property)]
    fn generated_at(&self) -> String {
        self.shared
            .snapshot()
            .map(|s| s.generated_at.clone())
            .unwrap_or_default()
    }

    /// When NVML last answered, in microseconds since the epoch (0: never).
    #[zbus(property(emits_changed_signal = "false"))]
    fn last_refresh(&self) -> u64 {
        usec(self.shared.inventory().last_success)
    }

    /// Why the last refresh failed ("" when it succeeded).
    #[zbus(property)]
    fn last_error(&self) -> String {
        self.shared.inventory().last_error.unwrap_or_default()
    }

    /// The NVML library gpuarchd loads, as it was named: `--nvml-lib`,
    /// else `GPUARCH_NVML_LIB`, else `libnvidia-ml.so.1`.
    #[zbus(property(emits_changed_signal = "const"))]
    fn nvml_library(&self) -> String {
        self.shared.nvml_library.clone()
    }

    /// The set of GPUs or their properties changed.
    #[zbus(signal)]
    pub async fn devices_changed(emitter: &SignalEmitter<'_>) -> zbus::Result<()>;
}
