//! gpuarch-registry: the kernel store's remote tier, builds shared through
//! an OCI registry (the distribution API, by gpuarch's own bounded client,
//! [`http`]: one host, bounded bodies, credentials only over TLS), and
//! consumers' library wheels beside them ([`library`]).
//!
//! One entry is one artifact in `kernels.remote.repository`, tagged by its
//! store key. Its config blob is the entry's `manifest.json`
//! ([`CONFIG_MEDIA_TYPE`]); each layer is one file, named by its
//! `org.opencontainers.image.title` annotation. What a pull brings is
//! trusted no more than a build: every blob's digest is checked as it
//! arrives, every file's sha256 against the entry manifest, and every
//! binary's architecture is read again by the inspector
//! ([`gpuarch_kernels::store::check_outputs`]). An artifact that fails is refused and
//! recorded, and the build runs here.
#![forbid(unsafe_code)]

pub mod http;
pub mod library;

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::Path;
use std::time::Duration;

use gpuarch_core::config::RemoteConfig;
use serde::{Deserialize, Serialize};

use gpuarch_kernels::remote::{Pulled, Remote, RemoteError, SharedWheel};
use gpuarch_kernels::store::{Entry, EntryManifest, MANIFEST, Meta, SCHEMA};
use http::{Http, HttpError};

/// The artifact type of a gpuarch build.
pub const ARTIFACT_TYPE: &str = "application/vnd.gpuarch.kernel.v1";
/// The config blob: the entry's manifest.json.
pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.gpuarch.kernel.manifest.v1+json";
/// Each file of the entry.
pub const FILE_MEDIA_TYPE: &str = "application/vnd.gpuarch.kernel.file.v1";
const TITLE: &str = "org.opencontainers.image.title";
/// The most a config blob (an entry manifest) may be.
const MAX_CONFIG_BYTES: i64 = 1 << 20;
/// The most files one entry may have.
const MAX_FILES: usize = 256;

/// An OCI descriptor, as far as gpuarch reads one. Its `urls` (other
/// places to fetch the blob from) are never read: blobs come from the
/// registry alone.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    media_type: String,
    digest: String,
    size: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    annotations: Option<BTreeMap<String, String>>,
}

/// An OCI image manifest, as far as gpuarch reads one.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ImageManifest {
    schema_version: u32,
    #[serde(default)]
    media_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    artifact_type: Option<String>,
    config: Descriptor,
    layers: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    annotations: Option<BTreeMap<String, String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Credentials {
    username: String,
    password: String,
}

/// A registry client for one repository. Its calls block (they run on a
/// runtime of their own), for the store's build threads.
pub struct OciRemote {
    cfg: RemoteConfig,
    client: Http,
    /// Always `Some` until dropped.
    rt: Option<tokio::runtime::Runtime>,
}

impl Drop for OciRemote {
    /// Without waiting: gpuarchd drops it from async code, where a
    /// blocking shutdown would panic.
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl std::fmt::Debug for OciRemote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OciRemote")
            .field("repository", &self.cfg.repository)
            .finish_non_exhaustive()
    }
}

/// Read a file gpuarchd acts on: trusted as its config is
/// ([`gpuarch_fs::trust`]), and, when `secret`, readable by no one else.
fn read_trusted(path: &Path, what: &str, secret: bool) -> Result<Vec<u8>, RemoteError> {
    use std::os::unix::fs::MetadataExt;
    let err = |e: &dyn std::fmt::Display| RemoteError::Config(format!("{what}: {e}"));
    // Opened once and checked as opened: what is read is what was checked.
    let file = gpuarch_fs::trust::open(path).map_err(|e| err(&e))?;
    let md = file
        .metadata()
        .map_err(|e| err(&format!("{}: {e}", path.display())))?;
    if secret && md.mode() & 0o044 != 0 {
        return Err(err(&format!(
            "{} is readable by others (chmod 600 it)",
            path.display()
        )));
    }
    let mut bytes = Vec::new();
    io::Read::read_to_end(&mut &file, &mut bytes)
        .map_err(|e| err(&format!("{}: {e}", path.display())))?;
    Ok(bytes)
}

