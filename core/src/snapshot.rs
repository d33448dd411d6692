//! The inventory snapshot, schema 1: what the daemon writes to
//! `/run/gpuarch/inventory.json`, what the hook and the CLI read, and what the
//! fake NVML serves as a topology in tests.

use serde::{Deserialize, Serialize};

use crate::arch::ComputeCapability;

/// The schema this build reads and writes.
pub const SCHEMA: u32 = 1;

/// Snapshots larger than this are refused before parsing.
pub const MAX_BYTES: usize = 16 << 20;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Snapshot {
    pub schema: u32,
    /// Where the data came from: `nvml`, or a file's path.
    pub source: String,
    /// RFC 3339 UTC time the inventory was read.
    pub generated_at: String,
    pub driver_version: String,
    /// CUDA version the driver supports, `MAJOR.MINOR`.
    pub cuda_driver_version: String,
    /// True when the last refresh failed and this is the last good inventory.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stale: bool,
    pub devices: Vec<Device>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Device {
    /// NVML index (PCI bus order on every current driver).
    pub index: u32,
    /// Minor number: the N of `/dev/nvidiaN`.
    pub minor: u32,
    pub uuid: String,
    pub name: String,
    pub compute_capability: ComputeCapability,
    pub pci_bus_id: String,
    pub memory_bytes: u64,
    /// NVML's brand, as `nvmlBrandType_t` names it without `NVML_BRAND_`,
    /// lowercased (`tesla`, `geforce`, `nvidia_rtx`, ...); absent where
    /// NVML did not say. Images' `brand=` requirements are checked on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub brand: Option<String>,
    /// MIG devices, when MIG is enabled; empty otherwise.
    #[serde(default)]
    pub mig: Vec<MigDevice>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigDevice {
    /// MIG device index on its parent: the M of `N:M` in `NVIDIA_VISIBLE_DEVICES`.
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub memory_bytes: u64,
}

/// Why a snapshot could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("snapshot is {size} bytes, over the limit of {MAX_BYTES}")]
    TooLarge { size: usize },
    #[error("snapshot is not valid JSON at line {line}, column {column}: {reason}")]
    Syntax {
        line: usize,
        column: usize,
        reason: String,
    },
    #[error(
        "snapshot has schema {found}; this gpuarch reads schema {SCHEMA} (upgrade gpuarch to read it)"
    )]
    FutureSchema { found: u64 },
    #[error("snapshot has no usable \"schema\" field (expected {SCHEMA})")]
    NoSchema,
    #[error("snapshot field error at line {line}, column {column}: {reason}")]
    Field {
        line: usize,
        column: usize,
        reason: String,
    },
    #[error("snapshot is inconsistent: {0}")]
    Inconsistent(String),
}

impl Snapshot {
    /// Parse and check a snapshot: size, JSON syntax, schema, fields, and that
    /// indexes, minors and UUIDs are unique.
    pub fn from_json(bytes: &[u8]) -> Result<Self, SnapshotError> {
        if bytes.len() > MAX_BYTES {
            return Err(SnapshotError::TooLarge { size: bytes.len() });
        }
        // Read the schema first so a future snapshot is reported as such,
        // not as a list of unknown fields.
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| SnapshotError::Syntax {
                line: e.line(),
                column: e.column(),
                reason: e.to_string(),
            })?;
        match value.get("schema").and_then(serde_json::Value::as_u64) {
            Some(s) if s == u64::from(SCHEMA) => {}
            Some(s) if s > u64::from(SCHEMA) => {
                return Err(SnapshotError::FutureSchema { found: s });
            }
            _ => return Err(SnapshotError::NoSchema),
        }
        let snap: Snapshot = serde_json::from_slice(bytes).map_err(|e| SnapshotError::Field {
            line: e.line(),
            column: e.column(),
            reason: e.to_string(),
        })?;
        snap.check()?;
        Ok(snap)
    }

    pub fn to_json_pretty(&self) -> String {
        // Serialising plain structs of strings and numbers cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    fn check(&self) -> Result<(), SnapshotError> {
        let mut seen = std::collections::HashSet::new();
        for d in &self.devices {
            if !seen.insert(("index", d.index.to_string())) {
                return Err(SnapshotError::Inconsistent(format!(
                    "device index {} appears twice",
                    d.index
                )));
            }
            if !seen.insert(("minor", d.minor.to_string())) {
                return Err(SnapshotError::Inconsistent(format!(
                    "minor number {} appears twice",
                    d.minor
                )));
            }
            let uuids = std::iter::once(&d.uuid).chain(d.mig.iter().map(|m| &m.uuid));
            for u in uuids {
                if !seen.insert(("uuid", u.clone())) {
                    return Err(SnapshotError::Inconsistent(format!(
                        "UUID {u} appears twice"
                    )));
                }
            }
            let mut mig_idx = std::collections::HashSet::new();
            for m in &d.mig {
                if !mig_idx.insert(m.index) {
                    return Err(SnapshotError::Inconsistent(format!(
                        "MIG index {} appears twice on device {}",
                        m.index, d.index
                    )));
                }
            }
        }
        Ok(())
    }

    pub fn device_by_index(&self, index: u32) -> Option<&Device> {
        self.devices.iter().find(|d| d.index == index)
    }

    pub fn device_by_minor(&self, minor: u32) -> Option<&Device> {
        self.devices.iter().find(|d| d.minor == minor)
    }
}

