//! `gpuarchctl engine containerd`: the drop-in that wires gpuarch into
//! containerd, printed or written (see [`crate::containerd`]).

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context, Result};

use crate::cli::ContainerdArgs;
use crate::containerd;

pub fn containerd(args: &ContainerdArgs, out: &mut String) -> Result<u8> {
    let target = args
        .write
        .clone()
        .unwrap_or_else(|| PathBuf::from(containerd::DROPIN));
    let drop = containerd::containerd_dropin(
        &args.root,
        &args.config,
        &args.runtime,
        &args.handler,
        &target,
    )?;
    for n in &drop.notes {
        eprintln!("gpuarchctl: {n}");
    }
    match &args.write {
        None => out.push_str(&drop.text),
        Some(path) => {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).with_context(|| dir.display().to_string())?;
            }
            gpuarch_fs::write_atomic(path, drop.text.as_bytes())
                .with_context(|| path.display().to_string())?;
            let _ = writeln!(
                out,
                "wrote {}; restart containerd, then give pods runtimeClassName: {}",
                path.display(),
                args.handler
            );
        }
    }
    Ok(0)
}
