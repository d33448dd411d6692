//! Plans shaped by the image's consumers: xformers and DeepSpeed on Hopper,
//! an image not known or partly read, the attention hint, DeepSpeed's ops.

use super::*;

/// A node of one GPU of capability `cc`, in an image holding `dists`.
fn one_gpu(cc: &str, dists: &[(Dist, &str)], read: bool) -> Plan {
    let read: &[&str] = if read {
        &["/usr/lib/python3/dist-packages"]
    } else {
        &[]
    };
    one_gpu_in(cc, dists, read, &[])
}

/// [`one_gpu`], its image's environments `read` and `unread`.
fn one_gpu_in(cc: &str, dists: &[(Dist, &str)], read: &[&str], unread: &[&str]) -> Plan {
    use crate::select::tests::dev;
    let mut h = host();
    h.devices = vec![dev(0, 0, "GPU-x", "NVIDIA GPU", cc, 0x01)];
    let mut v = nvd("0");
    for (d, r) in dists {
        v.software
            .dists
            .insert(*d, crate::software::Release::parse(r).unwrap());
    }
    v.software.read = read.iter().map(|s| (*s).to_owned()).collect();
    v.software.unread = unread.iter().map(|s| (*s).to_owned()).collect();
    plan(&v, &h, &cfg())
}

#[test]
fn xformers_gets_9_0a_on_hopper_unless_deepspeed_would_reject_it() {
    let p = one_gpu(
        "9.0",
        &[(Dist::Xformers, "0.0.33"), (Dist::Torch, "2.9.1")],
        true,
    );
    assert_eq!(p.env_get("TORCH_CUDA_ARCH_LIST"), Some("9.0a"));
    assert!(
        p.notes
            .iter()
            .any(|n| n.contains("xformers 0.0.33 in the image builds FlashAttention 3")),
        "{:?}",
        p.notes
    );
    let p = one_gpu(
        "9.0",
        &[
            (Dist::Xformers, "0.0.33"),
            (Dist::DeepSpeed, "0.19.8"),
            (Dist::Torch, "2.9.1"),
        ],
        true,
    );
    // No list serves both: 9.0 traps xformers' FlashAttention 3, 9.0a
    // breaks DeepSpeed's builder; unset serves both, so it is not set, and
    // neither are DeepSpeed's op switches for it.
    assert_eq!(p.env_get("TORCH_CUDA_ARCH_LIST"), None);
    assert!(
        p.env.iter().all(|(k, _)| !k.starts_with("DS_BUILD_")),
        "{:?}",
        p.env
    );
    assert!(
        p.notes.iter().any(|n| n.starts_with(
            "TORCH_CUDA_ARCH_LIST not set: DeepSpeed 0.19.8 in the image rejects 9.0a, and xformers 0.0.33 built with 9.0 would trap"
        )),
        "{:?}",
        p.notes
    );
    assert!(
        !p.notes
            .iter()
            .any(|n| n.contains("nothing the container's toolkit")),
        "{:?}",
        p.notes
    );
    // The other lists are set as ever.
    assert_eq!(p.env_get("FLASHINFER_CUDA_ARCH_LIST"), Some("9.0a"));
    // Without xformers, or not on a Hopper: as ever.
    assert_eq!(
        one_gpu("9.0", &[], true).env_get("TORCH_CUDA_ARCH_LIST"),
        Some("9.0")
    );
    let p = one_gpu("8.6", &[(Dist::Xformers, "0.0.33")], true);
    assert_eq!(p.env_get("TORCH_CUDA_ARCH_LIST"), Some("8.6"));
}