/// A snapshot of `tests/fixtures/<name>.json`, for unit tests.
#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) fn fixture(name: &str) -> Snapshot {
    let path = format!(
        "{}/../tests/fixtures/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    Snapshot::from_json(&std::fs::read(path).unwrap()).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{"schema": 1, "source": "nvml", "generated_at": "2026-11-21T12:00:00Z",
 "driver_version": "580.95.05", "cuda_driver_version": "13.0",
 "devices": [
  {"index": 0, "minor": 0, "uuid": "GPU-1a2b", "name": "NVIDIA GeForce RTX 2080 Ti",
   "compute_capability": "7.5", "pci_bus_id": "00000000:01:00.0",
   "memory_bytes": 11811160064, "mig": []}]}"#;

    #[test]
    fn the_design_example_parses_and_round_trips() {
        let s = Snapshot::from_json(GOOD.as_bytes()).unwrap();
        assert_eq!(
            s.devices[0].compute_capability,
            ComputeCapability::new(7, 5)
        );
        assert!(!s.stale);
        let again = Snapshot::from_json(s.to_json_pretty().as_bytes()).unwrap();
        assert_eq!(s, again);
        assert!(!s.to_json_pretty().contains("stale"));
    }

    #[test]
    fn errors_say_what_and_where() {
        let e = Snapshot::from_json(b"{\"schema\": 1,\n \"devices\": [").unwrap_err();
        assert!(matches!(e, SnapshotError::Syntax { line: 2, .. }), "{e}");

        let future = GOOD.replace("\"schema\": 1", "\"schema\": 2");
        let e = Snapshot::from_json(future.as_bytes()).unwrap_err();
        assert!(e.to_string().contains("schema 2"), "{e}");

        let bad_cc = GOOD.replace("\"7.5\"", "\"7.x\"");
        let e = Snapshot::from_json(bad_cc.as_bytes())
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 5") && e.contains("'7.x'"), "{e}");

        let typo = GOOD.replace("\"minor\"", "\"minro\"");
        let e = Snapshot::from_json(typo.as_bytes())
            .unwrap_err()
            .to_string();
        assert!(e.contains("minro"), "{e}");

        let e = Snapshot::from_json(b"{\"devices\": []}").unwrap_err();
        assert!(matches!(e, SnapshotError::NoSchema));

        let big = vec![b' '; MAX_BYTES + 1];
        assert!(matches!(
            Snapshot::from_json(&big),
            Err(SnapshotError::TooLarge { .. })
        ));
    }

    #[test]
    fn duplicate_identities_are_refused() {
        let mut s = Snapshot::from_json(GOOD.as_bytes()).unwrap();
        let mut d = s.devices[0].clone();
        d.index = 1;
        d.minor = 1;
        s.devices.push(d);
        let e = Snapshot::from_json(s.to_json_pretty().as_bytes()).unwrap_err();
        assert!(e.to_string().contains("GPU-1a2b appears twice"), "{e}");
    }
}
