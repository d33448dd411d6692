//! Fatbin containers: the entries a `.fatbin` file or a `.nv_fatbin`
//! section holds (SASS cubins, PTX text, compressed or not), read into
//! code objects; and the inverse, for making test libraries and imports.

use super::*;

/// A fatbin container of `(kind, sm, payload)` entries, kind 1 = PTX and
/// 2 = ELF, uncompressed, in the layout nvcc's fatbinary writes: the
/// inverse of [`inspect`] for fatbins, for making libraries to import and
/// test fixtures without NVIDIA's fatbinary (kernels/tests/inspect.rs
/// checks cuobjdump reads what this makes).
pub fn write_fatbin(entries: &[(u16, u32, &[u8])]) -> Vec<u8> {
    let mut body = Vec::new();
    for (kind, sm, payload) in entries {
        let mut data = payload.to_vec();
        if *kind == 1 {
            data.push(0);
        }
        while data.len() % 8 != 0 {
            data.push(0);
        }
        let mut h = vec![0u8; 64];
        h[0..2].copy_from_slice(&kind.to_le_bytes());
        h[2..4].copy_from_slice(&0x0101u16.to_le_bytes());
        h[4..8].copy_from_slice(&64u32.to_le_bytes());
        h[8..16].copy_from_slice(&(data.len() as u64).to_le_bytes());
        let (major, minor): (u16, u16) = if *kind == 1 { (8, 8) } else { (1, 7) };
        h[24..26].copy_from_slice(&minor.to_le_bytes());
        h[26..28].copy_from_slice(&major.to_le_bytes());
        h[28..32].copy_from_slice(&sm.to_le_bytes());
        h[40..48].copy_from_slice(&0x11u64.to_le_bytes()); // 64-bit, Linux host
        body.extend(h);
        body.extend(data);
    }
    let mut out = Vec::new();
    out.extend(0xBA55_ED50u32.to_le_bytes());
    out.extend(1u16.to_le_bytes());
    out.extend(16u16.to_le_bytes());
    out.extend((body.len() as u64).to_le_bytes());
    out.extend(body);
    out
}

/// A cubin of SM `sm` (below 100: ELF ABI 7) whose one kernel is
/// `kernel`: the inverse of [`inspect`] for a cubin's target and kernels,
/// for test fixtures without NVIDIA's compiler.
pub fn write_cubin(sm: u32, kernel: &str) -> Vec<u8> {
    let mut head = vec![0u8; 64];
    head[..4].copy_from_slice(b"\x7fELF");
    head[4] = 2;
    head[5] = 1;
    head[7] = 51;
    head[8] = 7;
    head[18..20].copy_from_slice(&EM_CUDA.to_le_bytes());
    head[48..52].copy_from_slice(&(sm | (sm << 16)).to_le_bytes());
    let strtab = format!("\0{kernel}\0");
    cubin_elf(head, strtab.as_bytes(), 1, |_| 1)
}

