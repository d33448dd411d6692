//! The one edit of an OCI config ([`edit`]): the Plan's env, the kernel
//! mounts, and a `createContainer` entry when something must run inside;
//! [`precreate`] wraps it for podman's hooks.d stage.

use gpuarch_core::oci::{self, ContainerView};
use gpuarch_core::plan::{self, Plan};
use gpuarch_core::software::Software;
use serde_json::{Value, json};

use std::path::Path;

use crate::audit;
use crate::context::Context;
use crate::image;
use crate::jit;
use crate::kernels;
use crate::library;
use crate::rootfs::Root;
use crate::stage;

#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error(transparent)]
    Oci(#[from] oci::OciError),
    #[error("OCI config has {0}")]
    Shape(&'static str),
    #[error("cannot encode the OCI config: {0}")]
    Encode(serde_json::Error),
    /// What `strict: true` refuses a start over (the Plan's `blocking`).
    #[error("{0}")]
    Refused(String),
    /// What `audit.refuse` refuses a start over, strict or not: a binary
    /// in the image that an assigned GPU cannot run.
    #[error("{0}")]
    AuditRefused(String),
}

impl HookError {
    /// Whether the start must fail whatever `strict` says.
    pub fn refuses(&self) -> bool {
        matches!(self, Self::AuditRefused(_))
    }
}

impl From<serde_json::Error> for HookError {
    fn from(e: serde_json::Error) -> Self {
        Self::Encode(e)
    }
}

/// The `createContainer` entry that runs gpuarch-hook inside the
/// container; `None` without a hook path.
fn hook_entry(ctx: &Context) -> Option<Value> {
    let path = ctx.hook_path.as_ref()?;
    // OCI timeouts are whole seconds; leave the hook its own budget.
    let timeout = ctx.config.hook.timeout_ms.div_ceil(1000) + 1;
    Some(json!({
        "path": path,
        "args": ["gpuarch-hook", stage::CREATE_CONTAINER],
        "env": ctx.hook_env,
        "timeout": timeout,
    }))
}

/// Set the Plan's env in `process.env`. An entry of the same name is
/// replaced: the Plan holds a variable the container sets only when the
/// config says to override it. Nothing else in the config is touched.
pub fn apply_env(config: &mut Value, plan: &Plan) -> Result<(), HookError> {
    if plan.env.is_empty() {
        return Ok(());
    }
    let process = config
        .as_object_mut()
        .ok_or(HookError::Shape("no top-level object"))?
        .get_mut("process")
        .and_then(Value::as_object_mut)
        .ok_or(HookError::Shape("no \"process\" object; cannot add env"))?;
    let env = process
        .entry("env")
        .or_insert_with(|| Value::Array(Vec::new()))
        .as_array_mut()
        .ok_or(HookError::Shape("a \"process.env\" that is not a list"))?;
    let ours: std::collections::HashSet<&str> = plan.env.iter().map(|(k, _)| k.as_str()).collect();
    env.retain(|e| {
        e.as_str()
            .and_then(|s| s.split_once('='))
            .is_none_or(|(name, _)| !ours.contains(name))
    });
    env.extend(
        plan.env
            .iter()
            .map(|(k, v)| Value::String(format!("{k}={v}"))),
    );
    Ok(())
}

/// The list at `config[key]`, created empty when absent.
fn list_at<'a>(config: &'a mut Value, key: &str) -> Result<&'a mut Vec<Value>, HookError> {
    config
        .as_object_mut()
        .ok_or(HookError::Shape("no top-level object"))?
        .entry(key)
        .or_insert_with(|| Value::Array(Vec::new()))
        .as_array_mut()
        .ok_or(HookError::Shape("a list field that is not a list"))
}

/// Whether hook entry `e` is ours: gpuarch-hook's createContainer stage.
fn is_ours(e: &Value) -> bool {
    e.get("args")
        .and_then(Value::as_array)
        .is_some_and(|a| a.iter().any(|x| x == stage::CREATE_CONTAINER))
        && e.get("path")
            .and_then(Value::as_str)
            .is_some_and(|p| p.ends_with("gpuarch-hook"))
}

/// Add our `createContainer` hook entry unless one is there already.
fn apply_hook(config: &mut Value, entry: Value) -> Result<(), HookError> {
    let hooks = config
        .as_object_mut()
        .ok_or(HookError::Shape("no top-level object"))?
        .entry("hooks")
        .or_insert_with(|| json!({}));
    let list = list_at(hooks, "createContainer")
        .map_err(|_| HookError::Shape("a \"hooks\" that is not an object of lists"))?;
    if !list.iter().any(is_ours) {
        list.push(entry);
    }
    Ok(())
}

/// Plan the container of `config` and apply the Plan: env, kernel mounts,
/// and a `createContainer` entry when mounted libraries need ldconfig.
/// Returns the Plan; a no-op Plan leaves `config` untouched.
pub fn edit(config: &mut Value, ctx: &Context) -> Result<Plan, HookError> {
    edit_in(config, ctx, None)
}

