//! Unit tests of `kernels/src/inspect.rs`.

use super::*;

/// A minimal cubin-shaped ELF header: enough for the SM rules.
fn header(abi: u8, flags: u32) -> Vec<u8> {
    let mut d = vec![0u8; 64];
    d[..4].copy_from_slice(b"\x7fELF");
    d[4] = 2;
    d[5] = 1;
    d[7] = if abi >= 8 { 65 } else { 51 };
    d[8] = abi;
    d[18..20].copy_from_slice(&EM_CUDA.to_le_bytes());
    d[48..52].copy_from_slice(&flags.to_le_bytes());
    d
}

#[test]
fn both_elf_layouts_and_arch_specific_targets() {
    // e_flags as NVRTC 12.9 writes them (read off real cubins).
    let cases = [
        (7, 0x0050_0550, "sm_80"),
        (7, 0x0056_0556, "sm_86"),
        (7, 0x005a_055a, "sm_90"),
        (7, 0x005a_0d5a, "sm_90a"),
        (8, 0x0600_6402, "sm_100"),
        (8, 0x0600_640a, "sm_100a"),
        (8, 0x0600_7802, "sm_120"),
    ];
    for (abi, flags, want) in cases {
        let t = cubin_target(&header(abi, flags)).unwrap();
        assert_eq!(t.to_string(), want, "abi {abi} flags {flags:#x}");
    }
    let e = cubin_target(&header(7, 0x0000_0063)).unwrap_err();
    assert!(e.to_string().contains("SM 99"), "{e}");
}

#[test]
fn garbage_is_an_error_not_a_panic() {
    assert_eq!(inspect(b"hello"), Err(InspectError::Unrecognised));
    let mut h = header(7, 0x56);
    h[40..48].copy_from_slice(&u64::MAX.to_le_bytes());
    h[60] = 3;
    h[58] = 64;
    assert!(inspect(&h).is_err());
    for cut in [0, 10, 20, 63] {
        let _ = inspect(&header(7, 0x56)[..cut]);
    }
    let mut fb = FATBIN_MAGIC.to_le_bytes().to_vec();
    fb.extend([1, 0, 16, 0]);
    fb.extend(1000u64.to_le_bytes());
    let e = inspect(&fb).unwrap_err();
    assert!(e.to_string().contains("past the end"), "{e}");
}

#[test]
fn ptx_target_line() {
    let ptx = b"//\n.version 8.8\n.target sm_80\n.address_size 64\n.visible .entry saxpy(\n";
    let o = inspect(ptx).unwrap();
    assert_eq!(o[0].target.to_string(), "compute_80");
    assert_eq!(o[0].functions, ["saxpy"]);
}

/// A cubin (sm_86) with one symbol table of `syms` kernel symbols,
/// each naming `strtab` at the offset `name(i)` gives.
fn cubin_with_symbols(strtab: &[u8], syms: usize, name: impl Fn(usize) -> u32) -> Vec<u8> {
    cubin_elf(header(7, 0x0056_0556), strtab, syms, name)
}

#[test]
fn a_cubins_kernels_are_named_each_once() {
    let cubin = cubin_with_symbols(b"\0saxpy\0axpy\0", 6, |i| [1, 7, 1, 2][i % 4]);
    let o = inspect(&cubin).unwrap();
    assert_eq!(o[0].target.to_string(), "sm_86");
    // Offset 2 names "axpy" inside "saxpy": tail-shared, as linkers do.
    assert_eq!(o[0].functions, ["axpy", "saxpy"]);
}

/// Run `f` on a thread; it must answer within `secs`.
fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(f()));
    rx.recv_timeout(std::time::Duration::from_secs(secs))
        .unwrap_or_else(|_| panic!("no answer in {secs} s"))
}

#[test]
fn symbols_into_one_endless_string_are_malformed_not_a_quadratic_read() {
    // 200,000 kernels naming 4 MiB without a NUL: each name read to the
    // end of the table would be 800 GiB of reading.
    let strtab = [b"\0".as_slice(), &vec![b'k'; 4 << 20]].concat();
    let cubin = cubin_with_symbols(&strtab, 200_000, |i| 1 + (i % 4096) as u32);
    let e = within(10, move || inspect(&cubin)).unwrap_err();
    assert!(e.to_string().contains("symbol names overlap"), "{e}");
}