/// `head` (a cubin's ELF header) followed by a section name table, a
/// symbol table of `syms` kernel symbols, each naming `strtab` at the
/// offset `name(i)` gives, and that string table.
pub(super) fn cubin_elf(
    head: Vec<u8>,
    strtab: &[u8],
    syms: usize,
    name: impl Fn(usize) -> u32,
) -> Vec<u8> {
    let shstr = b"\0.shstrtab\0.symtab\0.strtab\0";
    let mut symtab = Vec::with_capacity(syms * 24);
    for i in 0..syms {
        let mut e = [0u8; 24];
        e[..4].copy_from_slice(&name(i).to_le_bytes());
        e[4] = 2; // STT_FUNC
        e[5] = 0x10; // STO_CUDA_ENTRY
        symtab.extend(e);
    }
    let mut d = head;
    let place = |bytes: &[u8], d: &mut Vec<u8>| {
        let at = d.len() as u64;
        d.extend(bytes);
        at
    };
    let shstr_at = place(shstr, &mut d);
    let sym_at = place(&symtab, &mut d);
    let str_at = place(strtab, &mut d);
    let shoff = d.len() as u64;
    // (name, type, offset, size, link, entsize)
    let sections = [
        (0u32, 0u32, 0u64, 0usize, 0u32, 0u64),
        (1, 3, shstr_at, shstr.len(), 0, 0),
        (11, 2, sym_at, symtab.len(), 3, 24),
        (19, 3, str_at, strtab.len(), 0, 0),
    ];
    for (name, kind, off, size, link, entsize) in sections {
        let mut h = [0u8; 64];
        h[..4].copy_from_slice(&name.to_le_bytes());
        h[4..8].copy_from_slice(&kind.to_le_bytes());
        h[24..32].copy_from_slice(&off.to_le_bytes());
        h[32..40].copy_from_slice(&(size as u64).to_le_bytes());
        h[40..44].copy_from_slice(&link.to_le_bytes());
        h[56..64].copy_from_slice(&entsize.to_le_bytes());
        d.extend(h);
    }
    d[40..48].copy_from_slice(&shoff.to_le_bytes());
    d[58..60].copy_from_slice(&64u16.to_le_bytes());
    d[60..62].copy_from_slice(&4u16.to_le_bytes());
    d[62..64].copy_from_slice(&1u16.to_le_bytes());
    d
}

/// Every container in a fatbin blob (a `.fatbin` file or a section).
pub(super) fn fatbins(data: &[u8], name: &str, out: &mut Sink) -> Result<(), InspectError> {
    let mut off = 0usize;
    let mut container = 0;
    while off + 16 <= data.len() {
        if u32_at(data, off) != Some(FATBIN_MAGIC) {
            // Containers in a section are 8-byte aligned with zero padding.
            if data[off..].iter().take(16).all(|b| *b == 0) {
                off += 8;
                continue;
            }
            return Err(malformed(
                "fatbin",
                format!("no fatbin magic at offset {off} of {name}"),
            ));
        }
        container += 1;
        let hdr = u16_at(data, off + 6).unwrap_or(0) as usize;
        let size = u64_at(data, off + 8).unwrap_or(0);
        if hdr < 16 {
            return Err(malformed("fatbin", format!("header size {hdr}")));
        }
        let end = usize::try_from(size)
            .ok()
            .and_then(|s| (off + hdr).checked_add(s))
            .filter(|e| *e <= data.len())
            .ok_or_else(|| {
                malformed(
                    "fatbin",
                    format!("container {container} runs past the end of {name}"),
                )
            })?;
        let mut e = off + hdr;
        let mut entry = 0;
        while e + 64 <= end {
            entry += 1;
            let origin = if name == "fatbin" && container == 1 {
                format!("fatbin entry {entry}")
            } else {
                format!("{name} container {container} entry {entry}")
            };
            e = fatbin_entry(data, e, end, origin, out)?;
        }
        off = end;
    }
    Ok(())
}

