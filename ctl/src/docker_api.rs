//! The one question gpuarchctl asks Docker: a container's id from its name
//! (or any prefix Docker accepts), over dockerd's own API socket
//! (`DOCKER_HOST=unix://PATH`, else `/var/run/docker.sock`, else podman's
//! Docker-compatible `/run/podman/podman.sock`). Neither gives the runtime
//! or the hook names, so records carry only ids; `gpuarchctl why web`
//! asks the engine which container `web` is.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

/// Most bytes of an answer read: a container's inspect is a few KiB.
const MAX_ANSWER: u64 = 4 << 20;
/// How long Docker may take to answer.
const PATIENCE: Duration = Duration::from_secs(3);

/// Podman's Docker-compatible API socket (`podman.socket`), asked when
/// dockerd's is not there.
const PODMAN_SOCKET: &str = "/run/podman/podman.sock";

/// The engine's API socket: `DOCKER_HOST`, else dockerd's, else podman's.
pub fn socket() -> Option<PathBuf> {
    match std::env::var("DOCKER_HOST") {
        Ok(h) if !h.is_empty() => h.strip_prefix("unix://").map(PathBuf::from),
        _ => {
            let docker = PathBuf::from("/var/run/docker.sock");
            if !docker.exists() && std::path::Path::new(PODMAN_SOCKET).exists() {
                Some(PathBuf::from(PODMAN_SOCKET))
            } else {
                Some(docker)
            }
        }
    }
}

/// Why Docker could not say.
#[derive(Debug, thiserror::Error)]
pub enum DockerError {
    #[error("no Docker API socket at {0}")]
    NoSocket(String),
    #[error("Docker's API at {path}: {error}")]
    Io { path: String, error: std::io::Error },
    #[error("Docker knows no container {0:?}")]
    NoSuch(String),
    #[error("Docker's API answered {0}")]
    Answer(String),
}

/// The full id of the container Docker calls `name`.
pub fn container_id(name: &str) -> Result<String, DockerError> {
    let path = socket().ok_or_else(|| DockerError::NoSocket("DOCKER_HOST (not unix://)".into()))?;
    container_id_at(&path, name)
}

/// [`container_id`], asked of the API at `path`.
pub fn container_id_at(path: &std::path::Path, name: &str) -> Result<String, DockerError> {
    let shown = path.display().to_string();
    if !path.exists() {
        return Err(DockerError::NoSocket(shown));
    }
    let io = |error| DockerError::Io {
        path: shown.clone(),
        error,
    };
    // A name Docker accepts: letters, digits, _.- (and an id prefix). Any
    // other byte could bend the request line.
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
    {
        return Err(DockerError::NoSuch(name.to_owned()));
    }
    let mut s = UnixStream::connect(path).map_err(io)?;
    s.set_read_timeout(Some(PATIENCE)).map_err(io)?;
    s.set_write_timeout(Some(PATIENCE)).map_err(io)?;
    // HTTP/1.0: the answer is whole and ends with the connection. The
    // request goes in one write.
    let request = format!("GET /containers/{name}/json HTTP/1.0\r\nHost: docker\r\n\r\n");
    s.write_all(request.as_bytes()).map_err(io)?;
    let mut answer = Vec::new();
    s.take(MAX_ANSWER).read_to_end(&mut answer).map_err(io)?;
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| DockerError::Answer("no HTTP header".into()))?;
    let status = head.split_whitespace().nth(1).unwrap_or("");
    match status {
        "200" => {}
        "404" => return Err(DockerError::NoSuch(name.to_owned())),
        other => {
            return Err(DockerError::Answer(format!(
                "HTTP {other}: {}",
                gpuarch_core::text::first_line(body.trim())
            )));
        }
    }
    let doc: serde_json::Value =
        serde_json::from_str(body).map_err(|e| DockerError::Answer(format!("not JSON: {e}")))?;
    match doc["Id"].as_str() {
        Some(id) if id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()) => {
            Ok(id.to_owned())
        }
        _ => Err(DockerError::Answer("no container Id".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;
    use std::time::Instant;

    /// A peer at a socket that answers each connection with `answer`
    /// (after reading the request), or, given none, never answers.
    fn peer(answer: Option<Vec<u8>>) -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("docker.sock");
        let l = UnixListener::bind(&path).unwrap();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(mut c) = c else { return };
                // The whole request, as a server reads it: closing with
                // some of it unread would reset the connection.
                let mut req = Vec::new();
                let mut buf = [0u8; 4096];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match c.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                match &answer {
                    Some(a) => {
                        let _ = c.write_all(a);
                    }
                    None => std::thread::sleep(Duration::from_secs(30)),
                }
            }
        });
        (d, path)
    }

    #[test]
    fn a_real_answer_gives_the_id() {
        let id = "a".repeat(64);
        let body = format!("{{\"Id\":\"{id}\",\"Name\":\"/web\"}}");
        let (_d, p) = peer(Some(
            format!("HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{body}").into_bytes(),
        ));
        assert_eq!(container_id_at(&p, "web").unwrap(), id);
        let (_d, p) = peer(Some(b"HTTP/1.0 404 Not Found\r\n\r\n{}".to_vec()));
        assert!(matches!(
            container_id_at(&p, "web"),
            Err(DockerError::NoSuch(_))
        ));
    }

    /// A peer that never answers costs the patience, not forever; a huge
    /// answer is read to the bound and refused; a name that could bend
    /// the request is not sent.
    #[test]
    fn a_hostile_peer_is_bounded() {
        let (_d, p) = peer(None);
        let t0 = Instant::now();
        assert!(matches!(
            container_id_at(&p, "web"),
            Err(DockerError::Io { .. })
        ));
        assert!(
            t0.elapsed() < PATIENCE + Duration::from_secs(2),
            "{:?}",
            t0.elapsed()
        );
        let mut huge = b"HTTP/1.0 200 OK\r\n\r\n{\"Id\":\"".to_vec();
        huge.resize(3 * MAX_ANSWER as usize, b'a');
        let (_d, p) = peer(Some(huge));
        assert!(matches!(
            container_id_at(&p, "web"),
            Err(DockerError::Answer(_))
        ));
        for bad in ["web/../../info", "a b", "x\r\nHost: y", ""] {
            assert!(
                matches!(container_id_at(&p, bad), Err(DockerError::NoSuch(_))),
                "{bad:?}"
            );
        }
    }
}