#[test]
fn a_section_name_table_without_nuls_is_not_read_per_section() {
    // 65,535 sections, each named at another offset of 16 MiB without
    // a NUL: finding .nv_fatbin must not read to the end each time.
    let mut d = header(7, 0x56);
    d[18..20].copy_from_slice(&62u16.to_le_bytes()); // x86-64: a host library
    let names_at = d.len() as u64;
    d.extend(vec![b'n'; 16 << 20]);
    let shoff = d.len() as u64;
    for i in 0..65_535u32 {
        let mut h = [0u8; 64];
        h[..4].copy_from_slice(&i.to_le_bytes());
        h[4..8].copy_from_slice(&3u32.to_le_bytes());
        h[24..32].copy_from_slice(&names_at.to_le_bytes());
        h[32..40].copy_from_slice(&(16u64 << 20).to_le_bytes());
        d.extend(h);
    }
    d[40..48].copy_from_slice(&shoff.to_le_bytes());
    d[58..60].copy_from_slice(&64u16.to_le_bytes());
    d[60..62].copy_from_slice(&65_535u16.to_le_bytes());
    d[62..64].copy_from_slice(&0u16.to_le_bytes());
    assert_eq!(within(10, move || inspect(&d)), Ok(Vec::new()));
}

#[test]
fn a_summary_keeps_each_target_once_however_many_entries_carry_it() {
    let ptx = b".version 8.0\n.target sm_80\n.visible .entry k(\n".as_slice();
    let sass = header(7, 0x0056_0556);
    let mut entries = vec![(1u16, 80u32, ptx); 100_000];
    entries.push((2, 86, &sass));
    let fb = write_fatbin(&entries);
    assert_eq!(inspect(&fb).unwrap().len(), 100_001);
    let s = summarize(&fb).unwrap();
    let got: Vec<String> = s
        .iter()
        .map(|o| format!("{} {} {:?}", o.target, o.origin, o.functions))
        .collect();
    assert_eq!(
        got,
        [
            "compute_80 fatbin entry 1 [\"k\"]",
            "sm_86 fatbin entry 100001 []"
        ]
    );
}

#[test]
fn a_summary_gathers_kernels_once_not_again_for_each_entry() {
    // 50,000 entries of one target, each naming its own kernel: gathered
    // as they come, not the whole list rebuilt at each entry.
    let texts: Vec<String> = (0..50_000)
        .map(|i| format!(".version 8.0\n.target sm_80\n.visible .entry k{i}(\n"))
        .collect();
    let entries: Vec<(u16, u32, &[u8])> =
        texts.iter().map(|t| (1u16, 80u32, t.as_bytes())).collect();
    let fb = write_fatbin(&entries);
    let s = within(10, move || summarize(&fb)).unwrap();
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].functions.len(), 50_000);
}

/// A crafted data section: a container header at every 8 bytes, each
/// claiming the rest of the section, its entries skipped kinds, the last
/// one broken. The search walks each byte once: well under a second for
/// 4 MiB, not the quadratic walk each failed container re-read would cost.
#[test]
fn nested_container_headers_in_data_cost_one_walk() {
    let n = 4 << 20;
    let mut data = vec![0u8; n];
    let mut off = 0;
    while off + 64 <= n {
        data[off..off + 4].copy_from_slice(&FATBIN_MAGIC.to_le_bytes());
        data[off + 4..off + 6].copy_from_slice(&1u16.to_le_bytes());
        data[off + 6..off + 8].copy_from_slice(&16u16.to_le_bytes());
        data[off + 8..off + 16].copy_from_slice(&((n - off - 16) as u64).to_le_bytes());
        off += 8;
    }
    let t0 = std::time::Instant::now();
    let mut sink = Sink::new(false);
    fatbin::embedded_fatbins(&data, ".ldata", &mut sink);
    assert!(sink.finish().is_empty());
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(1),
        "{:?}",
        t0.elapsed()
    );
}
