//! What GPU code a binary really carries, read from its bytes.
//!
//! A cubin is an ELF file for `EM_CUDA` whose SM version is in `e_flags`:
//! with ELF ABI version 7 (CUDA up to sm_90a) in the low byte, with the
//! `a` flag at `0x800`; with ABI version 8 (sm_100 and later) in the second
//! byte, with the `a` flag at `0x8`. CUDA 13's compilers no longer set
//! that flag (an nvcc 13.0 `sm_90a` cubin has the `sm_90` e_flags); they
//! record it in the `.nv.compat` section instead, as attribute 9
//! ("arch-specific") of its records, and both places are read. A fatbin is
//! a series of containers (magic `0xBA55ED50`) of entries, each PTX or a
//! cubin with the SM in its header and the `a` flag at `0x10_0000` of its
//! flags; a host shared library or executable carries fatbins in its
//! `.nv_fatbin` section. PTX names its target on its `.target` line.
//! (The CUDA 13 layouts were read off nvcc 13.0's output and are checked
//! against cuobjdump in kernels/tests/nvcc13.rs.)
//!
//! Nothing here trusts a file name: the store checks every build with
//! [`inspect`], and `gpuarchctl inspect` reports from it.

use std::fmt;

use gpuarch_core::arch::{CodeKind, ComputeCapability, CudaVersion, Specificity, Target};

const EM_CUDA: u16 = 190;
const FATBIN_MAGIC: u32 = 0xBA55_ED50;
const FATBIN_KIND_PTX: u16 = 1;
const FATBIN_KIND_ELF: u16 = 2;
/// Older fatbin compression flag, and the one newer toolkits use.
const FATBIN_COMPRESSED: u64 = 0x2000 | 0x8000;
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];
/// A fatbin entry's flag for arch-specific (`sm_90a`) code.
const FATBIN_ARCH_SPECIFIC: u64 = 0x0010_0000;
/// The `.nv.compat` attribute saying the code is arch-specific.
const COMPAT_ARCH_SPECIFIC: u8 = 9;

/// Data sections a library may keep fatbins of its own in, registered by
/// its code rather than by the CUDA runtime's start-up (cuFFT's `.ldata`).
const EMBEDDING_SECTIONS: [&str; 5] = [".ldata", ".lrodata", ".rodata", ".data.rel.ro", ".data"];

/// One piece of GPU code found in a binary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodeObject {
    /// SASS (`sm_86`) or PTX (`compute_86`).
    pub target: Target,
    /// Where it was found: `cubin`, `fatbin entry 2`, `.nv_fatbin container 1 entry 3`.
    pub origin: String,
    /// Kernel entry points, when the code could be read (not compressed).
    pub functions: Vec<String>,
    /// True when the SM came from the code itself (the cubin's ELF header or
    /// the PTX `.target`); false when only the fatbin entry header gave it
    /// because the payload is compressed.
    pub verified: bool,
}

/// Why a binary could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InspectError {
    #[error("not a cubin, fatbin, PTX file or ELF file with a .nv_fatbin section")]
    Unrecognised,
    #[error("malformed {what}: {reason}")]
    Malformed { what: &'static str, reason: String },
    #[error("{0}")]
    Arch(String),
}

fn malformed(what: &'static str, reason: impl Into<String>) -> InspectError {
    InspectError::Malformed {
        what,
        reason: reason.into(),
    }
}

impl fmt::Display for CodeObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.target.kind {
            CodeKind::Sass => "SASS",
            CodeKind::Ptx => "PTX",
        };
        write!(f, "{} {kind} ({})", self.target, self.origin)?;
        if !self.verified {
            write!(f, " [compressed: SM from the fatbin header]")?;
        }
        Ok(())
    }
}

fn u16_at(d: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_le_bytes(
        d.get(off..off.checked_add(2)?)?.try_into().ok()?,
    ))
}
fn u32_at(d: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        d.get(off..off.checked_add(4)?)?.try_into().ok()?,
    ))
}
fn u64_at(d: &[u8], off: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        d.get(off..off.checked_add(8)?)?.try_into().ok()?,
    ))
}