impl OciRemote {
    pub fn new(cfg: &RemoteConfig) -> Result<Self, RemoteError> {
        cfg.check()
            .map_err(|e| RemoteError::Config(e.to_string()))?;
        let basic = match &cfg.credentials {
            None => None,
            Some(p) => {
                let bytes = read_trusted(p, "credentials", true)?;
                let c: Credentials = serde_json::from_slice(&bytes).map_err(|e| {
                    RemoteError::Config(format!(
                        "credentials {}: {e} (want {{\"username\": ..., \"password\": ...}})",
                        p.display()
                    ))
                })?;
                Some((c.username, c.password))
            }
        };
        let ca = match &cfg.ca_file {
            Some(p) => Some(read_trusted(p, "ca_file", false)?),
            None => None,
        };
        // reqwest is built without a TLS provider of its own: ring's, once
        // per process (a second install is refused, harmlessly).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = Http::new(
            cfg.registry(),
            cfg.path(),
            cfg.plain_http,
            basic,
            ca.as_deref(),
        )
        .map_err(|e| RemoteError::Config(e.to_string()))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("gpuarch-registry")
            .enable_all()
            .build()
            .map_err(|e| RemoteError::Config(format!("no runtime for the registry client: {e}")))?;
        Ok(Self {
            cfg: cfg.clone(),
            client,
            rt: Some(rt),
        })
    }

    fn runtime(&self) -> &tokio::runtime::Runtime {
        #[allow(clippy::expect_used)] // taken only by Drop
        self.rt.as_ref().expect("runtime present until drop")
    }

    pub fn config(&self) -> &RemoteConfig {
        &self.cfg
    }

    /// How a tag is shown: `registry/path:key`.
    fn shown(&self, key: &str) -> String {
        format!("{}:{key}", self.cfg.repository)
    }

    /// Run `fetch` on the client's runtime within `budget`; past it, the
    /// registry is unavailable, and `late` says why.
    fn block_within<T>(
        &self,
        reference: &str,
        budget: Duration,
        late: String,
        fetch: impl std::future::Future<Output = Result<T, RemoteError>>,
    ) -> Result<T, RemoteError> {
        self.runtime().block_on(async {
            tokio::time::timeout(budget, fetch)
                .await
                .unwrap_or_else(|_| {
                    Err(RemoteError::Unavailable {
                        reference: reference.to_owned(),
                        message: late,
                    })
                })
        })
    }

    /// The manifest tagged `tag` and its config blob, when it is an
    /// artifact of `artifact_type` whose config is `config_type` (`what`
    /// names it in a refusal), within the bounds of a config and a file
    /// list: `Ok(None)` when the registry has no such tag.
    async fn artifact(
        &self,
        tag: &str,
        artifact_type: &str,
        config_type: &str,
        what: &str,
    ) -> Result<Option<Artifact>, RemoteError> {
        let shown = self.shown(tag);
        let (bytes, digest) = match self.client.manifest(tag).await {
            Ok(m) => m,
            Err(HttpError::NotFound) => return Ok(None),
            Err(e) => return Err(unavailable(&shown)(e)),
        };
        let m = {
            let refused = refused(&shown, &digest);
            let m: ImageManifest = serde_json::from_slice(&bytes)
                .map_err(|e| refused(format!("not an image manifest (an index?): {e}")))?;
            if m.artifact_type.as_deref() != Some(artifact_type)
                || m.config.media_type != config_type
            {
                return Err(refused(format!(
                    "artifact type {:?} and config {:?}, not {what}",
                    m.artifact_type.as_deref().unwrap_or(""),
                    m.config.media_type
                )));
            }
            if m.config.size > MAX_CONFIG_BYTES || m.config.size < 0 || m.layers.len() > MAX_FILES {
                return Err(refused("config or file list too large".into()));
            }
            m
        };
        let config = self
            .client
            .blob(&m.config.digest, m.config.size as u64)
            .await
            .map_err(blob_error(&shown, &digest))?;
        Ok(Some(Artifact {
            manifest: m,
            digest,
            config,
        }))
    }

    /// `layer` of the artifact `digest` into `file`, checked against its
    /// descriptor as it arrives, then synced.
    async fn layer_into(
        &self,
        shown: &str,
        digest: &str,
        layer: &Descriptor,
        file: &mut tokio::fs::File,
    ) -> Result<(), RemoteError> {
        let size = u64::try_from(layer.size).map_err(|_| {
            refused(shown, digest)(format!("layer {}: a negative size", layer.digest))
        })?;
        self.client
            .blob_into(&layer.digest, size, file)
            .await
            .map_err(blob_error(shown, digest))?;
        file.sync_all().await.map_err(|e| RemoteError::Unavailable {
            reference: shown.to_owned(),
            message: e.to_string(),
        })
    }

    async fn fetch(
        &self,
        key: &str,
        meta: &Meta,
        out: &Path,
        max_bytes: u64,
    ) -> Result<Option<Pulled>, RemoteError> {
        let Some(Artifact {
            manifest: m,
            digest,
            config,
        }) = self
            .artifact(key, ARTIFACT_TYPE, CONFIG_MEDIA_TYPE, "a gpuarch build")
            .await?
        else {
            return Ok(None);
        };
        let shown = self.shown(key);
        let refused = refused(&shown, &digest);
        let em: EntryManifest = serde_json::from_slice(&config)
            .map_err(|e| refused(format!("config is not an entry manifest: {e}")))?;
        let want = [
            ("key", em.key.as_str(), key.to_owned()),
            ("package", em.package.as_str(), meta.package.clone()),
            ("variant", em.variant.as_str(), meta.variant.clone()),
            ("arch", em.arch.as_str(), meta.arch.to_string()),
        ];
        for (what, got, want) in want {
            if got != want {
                return Err(refused(format!(
                    "its manifest says {what} {got}, the tag {want}"
                )));
            }
        }
        if em.schema != SCHEMA {
            return Err(refused(format!(
                "entry schema {} (this gpuarch reads {SCHEMA})",
                em.schema
            )));
        }
        let names: BTreeMap<&str, &Descriptor> = m.layers.iter().map(|l| (title(l), l)).collect();
        let listed: BTreeSet<&str> = em.files.keys().map(String::as_str).collect();
        if names.len() != m.layers.len() || names.keys().copied().collect::<BTreeSet<_>>() != listed
        {
            return Err(refused(
                "its files are not the ones its manifest lists".into(),
            ));
        }
        let total: u64 = m
            .layers
            .iter()
            .map(|l| u64::try_from(l.size).unwrap_or(u64::MAX))
            .fold(0, u64::saturating_add);
        if total > max_bytes {
            return Err(refused(format!("{total} bytes, over kernels.max_bytes")));
        }
        for (name, layer) in names {
            if !gpuarch_core::config::valid_package_name(name) || name == MANIFEST {
                return Err(refused(format!("file name {name:?}")));
            }
            let info = &em.files[name];
            if layer.digest != format!("sha256:{}", info.sha256)
                || u64::try_from(layer.size).ok() != Some(info.bytes)
            {
                return Err(refused(format!(
                    "{name}: the layer is not the file its manifest lists"
                )));
            }
            let mut file = tokio::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(out.join(name))
                .await
                .map_err(|e| RemoteError::Unavailable {
                    reference: shown.clone(),
                    message: format!("{}: {e}", out.join(name).display()),
                })?;
            self.layer_into(&shown, &digest, layer, &mut file).await?;
        }
        let repo = self.cfg.repository.clone();
        Ok(Some(Pulled {
            origin: format!("{repo}@{digest}"),
            manifest: em,
        }))
    }
}

