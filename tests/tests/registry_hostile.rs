//! A hostile registry on loopback. 127.0.0.1
//! is the configured registry; 127.0.0.2 stands in for another host, and
//! must never be contacted. The registry:
//! - sends a manifest, or an error, that never ends: refused at its bound,
//!   in bounded memory, within the pull budget;
//! - redirects to the other host (307): not followed;
//! - lists a blob with `urls` on the other host, and 404s it itself: the
//!   urls are never read;
//! - asks for a Bearer token from a realm on the other host, with
//!   credentials configured: no credentials sent, anywhere (plain HTTP).
//!
//! Before, oci-client buffered a body whole (2 GiB of RSS inside the 20 s
//! budget), followed redirects and `urls` to any host, and gave the realm
//! on another host the credentials file's Basic auth, in clear.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpuarch_core::arch::Target;
use gpuarch_core::config::RemoteConfig;
use gpuarch_kernels::remote::{Remote, RemoteError};
use gpuarch_kernels::store::Meta;
use gpuarch_registry::OciRemote;

/// What a request looked like: its request line and headers.
#[derive(Clone, Debug)]
struct Seen {
    line: String,
    headers: Vec<String>,
}

/// A listener on `addr` answering every request with `answer(path)`,
/// recording what it saw.
fn serve(
    addr: &str,
    answer: impl Fn(&str, &mut TcpStream) + Send + Sync + 'static,
) -> (u16, Arc<Mutex<Vec<Seen>>>) {
    let l = TcpListener::bind((addr, 0)).unwrap();
    let port = l.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let answer = Arc::new(answer);
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let (log, answer) = (log.clone(), answer.clone());
            std::thread::spawn(move || {
                let mut r = BufReader::new(s.try_clone().unwrap());
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let mut headers = Vec::new();
                    loop {
                        let mut h = String::new();
                        if r.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                            break;
                        }
                        headers.push(h.trim_end().to_owned());
                    }
                    let path = line.split_whitespace().nth(1).unwrap_or("").to_owned();
                    log.lock().unwrap().push(Seen {
                        line: line.trim_end().to_owned(),
                        headers,
                    });
                    answer(&path, &mut s);
                }
            });
        }
    });
    (port, seen)
}

fn respond(s: &mut TcpStream, status: &str, headers: &[(&str, String)], body: &[u8]) {
    let mut head = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\n", body.len());
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let _ = s.write_all(head.as_bytes());
    let _ = s.write_all(body);
}

/// A chunked body that never ends, until the client hangs up.
fn endless(s: &mut TcpStream, status: &str) {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/vnd.oci.image.manifest.v1+json\r\nTransfer-Encoding: chunked\r\n\r\n"
    );
    if s.write_all(head.as_bytes()).is_err() {
        return;
    }
    let chunk = vec![b'{'; 64 << 10];
    let frame = [
        format!("{:x}\r\n", chunk.len()).into_bytes(),
        chunk,
        b"\r\n".to_vec(),
    ]
    .concat();
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(30) {
        if s.write_all(&frame).is_err() {
            return;
        }
    }
}

fn remote(port: u16, credentials: Option<&std::path::Path>) -> OciRemote {
    OciRemote::new(&RemoteConfig {
        repository: format!("127.0.0.1:{port}/gpuarch/kernels"),
        push: false,
        credentials: credentials.map(|p| p.to_owned()),
        plain_http: true,
        ca_file: None,
        pull_timeout_ms: 20_000,
    })
    .unwrap()
}

fn meta() -> Meta {
    Meta {
        package: "saxpy".into(),
        version: "1".into(),
        variant: "fp32".into(),
        dtype: None,
        arch: Target::parse("sm_86").unwrap(),
        backend: "nvrtc".into(),
        exports: Vec::new(),
    }
}

fn vm_hwm_kib() -> u64 {
    gpuarch_tests::proc_status_kib(std::process::id(), "VmHWM")
}