#[test]
fn an_image_not_known_on_a_hopper_leaves_the_torch_list_to_its_consumers() {
    use crate::select::tests::dev;
    let mut h = host();
    h.devices = vec![dev(0, 0, "GPU-x", "NVIDIA H100", "9.0", 0x01)];
    let with = |cuda: Option<&str>| {
        let mut env = vec![("NVIDIA_VISIBLE_DEVICES", "0")];
        env.extend(cuda.map(|c| ("CUDA_VERSION", c)));
        plan(&ContainerView::with_env(env), &h, &cfg())
    };
    // Not read: an xformers (whose default builds 9.0a) and a DeepSpeed
    // (which rejects 9.0a) may both be there. Unset, each builds its own.
    for cuda in [None, Some("12.8.1"), Some("13.0.2")] {
        let p = with(cuda);
        assert_eq!(p.env_get("TORCH_CUDA_ARCH_LIST"), None, "{cuda:?}");
        assert!(
            p.notes.iter().any(|n| n.starts_with(
                "TORCH_CUDA_ARCH_LIST not set: not every environment of the image was read"
            ) && n.contains("an xformers, which may be in the image,")),
            "{cuda:?}: {:?}",
            p.notes
        );
        // The lists no consumer of the two reads are set as ever.
        assert_eq!(p.env_get("FLASHINFER_CUDA_ARCH_LIST"), Some("9.0a"));
    }
    // Before CUDA 12.0 xformers builds no FlashAttention 3: plain 9.0.
    assert_eq!(
        with(Some("11.8.0")).env_get("TORCH_CUDA_ARCH_LIST"),
        Some("9.0")
    );
    // Read, and neither there: 9.0 as ever.
    assert_eq!(
        one_gpu("9.0", &[(Dist::Torch, "2.9.1")], true).env_get("TORCH_CUDA_ARCH_LIST"),
        Some("9.0")
    );
}

/// [`one_gpu`], with an environment the image's interpreters would
/// import from that was not read.
fn one_gpu_partly_read(cc: &str, dists: &[(Dist, &str)]) -> Plan {
    one_gpu_in(
        cc,
        dists,
        &["/usr/local/lib/python3.12/dist-packages"],
        &["\"/opt/x/bin/python3\": no lib/python3.* under \"/opt/x\""],
    )
}

#[test]
fn an_absence_not_proven_never_makes_a_value_a_release_might_reject() {
    // xformers read, DeepSpeed perhaps in the environment not read: not
    // 9.0a, which DeepSpeed rejects, nor 9.0, which traps xformers'
    // FlashAttention 3: unset, as both take it.
    let p = one_gpu_partly_read("9.0", &[(Dist::Xformers, "0.0.33"), (Dist::Torch, "2.9.1")]);
    assert_eq!(p.env_get("TORCH_CUDA_ARCH_LIST"), None);
    let notes = p.notes.join("\n");
    assert!(
        notes.contains("TORCH_CUDA_ARCH_LIST not set: not every environment of the image was read, so a DeepSpeed (which rejects 9.0a) may be there"),
        "{notes}"
    );
    assert!(
        notes.contains(
            "not read, so a consumer not found may still be there: \"/opt/x/bin/python3\""
        ),
        "{notes}"
    );
    // A Turing: DeepSpeed not seen, not proven absent: its ops that cannot
    // run there are switched off.
    let p = one_gpu_partly_read("7.5", &[(Dist::Torch, "2.9.1")]);
    assert_eq!(p.env_get("DS_BUILD_FP_QUANTIZER"), Some("0"));
}

#[test]
fn a_new_deepspeed_found_does_not_vouch_for_an_environment_not_read() {
    // DeepSpeed 0.17 parses `10.0`; all read, a B200 gets its own name.
    let dists = [(Dist::Torch, "2.9.1"), (Dist::DeepSpeed, "0.17.0")];
    let p = one_gpu("10.0", &dists, true);
    assert_eq!(p.env_get("TORCH_CUDA_ARCH_LIST"), Some("10.0"));
    // Where a DeepSpeed from 0.12 to 0.15 may be, whose op builder raises
    // on `10.0` (where unset it builds), `9.0+PTX`, which it parses, would
    // give the B200 older code than torch builds unset: not set, as unset
    // serves both.
    let not_set = |p: &Plan| {
        assert_eq!(p.env_get("TORCH_CUDA_ARCH_LIST"), None, "{:?}", p.notes);
        assert!(
            p.notes.iter().any(|n| n
                .starts_with("TORCH_CUDA_ARCH_LIST not set: a DeepSpeed may be in the image")
                && n.contains("cannot parse 10.0, torch's SASS for 10.0")),
            "{:?}",
            p.notes
        );
    };
    // An environment not read may hold one.
    not_set(&one_gpu_partly_read("10.0", &dists));
    // DeepSpeed 0.15 beside a torch that names `10.0`.
    not_set(&one_gpu(
        "10.0",
        &[(Dist::Torch, "2.9.1"), (Dist::DeepSpeed, "0.15.4")],
        true,
    ));
    // Torch known (PYTORCH_VERSION), the image not read: any DeepSpeed
    // may be there.
    not_set(&one_gpu("10.0", &[(Dist::Torch, "2.9.1")], false));
}

