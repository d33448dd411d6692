//! The sd_notify protocol, client side: one datagram per state change to the
//! socket systemd names in `NOTIFY_SOCKET` (a path, or `@name` for an
//! abstract socket). Twenty lines do not earn a dependency.

use std::io;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

/// Send `state` (`READY=1`, `STATUS=...`, newline-separated assignments) to
/// systemd. Returns `Ok(false)` when not started by systemd (no
/// `NOTIFY_SOCKET`).
pub fn notify(state: &str) -> io::Result<bool> {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(false);
    };
    let bytes = path.as_encoded_bytes();
    let addr = match bytes.strip_prefix(b"@") {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(name)?
        }
        None => SocketAddr::from_pathname(&path)?,
    };
    let sock = UnixDatagram::unbound()?;
    sock.send_to_addr(state.as_bytes(), &addr)?;
    Ok(true)
}

/// How often to send `WATCHDOG=1`: half of `WATCHDOG_USEC`, when systemd set
/// it for this process (`WATCHDOG_PID` absent or ours).
pub fn watchdog_interval() -> Option<Duration> {
    if let Some(pid) = std::env::var_os("WATCHDOG_PID")
        && pid.to_str() != Some(&std::process::id().to_string())
    {
        return None;
    }
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    (usec > 0).then(|| Duration::from_micros(usec / 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test touches the environment, so nothing races on it.
    #[test]
    fn datagrams_reach_a_path_socket_and_an_abstract_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let rx = UnixDatagram::bind(&path).unwrap();
        // SAFETY: the only test in this binary that reads or writes the env.
        unsafe { std::env::set_var("NOTIFY_SOCKET", &path) };
        assert!(notify("READY=1\nSTATUS=up").unwrap());
        let mut buf = [0u8; 64];
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=up");

        use std::os::linux::net::SocketAddrExt;
        let name = format!("gpuarch-test-{}", std::process::id());
        let rx = UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(&name).unwrap()).unwrap();
        // SAFETY: as above.
        unsafe { std::env::set_var("NOTIFY_SOCKET", format!("@{name}")) };
        assert!(notify("WATCHDOG=1").unwrap());
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"WATCHDOG=1");

        // SAFETY: as above.
        unsafe { std::env::set_var("WATCHDOG_USEC", "2000000") };
        assert_eq!(watchdog_interval(), Some(Duration::from_secs(1)));
        // SAFETY: as above.
        unsafe { std::env::set_var("WATCHDOG_PID", "1") };
        assert_eq!(watchdog_interval(), None);
        // SAFETY: as above.
        unsafe {
            std::env::remove_var("WATCHDOG_PID");
            std::env::remove_var("WATCHDOG_USEC");
            std::env::remove_var("NOTIFY_SOCKET");
        }
        assert!(!notify("READY=1").unwrap());
    }
}
