//! gpuarch-registry: the kernel store's remote tier, builds shared through
//! an OCI registry (the distribution API, by `oci-client`).
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

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use gpuarch_core::config::RemoteConfig;
use oci_client::client::{
    Certificate, CertificateEncoding, ClientConfig, ClientProtocol, Config, ImageLayer,
};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::manifest::{OciDescriptor, OciImageManifest, OciManifest};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use serde::Deserialize;
use tokio::io::AsyncWrite;

use gpuarch_kernels::remote::{Pulled, Remote, RemoteError};
use gpuarch_kernels::store::{Entry, EntryManifest, MANIFEST, Meta, SCHEMA};

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
    client: Client,
    auth: RegistryAuth,
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
    gpuarch_fs::trust::check(path).map_err(|e| err(&e))?;
    let file = std::fs::File::open(path).map_err(|e| err(&format!("{}: {e}", path.display())))?;
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
        cfg.check().map_err(RemoteError::Config)?;
        let auth = match &cfg.credentials {
            None => RegistryAuth::Anonymous,
            Some(p) => {
                let bytes = read_trusted(p, "credentials", true)?;
                let c: Credentials = serde_json::from_slice(&bytes).map_err(|e| {
                    RemoteError::Config(format!(
                        "credentials {}: {e} (want {{\"username\": ..., \"password\": ...}})",
                        p.display()
                    ))
                })?;
                RegistryAuth::Basic(c.username, c.password)
            }
        };
        let mut extra = Vec::new();
        if let Some(p) = &cfg.ca_file {
            extra.push(Certificate {
                encoding: CertificateEncoding::Pem,
                data: read_trusted(p, "ca_file", false)?,
            });
        }
        // reqwest is built without a TLS provider of its own: ring's, once
        // per process (a second install is refused, harmlessly).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = Client::new(ClientConfig {
            protocol: if cfg.plain_http {
                ClientProtocol::Http
            } else {
                ClientProtocol::Https
            },
            extra_root_certificates: extra,
            connect_timeout: Some(Duration::from_secs(5)),
            read_timeout: Some(Duration::from_secs(30)),
            ..ClientConfig::default()
        });
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("gpuarch-registry")
            .enable_all()
            .build()
            .map_err(|e| RemoteError::Config(format!("no runtime for the registry client: {e}")))?;
        Ok(Self {
            cfg: cfg.clone(),
            client,
            auth,
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

    fn reference(&self, key: &str) -> Reference {
        Reference::with_tag(
            self.cfg.registry().to_owned(),
            self.cfg.path().to_owned(),
            key.to_owned(),
        )
    }

    async fn fetch(
        &self,
        reference: &Reference,
        key: &str,
        meta: &Meta,
        out: &Path,
        max_bytes: u64,
    ) -> Result<Option<Pulled>, RemoteError> {
        let shown = reference.whole();
        let unavailable = |e: OciDistributionError| RemoteError::Unavailable {
            reference: shown.clone(),
            message: e.to_string(),
        };
        let (manifest, digest) = match self.client.pull_manifest(reference, &self.auth).await {
            Ok(m) => m,
            Err(e) if not_found(&e) => return Ok(None),
            Err(e) => return Err(unavailable(e)),
        };
        let refused = |reason: String| RemoteError::Refused {
            reference: shown.clone(),
            digest: digest.clone(),
            reason,
        };
        let OciManifest::Image(m) = manifest else {
            return Err(refused("an image index, not a gpuarch build".into()));
        };
        if m.artifact_type.as_deref() != Some(ARTIFACT_TYPE)
            || m.config.media_type != CONFIG_MEDIA_TYPE
        {
            return Err(refused(format!(
                "artifact type {:?} and config {:?}, not a gpuarch build",
                m.artifact_type.as_deref().unwrap_or(""),
                m.config.media_type
            )));
        }
        if m.config.size > MAX_CONFIG_BYTES || m.layers.len() > MAX_FILES {
            return Err(refused("config or file list too large".into()));
        }
        let mut config = Vec::new();
        self.client
            .pull_blob(
                reference,
                &m.config,
                Limited::new(&mut config, m.config.size),
            )
            .await
            .map_err(|e| pull_error(e, &refused, &unavailable))?;
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
        let names: BTreeMap<&str, &OciDescriptor> =
            m.layers.iter().map(|l| (title(l), l)).collect();
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
            let file = tokio::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(out.join(name))
                .await
                .map_err(|e| RemoteError::Unavailable {
                    reference: shown.clone(),
                    message: format!("{}: {e}", out.join(name).display()),
                })?;
            let mut file = file;
            self.client
                .pull_blob(reference, layer, Limited::new(&mut file, layer.size))
                .await
                .map_err(|e| pull_error(e, &refused, &unavailable))?;
            file.sync_all()
                .await
                .map_err(|e| RemoteError::Unavailable {
                    reference: shown.clone(),
                    message: e.to_string(),
                })?;
        }
        let repo = self.cfg.repository.clone();
        Ok(Some(Pulled {
            origin: format!("{repo}@{digest}"),
            manifest: em,
        }))
    }
}