/// The target of an SM number (`86`, `100`) with or without `a`.
fn sm_target(sm: u32, arch_specific: bool, kind: CodeKind) -> Result<Target, InspectError> {
    let cap = ComputeCapability::new(
        u8::try_from(sm / 10)
            .map_err(|_| InspectError::Arch(format!("SM {sm} is out of range")))?,
        (sm % 10) as u8,
    );
    if !cap.is_known() {
        return Err(InspectError::Arch(format!(
            "SM {sm} is not a known compute capability"
        )));
    }
    let spec = if arch_specific && cap.has_arch_specific() {
        Specificity::ArchSpecific
    } else {
        Specificity::Generic
    };
    Ok(Target { cap, spec, kind })
}

pub use gpuarch_core::arch::Placement;

/// Where the code in `objs` runs on a GPU of capability `cap`
/// ([`gpuarch_core::arch::placement`]).
pub fn placement(
    objs: &[CodeObject],
    cap: ComputeCapability,
    driver_cuda: Option<CudaVersion>,
) -> Placement {
    gpuarch_core::arch::placement(objs.iter().map(|o| o.target), cap, driver_cuda)
}

/// Read everything `data` carries, each piece of code where it was found.
/// An empty list means a well-formed file with no GPU code (a host library
/// without `.nv_fatbin`).
pub fn inspect(data: &[u8]) -> Result<Vec<CodeObject>, InspectError> {
    walk(data, Sink::new(false), &|_| {})
}

/// What `data` carries, each distinct piece of code once: one object per
/// target (and per whether it was verified), the first place it was found,
/// the kernels of all its places. This is what gpuarchd keeps of a file it
/// stores: its size is bounded by the targets there are, not by the file,
/// however many entries a hostile fatbin has.
pub fn summarize(data: &[u8]) -> Result<Vec<CodeObject>, InspectError> {
    walk(data, Sink::new(true), &|_| {})
}

/// [`summarize`] of a mapped file, reading from disk little more than what
/// it looks at: a `.nv_fatbin` is walked by its entries' headers, each
/// compressed payload skipped, so the mapping is read page by page
/// ([`crate::file::Mapped::advise_random`]); what is read through, the
/// data sections searched for embedded fatbins and a file read as PTX
/// text, is read ahead. An image audit of a cold page cache read whole
/// files before (`scripts/bench-audit`'s cold part).
pub fn summarize_mapped(map: &crate::file::Mapped) -> Result<Vec<CodeObject>, InspectError> {
    walk_mapped(map, Sink::new(true))
}

/// [`inspect`] of a mapped file, read as [`summarize_mapped`] reads it.
pub fn inspect_mapped(map: &crate::file::Mapped) -> Result<Vec<CodeObject>, InspectError> {
    walk_mapped(map, Sink::new(false))
}

fn walk_mapped(map: &crate::file::Mapped, sink: Sink) -> Result<Vec<CodeObject>, InspectError> {
    map.advise_random();
    walk(map.bytes(), sink, &|section| map.advise_sequential(section))
}

/// Walk `data`; `scan` is told of each section about to be read through.
fn walk(
    data: &[u8],
    mut sink: Sink,
    scan: &dyn Fn(&[u8]),
) -> Result<Vec<CodeObject>, InspectError> {
    if data.starts_with(b"\x7fELF") {
        let elf = Elf::parse(data)?;
        if elf.machine == EM_CUDA {
            return Ok(vec![cubin_object(&elf, "cubin".into())?]);
        }
        for name in [".nv_fatbin", "__nv_relfatbin"] {
            if let Some(sec) = elf.section(name)? {
                fatbins(sec, name, &mut sink)?;
            }
        }
        for name in EMBEDDING_SECTIONS {
            if let Some(sec) = elf.section(name)? {
                scan(sec);
                fatbin::embedded_fatbins(sec, name, &mut sink);
            }
        }
        return Ok(sink.finish());
    }
    if u32_at(data, 0) == Some(FATBIN_MAGIC) {
        fatbins(data, "fatbin", &mut sink)?;
        return Ok(sink.finish());
    }
    // Anything else is read as PTX text, through.
    scan(data);
    if let Some((text, t)) = ptx_target(data) {
        return Ok(vec![CodeObject {
            target: t?,
            origin: "PTX".into(),
            functions: ptx_entries(text),
            verified: true,
        }]);
    }
    Err(InspectError::Unrecognised)
}

