//! The one way a build fails, for every backend: the compiler, the command
//! or the package refused it (recorded, not retried until its inputs
//! change), or something around it failed (retried on the next request).

use std::io;

/// How a build ended without an entry: NVRTC, a `command` build and the
/// store all answer with this.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// The compiler or command refused this build; recorded so it is not
    /// retried until its inputs change.
    #[error("{0}")]
    Rejected(String),
    /// Something around the build failed (no compiler, a full disk, a
    /// timeout); not recorded, the next request tries again.
    #[error("{0}")]
    Tool(String),
}

impl From<io::Error> for BuildError {
    fn from(e: io::Error) -> Self {
        BuildError::Tool(e.to_string())
    }
}
