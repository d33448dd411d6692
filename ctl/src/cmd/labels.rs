//! `gpuarchctl labels`: this node's Kubernetes labels, as gpuarchd's
//! `export.nfd` keeps them for Node Feature Discovery.

use anyhow::Result;
use serde_json::json;

use crate::source::Source;

/// The NFD feature file's text, or with `json` the labels as an object.
pub fn run(json: bool, source: &Source, out: &mut String) -> Result<u8> {
    let (inv, _) = source.inventory()?;
    let labels = gpuarch_core::nfd::labels(&inv);
    if json {
        let map: serde_json::Map<_, _> = labels.into_iter().map(|(k, v)| (k, v.into())).collect();
        out.push_str(&serde_json::to_string_pretty(&json!({ "labels": map }))?);
        out.push('\n');
    } else {
        out.push_str(&gpuarch_core::nfd::render(&labels));
    }
    Ok(0)
}
