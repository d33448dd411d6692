//! Per-architecture JIT caches (`jit_cache:` in the config): which cache a
//! container gets. The hook makes and mounts it, gpuarchd keeps it under its
//! size limit; this is the part both agree on.
//!
//! A cache is `<jit_cache.dir>/<scope>/<targets>/`, mounted read-write at
//! [`CONTAINER_DIR`]:
//!
//! - `<scope>` keeps tenants apart: what one container leaves in a cache
//!   runs in the next, so only containers that trust each other may share
//!   one. It is always per host uid (`uid1000-...`), then per image, per
//!   Kubernetes namespace, or one for the uid ([`JitScope`]).
//! - `<targets>` is what the container's arch list builds for its toolkit
//!   (`sm_86+sm_90-cuda12.8`): torch keys its extension cache on sources and
//!   versions but not the GPU, so an extension built for one architecture
//!   must never be found by a container on another.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::arch::ArchList;
use crate::config::{JitCacheConfig, JitScope};
use crate::env::EnvVar;
use crate::oci::ContainerView;
use crate::plan::{self, Plan};
use crate::toolkit;

/// Where a container sees its cache.
pub const CONTAINER_DIR: &str = "/var/cache/gpuarch/jit";

/// The file in each scope directory saying whose it is, for `gpuarchctl
/// jit ls`.
pub const LABEL_FILE: &str = "scope.json";

/// Annotations naming the image, most exact first (an image ID or digest,
/// then the name the pod asked for).
const IMAGE_KEYS: [&str; 5] = [
    "io.kubernetes.cri-o.ImageRef",
    "io.kubernetes.cri-o.Image",
    "io.kubernetes.cri.image-ref",
    "io.kubernetes.cri-o.ImageName",
    "io.kubernetes.cri.image-name",
];

/// Every name the engine's annotations give the container's image (its
/// reference or digest first), each once.
pub fn image_names(view: &crate::oci::ContainerView) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for k in IMAGE_KEYS {
        if let Some(v) = view.annotations.get(k)
            && !v.is_empty()
            && !names.contains(v)
        {
            names.push(v.clone());
        }
    }
    names
}

/// The annotation naming the pod's namespace that only the engine sets:
/// containerd's CRI writes it from the sandbox it made.
const NAMESPACE_KEYS: [&str; 1] = ["io.kubernetes.cri.sandbox-namespace"];

/// Namespace annotations a pod's own annotations can carry into the spec
/// (containerd passes allowed pod annotations through; CRI-O copies them):
/// a claim, never taken as the namespace, only noted.
const CLAIMED_NAMESPACE_KEYS: [&str; 1] = ["io.kubernetes.pod.namespace"];

/// Who a scope belongs to, as `<scope>/scope.json` records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Label {
    pub scope: JitScope,
    /// Host uid and gid that own the caches.
    pub uid: u32,
    pub gid: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// The cache a container gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cache {
    /// `<scope>` directory name.
    pub scope_dir: String,
    /// `<targets>` directory name.
    pub targets_dir: String,
    pub label: Label,
}

impl Label {
    /// The scope's directory name: `uid<N>-<kind>[-<what>]`. An image is
    /// named by a digest of its reference (any string the runtime chose);
    /// a namespace by itself (a DNS label), or by a digest if it is not one.
    pub fn dir_name(&self) -> String {
        let uid = self.uid;
        match (self.scope, &self.image, &self.namespace) {
            // The namespace first (tenants never share), then the image.
            (JitScope::Image, Some(image), Some(ns)) => {
                format!("uid{uid}-image-{}", short_digest(&format!("{ns}\0{image}")))
            }
            (JitScope::Image, Some(image), None) => {
                format!("uid{uid}-image-{}", short_digest(image))
            }
            (JitScope::Namespace, _, Some(ns)) if dns_label(ns) => format!("uid{uid}-ns-{ns}"),
            (JitScope::Namespace, _, Some(ns)) => format!("uid{uid}-ns-{}", short_digest(ns)),
            (JitScope::Shared, ..) => format!("uid{uid}-shared"),
            _ => format!("uid{uid}"),
        }
    }
}

fn short_digest(s: &str) -> String {
    Sha256::digest(s.as_bytes())[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A scope or targets directory name as gpuarch makes them: what gpuarchd
/// and `gpuarchctl` touch under `jit_cache.dir`, and nothing else.
pub fn valid_dir_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 255
        && !n.starts_with('.')
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'+'))
}

