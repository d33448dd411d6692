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