/// The most kernel names kept for one piece of code, and their most bytes:
/// enough for any real library, and a bound on what a crafted symbol table
/// (a million entries naming one long string) costs.
const MAX_NAMES: usize = 1 << 16;
const MAX_NAME_BYTES: usize = 4 << 20;

/// Kernel names, each once, in order, within [`MAX_NAMES`] and
/// [`MAX_NAME_BYTES`].
#[derive(Default)]
struct Names {
    set: std::collections::BTreeSet<String>,
    bytes: usize,
}

impl Names {
    fn add(&mut self, n: &str) {
        if self.set.len() < MAX_NAMES
            && self.bytes + n.len() <= MAX_NAME_BYTES
            && !self.set.contains(n)
        {
            self.bytes += n.len();
            self.set.insert(n.to_owned());
        }
    }

    fn into_vec(self) -> Vec<String> {
        self.set.into_iter().collect()
    }
}

/// Where the pieces of code a walk finds go: every one, or with
/// `distinct`, each target once, its kernels gathered as the walk goes.
struct Sink {
    objs: Vec<(CodeObject, Names)>,
    distinct: bool,
}

impl Sink {
    fn new(distinct: bool) -> Self {
        Self {
            objs: Vec::new(),
            distinct,
        }
    }

    fn push(&mut self, mut o: CodeObject) {
        if !self.distinct {
            self.objs.push((o, Names::default()));
            return;
        }
        let functions = std::mem::take(&mut o.functions);
        let names = match self
            .objs
            .iter_mut()
            .find(|(s, _)| s.target == o.target && s.verified == o.verified)
        {
            Some((_, names)) => names,
            None => {
                self.objs.push((o, Names::default()));
                &mut self.objs.last_mut().expect("just pushed").1
            }
        };
        for n in &functions {
            names.add(n);
        }
    }

    fn finish(self) -> Vec<CodeObject> {
        let distinct = self.distinct;
        self.objs
            .into_iter()
            .map(|(mut o, names)| {
                if distinct {
                    o.functions = names.into_vec();
                }
                o
            })
            .collect()
    }
}

/// The SASS target of a cubin, from its ELF header.
pub fn cubin_target(data: &[u8]) -> Result<Target, InspectError> {
    let elf = Elf::parse(data)?;
    if elf.machine != EM_CUDA {
        return Err(malformed(
            "cubin",
            format!("ELF machine {} is not EM_CUDA (190)", elf.machine),
        ));
    }
    elf_sm(&elf)
}

fn elf_sm(elf: &Elf<'_>) -> Result<Target, InspectError> {
    let (sm, a) = if elf.abi_version >= 8 {
        ((elf.flags >> 8) & 0xff, elf.flags & 0x8 != 0)
    } else {
        (elf.flags & 0xff, elf.flags & 0x800 != 0)
    };
    let a = a || elf.section(".nv.compat")?.is_some_and(compat_arch_specific);
    sm_target(sm, a, CodeKind::Sass)
}

/// Whether `.nv.compat` records the code as arch-specific. The section is
/// a run of records `[format, attribute, value...]`: format 1 carries no
/// value (2 bytes), 2 a byte and 3 a 16-bit value (4 bytes each), 4 a
/// 16-bit size and that many bytes. A format not known here ends the
/// reading.
fn compat_arch_specific(mut b: &[u8]) -> bool {
    while let [format, attr, rest @ ..] = b {
        let (value, len) = match format {
            1 => (0, 0),
            2 => (u16::from(rest.first().copied().unwrap_or(0)), 2),
            3 => (u16_at(rest, 0).unwrap_or(0), 2),
            4 => (0, 2 + usize::from(u16_at(rest, 0).unwrap_or(0))),
            _ => return false,
        };
        if *attr == COMPAT_ARCH_SPECIFIC && matches!(format, 2 | 3) {
            return value != 0;
        }
        let Some(next) = rest.get(len..) else {
            return false;
        };
        b = next;
    }
    false
}

