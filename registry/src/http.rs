//! The distribution API as gpuarchd speaks it: few requests, every one
//! bounded, to one host.
//!
//! The registry is the admin's choice, but what it answers is not trusted
//! (docs/SECURITY.md). So:
//! - **one host**: every request goes to the configured registry, by the
//!   configured scheme. A redirect elsewhere (another host, port or
//!   scheme) is not followed, nor is an upload `Location` elsewhere; a
//!   descriptor's `urls` are never read.
//! - **bounded bodies**: every body is read chunk by chunk against a limit
//!   fixed before the request (manifests 4 MiB, tokens and errors 64 KiB,
//!   a blob its descriptor's size), and dropped past it.
//! - **credentials**: sent only over TLS, only to the registry itself or a
//!   token realm on the registry's own host over https. Never over plain
//!   HTTP (allowed for loopback registries only, and then anonymously).

use std::path::Path;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderValue, WWW_AUTHENTICATE};
use reqwest::{Method, StatusCode, Url};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

/// The most a manifest may be.
pub const MAX_MANIFEST_BYTES: u64 = 4 << 20;
/// The most a token answer or an error body may be.
pub const MAX_SMALL_BYTES: u64 = 64 << 10;

pub const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";

/// What went wrong talking to the registry.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The registry answered, and the answer is not acceptable: the
    /// artifact's fault (a blob past its size, a digest that differs).
    #[error("{0}")]
    Refused(String),
    /// The registry could not be asked, or said no.
    #[error("{0}")]
    Unavailable(String),
    /// 404.
    #[error("not found")]
    NotFound,
}

fn unavailable(e: impl std::fmt::Display) -> HttpError {
    HttpError::Unavailable(e.to_string())
}

/// A client for one repository of one registry.
#[derive(Debug)]
pub struct Http {
    client: reqwest::Client,
    /// `scheme://host[:port]`, the only origin ever asked.
    base: Url,
    /// The repository's path in the registry.
    name: String,
    basic: Option<(String, String)>,
    /// What the registry's last challenge asked for.
    auth: tokio::sync::Mutex<Auth>,
}

#[derive(Clone, Debug)]
enum Auth {
    Anonymous,
    /// The registry asked for Basic: the credentials, to it, over TLS.
    Basic,
    Bearer(String),
}

/// Whether `url` is on the same origin as `base` (scheme, host, port).
fn same_origin(url: &Url, base: &Url) -> bool {
    url.scheme() == base.scheme()
        && url.host_str() == base.host_str()
        && url.port_or_known_default() == base.port_or_known_default()
}

/// Whether a token `realm` may be given the credentials: https, on the
/// registry's own host (any port).
pub fn realm_allowed(realm: &Url, base: &Url) -> bool {
    realm.scheme() == "https" && base.scheme() == "https" && realm.host_str() == base.host_str()
}

/// Why the registry client could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("registry {registry:?}: {error}")]
    Registry {
        registry: String,
        /// The URL parser's words.
        error: String,
    },
    #[error("ca_file: {0}")]
    CaFile(reqwest::Error),
    #[error("registry client: {0}")]
    Build(reqwest::Error),
}

