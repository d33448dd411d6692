//! An image's `NVIDIA_REQUIRE_*` requirements, checked against each
//! assigned GPU and the host's driver the way NVIDIA's legacy runtime
//! checks them (`nvidia-container-cli --require`). NVIDIA's CDI mode does
//! not check them at all, so on a CDI node gpuarch is the only one to say.
//!
//! The grammar, as NVIDIA's evaluator reads it:
//!
//! ```text
//! NVIDIA_REQUIRE_CUDA="cuda>=12.4 brand=tesla,driver>=470,driver<471"
//!                      \_______/ \_____________________________/
//!                      one alternative  another: all of its terms
//! ```
//!
//! A space separates alternatives (any one may hold), a comma separates the
//! terms of one alternative (all must hold), and every `NVIDIA_REQUIRE_*`
//! variable must hold on every assigned GPU. A term is `NAME OP VALUE` with
//! NAME one of `cuda` (the driver's CUDA version), `driver` (the driver's
//! version), `arch` (the GPU's compute capability) or `brand` (its NVML
//! brand), any case; OP one of `=`, `!=`, `<`, `<=`, `>`, `>=` (`==` is not
//! one); versions are dotted numbers, trailing zeros not counting; `brand`
//! takes only `=` and `!=`. A term NVIDIA cannot read is an invalid
//! expression, which its runtime refuses to start. Evaluation stops where
//! NVIDIA's stops: at the first failing term of an alternative, and at the
//! first alternative that holds, so a bad term it never reads is no error
//! here either.
//!
//! Which variables count: every `NVIDIA_REQUIRE_*` but
//! `NVIDIA_REQUIRE_JETPACK*`; for an image with `CUDA_VERSION` and no
//! `NVIDIA_REQUIRE_CUDA`, `cuda>=MAJOR.MINOR` of it; none at all when
//! `NVIDIA_DISABLE_REQUIRE` is a true boolean (`1`, `t`, `true`, ...).

use std::fmt;

/// Longest requirement value evaluated (real ones are under 300 bytes); a
/// longer one is reported as unreadable rather than walked per GPU.
pub const MAX_VALUE: usize = 4096;

/// One requirement variable of the image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requirement {
    /// `NVIDIA_REQUIRE_CUDA`, or `CUDA_VERSION` for the legacy form.
    pub var: String,
    pub expr: String,
}

/// What the terms are compared with. `None` is a fact the host did not
/// give; NVIDIA's evaluator takes such a term as met, and so does this one.
#[derive(Clone, Copy, Debug, Default)]
pub struct Facts<'a> {
    /// The driver's CUDA version (`12.4`).
    pub cuda: Option<&'a str>,
    /// The driver's version (`550.54.15`).
    pub driver: Option<&'a str>,
    /// The GPU's compute capability (`9.0`); `None` when no GPU is assigned.
    pub arch: Option<&'a str>,
    /// The GPU's NVML brand as the snapshot spells it (`tesla`).
    pub brand: Option<&'a str>,
}

/// Why a requirement does not hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unmet {
    /// NVIDIA's evaluator cannot read this term: its runtime refuses.
    Invalid(String),
    /// No alternative holds; for each, the first term that failed.
    Failed(Vec<String>),
}

impl fmt::Display for Unmet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unmet::Invalid(t) => write!(f, "{t:?} is not a term NVIDIA's runtime can read"),
            Unmet::Failed(terms) => {
                let shown: Vec<String> = terms.iter().map(|t| format!("{t:?}")).collect();
                match shown.as_slice() {
                    [one] => write!(f, "{one} fails"),
                    _ => write!(f, "every alternative fails ({})", shown.join(", ")),
                }
            }
        }
    }
}

const PREFIX: &str = "NVIDIA_REQUIRE_";