/// Where [`edit_with`] finds the image's consumers.
pub enum Image<'a> {
    /// The config's `root.path`, a relative one under this bundle.
    Rootfs(Option<&'a Path>),
    /// Read by the caller for the container's process (gpuarchd's NRI
    /// path, from the image's layers).
    Read(&'a dyn Fn(&ContainerView) -> Read),
}

/// What a caller's read of the image gives ([`Image::Read`]).
#[derive(Debug, Default)]
pub struct Read {
    /// What the image holds for the container's process.
    pub software: Software,
    /// What could not be read, for the Plan's notes.
    pub notes: Vec<String>,
    /// Where the image's audit would read it from, where it can be read.
    pub source: Option<audit::Source>,
}

impl std::fmt::Debug for Image<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Rootfs(b) => f.debug_tuple("Rootfs").field(b).finish(),
            Self::Read(_) => f.write_str("Read"),
        }
    }
}

/// [`edit`] for a config whose relative `root.path` is relative to
/// `bundle`.
pub fn edit_in(
    config: &mut Value,
    ctx: &Context,
    bundle: Option<&Path>,
) -> Result<Plan, HookError> {
    edit_with(config, ctx, Image::Rootfs(bundle))
}

/// What one container gets, made once per start and applied by each way
/// in: the Plan (its env, notes, the mounts it lists), the mounts to add,
/// and the `createContainer` entry to add, if any. [`apply`] writes it
/// into an OCI config; gpuarchd's NRI plugin turns it into an adjustment.
#[derive(Debug, Clone)]
pub struct Edit {
    pub plan: Plan,
    /// OCI mount entries to append, in order.
    pub mounts: Vec<Value>,
    /// The `createContainer` hook entry to add (none is there yet).
    pub create_container: Option<Value>,
}

/// [`edit`], the image's consumers found as `image` says. The image is
/// read only for a container that gets a Plan.
pub fn edit_with(config: &mut Value, ctx: &Context, image: Image<'_>) -> Result<Plan, HookError> {
    let e = make(config, ctx, image)?;
    apply(config, &e)?;
    Ok(e.plan)
}

/// Write `e` into `config`: the mounts, the Plan's env, the hook entry. A
/// no-op Plan leaves `config` untouched.
pub fn apply(config: &mut Value, e: &Edit) -> Result<(), HookError> {
    if e.plan.is_noop() {
        return Ok(());
    }
    if !e.mounts.is_empty() {
        list_at(config, "mounts")?.extend(e.mounts.iter().cloned());
    }
    apply_env(config, &e.plan)?;
    if let Some(entry) = &e.create_container {
        apply_hook(config, entry.clone())?;
    }
    Ok(())
}