impl Http {
    pub fn new(
        registry: &str,
        name: &str,
        plain_http: bool,
        basic: Option<(String, String)>,
        extra_ca: Option<&[u8]>,
    ) -> Result<Self, ClientError> {
        let scheme = if plain_http { "http" } else { "https" };
        let base =
            Url::parse(&format!("{scheme}://{registry}/")).map_err(|e| ClientError::Registry {
                registry: registry.to_owned(),
                error: e.to_string(),
            })?;
        let origin = base.clone();
        let mut b = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::custom(move |a| {
                if a.previous().len() >= 5 || !same_origin(a.url(), &origin) {
                    a.stop()
                } else {
                    a.follow()
                }
            }))
            .no_proxy()
            .connect_timeout(Duration::from_secs(5))
            .read_timeout(Duration::from_secs(30));
        if let Some(pem) = extra_ca {
            let cert = reqwest::Certificate::from_pem(pem).map_err(ClientError::CaFile)?;
            b = b.add_root_certificate(cert);
        }
        let client = b.build().map_err(ClientError::Build)?;
        Ok(Self {
            client,
            base,
            name: name.to_owned(),
            basic,
            auth: tokio::sync::Mutex::new(Auth::Anonymous),
        })
    }

    /// The configured credentials, if any.
    pub fn credentials(&self) -> Option<(&str, &str)> {
        self.basic.as_ref().map(|(u, p)| (u.as_str(), p.as_str()))
    }

    fn url(&self, rest: &str) -> Result<Url, HttpError> {
        self.base
            .join(&format!("v2/{}/{rest}", self.name))
            .map_err(unavailable)
    }

    /// Send, answering one auth challenge. `body` is sent again if asked
    /// twice.
    async fn send(
        &self,
        method: Method,
        url: Url,
        headers: HeaderMap,
        body: Option<Payload<'_>>,
    ) -> Result<reqwest::Response, HttpError> {
        if !same_origin(&url, &self.base) {
            return Err(HttpError::Refused(format!(
                "{url} is not on the registry {}: not asked",
                self.base
            )));
        }
        let build = |auth: &Auth| {
            let mut r = self
                .client
                .request(method.clone(), url.clone())
                .headers(headers.clone());
            // Never an Authorization header over plain HTTP.
            if self.base.scheme() == "https" {
                match (auth, &self.basic) {
                    (Auth::Bearer(t), _) => r = r.bearer_auth(t),
                    (Auth::Basic, Some((u, p))) => r = r.basic_auth(u, Some(p)),
                    _ => {}
                }
            }
            match body {
                Some(Payload::Bytes(b)) => r = r.body(b.to_vec()),
                // Read from the file as it is sent, once per attempt.
                Some(Payload::File(path, len)) => {
                    let f = std::fs::File::open(path)
                        .map_err(|e| HttpError::Unavailable(format!("{}: {e}", path.display())))?;
                    r = r
                        .header(reqwest::header::CONTENT_LENGTH, len)
                        .body(tokio::fs::File::from_std(f));
                }
                // An open file, from its start, once per attempt.
                Some(Payload::Open(file, len)) => {
                    let mut f = file.try_clone().map_err(unavailable)?;
                    std::io::Seek::rewind(&mut f).map_err(unavailable)?;
                    r = r
                        .header(reqwest::header::CONTENT_LENGTH, len)
                        .body(tokio::fs::File::from_std(f));
                }
                None => {}
            }
            Ok::<_, HttpError>(r)
        };
        let auth = self.auth.lock().await.clone();
        let res = build(&auth)?.send().await.map_err(unavailable)?;
        if res.status() != StatusCode::UNAUTHORIZED {
            return check_redirect(res);
        }
        let challenge = res
            .headers()
            .get(WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .unwrap_or_default();
        drop(res);
        if self.base.scheme() != "https" {
            return Err(HttpError::Unavailable(
                "the registry asks for credentials, and they are never sent over plain HTTP".into(),
            ));
        }
        let auth = if let Some(bearer) = parse_bearer(&challenge) {
            Auth::Bearer(self.fetch_token(&bearer).await?)
        } else if challenge
            .trim_start()
            .to_ascii_lowercase()
            .starts_with("basic")
            && self.basic.is_some()
            && !matches!(auth, Auth::Basic)
        {
            Auth::Basic
        } else {
            return Err(HttpError::Unavailable(format!(
                "unauthorized (challenge {:?})",
                clip(&challenge)
            )));
        };
        *self.auth.lock().await = auth.clone();
        let res = build(&auth)?.send().await.map_err(unavailable)?;
        check_redirect(res)
    }

    async fn fetch_token(&self, b: &Bearer) -> Result<String, HttpError> {
        let realm = Url::parse(&b.realm).map_err(|e| {
            HttpError::Unavailable(format!("token realm {:?}: {e}", clip(&b.realm)))
        })?;
        if !realm_allowed(&realm, &self.base) {
            return Err(HttpError::Refused(format!(
                "token realm {realm} is not https on the registry's host {}: no credentials sent",
                self.base.host_str().unwrap_or("")
            )));
        }
        let mut r = self.client.get(realm);
        let mut q = Vec::new();
        if let Some(s) = &b.service {
            q.push(("service", s.as_str()));
        }
        if let Some(s) = &b.scope {
            q.push(("scope", s.as_str()));
        }
        r = r.query(&q);
        if let Some((u, p)) = &self.basic {
            r = r.basic_auth(u, Some(p));
        }
        let res = check_redirect(r.send().await.map_err(unavailable)?)?;
        let status = res.status();
        let body = read_limited(res, MAX_SMALL_BYTES).await?;
        if !status.is_success() {
            return Err(HttpError::Unavailable(format!(
                "token realm answered {status}: {}",
                clip(&String::from_utf8_lossy(&body))
            )));
        }
        #[derive(serde::Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
        }
        let t: Token = serde_json::from_slice(&body)
            .map_err(|e| HttpError::Unavailable(format!("token answer: {e}")))?;
        t.token
            .or(t.access_token)
            .filter(|t| !t.is_empty() && t.len() < 16 << 10)
            .ok_or_else(|| HttpError::Unavailable("token answer without a token".into()))
    }

    /// The manifest tagged or digested `reference`: (bytes, digest).
    pub async fn manifest(&self, reference: &str) -> Result<(Vec<u8>, String), HttpError> {
        let h = one_header(reqwest::header::ACCEPT, MANIFEST_TYPE);
        let res = self
            .send(
                Method::GET,
                self.url(&format!("manifests/{reference}"))?,
                h,
                None,
            )
            .await?;
        let res = ok(res).await?;
        let body = read_limited(res, MAX_MANIFEST_BYTES).await?;
        let digest = format!("sha256:{}", hex(&Sha256::digest(&body)));
        Ok((body, digest))
    }

    /// The blob `digest` of `size` bytes, into `out`, its sha256 checked as
    /// it arrives; more than `size` bytes is refused at once.
    pub async fn blob_into(
        &self,
        digest: &str,
        size: u64,
        out: &mut (impl tokio::io::AsyncWrite + Unpin),
    ) -> Result<(), HttpError> {
        let want = digest
            .strip_prefix("sha256:")
            .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or_else(|| {
                HttpError::Refused(format!("digest {:?} is not sha256", clip(digest)))
            })?;
        let res = self
            .send(
                Method::GET,
                self.url(&format!("blobs/{digest}"))?,
                HeaderMap::new(),
                None,
            )
            .await?;
        let mut res = ok(res).await?;
        let mut hash = Sha256::new();
        let mut got = 0u64;
        while let Some(chunk) = res.chunk().await.map_err(unavailable)? {
            got += chunk.len() as u64;
            if got > size {
                return Err(HttpError::Refused(format!(
                    "blob {digest} is larger than its descriptor's {size} bytes"
                )));
            }
            hash.update(&chunk);
            out.write_all(&chunk).await.map_err(unavailable)?;
        }
        if got != size || hex(&hash.finalize()) != want {
            return Err(HttpError::Refused(format!(
                "blob {digest}: the {got} bytes received do not match its digest"
            )));
        }
        Ok(())
    }

    /// A blob, up to `size` bytes, into memory (a config).
    pub async fn blob(&self, digest: &str, size: u64) -> Result<Vec<u8>, HttpError> {
        let mut v = Vec::new();
        self.blob_into(digest, size, &mut v).await?;
        Ok(v)
    }

    /// Upload `data` as a blob unless the registry has it.
    pub async fn push_blob(&self, data: &[u8]) -> Result<String, HttpError> {
        let digest = format!("sha256:{}", hex(&Sha256::digest(data)));
        self.push_payload(&digest, Payload::Bytes(data)).await?;
        Ok(digest)
    }

    /// Upload file `path` (`len` bytes, sha256 `sha256` as the store
    /// recorded it) as a blob unless the registry has it: read as it is
    /// sent, never held whole. A file that changed since is refused by the
    /// registry, which checks the digest.
    pub async fn push_file(
        &self,
        path: &Path,
        len: u64,
        sha256: &str,
    ) -> Result<String, HttpError> {
        let digest = format!("sha256:{sha256}");
        self.push_payload(&digest, Payload::File(path, len)).await?;
        Ok(digest)
    }

    /// Upload the open file `file` (`len` bytes, sha256 `sha256`) as a
    /// blob unless the registry has it, read from its start as it is sent.
    /// A file that is not what `sha256` says is refused by the registry.
    pub async fn push_open(
        &self,
        file: &std::fs::File,
        len: u64,
        sha256: &str,
    ) -> Result<String, HttpError> {
        let digest = format!("sha256:{sha256}");
        self.push_payload(&digest, Payload::Open(file, len)).await?;
        Ok(digest)
    }

    async fn push_payload(&self, digest: &str, body: Payload<'_>) -> Result<(), HttpError> {
        let head = self
            .send(
                Method::HEAD,
                self.url(&format!("blobs/{digest}"))?,
                HeaderMap::new(),
                None,
            )
            .await?;
        if head.status().is_success() {
            return Ok(());
        }
        let start = self
            .send(
                Method::POST,
                self.url("blobs/uploads/")?,
                HeaderMap::new(),
                None,
            )
            .await?;
        let start = ok(start).await?;
        let location = start
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| HttpError::Unavailable("upload without a Location".into()))?;
        let mut put = self.base.join(location).map_err(unavailable)?;
        put.query_pairs_mut().append_pair("digest", digest);
        let h = one_header(reqwest::header::CONTENT_TYPE, "application/octet-stream");
        let res = self.send(Method::PUT, put, h, Some(body)).await?;
        ok(res).await?;
        Ok(())
    }

    /// Put `manifest` under `tag`; its digest.
    pub async fn push_manifest(&self, tag: &str, manifest: &[u8]) -> Result<String, HttpError> {
        let h = one_header(reqwest::header::CONTENT_TYPE, MANIFEST_TYPE);
        let res = self
            .send(
                Method::PUT,
                self.url(&format!("manifests/{tag}"))?,
                h,
                Some(Payload::Bytes(manifest)),
            )
            .await?;
        ok(res).await?;
        Ok(format!("sha256:{}", hex(&Sha256::digest(manifest))))
    }
}