#[test]
fn the_attention_hint_follows_the_images_flash_attn() {
    let attn = |p: &Plan| p.env_get("GPUARCH_ATTN_IMPLEMENTATION").map(str::to_owned);
    // Read, and no flash-attn: sdpa, and the note says why.
    let p = one_gpu("8.6", &[(Dist::Torch, "2.9.1")], true);
    assert_eq!(attn(&p).as_deref(), Some("sdpa"));
    assert!(
        p.notes.iter().any(|n| n
            == "GPUARCH_ATTN_IMPLEMENTATION=sdpa: FlashAttention-2 runs on every assigned GPU, but the image has no flash-attn (read from /usr/lib/python3/dist-packages)"),
        "{:?}",
        p.notes
    );
    // flash-attn there, the image not read, or not every environment read.
    let fa2 = Some("flash_attention_2".to_owned());
    assert_eq!(
        attn(&one_gpu("8.6", &[(Dist::FlashAttn, "2.8.3")], true)),
        fa2
    );
    assert_eq!(attn(&one_gpu("8.6", &[], false)), fa2);
    assert_eq!(attn(&one_gpu_partly_read("8.6", &[])), fa2);
    // No Python at all: what it installs at start decides; the GPUs' hint.
    let mut h = host();
    h.devices.truncate(2);
    let mut v = nvd("1");
    v.software.read.push(crate::software::NO_PYTHON.into());
    assert_eq!(attn(&plan(&v, &h, &cfg())), fa2);
    // A Turing never gets it, whatever the image.
    assert_eq!(
        attn(&one_gpu("7.5", &[(Dist::FlashAttn, "2.8.3")], true)).as_deref(),
        Some("sdpa")
    );
}

#[test]
fn deepspeed_ops_that_cannot_run_are_switched_off() {
    let ds = |p: &Plan| -> Vec<String> {
        p.env
            .iter()
            .filter(|(k, _)| k.starts_with("DS_BUILD_"))
            .map(|(k, v)| format!("{k}={v}"))
            .collect()
    };
    // A Turing: the three ops that keep 8.0 and newer only, where
    // DeepSpeed is present or the image was not read.
    let want = [
        "DS_BUILD_FP_QUANTIZER=0",
        "DS_BUILD_CUTLASS_OPS=0",
        "DS_BUILD_RAGGED_DEVICE_OPS=0",
    ];
    assert_eq!(
        ds(&one_gpu("7.5", &[(Dist::DeepSpeed, "0.19.8")], true)),
        want
    );
    assert_eq!(ds(&one_gpu("7.5", &[], false)), want);
    assert_eq!(
        ds(&one_gpu("7.5", &[], true)),
        Vec::<String>::new(),
        "read, no DeepSpeed"
    );
    // A Pascal: the one for 7.0 too.
    assert_eq!(ds(&one_gpu("6.1", &[], false)).len(), 4);
    assert!(ds(&one_gpu("8.6", &[], false)).is_empty());
    // Under the container's own list, nothing of DeepSpeed's.
    let mut h = host();
    h.devices.truncate(1);
    let v = ContainerView::with_env([
        ("NVIDIA_VISIBLE_DEVICES", "0"),
        ("TORCH_CUDA_ARCH_LIST", "7.5"),
    ]);
    assert!(ds(&plan(&v, &h, &cfg())).is_empty());
}
