//! Kubernetes node labels for Node Feature Discovery's local source: the
//! file gpuarchd keeps in `features.d` (config `export.nfd`).
//!
//! NFD reads `name[=value]` lines (`#` starts a comment, a file over 64 KiB
//! is refused, dot-files are ignored) and turns each into a node label;
//! every name here is under `gpuarch.io/` and every label is valid by
//! Kubernetes' rules ([`check_label`]).

use std::collections::BTreeMap;

use crate::features::Feature;
use crate::snapshot::Snapshot;

/// The label prefix.
pub const PREFIX: &str = "gpuarch.io/";

/// NFD's limit on a feature file.
pub const MAX_FILE_BYTES: usize = 64 << 10;

/// The node's labels, sorted: the GPU count, the count per architecture
/// (`gpuarch.io/sm_86.count=1`), the lowest and highest capability (as
/// `7.5`, and as the integer `75` for node affinity's `Gt`/`Lt`), whether
/// the GPUs are of more than one architecture, and per feature whether
/// every GPU has it (`gpuarch.io/bf16.all=true`). No GPU: the count alone.
pub fn labels(inv: &Snapshot) -> Vec<(String, String)> {
    let mut out = BTreeMap::new();
    let caps: Vec<_> = inv.devices.iter().map(|d| d.compute_capability).collect();
    out.insert(format!("{PREFIX}gpu.count"), caps.len().to_string());
    let mut per_arch: BTreeMap<String, usize> = BTreeMap::new();
    for c in &caps {
        *per_arch.entry(format!("sm_{}", c.digits())).or_default() += 1;
    }
    for (arch, n) in &per_arch {
        out.insert(format!("{PREFIX}{arch}.count"), n.to_string());
    }
    if let (Some(min), Some(max)) = (caps.iter().min(), caps.iter().max()) {
        out.insert(format!("{PREFIX}compute-capability.min"), min.to_string());
        out.insert(format!("{PREFIX}compute-capability.max"), max.to_string());
        // Node affinity's Gt and Lt compare integers only ("8.6" never
        // matches them): the same bounds as sm numbers, 75 < 86 < 100 < 121.
        out.insert(format!("{PREFIX}sm.min"), min.digits());
        out.insert(format!("{PREFIX}sm.max"), max.digits());
        out.insert(
            format!("{PREFIX}arch.mixed"),
            (per_arch.len() > 1).to_string(),
        );
        for f in Feature::ALL {
            out.insert(
                format!("{PREFIX}{}.all", f.name()),
                f.supported_on_all(&caps).to_string(),
            );
        }
    }
    out.into_iter().collect()
}

/// The feature file's first line: a comment (not an NFD `# +` directive)
/// that also marks the file as gpuarchd's, the only kind it removes.
pub const HEADER: &str =
    "# Written by gpuarchd from the GPU inventory (export.nfd); replaced on change.\n";

/// The feature file: [`HEADER`], then `name=value` lines.
pub fn render(labels: &[(String, String)]) -> String {
    let mut s = String::from(HEADER);
    for (k, v) in labels {
        s.push_str(&format!("{k}={v}\n"));
    }
    s
}

/// A label Kubernetes would refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    #[error("label prefix {0:?} is not a DNS subdomain")]
    Prefix(String),
    #[error("label name {0:?} is not valid")]
    Name(String),
    #[error("label value {value:?} of {name} is not valid")]
    Value { name: String, value: String },
}

