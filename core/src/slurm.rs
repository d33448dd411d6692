//! Slurm: gres.conf lines typed by architecture, and the GPUs of a job step
//! as Slurm numbers them.
//!
//! Slurm numbers a node's GPUs by their place in gres.conf (what
//! `SLURM_STEP_GPUS`, `SLURM_JOB_GPUS` and its `CUDA_VISIBLE_DEVICES` say),
//! not by the N of `/dev/nvidiaN`. gpuarch writes gres.conf in minor order,
//! so Slurm's index i is the GPU with the i-th smallest minor number.

use std::collections::BTreeMap;

use crate::config::EnvConfig;
use crate::features::Feature;
use crate::oci::ContainerView;
use crate::plan::Plan;
use crate::snapshot::{Device, Snapshot};

/// Why gres.conf lines cannot be given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlurmError {
    #[error("no GPU in the inventory: nothing for gres.conf")]
    NoGpu,
    #[error(
        "GPU {index} ({name}) has MIG enabled: Slurm schedules MIG devices only through its NVML autodetection \
         (gres.conf AutoDetect=nvml, Slurm built with NVML), whose types are MIG profiles, not architectures; \
         gpuarchctl slurm gres writes no lines for a node with MIG (disable MIG, or use AutoDetect=nvml)"
    )]
    Mig { index: u32, name: String },
    #[error("Slurm GPU index {index} on a node of {count} GPU(s)")]
    NoSuchIndex { index: u32, count: usize },
    #[error("{0:?} is not a Slurm GPU list (comma-separated indices or ranges: 0,2-3)")]
    BadList(String),
    #[error("a Slurm GPU list of {len} bytes: at most {max} are taken")]
    TooLong { len: usize, max: usize },
    #[error(transparent)]
    Devices(#[from] crate::plan::DeviceListError),
}

/// The node's GPUs in Slurm's order: by minor number.
pub fn slurm_order(inv: &Snapshot) -> Vec<&Device> {
    let mut d: Vec<&Device> = inv.devices.iter().collect();
    d.sort_by_key(|d| d.minor);
    d
}

/// A GPU's gres type: `sm_86`.
pub fn gres_type(d: &Device) -> String {
    format!("sm_{}", d.compute_capability.digits())
}

/// gres.conf for the node: one `Name=gpu Type=sm_XY File=/dev/nvidiaN`
/// line per GPU in minor order, after a comment with the node's slurm.conf
/// `Gres=` and `Features=` (each architecture, and each feature every GPU
/// has). `node` names the node in that comment.
pub fn gres_conf(inv: &Snapshot, node: &str) -> Result<String, SlurmError> {
    if inv.devices.is_empty() {
        return Err(SlurmError::NoGpu);
    }
    if let Some(d) = inv.devices.iter().find(|d| !d.mig.is_empty()) {
        return Err(SlurmError::Mig {
            index: d.index,
            name: d.name.clone(),
        });
    }
    let order = slurm_order(inv);
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for d in &order {
        *counts.entry(gres_type(d)).or_default() += 1;
    }
    let gres: Vec<String> = counts.iter().map(|(t, n)| format!("gpu:{t}:{n}")).collect();
    let caps: Vec<_> = order.iter().map(|d| d.compute_capability).collect();
    let mut features: Vec<String> = counts.keys().cloned().collect();
    features.extend(
        Feature::ALL
            .into_iter()
            .filter(|f| f.supported_on_all(&caps))
            .map(|f| f.name().to_owned()),
    );
    let mut out = format!(
        "# gres.conf for {node}, written by gpuarchctl slurm gres from the GPU inventory.\n\
         # Slurm numbers GPUs by their place here: keep the lines in minor order.\n\
         # slurm.conf: NodeName={node} Gres={} Features={}\n",
        gres.join(","),
        features.join(",")
    );
    for d in &order {
        out.push_str(&format!(
            "Name=gpu Type={} File=/dev/nvidia{}\n",
            gres_type(d),
            d.minor
        ));
    }
    Ok(out)
}

