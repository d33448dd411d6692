//! Consumers' wheels (`gpuarch_kernels::library`) through the registry:
//! one artifact per library version, tagged
//! [`gpuarch_kernels::remote::library_tag`], whose config is a
//! [`SharedWheel`] and whose one layer is the wheel as it was imported.
//!
//! The wheel is shared, not the unpacked files: it is a quarter of their
//! size, and a node that pulls it imports it exactly as it would a wheel
//! an admin handed over (RECORD, the library's checksum lists, the
//! inspector, the same bounds). What the artifact says is only checked
//! against: its dist and version against the tag, its digest against the
//! blob as it arrives.

use std::time::Duration;

use gpuarch_kernels::remote::{RemoteError, SHARED_WHEEL_SCHEMA, SharedWheel, library_tag};

use crate::http::{self, HttpError};
use crate::{Artifact, Descriptor, ImageManifest, OciRemote, TITLE, refused, unavailable};

/// The artifact type of a shared library wheel.
pub const LIBRARY_ARTIFACT_TYPE: &str = "application/vnd.gpuarch.library.v1";
/// Its config blob: a [`SharedWheel`].
pub const LIBRARY_CONFIG_MEDIA_TYPE: &str = "application/vnd.gpuarch.library.wheel-info.v1+json";
/// Its one layer: the wheel.
pub const WHEEL_MEDIA_TYPE: &str = "application/vnd.gpuarch.library.wheel.v1";

/// Whether `name` can be a wheel's file name: one plain component ending
/// in `.whl`, no control characters, at most 255 bytes.
fn wheel_name_ok(name: &str) -> bool {
    name.len() <= 255
        && name.ends_with(".whl")
        && !name.starts_with('.')
        && !name.contains('/')
        && !name.chars().any(char::is_control)
}

fn tag_of(dist: &str, version: &str) -> Result<String, RemoteError> {
    library_tag(dist, version).ok_or_else(|| {
        RemoteError::Config(format!(
            "{dist} {version} cannot be shared through a registry: no tag can hold its version"
        ))
    })
}

impl OciRemote {
    pub(crate) fn push_wheel_now(
        &self,
        wheel: &std::fs::File,
        about: &SharedWheel,
    ) -> Result<String, RemoteError> {
        let tag = tag_of(&about.dist, &about.version)?;
        let shown = self.shown(&tag);
        let config = serde_json::to_vec(about).map_err(|e| RemoteError::Config(e.to_string()))?;
        let digest = self
            .runtime()
            .block_on(async {
                let config = Descriptor {
                    media_type: LIBRARY_CONFIG_MEDIA_TYPE.to_owned(),
                    digest: self.client.push_blob(&config).await?,
                    size: config.len() as i64,
                    annotations: None,
                };
                let layer = Descriptor {
                    media_type: WHEEL_MEDIA_TYPE.to_owned(),
                    digest: self
                        .client
                        .push_open(wheel, about.bytes, &about.sha256)
                        .await?,
                    size: i64::try_from(about.bytes).unwrap_or(i64::MAX),
                    annotations: Some([(TITLE.to_owned(), about.wheel.clone())].into()),
                };
                let manifest = ImageManifest {
                    schema_version: 2,
                    media_type: Some(http::MANIFEST_TYPE.to_owned()),
                    artifact_type: Some(LIBRARY_ARTIFACT_TYPE.to_owned()),
                    config,
                    layers: vec![layer],
                    annotations: Some(
                        [
                            ("io.gpuarch.library".to_owned(), about.dist.clone()),
                            ("io.gpuarch.version".to_owned(), about.version.clone()),
                        ]
                        .into(),
                    ),
                };
                let bytes = serde_json::to_vec(&manifest)
                    .map_err(|e| HttpError::Unavailable(e.to_string()))?;
                self.client.push_manifest(&tag, &bytes).await
            })
            .map_err(unavailable(&shown))?;
        Ok(format!("{}@{digest}", self.config().repository))
    }

    pub(crate) fn pull_wheel_now(
        &self,
        dist: &str,
        version: &str,
        out: &std::fs::File,
        max_bytes: u64,
        budget: Duration,
    ) -> Result<Option<(SharedWheel, String)>, RemoteError> {
        let tag = tag_of(dist, version)?;
        let shown = self.shown(&tag);
        let r = self.block_within(
            &shown,
            budget,
            format!("no wheel within {} s", budget.as_secs()),
            self.fetch_wheel(&tag, dist, version, out, max_bytes),
        );
        if !matches!(r, Ok(Some(_))) {
            let _ = out.set_len(0);
        }
        r
    }

    async fn fetch_wheel(
        &self,
        tag: &str,
        dist: &str,
        version: &str,
        out: &std::fs::File,
        max_bytes: u64,
    ) -> Result<Option<(SharedWheel, String)>, RemoteError> {
        let Some(Artifact {
            manifest: m,
            digest,
            config,
        }) = self
            .artifact(
                tag,
                LIBRARY_ARTIFACT_TYPE,
                LIBRARY_CONFIG_MEDIA_TYPE,
                "a gpuarch library wheel",
            )
            .await?
        else {
            return Ok(None);
        };
        let shown = self.shown(tag);
        let refused = refused(&shown, &digest);
        let [layer] = m.layers.as_slice() else {
            return Err(refused(format!(
                "{} layers; a wheel is one",
                m.layers.len()
            )));
        };
        let about: SharedWheel = serde_json::from_slice(&config)
            .map_err(|e| refused(format!("config is not a shared wheel's: {e}")))?;
        if about.schema != SHARED_WHEEL_SCHEMA {
            return Err(refused(format!(
                "schema {} (this gpuarch reads {SHARED_WHEEL_SCHEMA})",
                about.schema
            )));
        }
        if (about.dist.as_str(), about.version.as_str()) != (dist, version) {
            return Err(refused(format!(
                "its config says {} {}, the tag {dist} {version}",
                about.dist, about.version
            )));
        }
        if !wheel_name_ok(&about.wheel) || crate::title(layer) != about.wheel {
            return Err(refused(format!("wheel name {:?}", about.wheel)));
        }
        if layer.media_type != WHEEL_MEDIA_TYPE
            || layer.digest != format!("sha256:{}", about.sha256)
            || u64::try_from(layer.size).ok() != Some(about.bytes)
        {
            return Err(refused(
                "the layer is not the wheel its config names".into(),
            ));
        }
        if about.bytes > max_bytes {
            return Err(refused(format!(
                "a wheel of {} bytes; {max_bytes} may be taken",
                about.bytes
            )));
        }
        let mut file =
            tokio::fs::File::from_std(out.try_clone().map_err(|e| RemoteError::Unavailable {
                reference: shown.clone(),
                message: e.to_string(),
            })?);
        self.layer_into(&shown, &digest, layer, &mut file).await?;
        let origin = format!("{}@{digest}", self.config().repository);
        Ok(Some((about, origin)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_plain_wheel_file_name_is_taken() {
        assert!(wheel_name_ok("flashinfer_cubin-0.6.13-py3-none-any.whl"));
        for bad in [
            "../x.whl",
            "a/b.whl",
            ".whl",
            "x.zip",
            "x\n.whl",
            &format!("{}.whl", "a".repeat(252)),
        ] {
            assert!(!wheel_name_ok(bad), "{bad:?}");
        }
    }
}