fn cubin_object(elf: &Elf<'_>, origin: String) -> Result<CodeObject, InspectError> {
    Ok(CodeObject {
        target: elf_sm(elf)?,
        origin,
        functions: elf.functions()?,
        verified: true,
    })
}

/// The text and `.target` of PTX, if `data` looks like PTX: the text ends
/// at the first NUL (a fatbin pads it so).
fn ptx_target(data: &[u8]) -> Option<(&str, Result<Target, InspectError>)> {
    let text = std::str::from_utf8(data.split(|b| *b == 0).next()?).ok()?;
    if !text.lines().any(|l| l.trim_start().starts_with(".version")) {
        return None;
    }
    let line = text
        .lines()
        .find_map(|l| l.trim().strip_prefix(".target"))?;
    let first = line.split([',', ' ', '\t']).find(|s| !s.is_empty())?;
    let digits = first.strip_prefix("sm_")?;
    let (digits, a) = match digits.strip_suffix('a') {
        Some(d) => (d, true),
        None => (digits.strip_suffix('f').unwrap_or(digits), false),
    };
    Some((
        text,
        digits
            .parse::<u32>()
            .map_err(|_| malformed("PTX", format!("bad .target {first}")))
            .and_then(|sm| sm_target(sm, a, CodeKind::Ptx)),
    ))
}

fn ptx_entries(text: &str) -> Vec<String> {
    let mut names = Names::default();
    for l in text.lines() {
        if let Some(n) = l
            .trim()
            .strip_prefix(".visible .entry ")
            .and_then(|rest| rest.split(['(', ' ']).next())
        {
            names.add(n);
        }
    }
    names.into_vec()
}

/// The parts of an ELF file this module reads (64-bit little-endian only,
/// which is every cubin and every x86-64/aarch64 Linux library).
struct Elf<'a> {
    data: &'a [u8],
    machine: u16,
    abi_version: u8,
    flags: u32,
    sections: Vec<Section>,
    shstrndx: usize,
}

#[derive(Clone, Copy)]
struct Section {
    name: u32,
    kind: u32,
    offset: usize,
    size: usize,
    link: u32,
    entsize: usize,
}

impl<'a> Elf<'a> {
    fn parse(data: &'a [u8]) -> Result<Self, InspectError> {
        let bad = |r: &str| malformed("ELF", r.to_owned());
        if data.get(..4) != Some(b"\x7fELF") {
            return Err(bad("no ELF magic"));
        }
        if data.get(4) != Some(&2) || data.get(5) != Some(&1) {
            return Err(bad("not a 64-bit little-endian ELF"));
        }
        let abi_version = *data.get(8).ok_or_else(|| bad("truncated header"))?;
        let machine = u16_at(data, 18).ok_or_else(|| bad("truncated header"))?;
        let flags = u32_at(data, 48).ok_or_else(|| bad("truncated header"))?;
        let shoff = u64_at(data, 40).ok_or_else(|| bad("truncated header"))?;
        let shentsize = u16_at(data, 58).ok_or_else(|| bad("truncated header"))? as usize;
        let shnum = u16_at(data, 60).ok_or_else(|| bad("truncated header"))? as usize;
        let shstrndx = u16_at(data, 62).ok_or_else(|| bad("truncated header"))? as usize;
        let mut sections = Vec::with_capacity(shnum);
        if shnum > 0 {
            if shentsize < 64 {
                return Err(bad("section header entries too small"));
            }
            let shoff = usize::try_from(shoff).map_err(|_| bad("section table offset"))?;
            for i in 0..shnum {
                let h = shoff
                    .checked_add(i * shentsize)
                    .filter(|h| *h < data.len())
                    .ok_or_else(|| bad("section table past the end"))?;
                let field =
                    |o: usize| u64_at(data, h + o).ok_or_else(|| bad("section table past the end"));
                let s = Section {
                    name: u32_at(data, h).ok_or_else(|| bad("section table past the end"))?,
                    kind: u32_at(data, h + 4).ok_or_else(|| bad("section table past the end"))?,
                    offset: usize::try_from(field(24)?).map_err(|_| bad("section offset"))?,
                    size: usize::try_from(field(32)?).map_err(|_| bad("section size"))?,
                    link: u32_at(data, h + 40).ok_or_else(|| bad("section table past the end"))?,
                    entsize: usize::try_from(field(56)?).map_err(|_| bad("section entsize"))?,
                };
                sections.push(s);
            }
        }
        Ok(Self {
            data,
            machine,
            abi_version,
            flags,
            sections,
            shstrndx,
        })
    }

