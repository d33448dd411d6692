//! Build requests the hook leaves for gpuarchd: one empty file per
//! request in `kernels.spool_dir`, named `<package>@<arch>`. The hook
//! writes the name with [`request_name`]; gpuarchd reads it back with
//! [`parse_request`] and checks both parts before building anything.

/// The file name of a request for `package` built for `arch` (`sm_86`).
pub fn request_name(package: &str, arch: &str) -> String {
    format!("{package}@{arch}")
}

/// Where gpuarchd says which requests it could not build, and why: beside
/// the spool (`/run/gpuarch/kernel-requests.unbuildable.json`), a JSON
/// object of [`request_name`] to a one-line reason. The hook reads it
/// before asking again; gpuarchd empties it at its start (a restart is
/// what applies a newly installed NVRTC).
pub fn unbuildable_path(spool_dir: &std::path::Path) -> std::path::PathBuf {
    let name = spool_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "kernel-requests".to_owned());
    spool_dir.with_file_name(format!("{name}.unbuildable.json"))
}

/// Most bytes of the unbuildable file read.
pub const MAX_UNBUILDABLE: u64 = 256 << 10;

/// The unbuildable file beside `spool_dir`, request name to reason (at
/// most [`MAX_UNBUILDABLE`] bytes read); empty when there is none or it
/// cannot be read as such.
pub fn read_unbuildable(spool_dir: &std::path::Path) -> serde_json::Map<String, serde_json::Value> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(unbuildable_path(spool_dir))
        .and_then(|f| f.take(MAX_UNBUILDABLE).read_to_end(&mut bytes))
        .ok()
        .and_then(|_| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}
/// Most entries it keeps.
pub const MOST_UNBUILDABLE: usize = 1024;

/// The package and arch a request's file name asks for, unchecked (the
/// reader checks both and says what it drops); `None` when it has no `@`.
pub fn parse_request(name: &str) -> Option<(&str, &str)> {
    name.split_once('@')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_name_reads_back_as_written() {
        let n = request_name("rmsnorm", "sm_86");
        assert_eq!(n, "rmsnorm@sm_86");
        assert_eq!(parse_request(&n), Some(("rmsnorm", "sm_86")));
        assert_eq!(parse_request("rmsnorm"), None);
        assert_eq!(parse_request(""), None);
        // The rest is the arch's, for the reader to refuse.
        assert_eq!(parse_request("a@b@c"), Some(("a", "b@c")));
    }
}
