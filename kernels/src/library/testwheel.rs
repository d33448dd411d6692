//! A wheel as pip's builders write one, for tests: FlashInfer's cubin
//! wheel in small (two real Blackwell cubins, headers, its checksum lists),
//! or one made hostile member by member.
#![allow(clippy::unwrap_used, clippy::missing_panics_doc)] // a failed write is a failed test

use std::io::Write as _;
use std::path::Path;

use base64::Engine as _;
use sha2::Digest as _;

pub const SM100A: &[u8] = include_bytes!("../../tests/fixtures/nvcc13/sm_100a.cubin");
pub const SM100F: &[u8] = include_bytes!("../../tests/fixtures/nvcc13/sm_100f.cubin");
pub const FMHA: &str = "flashinfer_cubin/cubins/158f/fmha/trtllm-gen/";
pub const DSL: &str = "flashinfer_cubin/cubins/801e/fmha/cute-dsl/x86_64/sm_100a/";

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn sha(b: &[u8]) -> String {
    hex(&sha2::Sha256::digest(b))
}

/// A wheel as pip's builders write one: members, then RECORD naming each.
#[derive(Debug)]
pub struct Wheel {
    pub members: Vec<(String, Vec<u8>)>,
    pub symlinks: Vec<(String, String)>,
    /// Members left out of RECORD, or listed with another hash.
    pub unlisted: Vec<String>,
    pub wrong_hash: Vec<String>,
    pub compress: bool,
}

impl Wheel {
    pub fn flashinfer(version: &str) -> Self {
        let list = format!(
            "{}  fmhaSm100aKernel_Q.cubin\n{}  fmhaSm100fKernel_Q.cubin\n{}  fmhaSm103aKernel_Q.cubin\n{}  include/flashInferMetaInfo.h\n",
            sha(SM100A),
            sha(SM100F),
            "ab".repeat(32),
            sha(b"// meta\n"),
        );
        let dsl = format!("{}  cute_dsl_fmha_bf16.so\n", "cd".repeat(32));
        let members = vec![
            (
                "flashinfer_cubin/__init__.py".into(),
                b"CUBIN_DIR = None\n".to_vec(),
            ),
            (format!("{FMHA}fmhaSm100aKernel_Q.cubin"), SM100A.to_vec()),
            (format!("{FMHA}fmhaSm100fKernel_Q.cubin"), SM100F.to_vec()),
            (
                format!("{FMHA}include/flashInferMetaInfo.h"),
                b"// meta\n".to_vec(),
            ),
            (format!("{FMHA}checksums.txt"), list.into_bytes()),
            (format!("{DSL}checksums.txt"), dsl.into_bytes()),
            (
                format!("flashinfer_cubin-{version}.dist-info/METADATA"),
                format!(
                    "Metadata-Version: 2.1\nName: flashinfer-cubin\nVersion: {version}\n\nbody\n"
                )
                .into_bytes(),
            ),
        ];
        Self {
            members,
            symlinks: Vec::new(),
            unlisted: Vec::new(),
            wrong_hash: Vec::new(),
            compress: true,
        }
    }

    pub fn write(&self, path: &Path) {
        let f = std::fs::File::create(path).unwrap();
        let mut z = zip::ZipWriter::new(f);
        let method = if self.compress {
            zip::CompressionMethod::Deflated
        } else {
            zip::CompressionMethod::Stored
        };
        let opts = zip::write::SimpleFileOptions::default().compression_method(method);
        let mut record = String::new();
        let dist_info = self
            .members
            .iter()
            .find_map(|(n, _)| n.strip_suffix("/METADATA"))
            .unwrap()
            .to_owned();
        for (name, body) in &self.members {
            z.start_file(name.as_str(), opts).unwrap();
            z.write_all(body).unwrap();
            if self.unlisted.contains(name) {
                continue;
            }
            let digest = if self.wrong_hash.contains(name) {
                sha2::Sha256::digest(b"something else")
            } else {
                sha2::Sha256::digest(body)
            };
            let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(digest);
            record.push_str(&format!("{name},sha256={b64},{}\n", body.len()));
        }
        for (name, target) in &self.symlinks {
            z.add_symlink(name.as_str(), target.as_str(), opts).unwrap();
            let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .encode(sha2::Sha256::digest(target.as_bytes()));
            record.push_str(&format!("{name},sha256={b64},{}\n", target.len()));
        }
        record.push_str(&format!("{dist_info}/RECORD,,\n"));
        z.start_file(format!("{dist_info}/RECORD"), opts).unwrap();
        z.write_all(record.as_bytes()).unwrap();
        z.finish().unwrap();
    }
}

impl Wheel {
    /// Install it into `dir` as pip would (its members and RECORD), by way
    /// of the wheel file `whl`.
    pub fn install(&self, whl: &Path, dir: &Path) {
        self.write(whl);
        zip::ZipArchive::new(std::fs::File::open(whl).unwrap())
            .unwrap()
            .extract(dir)
            .unwrap();
    }
}