    fn bytes(&self, s: &Section) -> Result<&'a [u8], InspectError> {
        const SHT_NOBITS: u32 = 8;
        if s.kind == SHT_NOBITS {
            return Ok(&[]);
        }
        s.offset
            .checked_add(s.size)
            .and_then(|e| self.data.get(s.offset..e))
            .ok_or_else(|| malformed("ELF", "a section runs past the end of the file"))
    }

    /// The NUL-terminated string at `off` of `table`, and the bytes
    /// looked at to find its end.
    fn str_at(table: &[u8], off: u32) -> (Option<&str>, usize) {
        let Some(rest) = table.get(off as usize..) else {
            return (None, 0);
        };
        match rest.iter().position(|b| *b == 0) {
            Some(end) => (std::str::from_utf8(&rest[..end]).ok(), end + 1),
            None => (None, rest.len()),
        }
    }

    fn section(&self, name: &str) -> Result<Option<&'a [u8]>, InspectError> {
        let Some(strtab) = self.sections.get(self.shstrndx) else {
            return Ok(None);
        };
        let strtab = self.bytes(strtab)?;
        // Compared in place: a section name table without NULs costs each
        // section a few bytes, not a scan to the end.
        let want = |off: u32| {
            let at = off as usize;
            let end = at.checked_add(name.len())?;
            Some(strtab.get(at..end)? == name.as_bytes() && strtab.get(end) == Some(&0))
        };
        for s in &self.sections {
            if want(s.name) == Some(true) {
                return self.bytes(s).map(Some);
            }
        }
        Ok(None)
    }

    /// Names of the kernel entry points in `.symtab`. Symbol tables and
    /// names may overlap, so the bytes read are bounded by the file's size:
    /// a thousand tables over one region, or a million symbols pointing
    /// into one string without an end, are malformed, not a quadratic read.
    fn functions(&self) -> Result<Vec<String>, InspectError> {
        const SHT_SYMTAB: u32 = 2;
        const STT_FUNC: u8 = 2;
        let mut names = Names::default();
        let mut read = 0usize;
        let budget = self.data.len().saturating_mul(2);
        for s in self.sections.iter().filter(|s| s.kind == SHT_SYMTAB) {
            let syms = self.bytes(s)?;
            read = read.saturating_add(syms.len());
            if read > budget {
                return Err(malformed("ELF", "symbol tables overlap"));
            }
            let Some(strs) = self.sections.get(s.link as usize) else {
                continue;
            };
            let strs = self.bytes(strs)?;
            let ent = if s.entsize >= 24 { s.entsize } else { 24 };
            for sym in syms.chunks_exact(ent) {
                let name = u32_at(sym, 0).unwrap_or(0);
                let info = sym[4];
                // Kernels only: STO_CUDA_ENTRY in st_other, not device helpers.
                let entry = sym[5] & 0x10 != 0;
                if info & 0xf != STT_FUNC || !entry {
                    continue;
                }
                let (n, looked) = Self::str_at(strs, name);
                read = read.saturating_add(looked);
                if read > budget {
                    return Err(malformed("ELF", "symbol names overlap"));
                }
                if let Some(n) = n.filter(|n| !n.is_empty()) {
                    names.add(n);
                }
            }
        }
        Ok(names.into_vec())
    }
}

mod fatbin;

#[cfg(test)]
use fatbin::cubin_elf;
use fatbin::fatbins;
pub use fatbin::{write_cubin, write_fatbin};

#[cfg(test)]
mod tests;