/// The first annotation of `keys` the container has.
fn annotation<'a>(view: &'a ContainerView, keys: &[&str]) -> Option<&'a str> {
    keys.iter()
        .find_map(|k| view.annotations.get(*k))
        .map(String::as_str)
        .filter(|v| !v.is_empty())
}

/// An image whose torch names every architecture (the table's newest), and
/// that holds nothing else: the cache is named by what the GPUs are, not by
/// the names the image's own torch takes (an image whose torch is not known
/// may get `9.0+PTX` for every Blackwell under a toolkit too old for them,
/// which must not make them share a cache), nor by what its other consumers
/// make of the list (left unset where xformers and DeepSpeed, or a DeepSpeed
/// and a GPU of a two-digit major, may be there).
fn names_every_gpu() -> crate::software::Software {
    use crate::software::{Dist, Software, torch_releases};
    let mut sw = Software {
        read: vec!["(the GPUs' own targets)".to_owned()],
        ..Software::default()
    };
    if let Some(newest) = torch_releases().last() {
        sw.dists.insert(Dist::Torch, newest);
    }
    sw
}

/// `<targets>`: the entries of the container's torch arch list for its
/// toolkit (whether or not the container keeps that variable: this names
/// what its GPUs are, not what it asked for), and the toolkit when known.
fn targets_dir(
    plan: &Plan,
    view: &ContainerView,
    cfg: &crate::config::EnvConfig,
) -> Option<String> {
    let caps: Vec<_> = plan.gpus.iter().map(|g| g.compute_capability).collect();
    let tk = toolkit::of_container(view, cfg.cuda_version, &mut Vec::new());
    let (hints, _) = plan::hints_for(&caps, tk.as_ref(), &names_every_gpu());
    let list = hints
        .into_iter()
        .find(|(v, _)| *v == EnvVar::TorchCudaArchList)?
        .1;
    let targets: Vec<String> = ArchList::parse(&list)
        .ok()?
        .targets()
        .map(ToString::to_string)
        .collect();
    if targets.is_empty() {
        return None;
    }
    let mut name = targets.join("+");
    if let Some(tk) = tk {
        name.push_str(&format!("-cuda{}", tk.version));
    }
    Some(name)
}

/// A note when the container carries a namespace annotation gpuarch does
/// not take (see [`CLAIMED_NAMESPACE_KEYS`]) that differs from the engine's.
pub fn claimed_namespace_note(view: &ContainerView) -> Option<String> {
    let claimed = annotation(view, &CLAIMED_NAMESPACE_KEYS)?;
    let engine = annotation(view, &NAMESPACE_KEYS);
    (engine != Some(claimed)).then(|| {
        format!(
            "annotation {} ({claimed:?}) ignored for the JIT cache's scope: a pod's own \
             annotations can set it; the namespace is {}",
            CLAIMED_NAMESPACE_KEYS[0],
            engine.map_or_else(
                || "not named by the engine".to_owned(),
                |e| format!("{e:?}")
            )
        )
    })
}

/// Why a container gets no JIT cache.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoCache {
    #[error(
        "the runtime does not say which user the container runs as (no process.user; NRI gives it from 0.9), or that user has no host uid (not in linux.uidMappings): a cache made for another uid is not writable by it"
    )]
    NoHostUid,
    #[error("its toolkit builds nothing for its GPUs")]
    NoTargets,
    #[error(
        "jit_cache.scope is image, and the runtime names no image (annotation {}; Docker and podman set none): set jit_cache.scope to uid where a uid is a tenant",
        IMAGE_KEYS.join(", ")
    )]
    NoImage,
    #[error(
        "jit_cache.scope is namespace, and the engine names no Kubernetes namespace (annotation {}, which containerd's CRI sets; {} is not taken: a pod's own annotations can carry it)",
        NAMESPACE_KEYS.join(", "),
        CLAIMED_NAMESPACE_KEYS.join(", ")
    )]
    NoNamespace,
}