fn title(l: &OciDescriptor) -> &str {
    l.annotations
        .as_ref()
        .and_then(|a| a.get(TITLE))
        .map_or("", String::as_str)
}

fn not_found(e: &OciDistributionError) -> bool {
    match e {
        OciDistributionError::ImageManifestNotFoundError(_) => true,
        OciDistributionError::RegistryError { envelope, .. } => envelope.errors.iter().any(|x| {
            matches!(
                x.code,
                OciErrorCode::ManifestUnknown | OciErrorCode::NameUnknown | OciErrorCode::NotFound
            )
        }),
        OciDistributionError::ServerError { code: 404, .. } => true,
        _ => false,
    }
}

/// A blob that does not match its digest, or runs past its size, is the
/// artifact's fault; anything else is the registry's or the network's.
fn pull_error(
    e: OciDistributionError,
    refused: &impl Fn(String) -> RemoteError,
    unavailable: &impl Fn(OciDistributionError) -> RemoteError,
) -> RemoteError {
    match &e {
        OciDistributionError::DigestError(_) => refused(format!("digest: {e}")),
        OciDistributionError::IoError(io) if io.kind() == io::ErrorKind::FileTooLarge => {
            refused(format!("a blob is larger than its descriptor says: {e}"))
        }
        _ => unavailable(e),
    }
}

/// Remove what a failed pull left in `out`.
fn clear_dir(out: &Path) {
    if let Ok(rd) = std::fs::read_dir(out) {
        for e in rd.flatten() {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// A writer that refuses more than `left` bytes: a registry cannot fill the
/// disk by sending more than the descriptor said before the digest fails.
struct Limited<W> {
    inner: W,
    left: u64,
}

impl<W> Limited<W> {
    fn new(inner: W, size: i64) -> Self {
        Self {
            inner,
            left: u64::try_from(size).unwrap_or(0),
        }
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Limited<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if buf.len() as u64 > self.left {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::FileTooLarge,
                "more bytes than the descriptor's size",
            )));
        }
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_write(cx, buf) {
            Poll::Ready(Ok(n)) => {
                this.left -= n as u64;
                Poll::Ready(Ok(n))
            }
            other => other,
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
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
        let reference = self.reference(key);
        let shown = reference.whole();
        let budget = Duration::from_millis(self.cfg.pull_timeout_ms);
        let r = self.runtime().block_on(async {
            tokio::time::timeout(budget, self.fetch(&reference, key, meta, out, max_bytes))
                .await
                .unwrap_or_else(|_| {
                    Err(RemoteError::Unavailable {
                        reference: shown.clone(),
                        message: format!(
                            "no artifact within {} ms (kernels.remote.pull_timeout_ms)",
                            budget.as_millis()
                        ),
                    })
                })
        });
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
        let reference = self.reference(&m.key);
        let shown = reference.whole();
        let unavailable = |message: String| RemoteError::Unavailable {
            reference: shown.clone(),
            message,
        };
        let config_bytes =
            std::fs::read(entry.dir.join(MANIFEST)).map_err(|e| unavailable(e.to_string()))?;
        let mut layers = Vec::new();
        for name in m.files.keys() {
            let data = std::fs::read(entry.dir.join(name))
                .map_err(|e| unavailable(format!("{name}: {e}")))?;
            layers.push(ImageLayer::new(
                data,
                FILE_MEDIA_TYPE.to_owned(),
                Some([(TITLE.to_owned(), name.clone())].into()),
            ));
        }
        let config = Config::new(config_bytes, CONFIG_MEDIA_TYPE.to_owned(), None);
        let annotations: BTreeMap<String, String> = [
            ("io.gpuarch.package", m.package.clone()),
            ("io.gpuarch.variant", m.variant.clone()),
            ("io.gpuarch.arch", m.arch.clone()),
            ("io.gpuarch.toolkit", m.toolkit.clone()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let mut manifest = OciImageManifest::build(&layers, &config, Some(annotations));
        manifest.artifact_type = Some(ARTIFACT_TYPE.to_owned());
        let digest = self
            .runtime()
            .block_on(async {
                self.client
                    .push(&reference, &layers, config, &self.auth, Some(manifest))
                    .await?;
                self.client
                    .fetch_manifest_digest(&reference, &self.auth)
                    .await
            })
            .map_err(|e| unavailable(e.to_string()))?;
        Ok(format!("{}@{digest}", self.cfg.repository))
    }

    fn pushes(&self) -> bool {
        self.cfg.push
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
        assert!(matches!(&r.auth, RegistryAuth::Basic(u, p) if u == "ci" && p == "s3cret"));

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
        assert!(matches!(
            remote(None).unwrap().auth,
            RegistryAuth::Anonymous
        ));
    }
}
