//! How gpuarchctl prints: tables, sizes, ages, a Plan. One of each, for
//! every command.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gpuarch_core::plan::Plan;

/// `s` as a terminal may be given it: a control character (a newline, an
/// escape sequence) from a container, an image or a record written as
/// `\n`, `\u{1b}`, so no line can be forged and no terminal driven. Every
/// string gpuarchctl prints that it did not write itself goes through it.
pub fn shown(s: &str) -> std::borrow::Cow<'_, str> {
    gpuarch_core::text::clean(s)
}

/// Left-aligned columns, two spaces apart; trailing blanks trimmed. Each
/// cell is [`shown`].
pub fn table(rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| r.iter().map(|c| shown(c).into_owned()).collect())
        .collect();
    let rows = &rows;
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut s = String::new();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(i, cell)| format!("{cell:<w$}", w = widths[i]))
            .collect();
        s.push_str(line.join("  ").trim_end());
        s.push('\n');
    }
    s
}

/// `512 B`, `1.5 KiB`, `10.0 GiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// `3d 4h`, `5m 2s`, `42s`: the two largest units.
pub fn short_duration(d: Duration) -> String {
    let s = d.as_secs();
    let (days, h, m, sec) = (s / 86400, s / 3600 % 24, s / 60 % 60, s % 60);
    match (days, h, m) {
        (0, 0, 0) => format!("{sec}s"),
        (0, 0, _) => format!("{m}m {sec}s"),
        (0, _, _) => format!("{h}h {m}m"),
        _ => format!("{days}d {h}h"),
    }
}

/// Time since an RFC 3339 stamp, if it parses and is in the past.
pub fn age_of_stamp(stamp: &str) -> Option<Duration> {
    let t = humantime::parse_rfc3339(stamp).ok()?;
    SystemTime::now().duration_since(t).ok()
}

/// Time since a moment in microseconds since the epoch (as gpuarchd's
/// properties give them); None for 0, which means never.
pub fn age_of_usec(usec: u64) -> Option<Duration> {
    let t = UNIX_EPOCH + Duration::from_micros(usec);
    (usec > 0).then(|| SystemTime::now().duration_since(t).unwrap_or_default())
}

/// Pretty JSON and a newline.
pub fn json(out: &mut String, doc: &impl serde::Serialize) -> serde_json::Result<()> {
    out.push_str(&serde_json::to_string_pretty(doc)?);
    out.push('\n');
    Ok(())
}

/// A whole Plan: the GPUs, then the env and notes.
pub fn plan(plan: &Plan, out: &mut String) {
    match plan.source {
        Some(src) if !plan.gpus.is_empty() => {
            let _ = writeln!(out, "GPUs (from {src}, in CUDA order):");
            let rows: Vec<Vec<String>> = plan
                .gpus
                .iter()
                .map(|g| {
                    vec![
                        format!(
                            "  {}",
                            g.mig
                                .map_or(g.index.to_string(), |m| format!("{}:{m}", g.index))
                        ),
                        g.name.clone(),
                        g.compute_capability.to_string(),
                        g.uuid.clone(),
                    ]
                })
                .collect();
            out.push_str(&table(&rows));
        }
        _ => out.push_str("GPUs: none\n"),
    }
    env_notes(
        plan.env.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        &plan.notes,
        out,
    );
}

/// The env a container gets and the notes saying why.
pub fn env_notes<'a>(
    env: impl ExactSizeIterator<Item = (&'a str, &'a str)>,
    notes: &[String],
    out: &mut String,
) {
    if env.len() == 0 {
        out.push_str("env: none (the container starts unchanged)\n");
    } else {
        out.push_str("env:\n");
        for (k, v) in env {
            let _ = writeln!(out, "  {}={}", shown(k), shown(v));
        }
    }
    out.push_str("notes:\n");
    for n in notes {
        let _ = writeln!(out, "  - {}", shown(n));
    }
}

/// A bus record (an `a{sv}` dictionary of `gpuarch_wire::dbus`) as plain
/// JSON, from the record's own `Serialize`: each value comes out of its
/// D-Bus variant (`{"signature": "s", "value": "x"}` becomes `"x"`), so a
/// field added to the record reaches `--json` without being named here.
pub fn record(r: &impl serde::Serialize) -> serde_json::Result<serde_json::Value> {
    let mut v = serde_json::to_value(r)?;
    if let serde_json::Value::Object(fields) = &mut v {
        for field in fields.values_mut() {
            if let serde_json::Value::Object(variant) = field
                && variant.len() == 2
                && variant.contains_key("signature")
                && let Some(inner) = variant.remove("value")
            {
                *field = inner;
            }
        }
    }
    Ok(v)
}

/// [`record`] for each of a list.
pub fn records<T: serde::Serialize>(rs: &[T]) -> serde_json::Result<Vec<serde_json::Value>> {
    rs.iter().map(record).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bus_record_is_plain_json_with_every_field() {
        let k = gpuarch_wire::dbus::KernelRecord {
            key: "ab12".into(),
            package: "saxpy".into(),
            version: "1".into(),
            variant: "default".into(),
            dtype: String::new(),
            arch: "sm_86".into(),
            toolkit: "nvrtc 13.0".into(),
            bytes: 4096,
            files: vec!["saxpy.cubin".into()],
            pinned: true,
            in_use: false,
            last_used: 7,
            built_at: 5,
            path: "/var/cache/gpuarch/kernels/ab12".into(),
        };
        let v = record(&k).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "key": "ab12", "package": "saxpy", "version": "1",
                "variant": "default", "dtype": "", "arch": "sm_86",
                "toolkit": "nvrtc 13.0", "bytes": 4096, "files": ["saxpy.cubin"],
                "pinned": true, "in_use": false, "last_used": 7, "built_at": 5,
                "path": "/var/cache/gpuarch/kernels/ab12",
            })
        );
    }

    #[test]
    fn sizes_and_ages_read_as_a_person_says_them() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(11_811_160_064), "11.0 GiB");
        assert_eq!(short_duration(Duration::from_secs(42)), "42s");
        assert_eq!(short_duration(Duration::from_secs(302)), "5m 2s");
        assert_eq!(short_duration(Duration::from_secs(90_061)), "1d 1h");
        assert_eq!(age_of_usec(0), None);
        assert!(age_of_stamp("2026-01-01T00:00:00Z").is_some());
        assert_eq!(age_of_stamp("yesterday"), None);
    }

    #[test]
    fn columns_line_up() {
        let t = table(&[
            vec!["GPU".into(), "NAME".into()],
            vec!["10".into(), "A100".into()],
        ]);
        assert_eq!(t, "GPU  NAME\n10   A100\n");
    }
}
