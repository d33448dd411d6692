//! Build requests the hook leaves for gpuarchd: one empty file per
//! request in `kernels.spool_dir`, named `<package>@<arch>`. The hook
//! writes the name with [`request_name`]; gpuarchd reads it back with
//! [`parse_request`] and checks both parts before building anything.

/// The file name of a request for `package` built for `arch` (`sm_86`).
pub fn request_name(package: &str, arch: &str) -> String {
    format!("{package}@{arch}")
}

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
