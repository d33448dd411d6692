//! One start's policy, for every program that plans a start: gpuarch-hook's
//! stages, gpuarch-runtime, and gpuarchd's NRI plugin ([`verdict`]).
//!
//! - The config is read once ([`Runner::load`]): the file, else gpuarchd's
//!   last valid one (said in the log and in the Plan's notes), else the
//!   defaults, and the start is not planned.
//! - A Plan is logged and recorded for `gpuarchctl why`.
//! - A start that could not be planned fails open: it goes on unchanged,
//!   said in the log; under `strict: true` it is refused. What
//!   `audit.refuse` refuses is refused whatever `strict` says.

use gpuarch_core::config::Config;
use gpuarch_core::plan::Plan;
use gpuarch_fs::config::NoConfig;

use crate::budget::BudgetError;
use crate::context::ContextError;
use crate::edit::HookError;
use crate::log;
use crate::shim::ShimError;
use crate::stage::{self, StageError};

/// Why a start was not planned. The causes are boxed: a start's result
/// stays small whatever went wrong.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(Box<NoConfig>),
    #[error(transparent)]
    Context(Box<ContextError>),
    #[error(transparent)]
    Edit(Box<HookError>),
    #[error(transparent)]
    Shim(Box<ShimError>),
    #[error(transparent)]
    Stage(Box<StageError>),
    #[error(transparent)]
    Budget(#[from] BudgetError),
    /// Not planned within the time the engine waits for an answer (NRI's
    /// watchdog).
    #[error("not planned within {0:?}, the most the runtime is kept waiting")]
    Late(std::time::Duration),
    /// The OCI config is over the bound: not parsed at all.
    #[error("OCI config is over {} MiB; not planning it", .0 >> 20)]
    TooLarge(u64),
}

macro_rules! boxed_from {
    ($($variant:ident($t:ty)),*) => {$(
        impl From<$t> for StartError {
            fn from(e: $t) -> Self {
                Self::$variant(Box::new(e))
            }
        }
    )*};
}
boxed_from!(
    Config(NoConfig),
    Context(ContextError),
    Edit(HookError),
    Shim(ShimError),
    Stage(StageError)
);

impl StartError {
    /// Whether the start must fail whatever `strict` says.
    pub fn refuses(&self) -> bool {
        match self {
            Self::Edit(e) => e.refuses(),
            Self::Shim(e) => e.refuses(),
            _ => false,
        }
    }
}

/// What becomes of a start that could not be planned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// It goes on as the engine gave it.
    Unchanged,
    /// It fails, because `strict` is on.
    Strict,
    /// It fails whatever `strict` says (`audit.refuse`).
    Refused,
}

/// The policy itself: refused, strict or fail open.
pub fn verdict(e: &StartError, strict: bool) -> Verdict {
    if e.refuses() {
        Verdict::Refused
    } else if strict {
        Verdict::Strict
    } else {
        Verdict::Unchanged
    }
}

/// What a planned start hands back, holding its Plan.
pub trait Planned {
    fn plan_mut(&mut self) -> &mut Plan;
}

impl Planned for Plan {
    fn plan_mut(&mut self) -> &mut Plan {
        self
    }
}

impl Planned for (Vec<u8>, Plan) {
    fn plan_mut(&mut self) -> &mut Plan {
        &mut self.1
    }
}

impl Planned for stage::Outcome {
    fn plan_mut(&mut self) -> &mut Plan {
        &mut self.plan
    }
}

/// One start, as a program names it in its log and its record.
#[derive(Clone, Copy, Debug)]
pub struct Start<'a> {
    /// Who planned it, for the record: `gpuarch-runtime create`.
    pub by: &'a str,
    /// The engine's id of the container, where it gives one.
    pub id: Option<&'a str>,
    /// Keep a record only where none is there for the id (the in-container
    /// stages: precreate's or the shim's Plan is what the env holds).
    pub only_first: bool,
    /// What happens to a start that fails open: "the container starts
    /// unchanged".
    pub unchanged: &'a str,
    /// What a refusal refuses: "start" or "create".
    pub verb: &'a str,
}

/// What became of a start.
#[derive(Debug)]
pub enum Ran<T> {
    Planned(T),
    /// Not planned; it goes on as the engine gave it.
    Unchanged,
    /// Refused: the program exits 1.
    Refused,
}

/// A program's config, read once, and its policy.
#[derive(Debug)]
pub struct Runner {
    config: Config,
    note: Option<String>,
    error: Option<NoConfig>,
}

impl Runner {
    /// Read the config (`GPUARCH_CONFIG` or `/etc/gpuarch/config.yaml`,
    /// else gpuarchd's last valid one) and set the log up by it. Which
    /// was used is said by [`Runner::run`], once per start planned (the
    /// shim is also run for every other runtime command).
    pub fn load() -> Self {
        let l = gpuarch_fs::config::read_config_or_last_good();
        log::configure(&l.config.log);
        Self {
            config: l.config,
            note: l.note,
            error: l.error,
        }
    }

    /// The config the start is planned with (the defaults when none could
    /// be read).
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Plan the start with `plan`, given the config, unless none could be
    /// read; then log and record the Plan, or decide what becomes of the
    /// start, and say so.
    pub fn run<T: Planned>(
        self,
        start: &Start<'_>,
        plan: impl FnOnce(Config) -> Result<T, StartError>,
    ) -> Ran<T> {
        if let Some(n) = &self.note {
            log::warn(n);
        }
        let strict = self.config.strict;
        let records = self.config.hook.record_dir.clone();
        let result = match self.error {
            // A config that cannot be read leaves strict off: fail open.
            Some(e) => Err(StartError::from(e)),
            None => plan(self.config),
        };
        match result {
            Ok(mut out) => {
                let p = out.plan_mut();
                p.notes.extend(self.note);
                log::set_container(start.id, &p.container);
                log::plan(p);
                crate::keep_record(&records, start.id, start.by, p, start.only_first);
                Ran::Planned(out)
            }
            Err(e) => fail(&e, strict, start),
        }
    }
}

/// Say what becomes of a start that `e` kept from being planned.
pub fn fail<T>(e: &StartError, strict: bool, start: &Start<'_>) -> Ran<T> {
    match verdict(e, strict) {
        Verdict::Refused => {
            log::fatal(&format!("{e} (refusing to {} the container)", start.verb));
            Ran::Refused
        }
        Verdict::Strict => {
            log::fatal(&format!(
                "{e} (strict: refusing to {} the container)",
                start.verb
            ));
            Ran::Refused
        }
        Verdict::Unchanged => {
            log::warn(&format!("{e}; {}", start.unchanged));
            Ran::Unchanged
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_whatever_strict_says_else_strict_decides() {
        let audit = StartError::from(HookError::AuditRefused("sm_75 only".into()));
        let shim_audit = StartError::from(ShimError::Edit {
            path: "/b/config.json".into(),
            error: HookError::AuditRefused("sm_75 only".into()),
        });
        let plain = StartError::from(HookError::Shape("no process"));
        let big = StartError::TooLarge(64 << 20);
        for strict in [false, true] {
            assert_eq!(verdict(&audit, strict), Verdict::Refused);
            assert_eq!(verdict(&shim_audit, strict), Verdict::Refused);
        }
        assert_eq!(verdict(&plain, false), Verdict::Unchanged);
        assert_eq!(verdict(&plain, true), Verdict::Strict);
        assert_eq!(verdict(&big, false), Verdict::Unchanged);
        assert_eq!(
            big.to_string(),
            "OCI config is over 64 MiB; not planning it"
        );
    }
}