/// What a request sends: bytes in memory, or a file of a known length.
#[derive(Clone, Copy, Debug)]
enum Payload<'a> {
    Bytes(&'a [u8]),
    File(&'a Path, u64),
    Open(&'a std::fs::File, u64),
}

/// A header map of one header.
fn one_header(name: reqwest::header::HeaderName, value: &'static str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(name, HeaderValue::from_static(value));
    h
}

/// A redirect the policy did not follow comes back as the 3xx itself.
fn check_redirect(res: reqwest::Response) -> Result<reqwest::Response, HttpError> {
    if res.status().is_redirection() {
        let to = res
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        return Err(HttpError::Refused(format!(
            "the registry redirected to {:?}, which is not the registry: not followed",
            clip(to)
        )));
    }
    Ok(res)
}

/// Success, 404, or the registry's (bounded) error.
async fn ok(res: reqwest::Response) -> Result<reqwest::Response, HttpError> {
    let status = res.status();
    if status.is_success() {
        return Ok(res);
    }
    if status == StatusCode::NOT_FOUND {
        return Err(HttpError::NotFound);
    }
    let body = read_limited(res, MAX_SMALL_BYTES).await.unwrap_or_default();
    Err(HttpError::Unavailable(format!(
        "{status}: {}",
        clip(&String::from_utf8_lossy(&body))
    )))
}

/// The body, refused past `limit` bytes as soon as it is.
pub async fn read_limited(mut res: reqwest::Response, limit: u64) -> Result<Vec<u8>, HttpError> {
    if res.content_length().is_some_and(|n| n > limit) {
        return Err(HttpError::Refused(format!(
            "a body of {} bytes, past the {limit} taken",
            res.content_length().unwrap_or(0)
        )));
    }
    let mut out = Vec::new();
    while let Some(chunk) = res.chunk().await.map_err(unavailable)? {
        if (out.len() + chunk.len()) as u64 > limit {
            return Err(HttpError::Refused(format!(
                "a body past the {limit} bytes taken"
            )));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

fn clip(s: &str) -> String {
    let s: String = s.chars().take(200).collect();
    s.escape_debug().to_string()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[derive(Debug, PartialEq, Eq)]
struct Bearer {
    realm: String,
    service: Option<String>,
    scope: Option<String>,
}

/// `Bearer realm="...",service="...",scope="..."`.
fn parse_bearer(h: &str) -> Option<Bearer> {
    let rest = h
        .trim()
        .strip_prefix("Bearer ")
        .or_else(|| h.trim().strip_prefix("bearer "))?;
    let mut realm = None;
    let mut service = None;
    let mut scope = None;
    let mut s = rest.trim();
    while !s.is_empty() {
        let (k, v) = s.split_once('=')?;
        let k = k.trim().to_ascii_lowercase();
        let v = v.trim_start();
        let (value, after) = if let Some(q) = v.strip_prefix('"') {
            let end = q.find('"')?;
            (&q[..end], &q[end + 1..])
        } else {
            let end = v.find(',').unwrap_or(v.len());
            (&v[..end], &v[end..])
        };
        match k.as_str() {
            "realm" => realm = Some(value.to_owned()),
            "service" => service = Some(value.to_owned()),
            "scope" => scope = Some(value.to_owned()),
            _ => {}
        }
        s = after.trim_start().trim_start_matches(',').trim_start();
    }
    Some(Bearer {
        realm: realm?,
        service,
        scope,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn challenges_are_read() {
        assert_eq!(
            parse_bearer(
                r#"Bearer realm="https://r.example/token",service="r.example",scope="repository:a/b:pull""#
            ),
            Some(Bearer {
                realm: "https://r.example/token".into(),
                service: Some("r.example".into()),
                scope: Some("repository:a/b:pull".into()),
            })
        );
        assert_eq!(parse_bearer("Basic realm=\"x\""), None);
        assert_eq!(parse_bearer("Bearer service=\"x\""), None);
    }

    #[test]
    fn only_https_on_the_registrys_host_gets_the_credentials() {
        let base = Url::parse("https://registry.example:5000/").unwrap();
        let ok = |u: &str| realm_allowed(&Url::parse(u).unwrap(), &base);
        assert!(ok("https://registry.example/token"));
        assert!(ok("https://registry.example:5001/token"));
        assert!(!ok("http://registry.example/token"));
        assert!(!ok("https://evil.example/token"));
        assert!(!ok("https://registry.example.evil.example/token"));
        let plain = Url::parse("http://127.0.0.1:5000/").unwrap();
        assert!(!realm_allowed(
            &Url::parse("https://127.0.0.1/").unwrap(),
            &plain
        ));
        let u = |s: &str| Url::parse(s).unwrap();
        assert!(same_origin(&u("https://registry.example:5000/v2/x"), &base));
        assert!(!same_origin(&u("https://registry.example/v2/x"), &base));
        assert!(!same_origin(&u("http://registry.example:5000/v2/x"), &base));
    }
}