/// The image's requirements, from its env entries in order (a name's
/// first entry is the one a process sees, as getenv).
pub fn of_env<'a>(env: impl IntoIterator<Item = (&'a str, &'a str)>) -> Vec<Requirement> {
    let mut seen = std::collections::HashSet::new();
    let mut out: Vec<Requirement> = Vec::new();
    let (mut disable, mut cuda_version, mut require_cuda) = (None, None, None);
    for (name, value) in env {
        if !seen.insert(name) {
            continue;
        }
        match name {
            "NVIDIA_DISABLE_REQUIRE" => disable = Some(value),
            "CUDA_VERSION" => cuda_version = Some(value),
            "NVIDIA_REQUIRE_CUDA" => require_cuda = Some(value),
            _ => {}
        }
        if name.starts_with(PREFIX) && !name.starts_with("NVIDIA_REQUIRE_JETPACK") {
            out.push(Requirement {
                var: name.to_owned(),
                expr: value.to_owned(),
            });
        }
    }
    if disable.is_some_and(parse_bool_true) {
        return Vec::new();
    }
    if let Some(v) = cuda_version.filter(|v| !v.is_empty())
        && require_cuda.is_none_or(str::is_empty)
        && let Some(mm) = major_minor(v)
    {
        out.push(Requirement {
            var: "CUDA_VERSION".to_owned(),
            expr: format!("cuda>={mm}"),
        });
    }
    out
}

/// Go's `strconv.ParseBool` true spellings.
fn parse_bool_true(v: &str) -> bool {
    matches!(v, "1" | "t" | "T" | "true" | "TRUE" | "True")
}

/// `12.4` of `12.4.1` or `v12.4`, as NVIDIA's legacy CUDA_VERSION reading.
fn major_minor(v: &str) -> Option<String> {
    let v = v.strip_prefix('v').unwrap_or(v);
    let core = v.split(['-', '+']).next()?;
    let mut parts = core.split('.');
    let major: u32 = parts.next()?.parse().ok()?;
    let minor: u32 = parts.next().map_or(Some(0), |m| m.parse().ok())?;
    Some(format!("{major}.{minor}"))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl Op {
    fn parse(s: &str) -> Option<Op> {
        Some(match s {
            "=" => Op::Eq,
            "!=" => Op::Ne,
            "<" => Op::Lt,
            "<=" => Op::Le,
            ">" => Op::Gt,
            ">=" => Op::Ge,
            _ => return None,
        })
    }

    fn holds(self, o: std::cmp::Ordering) -> bool {
        use std::cmp::Ordering::*;
        match self {
            Op::Eq => o == Equal,
            Op::Ne => o != Equal,
            Op::Lt => o == Less,
            Op::Le => o != Greater,
            Op::Gt => o == Greater,
            Op::Ge => o != Less,
        }
    }
}

/// Whether `v` is a version NVIDIA reads: digits and dots, not starting
/// with a dot, each number within u64.
fn valid_version(v: &str) -> bool {
    v.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        && !v.starts_with('.')
        && v.split('.')
            .all(|p| p.is_empty() || p.parse::<u64>().is_ok())
}

/// Compare dotted versions, missing numbers counting as zero; `None` when
/// either is not a version.
fn compare_versions(have: &str, want: &str) -> Option<std::cmp::Ordering> {
    if !valid_version(have) || !valid_version(want) {
        return None;
    }
    let mut a = have.split('.').filter(|p| !p.is_empty());
    let mut b = want.split('.').filter(|p| !p.is_empty());
    let num = |p: Option<&str>| p.map_or(0, |p| p.parse::<u64>().unwrap_or(0));
    loop {
        let (x, y) = (a.next(), b.next());
        if x.is_none() && y.is_none() {
            break;
        }
        match num(x).cmp(&num(y)) {
            std::cmp::Ordering::Equal => {}
            o => return Some(o),
        }
    }
    Some(std::cmp::Ordering::Equal)
}

/// The brand NVIDIA's evaluator compares: it knows six names and calls
/// every other brand `Unknown`.
fn nvidia_brand(snapshot_brand: &str) -> &'static str {
    match snapshot_brand {
        "quadro" => "quadro",
        "tesla" => "tesla",
        "nvs" => "nvs",
        "grid" => "grid",
        "geforce" => "geforce",
        "titan" => "titan",
        _ => "unknown",
    }
}

