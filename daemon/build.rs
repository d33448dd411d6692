//! Generates the NRI messages and services gpuarchd uses (proto/nri.proto)
//! with ttrpc's own code generator: pure Rust, no protoc. The generated
//! files' inner attributes are dropped so that `include!` can take them;
//! `src/nri/mod.rs` puts the same allowances on the modules instead.

use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=proto/nri.proto");
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    let gen_dir = Path::new(&out).join("generated");
    std::fs::create_dir_all(&gen_dir).expect("creating OUT_DIR/generated");
    ttrpc_codegen::Codegen::new()
        .out_dir(&gen_dir)
        .inputs(["proto/nri.proto"])
        .include("proto")
        .rust_protobuf()
        .customize(ttrpc_codegen::Customize {
            async_all: true,
            ..Default::default()
        })
        .run()
        .expect("generating the NRI bindings from proto/nri.proto");
    for name in ["nri.rs", "nri_ttrpc.rs"] {
        let text = std::fs::read_to_string(gen_dir.join(name)).expect("reading generated code");
        let kept: String = text
            .lines()
            .filter(|l| {
                let l = l.trim_start();
                !l.starts_with("#![") && !l.starts_with("//!")
            })
            .flat_map(|l| [l, "\n"])
            .collect();
        std::fs::write(Path::new(&out).join(name), kept).expect("writing generated code");
    }
}