/// What the container of `config` gets ([`Edit`]); `config` is only read.
pub fn make(config: &Value, ctx: &Context, image: Image<'_>) -> Result<Edit, HookError> {
    let mut view = ContainerView::from_value(config)?;
    let mut plan = plan::plan(&view, &ctx.inventory, &ctx.config.env);
    ctx.refuse_if_strict(&plan)
        .map_err(|r| HookError::Refused(r.0))?;
    let mut e = Edit {
        plan: Plan::default(),
        mounts: Vec::new(),
        create_container: None,
    };
    if plan.is_noop() {
        e.plan = plan;
        return Ok(e);
    }
    let (read, source) = match image {
        // A config with a relative root and no bundle, or a rootfs not
        // there yet, has no image to read.
        Image::Rootfs(bundle) => {
            let rootfs = image::rootfs_of(config, bundle);
            let read = rootfs
                .as_deref()
                .and_then(|r| Root::open(r).ok())
                .map(|root| image::read(&root, &view, Some(&ctx.config.hook.image_cache)));
            (read, rootfs.map(audit::Source::Rootfs))
        }
        Image::Read(read) => {
            let r = read(&view);
            (Some((r.software, r.notes)), r.source)
        }
    };
    if let Some((software, notes)) = read {
        view.software = software;
        plan = plan::plan(&view, &ctx.inventory, &ctx.config.env);
        plan.notes.extend(notes);
    }
    let driver = gpuarch_core::arch::CudaVersion::parse(&ctx.inventory.cuda_driver_version).ok();
    let judged = audit::at_start(&ctx.config.audit, &plan, &view, source.as_ref(), driver);
    plan.notes.extend(judged.notes);
    if let Some(why) = judged.refuse {
        return Err(HookError::AuditRefused(why));
    }
    let (kernels, notes) = kernels::discover(
        &ctx.config.kernels,
        &plan,
        &ctx.inventory.cuda_driver_version,
    );
    plan.notes.extend(notes);
    // The container's own mounts win, then each of ours over the next.
    let mut existing: Vec<String> = mount_destinations(config).map(str::to_owned).collect();
    if !kernels.is_empty() {
        let theirs: Vec<&str> = existing.iter().map(String::as_str).collect();
        let (binds, shown) = kernels.binds(&theirs, &mut plan.notes);
        e.mounts.extend(binds.iter().map(kernels::Bind::to_oci));
        if !shown.is_empty() {
            plan.add_kernels_dir(kernels::CONTAINER_DIR, &view, &ctx.config.env);
        }
    }
    existing.extend(destinations(&e.mounts));
    let env_cfg = &ctx.config.env;
    let libraries_dir = ctx.config.kernels.libraries_dir();
    for lib in library::plan(&libraries_dir, &mut plan, &view, &existing, env_cfg) {
        e.mounts.extend(lib.oci_mounts());
    }
    if let Some(p) = jit::plan_cache(config, &mut plan, &view, &ctx.config.jit_cache, env_cfg) {
        jit::add_env(&mut plan, &p, &view, env_cfg);
        e.mounts.push(jit::mount_entry(&p.source));
    }
    plan.mounts = e
        .mounts
        .iter()
        .map(|m| {
            let field = |k: &str| m.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
            gpuarch_core::plan::AddedMount {
                destination: field("destination"),
                source: field("source"),
            }
        })
        .collect();
    // The env goes in the config; the in-container stage is needed only
    // for what the config cannot say: the loader cache for mounted
    // libraries, and (asked for by the shim) the env files for sessions
    // that do not get the config's env. The shim writes those itself
    // before the runtime starts, unless a mount in the config would cover
    // them (then only the stage, which runs after the mounts, can).
    let why = if kernels.packages.iter().any(|m| !m.libraries.is_empty()) {
        Some("mounted libraries need ldconfig inside the container")
    } else if ctx.env_files && env_files_hidden(config) {
        Some("runtime.env_files, and a mount over /run or /etc would hide files written now")
    } else {
        None
    };
    if let Some(why) = why {
        match hook_entry(ctx) {
            Some(entry) => {
                let there = config
                    .pointer("/hooks/createContainer")
                    .and_then(Value::as_array)
                    .is_some_and(|l| l.iter().any(is_ours));
                if !there {
                    e.create_container = Some(entry);
                }
                plan.notes
                    .push(format!("createContainer hook added: {why}"));
            }
            None => plan.notes.push(format!(
                "{why}, but gpuarch-hook was not found beside this program: no createContainer hook"
            )),
        }
    }
    e.plan = plan;
    Ok(e)
}

/// The destinations of OCI mount entries.
fn destinations(mounts: &[Value]) -> impl Iterator<Item = String> + '_ {
    mounts
        .iter()
        .filter_map(|m| m.get("destination").and_then(Value::as_str))
        .map(str::to_owned)
}

/// Does a mount in `config` cover `/run/gpuarch/env` or
/// `/etc/profile.d/gpuarch.sh`, so that files written into the rootfs
/// before the runtime mounts it would be hidden?
pub fn env_files_hidden(config: &Value) -> bool {
    let covers = |dest: &str| {
        let dest = std::path::Path::new(dest);
        [stage::ENV_FILE, stage::PROFILE_FILE]
            .iter()
            .any(|f| std::path::Path::new("/").join(f).starts_with(dest))
    };
    mount_destinations(config).any(covers)
}

/// The destinations of the mounts in `config`, in order.
fn mount_destinations(config: &Value) -> impl Iterator<Item = &str> {
    config
        .get("mounts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|m| m.get("destination").and_then(Value::as_str))
}

/// Has `config` a `createContainer` entry running gpuarch-hook?
pub fn has_hook_entry(config: &Value) -> bool {
    config
        .get("hooks")
        .and_then(|h| h.get("createContainer"))
        .and_then(Value::as_array)
        .is_some_and(|l| {
            l.iter().any(|e| {
                e.get("path")
                    .and_then(Value::as_str)
                    .is_some_and(|p| p.ends_with("gpuarch-hook"))
            })
        })
}

/// A field error found in a parsed value, located in the bytes it came
/// from (parsed again, only on this error path).
pub fn locate(e: HookError, bytes: &[u8]) -> HookError {
    match e {
        HookError::Oci(oci::OciError::Value(_)) => match ContainerView::from_json(bytes) {
            Err(located) => HookError::Oci(located),
            Ok(_) => e,
        },
        e => e,
    }
}

/// The precreate stage: the proposed config in, the config with the Plan
/// applied out, and the Plan for the log. A no-op Plan gives back the input
/// bytes exactly.
pub fn precreate(input: &[u8], ctx: &Context) -> Result<(Vec<u8>, Plan), HookError> {
    let mut config = oci::parse_value(input)?;
    let plan = edit(&mut config, ctx).map_err(|e| locate(e, input))?;
    if plan.is_noop() {
        return Ok((input.to_vec(), plan));
    }
    let out = serde_json::to_vec(&config)?;
    Ok((out, plan))
}

#[cfg(test)]
pub(crate) mod tests;