/// Why `name=value` is not a valid Kubernetes label, if it is not: a
/// prefix that is a DNS subdomain (at most 253), a name of 1 to 63
/// characters, alphanumeric at both ends with `-`, `_` and `.` between, and
/// a value empty or of the name's form.
pub fn check_label(name: &str, value: &str) -> Result<(), LabelError> {
    let (prefix, short) = match name.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, name),
    };
    if let Some(p) = prefix {
        let ok = !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|part| {
                !part.is_empty()
                    && part.len() <= 63
                    && part
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !part.starts_with('-')
                    && !part.ends_with('-')
            });
        if !ok {
            return Err(LabelError::Prefix(p.to_owned()));
        }
    }
    let segment = |s: &str| {
        s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
    };
    if short.is_empty() || !segment(short) {
        return Err(LabelError::Name(short.to_owned()));
    }
    if !value.is_empty() && !segment(value) {
        return Err(LabelError::Value {
            name: name.to_owned(),
            value: value.to_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::snapshot::fixture;

    #[test]
    fn a_mixed_node_is_labelled_by_arch_and_by_what_every_gpu_has() {
        let l: BTreeMap<String, String> = labels(&fixture("2080ti-3090")).into_iter().collect();
        let get = |k: &str| l.get(&format!("{PREFIX}{k}")).map(String::as_str);
        assert_eq!(get("gpu.count"), Some("2"));
        assert_eq!(get("sm_75.count"), Some("1"));
        assert_eq!(get("sm_86.count"), Some("1"));
        assert_eq!(get("compute-capability.min"), Some("7.5"));
        assert_eq!(get("compute-capability.max"), Some("8.6"));
        assert_eq!(get("sm.min"), Some("75"));
        assert_eq!(get("sm.max"), Some("86"));
        assert_eq!(get("arch.mixed"), Some("true"));
        assert_eq!(get("bf16.all"), Some("false"));
        assert_eq!(get("flashinfer.all"), Some("true"));
    }

    #[test]
    fn every_fixtures_labels_are_valid_and_the_file_fits() {
        let mut bounds = Vec::new();
        for name in [
            "2080ti-3090",
            "a100-h100",
            "8xh100",
            "4090-5090",
            "a100-mig",
            "t4",
            "blackwell-mix",
            "thor-cuda12",
        ] {
            let l = labels(&fixture(name));
            for (k, v) in &l {
                assert!(k.starts_with(PREFIX), "{k}");
                check_label(k, v).unwrap_or_else(|e| panic!("{name}: {e}"));
            }
            // Gt/Lt parse both sides as integers; the order is the
            // capabilities' order.
            let m: BTreeMap<_, _> = l.iter().cloned().collect();
            let int = |k: &str| m[&format!("{PREFIX}{k}")].parse::<i64>().unwrap();
            let cc = |k: &str| {
                m[&format!("{PREFIX}{k}")]
                    .parse::<crate::arch::ComputeCapability>()
                    .unwrap()
            };
            for b in ["min", "max"] {
                bounds.push((
                    cc(&format!("compute-capability.{b}")),
                    int(&format!("sm.{b}")),
                ));
            }
            let text = render(&l);
            assert!(text.len() < MAX_FILE_BYTES);
            for line in text.lines().filter(|l| !l.starts_with('#')) {
                assert!(
                    line.split_once('=').is_some_and(|(k, _)| !k.is_empty()),
                    "{line}"
                );
            }
        }
        // Across every fixture, from 7.5 to 12.x: integer order is
        // capability order.
        bounds.sort();
        assert!(bounds.windows(2).all(|w| w[0].1 <= w[1].1), "{bounds:?}");
        assert!(bounds.first().unwrap().0 < bounds.last().unwrap().0);
        let mut none = fixture("t4");
        none.devices.clear();
        assert_eq!(
            labels(&none),
            [(format!("{PREFIX}gpu.count"), "0".to_owned())]
        );
    }

    #[test]
    fn the_validator_refuses_what_kubernetes_refuses() {
        assert!(check_label("gpuarch.io/sm_86.count", "1").is_ok());
        assert!(check_label("gpuarch.io/x", "").is_ok());
        for (k, v) in [
            ("gpuarch.io/", "1"),
            ("Gpuarch.io/x", "1"),
            ("gpuarch.io/-x", "1"),
            ("gpuarch.io/x", "a b"),
            ("gpuarch.io/x", "7.5;8.6"),
            ("gpuarch.io/x", ".5"),
        ] {
            assert!(check_label(k, v).is_err(), "{k}={v}");
        }
        assert!(check_label(&format!("gpuarch.io/{}", "a".repeat(64)), "1").is_err());
    }
}
