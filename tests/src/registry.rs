//! A real OCI registry for the tests: Debian's `docker-registry`
//! (distribution 2.8) on 127.0.0.1, a free port, and storage in a temporary
//! directory, started and stopped by the test.

#![allow(clippy::unwrap_used)] // test helpers: a failed unwrap is a failed test

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct Registry {
    dir: tempfile::TempDir,
    pub port: u16,
    child: Option<Child>,
}

impl Registry {
    /// Start one; it answers `/v2/` before this returns.
    pub fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut r = Self {
            dir,
            port,
            child: None,
        };
        r.resume();
        r
    }

    /// `127.0.0.1:PORT`.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Where the registry keeps its blobs and manifests.
    pub fn storage(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The blob file of `digest` (`sha256:...`) in the storage.
    pub fn blob_path(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap();
        self.storage()
            .join("docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// Start it again (same port, same storage) after [`Self::stop`].
    pub fn resume(&mut self) {
        let conf = self.dir.path().join("config.yml");
        std::fs::write(
            &conf,
            format!(
                "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{}\n",
                self.storage().display(),
                self.port
            ),
        )
        .unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.dir.path().join("log")).unwrap())
            .spawn()
            .unwrap();
        self.child = Some(child);
        let t0 = Instant::now();
        while !answers(self.port) {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "docker-registry did not answer: {}",
                std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

fn answers(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    let _ = s.write_all(b"GET /v2/ HTTP/1.0\r\nHost: localhost\r\n\r\n");
    let mut buf = [0u8; 16];
    s.read(&mut buf).is_ok_and(|n| {
        buf[..n].starts_with(b"HTTP/1.0 200") || buf[..n].starts_with(b"HTTP/1.1 200")
    })
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
    }
}
