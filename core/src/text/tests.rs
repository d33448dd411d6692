use super::*;

/// An error that returns its cause and does not print it: a context.
#[derive(Debug)]
struct Context(&'static str, Box<dyn std::error::Error + 'static>);

impl std::fmt::Display for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for Context {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.1.as_ref())
    }
}

/// An error that prints its cause and returns it too, as zbus's do.
#[derive(Debug)]
struct Both(std::io::Error);

impl std::fmt::Display for Both {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "I/O error: {}", self.0)
    }
}

impl std::error::Error for Both {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

fn io(msg: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::PermissionDenied, msg.to_owned())
}

#[test]
fn a_chain_of_contexts_reads_outermost_first() {
    let e = Context(
        "refusing to start",
        Box::new(Context("reading the config", Box::new(io("denied")))),
    );
    assert_eq!(
        one_line(&e),
        "refusing to start: reading the config: denied"
    );
}

#[test]
fn a_library_error_that_prints_and_returns_its_cause_shows_it_once() {
    let e = Context("owning io.gpuarch1", Box::new(Both(io("no such socket"))));
    assert_eq!(
        one_line(&e),
        "owning io.gpuarch1: I/O error: no such socket"
    );
}

#[test]
fn a_cause_named_earlier_in_the_line_is_still_written() {
    // The words "permission denied" appear before the cause, which is a
    // different error: it is written, not taken as said already.
    let e = Context(
        "permission denied by the bus policy, then",
        Box::new(io("permission denied")),
    );
    assert_eq!(
        one_line(&e),
        "permission denied by the bus policy, then: permission denied"
    );
}

#[test]
fn gpuarchs_errors_print_their_cause_once() {
    let e = crate::oci::OciError::from(io("disk gone"));
    assert_eq!(one_line(&e), "cannot read the OCI config: disk gone");
    assert!(std::error::Error::source(&e).is_none());
}