/// The node's name as Slurm takes it by default: the host name up to its
/// first dot (`localhost` for none).
pub fn short_name(hostname: &str) -> String {
    match hostname.split('.').next() {
        Some(n) if !n.is_empty() => n.to_owned(),
        _ => "localhost".to_owned(),
    }
}

/// The longest GPU list taken: a node's 1,024 GPUs written one by one
/// (`0,1,...,1023`) are 4,010 bytes. Anything longer is refused before it
/// is read, so a caller's cost is bounded by this, not by the bus's 32 MiB.
pub const MAX_LIST_BYTES: usize = 4096;
/// The most indices a list may name, counting repeats and every index of
/// a range: far above any node's GPUs, and a bound on the work.
pub const MAX_LIST_INDICES: usize = 4096;

/// Slurm's GPU list (`0,2-3`) as indices, in the order given, repeats
/// dropped. Linear in its length, which is at most [`MAX_LIST_BYTES`].
pub fn parse_list(list: &str) -> Result<Vec<u32>, SlurmError> {
    if list.len() > MAX_LIST_BYTES {
        return Err(SlurmError::TooLong {
            len: list.len(),
            max: MAX_LIST_BYTES,
        });
    }
    let bad = || SlurmError::BadList(list.chars().take(64).collect());
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut named = 0usize;
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a, b),
            None => (part, part),
        };
        let (a, b): (u32, u32) = (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
        if b < a || b - a > 1024 {
            return Err(bad());
        }
        named += (b - a) as usize + 1;
        if named > MAX_LIST_INDICES {
            return Err(bad());
        }
        for i in a..=b {
            if seen.insert(i) {
                out.push(i);
            }
        }
        if out.len() > 1024 {
            return Err(bad());
        }
    }
    Ok(out)
}

/// The UUIDs of the GPUs Slurm numbers `indices` (see [`slurm_order`]).
pub fn uuids(inv: &Snapshot, indices: &[u32]) -> Result<Vec<String>, SlurmError> {
    let order = slurm_order(inv);
    indices
        .iter()
        .map(|&i| {
            order
                .get(i as usize)
                .map(|d| d.uuid.clone())
                .ok_or(SlurmError::NoSuchIndex {
                    index: i,
                    count: order.len(),
                })
        })
        .collect()
}

/// The Plan of a job step given Slurm's GPU list (`SLURM_STEP_GPUS`):
/// each index through [`uuids`] to its GPU.
pub fn plan(list: &str, inv: &Snapshot, cfg: &EnvConfig) -> Result<Plan, SlurmError> {
    plan_for(list, &ContainerView::default(), inv, cfg)
}

/// [`plan`] for the task of `view`: its env, and what its Python
/// environments hold.
pub fn plan_for(
    list: &str,
    view: &ContainerView,
    inv: &Snapshot,
    cfg: &EnvConfig,
) -> Result<Plan, SlurmError> {
    let indices = parse_list(list)?;
    let ids = uuids(inv, &indices)?;
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    Ok(crate::plan::plan_devices_for(&ids, view, inv, cfg)?)
}