/// One term: `Some(holds)`, or `None` when NVIDIA cannot read it.
fn term(t: &str, facts: &Facts<'_>) -> Option<bool> {
    let is_op = |c: char| matches!(c, '<' | '>' | '=' | '!');
    let start = t.find(is_op)?;
    let (name, rest) = t.split_at(start);
    let end = rest.find(|c| !is_op(c)).unwrap_or(rest.len());
    let (op, value) = rest.split_at(end);
    let op = Op::parse(op)?;
    if name.is_empty() || value.is_empty() {
        return None;
    }
    let version = |have: Option<&str>| match have {
        None => Some(true),
        Some(h) => compare_versions(h, value).map(|o| op.holds(o)),
    };
    let is = |n: &str| name.eq_ignore_ascii_case(n);
    if is("cuda") {
        version(facts.cuda)
    } else if is("driver") {
        version(facts.driver)
    } else if is("arch") {
        version(facts.arch)
    } else if is("brand") {
        {
            let equal = |b: &str| nvidia_brand(b).eq_ignore_ascii_case(value);
            match (op, facts.brand) {
                (Op::Eq | Op::Ne, None) => Some(true),
                (Op::Eq, Some(b)) => Some(equal(b)),
                (Op::Ne, Some(b)) => Some(!equal(b)),
                _ => None,
            }
        }
    } else {
        None
    }
}

