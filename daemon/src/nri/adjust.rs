//! One container, as NRI shows it, through the same [`Edit`] the hook and
//! the shim make ([`gpuarch_container::edit::make`]), and back as NRI's
//! adjustment: the Plan's env, the kernel and JIT cache mounts, and the
//! `createContainer` hook when mounted libraries need ldconfig. The OCI
//! config written from NRI's view is only read; the Edit's parts are
//! turned into NRI's types as they are.
//!
//! [`Edit`]: gpuarch_container::edit::Edit
//!
//! NRI shows a container before its root filesystem is mounted: the
//! image is read from its layers ([`super::image`]), given here as
//! [`Image::Read`].

use gpuarch_container::edit::Image;
use gpuarch_container::{Context, HookError};
use gpuarch_core::plan::Plan;
use serde_json::{Value, json};

use super::proto::nri::{
    Container, ContainerAdjustment, Hook, Hooks, KeyValue, Mount, OptionalInt, PodSandbox,
};

/// What [`adjust`] decided for one container.
#[derive(Debug)]
pub enum Outcome {
    /// Nothing to do: no GPU asked for, or the Plan changes nothing.
    Nothing(Plan),
    /// The pod's runtime handler is one that plans by itself.
    Skipped(String),
    /// The adjustment to send, and the Plan it carries.
    Adjust(Box<ContainerAdjustment>, Plan),
}

/// The annotation naming the CDI devices NRI lists for the container, so
/// that the selection reads them as it reads a pod's CDI annotations.
pub const CDI_ANNOTATION: &str = "cdi.k8s.io/gpuarch-nri";

/// Plan `container` of `pod`, its image's consumers found as `image`
/// says, and give the adjustment; or why it could not be planned, for
/// the runner's policy ([`gpuarch_container::run::verdict`]).
pub fn adjust(
    pod: &PodSandbox,
    container: &Container,
    ctx: &Context,
    image: Image<'_>,
) -> Result<Outcome, HookError> {
    if !pod.runtime_handler.is_empty()
        && ctx.config.nri.skip_handlers.contains(&pod.runtime_handler)
    {
        return Ok(Outcome::Skipped(pod.runtime_handler.clone()));
    }
    let config = oci_config(pod, container);
    // What the container gets, made once; its parts become the
    // adjustment as they are (nothing is found by diffing a config).
    let e = gpuarch_container::edit::make(&config, ctx, image)?;
    if e.plan.is_noop() {
        return Ok(Outcome::Nothing(e.plan));
    }
    let mut adj = ContainerAdjustment::new();
    adj.env = e
        .plan
        .env
        .iter()
        .map(|(k, v)| {
            let mut kv = KeyValue::new();
            kv.key.clone_from(k);
            kv.value.clone_from(v);
            kv
        })
        .collect();
    adj.mounts = e.mounts.iter().map(nri_mount).collect();
    if let Some(entry) = &e.create_container {
        let mut hooks = Hooks::new();
        hooks.create_container = vec![nri_hook(entry)];
        adj.hooks = protobuf::MessageField::some(hooks);
    }
    Ok(Outcome::Adjust(Box::new(adj), e.plan))
}

/// The OCI config fields gpuarch reads, from what NRI shows: the env, the
/// annotations (the container's, then the names NRI gives), the devices,
/// the mounts and the `createContainer` hooks.
fn oci_config(pod: &PodSandbox, c: &Container) -> Value {
    let mut annotations: serde_json::Map<String, Value> = c
        .annotations
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    for (key, value) in [
        ("io.kubernetes.cri.container-name", &c.name),
        ("io.kubernetes.cri.sandbox-name", &pod.name),
        ("io.kubernetes.cri.sandbox-namespace", &pod.namespace),
    ] {
        if !value.is_empty() {
            annotations
                .entry(key)
                .or_insert_with(|| Value::String(value.clone()));
        }
    }
    let cdi: Vec<&str> = c.CDI_devices.iter().map(|d| d.name.as_str()).collect();
    if !cdi.is_empty() {
        annotations.insert(CDI_ANNOTATION.to_owned(), Value::String(cdi.join(",")));
    }
    let devices: Vec<Value> = c
        .linux
        .as_ref()
        .map(|l| l.devices.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|d| json!({"path": d.path, "type": d.type_, "major": d.major, "minor": d.minor}))
        .collect();
    let mounts: Vec<Value> = c
        .mounts
        .iter()
        .map(|m| {
            json!({"destination": m.destination, "type": m.type_, "source": m.source, "options": m.options})
        })
        .collect();
    let create_container: Vec<Value> = c
        .hooks
        .as_ref()
        .map(|h| h.create_container.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|h| json!({"path": h.path, "args": h.args}))
        .collect();
    // The process's user, where the runtime gives it (NRI 0.9 and
    // later): whose home and user site the image read looks in, and whose
    // JIT cache. Where it does not (containerd 1.7 and 2.1), none: the
    // read takes every passwd user's site, and there is no JIT cache, as a
    // cache made for root is not writable by a pod that runs as another.
    let mut process = json!({"env": c.env});
    if let Some(u) = c.user.as_ref() {
        process["user"] = json!({"uid": u.uid, "gid": u.gid});
    }
    json!({
        "ociVersion": "1.0.2",
        "process": process,
        "annotations": annotations,
        "linux": {"devices": devices},
        "mounts": mounts,
        "hooks": {"createContainer": create_container},
    })
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_owned))
        .collect()
}

