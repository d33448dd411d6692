//! Reading the shipped config (packaging/config.yaml, 10 KB, mostly
//! comments), which the hook and the shim do at every container start,
//! against a baseline measured in the same process: parsing the same text
//! into a `serde_yaml::Value`, the least any YAML reader does with it.
//! Prints per-iteration times and the ratio.
//!
//! cargo bench -p gpuarch-core --bench config
//! BENCH_CONFIG=/etc/gpuarch/config.yaml cargo bench -p gpuarch-core --bench config

mod common;

use std::hint::black_box;

use common::time;

use gpuarch_core::config::Config;

fn main() {
    let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/../packaging/config.yaml");
    // BENCH_CONFIG=FILE times another config instead.
    let path = std::env::var("BENCH_CONFIG").unwrap_or(shipped.to_owned());
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let iters = 5_000;
    // Interleaved rounds, the median of each kind: the machine is noisy.
    let mut base = Vec::new();
    let mut read = Vec::new();
    for _ in 0..9 {
        base.push(time(iters, || {
            let v: serde_yaml::Value = serde_yaml::from_str(black_box(&text)).expect("yaml");
            black_box(v);
        }));
        read.push(time(iters, || {
            black_box(Config::from_yaml(black_box(&text)).expect("config"));
        }));
    }
    base.sort();
    read.sort();
    let (base, read) = (base[4], read[4]);
    println!(
        "{path}: {} bytes; 9 rounds of {iters} iterations each, medians",
        text.len()
    );
    println!("baseline  parse to serde_yaml::Value : {base:>10.2?}");
    println!(
        "Config::from_yaml (parse and check)  : {read:>10.2?}  ({:.2}x baseline)",
        read.as_secs_f64() / base.as_secs_f64()
    );
}