/// Whether `NAME=value` can be a TaskProlog `export` line as it is: Slurm
/// takes the rest of the line, unquoted, as the value.
pub fn prolog_safe(name: &str, value: &str) -> bool {
    !name.is_empty()
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !value.contains(['\n', '\r', '\0'])
        && value.trim() == value
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::snapshot::fixture;

    #[test]
    fn gres_lines_are_typed_by_arch_in_minor_order() {
        let mut inv = fixture("2080ti-3090");
        let conf = gres_conf(&inv, "gpu1").unwrap();
        let lines: Vec<&str> = conf.lines().filter(|l| !l.starts_with('#')).collect();
        // Slurm numbers them by minor number, whatever NVML says.
        let by_minor = slurm_order(&inv);
        assert_eq!(
            lines,
            by_minor
                .iter()
                .map(|d| format!("Name=gpu Type={} File=/dev/nvidia{}", gres_type(d), d.minor))
                .collect::<Vec<_>>()
        );
        assert!(conf.contains("# slurm.conf: NodeName=gpu1 Gres=gpu:sm_75:1,gpu:sm_86:1 Features=sm_75,sm_86,flashinfer\n"), "{conf}");
        // Every GPU with bf16: the feature is the node's.
        inv.devices
            .retain(|d| d.compute_capability.to_string() == "8.6");
        let conf = gres_conf(&inv, "n").unwrap();
        assert!(
            conf.contains(
                "Gres=gpu:sm_86:1 Features=sm_86,bf16,tf32,flash_attention_2,flashinfer\n"
            ),
            "{conf}"
        );
        let e = gres_conf(&fixture("a100-mig"), "n").unwrap_err();
        assert!(e.to_string().contains("MIG enabled"), "{e}");
        inv.devices.clear();
        assert_eq!(gres_conf(&inv, "n"), Err(SlurmError::NoGpu));
    }

    #[test]
    fn slurm_indices_are_places_in_minor_order() {
        let inv = fixture("2080ti-3090");
        let order = slurm_order(&inv);
        assert_eq!(uuids(&inv, &[1]).unwrap(), [order[1].uuid.clone()]);
        assert_eq!(uuids(&inv, &[0, 1]).unwrap().len(), 2);
        assert!(matches!(
            uuids(&inv, &[2]),
            Err(SlurmError::NoSuchIndex { index: 2, count: 2 })
        ));
        assert_eq!(parse_list("0,2-3").unwrap(), [0, 2, 3]);
        assert_eq!(parse_list("1,1").unwrap(), [1]);
        assert_eq!(parse_list("").unwrap(), Vec::<u32>::new());
        for bad in ["a", "3-1", "0-99999", "1;2", "-1"] {
            assert!(parse_list(bad).is_err(), "{bad}");
        }
        let all: Vec<String> = (0..1024).map(|i| i.to_string()).collect();
        assert_eq!(parse_list(&all.join(",")).unwrap().len(), 1024);
        // The list that made the old parser quadratic: ranges of 1,025
        // named again and again. Refused by its count, not parsed.
        let ranges = vec!["0-1024"; 500].join(",");
        assert!(ranges.len() < MAX_LIST_BYTES);
        assert!(parse_list(&ranges).is_err());
        let huge = "0,".repeat(16 << 20);
        let t = std::time::Instant::now();
        let e = parse_list(&huge).unwrap_err();
        assert!(
            t.elapsed() < std::time::Duration::from_millis(10),
            "{:?}",
            t.elapsed()
        );
        assert_eq!(
            e.to_string(),
            format!(
                "a Slurm GPU list of {} bytes: at most 4096 are taken",
                32 << 20
            )
        );
    }

    #[test]
    fn a_steps_plan_is_its_gpus() {
        let inv = fixture("2080ti-3090");
        let cfg = EnvConfig::default();
        let p = plan("1", &inv, &cfg).unwrap();
        assert_eq!(p.env_get("TORCH_CUDA_ARCH_LIST"), Some("8.6"));
        assert_eq!(p.env_get("GPUARCH_DTYPE"), Some("bfloat16"));
        let p = plan("0,1", &inv, &cfg).unwrap();
        assert_eq!(p.env_get("TORCH_CUDA_ARCH_LIST"), Some("7.5;8.6"));
        assert!(plan("", &inv, &cfg).unwrap().is_noop());
        assert!(
            plan("7", &inv, &cfg)
                .unwrap_err()
                .to_string()
                .contains("index 7")
        );
    }

    #[test]
    fn prolog_lines_need_no_quoting() {
        assert!(prolog_safe("TORCH_CUDA_ARCH_LIST", "7.5;8.6"));
        assert!(!prolog_safe("X", "a\nexport Y=1"));
        assert!(!prolog_safe("X", " padded"));
        assert!(!prolog_safe("X-Y", "1"));
    }
}