fn text(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or("").to_owned()
}

fn nri_mount(m: &Value) -> Mount {
    let mut out = Mount::new();
    out.destination = text(m, "destination");
    out.type_ = text(m, "type");
    out.source = text(m, "source");
    out.options = strings(m.get("options"));
    out
}

fn nri_hook(h: &Value) -> Hook {
    let mut out = Hook::new();
    out.path = text(h, "path");
    out.args = strings(h.get("args"));
    out.env = strings(h.get("env"));
    if let Some(t) = h.get("timeout").and_then(Value::as_i64) {
        let mut timeout = OptionalInt::new();
        timeout.value = t;
        out.timeout = protobuf::MessageField::some(timeout);
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use gpuarch_container::edit::Read;
    use gpuarch_core::config::Config;
    use gpuarch_core::oci::ContainerView;
    use gpuarch_core::snapshot::Snapshot;

    /// A context on the 2080 Ti + 3090 fixture, gpuarch's paths in `dir`;
    /// the JIT cache on where `jit`.
    fn ctx_in(dir: &std::path::Path, jit: bool) -> Context {
        let fixture = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/2080ti-3090.json"
        );
        let snapshot = Snapshot::from_json(&std::fs::read(fixture).unwrap()).unwrap();
        let mut cfg = Config::default();
        cfg.hook.record_dir = dir.join("records");
        cfg.hook.image_cache = dir.join("images");
        cfg.kernels.mount_root = dir.join("kernels");
        cfg.kernels.cache_dir = dir.join("cache");
        cfg.jit_cache.dir = dir.join("jit");
        if jit {
            cfg.jit_cache.enable = true;
            cfg.jit_cache.scope = gpuarch_core::config::JitScope::Shared;
            std::fs::create_dir(&cfg.jit_cache.dir).unwrap();
        }
        Context::new(snapshot, cfg, None)
    }

    #[test]
    fn the_image_is_read_for_the_user_the_runtime_names() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = ctx_in(dir.path(), false);
        let (pod, mut c) =
            super::super::fake_runtime::container(&["NVIDIA_VISIBLE_DEVICES=1"], &[]);
        let seen = std::cell::RefCell::new(Vec::new());
        let read = |v: &ContainerView| {
            seen.borrow_mut().push(v.user);
            Read::default()
        };
        adjust(&pod, &c, &ctx, Image::Read(&read)).unwrap();
        let mut user = crate::nri::proto::nri::User::new();
        user.uid = 1000;
        user.gid = 100;
        c.user = protobuf::MessageField::some(user);
        adjust(&pod, &c, &ctx, Image::Read(&read)).unwrap();
        assert_eq!(*seen.borrow(), [None, Some((1000, 100))]);
    }

    #[test]
    fn no_jit_cache_where_the_runtime_names_no_user() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = ctx_in(dir.path(), true);
        let read = |_: &ContainerView| Read::default();
        let (pod, mut c) =
            super::super::fake_runtime::container(&["NVIDIA_VISIBLE_DEVICES=1"], &[]);
        let jit = |o: Outcome| match o {
            Outcome::Adjust(adj, plan) => (
                adj.env.iter().any(|kv| kv.key == "TORCH_EXTENSIONS_DIR"),
                plan.notes
                    .iter()
                    .any(|n| n.starts_with("no JIT cache: the runtime does not say")),
            ),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            jit(adjust(&pod, &c, &ctx, Image::Read(&read)).unwrap()),
            (false, true)
        );
        let mut user = crate::nri::proto::nri::User::new();
        user.uid = 1000;
        user.gid = 1000;
        c.user = protobuf::MessageField::some(user);
        assert_eq!(
            jit(adjust(&pod, &c, &ctx, Image::Read(&read)).unwrap()),
            (true, false)
        );
    }
}