/// A manifest, its digest and its config blob.
struct Artifact {
    manifest: ImageManifest,
    digest: String,
    config: Vec<u8>,
}

/// The registry did not answer `reference` as it should.
fn unavailable(reference: &str) -> impl Fn(HttpError) -> RemoteError + '_ {
    move |e| RemoteError::Unavailable {
        reference: reference.to_owned(),
        message: e.to_string(),
    }
}

/// The registry answered `reference` with `digest`, which is refused.
fn refused<'a>(reference: &'a str, digest: &'a str) -> impl Fn(String) -> RemoteError + 'a {
    move |reason| RemoteError::Refused {
        reference: reference.to_owned(),
        digest: digest.to_owned(),
        reason,
    }
}

/// A blob of that artifact that failed: refused when it is not what its
/// descriptor says, else the registry is unavailable.
fn blob_error<'a>(reference: &'a str, digest: &'a str) -> impl Fn(HttpError) -> RemoteError + 'a {
    move |e| match e {
        HttpError::Refused(r) => refused(reference, digest)(r),
        e => unavailable(reference)(e),
    }
}

fn title(l: &Descriptor) -> &str {
    l.annotations
        .as_ref()
        .and_then(|a| a.get(TITLE))
        .map_or("", String::as_str)
}

/// Remove what a failed pull left in `out`.
fn clear_dir(out: &Path) {
    if let Ok(rd) = std::fs::read_dir(out) {
        for e in rd.flatten() {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

impl Remote for OciRemote {
    fn pull_into(
        &self,
        key: &str,
        meta: &Meta,
        out: &Path,
        max_bytes: u64,
    ) -> Result<Option<Pulled>, RemoteError> {
        let shown = self.shown(key);
        let budget = Duration::from_millis(self.cfg.pull_timeout_ms);
        let r = self.block_within(
            &shown,
            budget,
            format!(
                "no artifact within {} ms (kernels.remote.pull_timeout_ms)",
                budget.as_millis()
            ),
            self.fetch(key, meta, out, max_bytes),
        );
        let r = r.and_then(|pulled| match pulled {
            None => Ok(None),
            Some(p) => match gpuarch_kernels::store::check_outputs(out, meta) {
                Ok(_) => Ok(Some(p)),
                Err(e) => Err(RemoteError::Refused {
                    reference: shown.clone(),
                    digest: p.origin.rsplit('@').next().unwrap_or_default().to_owned(),
                    reason: format!("inspection: {e}"),
                }),
            },
        });
        if !matches!(r, Ok(Some(_))) {
            clear_dir(out);
        }
        r
    }

    fn push(&self, entry: &Entry) -> Result<String, RemoteError> {
        let m = &entry.manifest;
        let shown = self.shown(&m.key);
        let unavailable = |message: String| RemoteError::Unavailable {
            reference: shown.clone(),
            message,
        };
        let config_bytes =
            std::fs::read(entry.dir.join(MANIFEST)).map_err(|e| unavailable(e.to_string()))?;
        let annotations: BTreeMap<String, String> = [
            ("io.gpuarch.package", m.package.clone()),
            ("io.gpuarch.variant", m.variant.clone()),
            ("io.gpuarch.arch", m.arch.clone()),
            ("io.gpuarch.toolkit", m.toolkit.clone()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let digest = self
            .runtime()
            .block_on(async {
                let config = Descriptor {
                    media_type: CONFIG_MEDIA_TYPE.to_owned(),
                    digest: self.client.push_blob(&config_bytes).await?,
                    size: config_bytes.len() as i64,
                    annotations: None,
                };
                let mut layers = Vec::new();
                for (name, info) in &m.files {
                    let path = entry.dir.join(name);
                    layers.push(Descriptor {
                        media_type: FILE_MEDIA_TYPE.to_owned(),
                        digest: self
                            .client
                            .push_file(&path, info.bytes, &info.sha256)
                            .await?,
                        size: i64::try_from(info.bytes).unwrap_or(i64::MAX),
                        annotations: Some([(TITLE.to_owned(), name.clone())].into()),
                    });
                }
                let manifest = ImageManifest {
                    schema_version: 2,
                    media_type: Some(http::MANIFEST_TYPE.to_owned()),
                    artifact_type: Some(ARTIFACT_TYPE.to_owned()),
                    config,
                    layers,
                    annotations: Some(annotations),
                };
                let bytes = serde_json::to_vec(&manifest)
                    .map_err(|e| HttpError::Unavailable(e.to_string()))?;
                self.client.push_manifest(&m.key, &bytes).await
            })
            .map_err(|e| unavailable(e.to_string()))?;
        Ok(format!("{}@{digest}", self.cfg.repository))
    }

    fn pushes(&self) -> bool {
        self.cfg.push
    }

    fn push_wheel(
        &self,
        wheel: &std::fs::File,
        about: &SharedWheel,
    ) -> Result<String, RemoteError> {
        self.push_wheel_now(wheel, about)
    }

    fn pull_wheel(
        &self,
        dist: &str,
        version: &str,
        out: &std::fs::File,
        max_bytes: u64,
        budget: Duration,
    ) -> Result<Option<(SharedWheel, String)>, RemoteError> {
        self.pull_wheel_now(dist, version, out, max_bytes, budget)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn remote(credentials: Option<&Path>) -> Result<OciRemote, RemoteError> {
        OciRemote::new(&RemoteConfig {
            repository: "127.0.0.1:5000/gpuarch/kernels".into(),
            push: false,
            credentials: credentials.map(Path::to_owned),
            plain_http: true,
            ca_file: None,
            pull_timeout_ms: 1000,
        })
    }

    #[test]
    fn credentials_must_be_private_and_well_formed() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("registry.json");
        std::fs::write(&file, r#"{"username": "ci", "password": "s3cret"}"#).unwrap();
        let mode = |m| std::fs::set_permissions(&file, std::fs::Permissions::from_mode(m)).unwrap();

        mode(0o600);
        let r = remote(Some(&file)).unwrap();
        assert!(
            r.client
                .credentials()
                .is_some_and(|(u, p)| u == "ci" && p == "s3cret")
        );

        mode(0o640);
        let e = remote(Some(&file)).unwrap_err().to_string();
        assert!(e.contains("readable by others"), "{e}");

        // Writable by others: anyone could point gpuarchd at their registry.
        mode(0o622);
        let e = remote(Some(&file)).unwrap_err().to_string();
        assert!(e.contains("not trusted"), "{e}");

        mode(0o600);
        std::fs::write(&file, r#"{"user": "ci"}"#).unwrap();
        let e = remote(Some(&file)).unwrap_err().to_string();
        assert!(e.contains("want {\"username\""), "{e}");

        let e = remote(Some(&dir.path().join("absent.json")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("absent.json"), "{e}");
        assert!(remote(None).unwrap().client.credentials().is_none());
    }
}
