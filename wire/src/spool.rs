//! Build requests the hook leaves for gpuarchd: one empty file per
//! request in `kernels.spool_dir`, named `<package>@<arch>`. The hook
//! writes the name with [`request_name`]; gpuarchd reads it back with
//! [`parse_request`] and checks both parts before building anything.

/// The file name of a request for `package` built for `arch` (`sm_86`).
pub fn request_name(package: &str, arch: &str) -> String {
    format!("{package}@{arch}")
}

/// The package and arch a request's file name asks for, unchecked; `None`
/// when it is not of [`request_name`]'s form.
pub fn parse_request(name: &str) -> Option<(&str, &str)> {
    name.split_once('@')
        .filter(|(p, a)| !p.is_empty() && !a.is_empty() && !a.contains('@'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_name_reads_back_as_written() {
        let n = request_name("rmsnorm", "sm_86");
        assert_eq!(n, "rmsnorm@sm_86");
        assert_eq!(parse_request(&n), Some(("rmsnorm", "sm_86")));
        for bad in ["rmsnorm", "@sm_86", "rmsnorm@", "a@b@c", ""] {
            assert_eq!(parse_request(bad), None, "{bad}");
        }
    }
}
