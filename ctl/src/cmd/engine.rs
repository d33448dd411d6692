//! `gpuarchctl engine containerd`: the drop-in that wires gpuarch into
//! containerd, printed or written (see [`crate::engine::containerd`]).
//!
//! `--write` leaves containerd reading the handler or fails: when the
//! config does not import the drop-in, the `imports` entry is added to it
//! (a backup first, the edit atomic, the owner and mode kept); when that
//! cannot be done it fails (status 2) with the exact edit to make.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::cli::ContainerdArgs;
use crate::engine::containerd;

pub fn containerd(json: bool, args: &ContainerdArgs, out: &mut String) -> Result<u8> {
    // The drop-in's path goes into containerd's imports, which containerd
    // 1.x resolves from `/`: a relative one is made absolute here.
    let mut args = args.clone();
    if let Some(w) = &args.write
        && w.is_relative()
    {
        args.write = Some(std::path::absolute(w)?);
    }
    let args = &args;
    let mut doc = serde_json::Map::new();
    let mut text = String::new();
    let code = containerd_into(args, &mut text, &mut doc)?;
    if json {
        crate::render::json(out, &doc)?;
    } else {
        out.push_str(&text);
    }
    Ok(code)
}

fn containerd_into(
    args: &ContainerdArgs,
    out: &mut String,
    doc: &mut serde_json::Map<String, serde_json::Value>,
) -> Result<u8> {
    use serde_json::Value;
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
    doc.insert("dropin".into(), Value::from(drop.text.clone()));
    doc.insert("handler".into(), Value::from(args.handler.clone()));
    doc.insert("imports_needed".into(), Value::from(drop.import.clone()));
    let Some(path) = &args.write else {
        out.push_str(&drop.text);
        if let Some(entry) = &drop.import {
            eprintln!(
                "gpuarchctl: containerd does not read {} yet: {} (--write does both)",
                target.display(),
                containerd::import_by_hand(&args.config, entry)
            );
        }
        return Ok(0);
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| dir.display().to_string())?;
    }
    gpuarch_fs::write_atomic(path, drop.text.as_bytes())
        .with_context(|| path.display().to_string())?;
    let _ = writeln!(out, "wrote {}", path.display());
    doc.insert("written".into(), Value::from(path.display().to_string()));
    if let Some(entry) = &drop.import {
        match import(&args.config, entry) {
            Ok(backup) => {
                doc.insert(
                    "imports_added_to".into(),
                    Value::from(args.config.display().to_string()),
                );
                doc.insert("backup".into(), Value::from(backup.display().to_string()));
                let _ = writeln!(
                    out,
                    "added \"{entry}\" to the imports of {} (the old file is {})",
                    args.config.display(),
                    backup.display()
                );
            }
            Err(e) => bail!(
                "wrote {}, but containerd does not read it: {} could not be edited ({e:#}).\n\
                 To finish by hand, {}",
                path.display(),
                args.config.display(),
                containerd::import_by_hand(&args.config, entry)
            ),
        }
    }
    // What containerd will load, read back as containerd reads it.
    let eff = containerd::effective(&args.root, &args.config, None)?;
    if let Some(problem) = eff.cri_problem() {
        bail!("containerd's CRI would not load: {problem}");
    }
    // The handler written, by the program it runs (whatever it is named).
    if eff.handler_binary(&args.handler).as_deref() != Some(&*args.runtime.to_string_lossy()) {
        bail!(
            "containerd still has no runtime handler {} after the edit (a later import overrides it?)",
            args.handler
        );
    }
    let next = format!(
        "restart containerd, then give pods runtimeClassName: {}",
        args.handler
    );
    let _ = writeln!(out, "{next}");
    doc.insert("next".into(), Value::from(next));
    Ok(0)
}

/// Add `entry` to `main`'s imports; the old file is kept beside it first.
fn import(main: &Path, entry: &str) -> Result<PathBuf> {
    let text = std::fs::read_to_string(main)?;
    let edited = containerd::add_import(&text, entry)?;
    let backup = backup_name(main)?;
    gpuarch_fs::write_atomic_like(&backup, text.as_bytes(), main)
        .with_context(|| format!("backup {}", backup.display()))?;
    gpuarch_fs::rewrite_atomic(main, edited.as_bytes())?;
    Ok(backup)
}

/// `config.toml.before-gpuarch`, or the first free `….N`: an older backup
/// is never overwritten.
fn backup_name(main: &Path) -> Result<PathBuf> {
    let base = format!("{}.before-gpuarch", main.display());
    std::iter::once(PathBuf::from(&base))
        .chain((1..100).map(|n| PathBuf::from(format!("{base}.{n}"))))
        .find(|p| std::fs::symlink_metadata(p).is_err())
        .with_context(|| format!("{base}.1 to .99 all exist"))
}