/// The other host: anything it sees is a failure.
fn other_host() -> (u16, Arc<Mutex<Vec<Seen>>>) {
    serve("127.0.0.2", |_, s| respond(s, "200 OK", &[], b"{}"))
}

#[test]
fn bodies_that_never_end_are_cut_at_their_bound() {
    let (port, _) = serve("127.0.0.1", |path, s| {
        if path.contains("/manifests/a") {
            endless(s, "200 OK");
        } else {
            endless(s, "500 Internal Server Error");
        }
    });
    let r = remote(port, None);
    let out = tempfile::tempdir().unwrap();
    let before = vm_hwm_kib();
    for key in ["a", "b"] {
        let t = Instant::now();
        let e = r.pull_into(key, &meta(), out.path(), 1 << 30).unwrap_err();
        let took = t.elapsed();
        eprintln!("{key}: {e} in {took:?}");
        assert!(took < Duration::from_secs(5), "{key}: {took:?}");
        match (key, &e) {
            ("a", RemoteError::Unavailable { message, .. }) => {
                assert!(message.contains("past the 4194304 bytes taken"), "{e}")
            }
            ("b", RemoteError::Unavailable { message, .. }) => {
                assert!(message.starts_with("500"), "{e}")
            }
            _ => panic!("{key}: {e:?}"),
        }
    }
    let after = vm_hwm_kib();
    assert!(
        after < before + 32 * 1024,
        "peak memory grew from {before} to {after} KiB"
    );
}

#[test]
fn another_host_is_never_asked_nor_given_credentials() {
    let (other, at_other) = other_host();
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "artifactType": gpuarch_registry::ARTIFACT_TYPE,
        "config": {
            "mediaType": gpuarch_registry::CONFIG_MEDIA_TYPE,
            "digest": format!("sha256:{}", "a".repeat(64)),
            "size": 10,
            "urls": [format!("http://127.0.0.2:{other}/config")],
        },
        "layers": [],
    })
    .to_string();
    let (port, seen) = serve("127.0.0.1", move |path, s| {
        if path.contains("/manifests/redirect") {
            let to = format!("http://127.0.0.2:{other}{path}");
            respond(s, "307 Temporary Redirect", &[("Location", to)], b"");
        } else if path.contains("/manifests/urls") {
            respond(s, "200 OK", &[], manifest.as_bytes());
        } else if path.contains("/manifests/token") {
            let realm = format!(
                "Bearer realm=\"https://127.0.0.2:{other}/token\",service=\"r\",scope=\"repository:gpuarch/kernels:pull\""
            );
            respond(s, "401 Unauthorized", &[("WWW-Authenticate", realm)], b"");
        } else {
            respond(s, "404 Not Found", &[], b"{}");
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let creds = dir.path().join("registry.json");
    std::fs::write(&creds, r#"{"username": "ci", "password": "s3cret"}"#).unwrap();
    std::fs::set_permissions(&creds, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let r = remote(port, Some(&creds));
    let out = tempfile::tempdir().unwrap();
    for key in ["redirect", "urls", "token"] {
        let e = r.pull_into(key, &meta(), out.path(), 1 << 30).unwrap_err();
        eprintln!("{key}: {e}");
        let text = e.to_string();
        let want = match key {
            "redirect" => "not followed",
            // The registry's own 404 for the blob; its urls never read.
            "urls" => "not found",
            _ => "never sent over plain HTTP",
        };
        assert!(text.contains(want), "{key}: {text}");
    }
    std::thread::sleep(Duration::from_millis(200));
    let at_other = at_other.lock().unwrap().clone();
    let lines: Vec<&str> = at_other.iter().map(|s| s.line.as_str()).collect();
    assert!(lines.is_empty(), "the other host was asked: {lines:?}");
    for s in seen.lock().unwrap().iter() {
        assert!(
            !s.headers
                .iter()
                .any(|h| h.to_ascii_lowercase().starts_with("authorization")),
            "credentials sent over plain HTTP: {s:?}"
        );
    }
}
