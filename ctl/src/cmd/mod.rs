//! One module per subcommand. Each takes what it answers from: nothing
//! (`arch`, `inspect`, `engine`), the host's files (`doctor`), a
//! [`Source`](crate::source::Source) (`status`, `devices`, `match`, `plan`),
//! or gpuarchd alone (`reload` and the kernel cache's commands).

pub mod arch;
pub mod audit;
pub mod devices;
pub mod doctor;
pub mod engine;
pub mod gc;
pub mod inspect;
pub mod jit;
pub mod kernels;
pub mod labels;
pub mod matching;
pub mod plan;
pub mod prewarm;
pub mod reload;
pub mod slurm;
pub mod status;
pub mod verify;
pub mod why;
