//! The one skip policy of gpuarch's tests, for every test crate and every
//! crate's unit tests (a dev-dependency only).
//!
//! A test that needs what this machine lacks (root, a program, the NVIDIA
//! wheels, a kernel feature) calls [`skip`] with the reason and returns, or
//! uses [`skip_unless!`] with an `Option` of the reason. Elsewhere that is a
//! `SKIPPED: <why>` line on stderr; where every test must run (under CI,
//! `CI=true`, or with `GPUARCH_TEST_REQUIRE_ALL=1`) it is a failure naming
//! what is missing, so that nothing passes in CI without running.
#![forbid(unsafe_code)]

/// Whether every test must run: `CI=true` or `GPUARCH_TEST_REQUIRE_ALL=1`
/// (any other value of either is not).
pub fn require_all() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
        || std::env::var("GPUARCH_TEST_REQUIRE_ALL").is_ok_and(|v| v == "1")
}

/// A test that cannot run here, and `why`: a failure where every test must
/// run ([`require_all`]), a `SKIPPED` line elsewhere. The caller returns.
pub fn skip(why: &str) {
    if require_all() {
        panic!("cannot run (CI=true or GPUARCH_TEST_REQUIRE_ALL=1): {why}");
    }
    eprintln!("SKIPPED: {why}");
}

/// Why a test that needs root `for_what` cannot run here, or `None`.
pub fn unless_root(for_what: &str) -> Option<String> {
    (!nix::unistd::Uid::effective().is_root()).then(|| format!("needs root {for_what}"))
}

/// Return from the test (through [`skip`]) when `$why`, an
/// `Option<String>` such as [`unless_root`]'s, says it cannot run.
#[macro_export]
macro_rules! skip_unless {
    ($why:expr) => {
        if let Some(why) = $why {
            $crate::skip(&why);
            return;
        }
    };
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The policy itself, run in a child process per case: under CI a skip
    /// fails the test and names what is missing; elsewhere it passes with a
    /// SKIPPED line; a CI variable that is not `true` is not CI.
    #[test]
    fn a_skip_fails_only_where_every_test_must_run() {
        if std::env::var_os("TESTKIT_CHILD").is_some() {
            skip("the reason");
            return;
        }
        let run = |env: &[(&str, &str)]| {
            let mut c = std::process::Command::new(std::env::current_exe().unwrap());
            c.args([
                "--exact",
                "tests::a_skip_fails_only_where_every_test_must_run",
                "--nocapture",
            ])
            .env_remove("CI")
            .env_remove("GPUARCH_TEST_REQUIRE_ALL")
            .env("TESTKIT_CHILD", "1");
            for (k, v) in env {
                c.env(k, v);
            }
            let o = c.output().unwrap();
            (
                o.status.success(),
                String::from_utf8_lossy(&o.stdout).into_owned()
                    + &String::from_utf8_lossy(&o.stderr),
            )
        };
        let (ok, out) = run(&[]);
        assert!(ok && out.contains("SKIPPED: the reason"), "{out}");
        let (ok, out) = run(&[("CI", "true")]);
        assert!(
            !ok && out.contains("cannot run (CI=true or GPUARCH_TEST_REQUIRE_ALL=1): the reason"),
            "{out}"
        );
        let (ok, out) = run(&[("GPUARCH_TEST_REQUIRE_ALL", "1")]);
        assert!(!ok, "{out}");
        let (ok, out) = run(&[("CI", "1")]);
        assert!(ok && out.contains("SKIPPED"), "{out}");
    }
}