/// `gpuarchctl engine docker`: `daemon.json` with the runtime merged in,
/// printed, or written in place (`--write`).
pub fn docker(json: bool, args: &crate::cli::DockerArgs, out: &mut String) -> Result<u8> {
    use serde_json::{Value, json};
    let path = &args.config;
    let (old, exists) = match std::fs::read(path) {
        Ok(b) => (b, true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (b"{}".to_vec(), false),
        Err(e) => bail!("{}: {e}", path.display()),
    };
    let mut doc: Value = serde_json::from_slice(&old).with_context(|| {
        format!(
            "{} is not JSON (dockerd refuses to start with it too); correct it first",
            path.display()
        )
    })?;
    let before = doc.clone();
    let Some(top) = doc.as_object_mut() else {
        bail!("{}: a JSON object is what dockerd reads", path.display());
    };
    let runtime = args.runtime.display().to_string();
    let runtimes = top.entry("runtimes").or_insert_with(|| json!({}));
    let Some(runtimes) = runtimes.as_object_mut() else {
        bail!("{}: \"runtimes\" is not an object", path.display());
    };
    // Other keys of an existing entry (runtimeArgs) are kept.
    let entry = runtimes
        .entry(args.name.clone())
        .or_insert_with(|| json!({}));
    let Some(entry) = entry.as_object_mut() else {
        bail!(
            "{}: runtimes.{} is not an object",
            path.display(),
            args.name
        );
    };
    entry.insert("path".into(), Value::from(runtime.clone()));
    if args.default {
        top.insert("default-runtime".into(), Value::from(args.name.clone()));
    }
    let changed = !exists || before != doc;
    let text = format!("{}\n", serde_json::to_string_pretty(&doc)?);
    let restart = "systemctl restart docker";
    let usage = if args.default {
        "every container is planned".to_owned()
    } else {
        format!("docker run --runtime {} ...", args.name)
    };
    let mut report = serde_json::Map::new();
    report.insert("config".into(), Value::from(path.display().to_string()));
    report.insert("runtime".into(), Value::from(args.name.clone()));
    report.insert("changed".into(), Value::from(changed));
    if !args.write {
        report.insert("daemon_json".into(), doc.clone());
        if json {
            crate::render::json(out, &report)?;
        } else {
            out.push_str(&text);
        }
        return Ok(0);
    }
    if changed {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| dir.display().to_string())?;
        }
        if exists {
            let backup = backup_name(path)?;
            gpuarch_fs::write_atomic_like(&backup, &old, path)
                .with_context(|| format!("backup {}", backup.display()))?;
            gpuarch_fs::rewrite_atomic(path, text.as_bytes())
                .with_context(|| path.display().to_string())?;
            report.insert("backup".into(), Value::from(backup.display().to_string()));
        } else {
            gpuarch_fs::write_atomic(path, text.as_bytes())
                .with_context(|| path.display().to_string())?;
        }
        // What dockerd will read, read back.
        let back: Value = serde_json::from_slice(&std::fs::read(path)?)
            .with_context(|| format!("{} as written", path.display()))?;
        if back["runtimes"][&args.name]["path"].as_str() != Some(runtime.as_str())
            || (args.default && back["default-runtime"].as_str() != Some(args.name.as_str()))
        {
            bail!(
                "{} does not say runtime {} runs {runtime} after the edit",
                path.display(),
                args.name
            );
        }
        report.insert(
            "next".into(),
            Value::from(format!("{restart}, then {usage}")),
        );
    }
    if json {
        crate::render::json(out, &report)?;
        return Ok(0);
    }
    if !changed {
        let _ = writeln!(
            out,
            "{} already has runtime {} running {runtime}{}; nothing written",
            path.display(),
            args.name,
            if args.default { " as the default" } else { "" }
        );
        return Ok(0);
    }
    let _ = writeln!(
        out,
        "wrote {}: runtime {} runs {runtime}{}{}",
        path.display(),
        args.name,
        if args.default {
            ", the default runtime"
        } else {
            ""
        },
        report
            .get("backup")
            .and_then(Value::as_str)
            .map(|b| format!(" (the old file is {b})"))
            .unwrap_or_default()
    );
    let _ = writeln!(
        out,
        "{restart} (dockerd reads daemon.json only at its start), then {usage}"
    );
    Ok(0)
}
