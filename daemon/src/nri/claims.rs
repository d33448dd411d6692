//! Which gpuarchd plans a container, while two are registered with the
//! runtime: during a handover (`SIGUSR2`, [`crate::handover`]) the new
//! gpuarchd registers before the old one leaves, and NRI calls both for
//! each container, one after the other. Two adjustments of the same
//! variables fail the container's creation (NRI's conflict check), so
//! while a handover is under way (`Shared::claiming`: the old gpuarchd
//! from the SIGUSR2 on, the successor until the old one has exited) each
//! adjustment is first claimed here: the first gpuarchd to claim a
//! container plans it, the other answers without an adjustment. A lone
//! gpuarchd claims nothing (a claim costs about 40 µs).
//!
//! One file beside the snapshot (`/run/gpuarch/nri-claims`, root's),
//! under an exclusive `flock`: the last [`MAX_CLAIMS`] claims, a line
//! each, "MILLISECONDS PID ID". A container is another gpuarchd's when
//! that process claimed it in the last [`WINDOW`]: one creation's calls
//! to both come within NRI's timeouts, and a later container of the same
//! id (`ctr run ID` again) is a new one. A claim is one open, lock, read
//! of at most [`MAX_BYTES`] and write.

use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

/// Ids kept: far more than the containers created while two gpuarchds
/// are registered (tens of milliseconds).
pub const MAX_CLAIMS: usize = 256;
/// Longest line: the time (13 digits), a pid (10), an id as
/// [`gpuarch_core::record::key`] keeps it (a plain name of at most 128
/// bytes, else `h-` and a hash), two spaces and the newline.
const MAX_LINE: usize = 160;
/// How long a claim holds against another gpuarchd: more than the two
/// calls of one creation can take (NRI waits 2 s for each plugin).
pub const WINDOW: std::time::Duration = std::time::Duration::from_secs(10);
/// Most bytes of the file read.
pub const MAX_BYTES: u64 = (MAX_CLAIMS * MAX_LINE) as u64;

/// The claims file of the gpuarchd whose snapshot is `snapshot`.
pub fn path_beside(snapshot: &Path) -> PathBuf {
    snapshot.with_file_name("nri-claims")
}

/// Claim container `id` for this gpuarchd: `Ok(true)` when no other
/// gpuarchd claimed it in the last [`WINDOW`] (this one plans it),
/// `Ok(false)` when one did.
pub fn claim(file: &Path, id: &str) -> std::io::Result<bool> {
    claim_as(file, id, std::process::id(), now_ms())
}

fn now_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

fn claim_as(file: &Path, id: &str, pid: u32, now: u128) -> std::io::Result<bool> {
    use std::os::unix::fs::OpenOptionsExt;
    let key = gpuarch_core::record::key(id);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(file)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other(format!(
            "{} is not a regular file",
            file.display()
        )));
    }
    let mut f = nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| std::io::Error::from(e))?;
    let mut text = String::new();
    (&mut *f).take(MAX_BYTES).read_to_string(&mut text)?;
    let mut kept = Vec::new();
    for line in text.lines() {
        let mut parts = line.splitn(3, ' ');
        let (Some(at), Some(by), Some(k)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let (Ok(at), Ok(by)) = (at.parse::<u128>(), by.parse::<u32>()) else {
            continue;
        };
        if k == key {
            if by != pid && now.saturating_sub(at) < WINDOW.as_millis() {
                return Ok(false);
            }
            continue;
        }
        kept.push(line);
    }
    let mine = format!("{now} {pid} {key}");
    kept.push(&mine);
    let keep = &kept[kept.len().saturating_sub(MAX_CLAIMS)..];
    let mut out = keep.join("\n");
    out.push('\n');
    f.rewind()?;
    f.set_len(0)?;
    f.write_all(out.as_bytes())?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_claim_wins_and_the_file_stays_bounded() {
        let d = tempfile::tempdir().unwrap();
        let file = path_beside(&d.path().join("inventory.json"));
        let t = 1_000_000;
        assert!(claim_as(&file, "c1", 10, t).unwrap());
        assert!(
            !claim_as(&file, "c1", 11, t + 5).unwrap(),
            "claimed by both"
        );
        // The same gpuarchd asked again is a new container of that id.
        assert!(claim_as(&file, "c1", 10, t + 6).unwrap());
        // So is one asked of the other past the window.
        let later = t + 6 + WINDOW.as_millis();
        assert!(claim_as(&file, "c1", 11, later).unwrap());
        assert!(!claim_as(&file, "c1", 10, later + 1).unwrap());
        // A hostile id is one line, and claimed once.
        let hostile = "a\n1 2 c2\n".repeat(100);
        assert!(claim_as(&file, &hostile, 10, t).unwrap());
        assert!(!claim_as(&file, &hostile, 11, t).unwrap());
        assert!(claim_as(&file, "c2", 11, t).unwrap());
        for i in 0..MAX_CLAIMS * 2 {
            assert!(claim_as(&file, &format!("{i:0128x}"), u32::MAX, 9_999_999_999_999).unwrap());
        }
        let len = std::fs::metadata(&file).unwrap().len();
        assert!(len <= MAX_BYTES, "{len}");
        let lines = std::fs::read_to_string(&file).unwrap().lines().count();
        assert_eq!(lines, MAX_CLAIMS);
        // The oldest were let go; the newest are still claimed.
        assert!(claim_as(&file, "c2", 10, t).unwrap());
        let newest = format!("{:0128x}", MAX_CLAIMS * 2 - 1);
        assert!(!claim_as(&file, &newest, 1, 9_999_999_999_999).unwrap());
    }

    #[test]
    fn a_link_or_a_fifo_at_the_path_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("elsewhere");
        std::fs::write(&target, "").unwrap();
        let link = d.path().join("nri-claims");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(claim(&link, "c1").is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "");
        let fifo = d.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        // O_RDWR on a fifo does not block; it is still not a claims file.
        assert!(claim(&fifo, "c1").is_err());
    }

    #[test]
    fn two_processes_racing_for_the_same_ids_never_both_win() {
        let d = tempfile::tempdir().unwrap();
        let file = path_beside(&d.path().join("inventory.json"));
        let ids: Vec<String> = (0..200).map(|i| format!("c{i}")).collect();
        let run = |ids: Vec<String>, file: PathBuf, pid: u32| {
            std::thread::spawn(move || {
                ids.iter()
                    .filter(|id| claim_as(&file, id, pid, now_ms()).unwrap())
                    .cloned()
                    .collect::<Vec<_>>()
            })
        };
        let a = run(ids.clone(), file.clone(), 1);
        let b = run(ids.clone(), file.clone(), 2);
        let (a, b) = (a.join().unwrap(), b.join().unwrap());
        assert_eq!(a.len() + b.len(), ids.len(), "each id won exactly once");
        assert!(a.iter().all(|x| !b.contains(x)));
    }
}