/// The cache for the container of `view` given `plan`, or why it gets none.
pub fn cache_for(
    plan: &Plan,
    view: &ContainerView,
    cfg: &JitCacheConfig,
    env: &crate::config::EnvConfig,
) -> Result<Cache, NoCache> {
    let (uid, gid) = view.host_user().ok_or(NoCache::NoHostUid)?;
    let targets_dir = targets_dir(plan, view, env).ok_or(NoCache::NoTargets)?;
    let (image, namespace) = match cfg.scope {
        JitScope::Image => {
            let image = annotation(view, &IMAGE_KEYS).ok_or(NoCache::NoImage)?;
            // The engine's own namespace, where it names one: pods of two
            // namespaces running one image as one uid are two tenants.
            let ns = annotation(view, &NAMESPACE_KEYS).map(str::to_owned);
            (Some(image.to_owned()), ns)
        }
        JitScope::Namespace => {
            let ns = annotation(view, &NAMESPACE_KEYS).ok_or(NoCache::NoNamespace)?;
            (None, Some(ns.to_owned()))
        }
        JitScope::Uid | JitScope::Shared => (None, None),
    };
    let label = Label {
        scope: cfg.scope,
        uid,
        gid,
        image,
        namespace,
    };
    Ok(Cache {
        scope_dir: label.dir_name(),
        targets_dir,
        label,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::EnvConfig;
    use crate::select::tests::host;

    fn view(json: serde_json::Value) -> ContainerView {
        ContainerView::from_value(&json).unwrap()
    }

    fn cfg(scope: JitScope) -> JitCacheConfig {
        JitCacheConfig {
            enable: true,
            scope,
            ..JitCacheConfig::default()
        }
    }

    fn cache(v: &ContainerView, scope: JitScope) -> Result<Cache, NoCache> {
        let p = plan::plan(v, &host(), &EnvConfig::default());
        cache_for(&p, v, &cfg(scope), &EnvConfig::default())
    }

    const CRI: &str = "io.kubernetes.cri.image-name";

    #[test]
    fn a_cache_is_per_uid_image_and_targets() {
        let on = |dev: &str, uid: u32, image: &str, env: &[&str]| {
            let mut e = vec![format!("NVIDIA_VISIBLE_DEVICES={dev}")];
            e.extend(env.iter().map(|s| s.to_string()));
            view(serde_json::json!({
                "process": {"env": e, "user": {"uid": uid, "gid": 100}},
                "annotations": {CRI: image},
            }))
        };
        let a = cache(&on("1", 1000, "torch:2.7", &[]), JitScope::Image).unwrap();
        // GPU 1 of the test host is the 3090 (8.6).
        assert_eq!(a.targets_dir, "sm_86");
        assert!(a.scope_dir.starts_with("uid1000-image-"), "{}", a.scope_dir);
        assert_eq!(a.label.image.as_deref(), Some("torch:2.7"));
        assert_eq!(
            a,
            cache(&on("1", 1000, "torch:2.7", &[]), JitScope::Image).unwrap()
        );
        // Another uid, another image, another GPU, another toolkit: another cache.
        let b = cache(&on("1", 1001, "torch:2.7", &[]), JitScope::Image).unwrap();
        let c = cache(&on("1", 1000, "torch:2.8", &[]), JitScope::Image).unwrap();
        let d = cache(&on("0", 1000, "torch:2.7", &[]), JitScope::Image).unwrap();
        let e = cache(
            &on("1", 1000, "torch:2.7", &["CUDA_VERSION=12.8.1"]),
            JitScope::Image,
        )
        .unwrap();
        assert_ne!(a.scope_dir, b.scope_dir);
        assert_ne!(a.scope_dir, c.scope_dir);
        assert_eq!(
            (d.scope_dir.as_str(), d.targets_dir.as_str()),
            (a.scope_dir.as_str(), "sm_75")
        );
        assert_eq!(e.targets_dir, "sm_86-cuda12.8");
        let both = cache(&on("0,1", 1000, "torch:2.7", &[]), JitScope::Image).unwrap();
        assert_eq!(both.targets_dir, "sm_75+sm_86");
        // The container keeping its own arch list does not change the key.
        let own = cache(
            &on("1", 1000, "torch:2.7", &["TORCH_CUDA_ARCH_LIST=7.0"]),
            JitScope::Image,
        )
        .unwrap();
        assert_eq!(own.targets_dir, "sm_86");
        for c in [&a, &b, &c, &d, &e, &both] {
            assert!(valid_dir_name(&c.scope_dir) && valid_dir_name(&c.targets_dir));
        }
    }

    #[test]
    fn user_namespaces_map_the_uid_to_the_host() {
        let v = view(serde_json::json!({
            "process": {"env": ["NVIDIA_VISIBLE_DEVICES=1"], "user": {"uid": 0, "gid": 0}},
            "linux": {
                "uidMappings": [{"containerID": 0, "hostID": 100000, "size": 65536}],
                "gidMappings": [{"containerID": 0, "hostID": 200000, "size": 65536}]
            }
        }));
        let c = cache(&v, JitScope::Uid).unwrap();
        assert_eq!((c.label.uid, c.label.gid), (100000, 200000));
        assert_eq!(c.scope_dir, "uid100000");
        let v = view(serde_json::json!({
            "process": {"env": ["NVIDIA_VISIBLE_DEVICES=1"], "user": {"uid": 70000}},
            "linux": {"uidMappings": [{"containerID": 0, "hostID": 100000, "size": 65536}]}
        }));
        let e = cache(&v, JitScope::Uid).unwrap_err().to_string();
        assert!(e.contains("no host uid"), "{e}");
        // No process.user (gpuarchd's NRI path where the runtime gives
        // none): the user is not known, so no cache, not root's.
        let v = view(serde_json::json!({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=1"]}}));
        assert_eq!(v.user, None);
        let e = cache(&v, JitScope::Uid).unwrap_err().to_string();
        assert!(e.starts_with("the runtime does not say which user"), "{e}");
    }

    #[test]
    fn a_scope_the_runtime_does_not_name_gives_no_cache() {
        let v = view(
            serde_json::json!({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=1"], "user": {"uid": 0, "gid": 0}}}),
        );
        let e = cache(&v, JitScope::Image).unwrap_err().to_string();
        assert!(
            e.contains("names no image") && e.contains("scope to uid"),
            "{e}"
        );
        let e = cache(&v, JitScope::Namespace).unwrap_err().to_string();
        assert!(e.contains("no Kubernetes namespace"), "{e}");
        assert_eq!(
            cache(&v, JitScope::Shared).unwrap().scope_dir,
            "uid0-shared"
        );
        let ns = |n: &str| {
            view(serde_json::json!({
                "process": {"env": ["NVIDIA_VISIBLE_DEVICES=1"], "user": {"uid": 0, "gid": 0}},
                "annotations": {"io.kubernetes.cri.sandbox-namespace": n},
            }))
        };
        assert_eq!(
            cache(&ns("team-a"), JitScope::Namespace).unwrap().scope_dir,
            "uid0-ns-team-a"
        );
        let odd = cache(&ns("../../etc"), JitScope::Namespace)
            .unwrap()
            .scope_dir;
        assert!(odd.starts_with("uid0-ns-") && valid_dir_name(&odd), "{odd}");
    }

    /// Before, under the default scope, pods of two namespaces
    /// running one image as uid 0 shared one writable cache; and a pod's
    /// own `io.kubernetes.pod.namespace` overrode containerd's namespace.
    #[test]
    fn tenants_never_share_and_a_pods_claim_is_not_its_namespace() {
        let pod = |engine_ns: Option<&str>, claim: Option<&str>| {
            let mut a = serde_json::Map::new();
            a.insert(CRI.into(), "vllm:0.9".into());
            if let Some(n) = engine_ns {
                a.insert("io.kubernetes.cri.sandbox-namespace".into(), n.into());
            }
            if let Some(n) = claim {
                a.insert("io.kubernetes.pod.namespace".into(), n.into());
            }
            view(serde_json::json!({
                "process": {"env": ["NVIDIA_VISIBLE_DEVICES=1"], "user": {"uid": 0, "gid": 0}},
                "annotations": a,
            }))
        };
        let dir = |v: &ContainerView, s: JitScope| cache(v, s).unwrap().scope_dir;
        let (a, b) = (pod(Some("team-a"), None), pod(Some("team-b"), None));
        assert_ne!(dir(&a, JitScope::Image), dir(&b, JitScope::Image));
        assert_eq!(
            dir(&a, JitScope::Image),
            dir(&pod(Some("team-a"), None), JitScope::Image)
        );
        // team-b claims team-a's namespace in its own annotation: nothing
        // changes, and the claim is noted.
        let liar = pod(Some("team-b"), Some("team-a"));
        assert_eq!(dir(&liar, JitScope::Image), dir(&b, JitScope::Image));
        assert_eq!(dir(&liar, JitScope::Namespace), "uid0-ns-team-b");
        let note = claimed_namespace_note(&liar).unwrap();
        assert!(
            note.contains("\"team-a\") ignored") && note.contains("\"team-b\""),
            "{note}"
        );
        assert_eq!(claimed_namespace_note(&pod(Some("x"), Some("x"))), None);
        // A claim alone names no namespace.
        let e = cache(&pod(None, Some("team-a")), JitScope::Namespace)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not taken"), "{e}");
    }

    #[test]
    fn labels_round_trip() {
        let l = Label {
            scope: JitScope::Image,
            uid: 1,
            gid: 2,
            image: Some("x".into()),
            namespace: None,
        };
        let text = serde_json::to_string(&l).unwrap();
        assert_eq!(text, r#"{"scope":"image","uid":1,"gid":2,"image":"x"}"#);
        assert_eq!(serde_json::from_str::<Label>(&text).unwrap(), l);
    }
}