/// Check one requirement's expression against `facts`.
pub fn check(expr: &str, facts: &Facts<'_>) -> Result<(), Unmet> {
    if expr.len() > MAX_VALUE {
        return Err(Unmet::Invalid(format!(
            "{}... ({} bytes)",
            expr.chars().take(32).collect::<String>(),
            expr.len()
        )));
    }
    let mut failed = Vec::new();
    for alternative in expr.split(' ').filter(|a| !a.is_empty()) {
        let mut first_failure = None;
        for t in alternative.split(',').filter(|t| !t.is_empty()) {
            match term(t, facts) {
                None => return Err(Unmet::Invalid(t.to_owned())),
                Some(true) => {}
                Some(false) => {
                    first_failure = Some(t.to_owned());
                    break;
                }
            }
        }
        match first_failure {
            None => return Ok(()),
            Some(t) => failed.push(t),
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(Unmet::Failed(failed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h100<'a>() -> Facts<'a> {
        Facts {
            cuda: Some("12.4"),
            driver: Some("550.54.15"),
            arch: Some("9.0"),
            brand: Some("nvidia"),
        }
    }

    #[test]
    fn space_is_or_comma_is_and() {
        let f = h100();
        // The NGC base image's form: the first alternative holds.
        assert_eq!(
            check("cuda>=12.4 brand=tesla,driver>=470,driver<471", &f),
            Ok(())
        );
        assert_eq!(
            check("cuda>=12.6 brand=tesla,driver>=470", &f),
            Err(Unmet::Failed(vec![
                "cuda>=12.6".into(),
                "brand=tesla".into()
            ]))
        );
        // An alternative holds only when each of its terms does.
        assert_eq!(
            check("cuda>=12.6 arch>=9.0,driver>=560", &f),
            Err(Unmet::Failed(vec![
                "cuda>=12.6".into(),
                "driver>=560".into()
            ]))
        );
        assert_eq!(check("cuda>=12.6 arch>=9.0,driver>=550", &f), Ok(()));
        assert_eq!(check("", &f), Ok(()));
        assert_eq!(check("  ,, ", &f), Ok(()));
    }

    #[test]
    fn versions_compare_as_numbers_with_trailing_zeros_equal() {
        let f = h100();
        for (expr, holds) in [
            ("driver>=470", true),
            ("driver>550.54", true),
            ("driver=550.54.15", true),
            ("driver=550.54.15.0", true),
            ("driver<550.54.9", false),
            ("driver<550.54.150", true),
            ("cuda=12.4.0", true),
            ("cuda!=12.4", false),
            ("cuda<=12.4", true),
            ("arch=9", true),
            ("arch<9.1", true),
            ("arch>=10.0", false),
            ("CUDA>=12.3", true),
            ("Arch=9.0", true),
        ] {
            assert_eq!(check(expr, &f).is_ok(), holds, "{expr}");
        }
    }

    #[test]
    fn brands_are_nvidias_six_names_or_unknown() {
        let mut f = h100();
        assert!(
            check("brand=unknown", &f).is_ok(),
            "NVML's nvidia is Unknown to NVIDIA"
        );
        assert!(check("brand=nvidia", &f).is_err());
        f.brand = Some("tesla");
        assert!(check("brand=Tesla", &f).is_ok());
        assert!(check("brand!=tesla", &f).is_err());
        f.brand = Some("geforce_rtx");
        assert!(check("brand=unknown", &f).is_ok());
        assert!(check("brand=geforce", &f).is_err());
        f.brand = None;
        assert!(
            check("brand=quadro", &f).is_ok(),
            "no brand known: met, as NVIDIA"
        );
    }

    #[test]
    fn what_nvidia_cannot_read_is_invalid() {
        let f = h100();
        for t in [
            "cuda==12.4",
            "cuda=>12",
            "cuda>=",
            ">=12",
            "cuda12",
            "cuda>=12.x",
            "cuda>=.12",
            "brand>=tesla",
            "vram>=80",
            "cuda>=-1",
        ] {
            assert_eq!(check(t, &f), Err(Unmet::Invalid(t.into())), "{t}");
        }
        // Not read at all: the first alternative already holds, or the
        // alternative failed before it.
        assert_eq!(check("cuda>=12 vram>=80", &f), Ok(()));
        assert!(matches!(
            check("cuda>=13,vram>=80", &f),
            Err(Unmet::Failed(_))
        ));
        let long = "cuda>=1,".repeat(MAX_VALUE);
        assert!(matches!(check(&long, &f), Err(Unmet::Invalid(_))));
    }

    #[test]
    fn facts_not_known_are_met() {
        let none = Facts::default();
        assert_eq!(
            check("cuda>=99 driver>=999 arch=1.0,brand=nvs", &none),
            Ok(())
        );
        // NVIDIA does not read the value of a term it has no fact for, but
        // it does look the name up.
        assert_eq!(check("cuda>=x", &none), Ok(()));
        assert!(check("vram>=1", &none).is_err());
    }

    #[test]
    fn which_variables_count() {
        let env = |pairs: &'static [(&'static str, &'static str)]| of_env(pairs.iter().copied());
        let r = env(&[
            ("NVIDIA_REQUIRE_CUDA", "cuda>=12.4"),
            ("NVIDIA_REQUIRE_DRIVER", "driver>=550"),
            ("NVIDIA_REQUIRE_JETPACK", "csv-mounts=all"),
            ("NVIDIA_REQUIRE_JETPACK_HOST_MOUNTS", "x"),
            ("CUDA_VERSION", "11.0.3"),
        ]);
        let vars: Vec<&str> = r.iter().map(|r| r.var.as_str()).collect();
        assert_eq!(vars, ["NVIDIA_REQUIRE_CUDA", "NVIDIA_REQUIRE_DRIVER"]);
        // Legacy: CUDA_VERSION without NVIDIA_REQUIRE_CUDA.
        let r = env(&[("CUDA_VERSION", "12.4.1")]);
        assert_eq!(r[0].expr, "cuda>=12.4");
        assert_eq!(env(&[("CUDA_VERSION", "12")])[0].expr, "cuda>=12.0");
        assert!(env(&[("CUDA_VERSION", "latest")]).is_empty());
        // The first entry of a name is the one that counts.
        let r = env(&[
            ("NVIDIA_REQUIRE_CUDA", "cuda>=1"),
            ("NVIDIA_REQUIRE_CUDA", "cuda>=99"),
        ]);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].expr, "cuda>=1");
        // NVIDIA_DISABLE_REQUIRE takes Go's true spellings only.
        for (v, off) in [
            ("1", true),
            ("true", true),
            ("T", true),
            ("yes", false),
            ("0", false),
        ] {
            let pairs: &'static [(&str, &str)] = Box::leak(Box::new([
                ("NVIDIA_DISABLE_REQUIRE", v),
                ("NVIDIA_REQUIRE_CUDA", "cuda>=99"),
            ]));
            assert_eq!(env(pairs).is_empty(), off, "NVIDIA_DISABLE_REQUIRE={v}");
        }
    }
}