/// Fatbin containers a library keeps in its data (cuFFT 12 keeps 24,000
/// in `.ldata` and registers them itself; cuobjdump lists only its
/// `.nv_fatbin`): each well-formed container in `data`, wherever its
/// magic is (`.ldata`'s own alignment is not the file's). One that does
/// not parse is not code, and is passed over.
pub(super) fn embedded_fatbins(data: &[u8], name: &str, out: &mut Sink) {
    let magic = FATBIN_MAGIC.to_le_bytes();
    let finder = memchr::memmem::Finder::new(&magic);
    let mut off = 0usize;
    let mut container = 0;
    while off + 16 <= data.len() {
        let Some(at) = finder.find(&data[off..]) else {
            break;
        };
        off += at;
        if off + 16 > data.len() || u16_at(data, off + 4) != Some(1) {
            off += 1;
            continue;
        }
        let hdr = u16_at(data, off + 6).unwrap_or(0) as usize;
        let end = u64_at(data, off + 8)
            .and_then(|s| usize::try_from(s).ok())
            .and_then(|s| (off + hdr).checked_add(s))
            .filter(|e| hdr >= 16 && *e <= data.len() && *e > off + hdr);
        let Some(end) = end else {
            off += 1;
            continue;
        };
        let mut one = Sink::new(false);
        let mut e = off + hdr;
        let mut entry = 0;
        let ok = loop {
            if e + 64 > end {
                break true;
            }
            entry += 1;
            let origin = format!("{name} container {} entry {entry}", container + 1);
            match fatbin_entry(data, e, end, origin, &mut one) {
                Ok(next) => e = next,
                Err(_) => break false,
            }
        };
        if ok && entry > 0 {
            container += 1;
            for o in one.finish() {
                out.push(o);
            }
            off = end;
        } else {
            // What the failed container's entries spanned is not searched
            // again: each byte is walked once, whatever a crafted section
            // of nested headers claims.
            off = e.max(off + 1);
        }
    }
}

/// Read the entry at `e`; push its object; return where the next begins.
fn fatbin_entry(
    data: &[u8],
    e: usize,
    end: usize,
    origin: String,
    out: &mut Sink,
) -> Result<usize, InspectError> {
    let short = || malformed("fatbin", format!("{origin} is truncated"));
    let kind = u16_at(data, e).ok_or_else(short)?;
    let hdr = u32_at(data, e + 4).ok_or_else(short)? as usize;
    let padded = u64_at(data, e + 8).ok_or_else(short)?;
    let compressed_size = u32_at(data, e + 16).ok_or_else(short)? as usize;
    let sm = u32_at(data, e + 28).ok_or_else(short)?;
    let flags = u64_at(data, e + 40).ok_or_else(short)?;
    if hdr < 64 {
        return Err(malformed("fatbin", format!("{origin}: header size {hdr}")));
    }
    let next = usize::try_from(padded)
        .ok()
        .and_then(|p| (e + hdr).checked_add(p))
        .filter(|n| *n <= end)
        .ok_or_else(|| malformed("fatbin", format!("{origin} runs past its container")))?;
    let payload = &data[e + hdr..next];
    let compressed = flags & FATBIN_COMPRESSED != 0 || payload.starts_with(&ZSTD_MAGIC);
    let compressed = compressed && compressed_size <= payload.len();
    let kind = match kind {
        FATBIN_KIND_PTX => CodeKind::Ptx,
        FATBIN_KIND_ELF | 0x10 => CodeKind::Sass,
        _ => return Ok(next), // not code: skip it
    };
    let header_target = sm_target(sm, flags & FATBIN_ARCH_SPECIFIC != 0, kind)?;
    if compressed {
        out.push(CodeObject {
            target: header_target,
            origin,
            functions: Vec::new(),
            verified: false,
        });
        return Ok(next);
    }
    let obj = match kind {
        CodeKind::Sass => {
            let elf = Elf::parse(payload)?;
            let o = cubin_object(&elf, origin)?;
            if o.target.cap != header_target.cap {
                return Err(malformed(
                    "fatbin",
                    format!(
                        "{}: entry header says SM {sm} but its cubin is {}",
                        o.origin, o.target
                    ),
                ));
            }
            o
        }
        CodeKind::Ptx => {
            let (target, functions) = match ptx_target(payload) {
                Some((text, t)) => (t?, ptx_entries(text)),
                None => {
                    let text = payload.split(|b| *b == 0).next().unwrap_or_default();
                    let names = std::str::from_utf8(text).map(ptx_entries);
                    (header_target, names.unwrap_or_default())
                }
            };
            CodeObject {
                target,
                origin,
                functions,
                verified: true,
            }
        }
    };
    out.push(obj);
    Ok(next)
}
