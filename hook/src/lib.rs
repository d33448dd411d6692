//! gpuarch-hook, gpuarch-runtime and gpuarch-slurm-task-prolog: the
//! programs a container start or a Slurm task runs. What they do is
//! gpuarch-container's ([`gpuarch_container::run`] decides every start);
//! this library holds only their command lines ([`cli`]), which the man
//! pages are made from.

pub mod cli;
