use super::*;

#[test]
fn a_distribution_is_found_however_it_is_spelled() {
    assert_eq!(kind("flashinfer_cubin"), Some(&FLASHINFER_CUBIN));
    assert_eq!(kind("FlashInfer.Cubin"), Some(&FLASHINFER_CUBIN));
    assert_eq!(kind("flashinfer-python"), None);
}

#[test]
fn versions_that_are_not_plain_directory_names_are_refused() {
    assert!(valid_version("0.6.13"));
    assert!(valid_version("0.3.1+cu129"));
    for bad in ["", ".", "..", "0.6/13", "0.6.13\n", &"9".repeat(65)] {
        assert!(!valid_version(bad), "{bad:?}");
    }
}

#[test]
fn the_image_names_the_exact_versions_a_library_is_gated_on() {
    let g = |e: &str| gated_dist_info(e);
    assert_eq!(
        g("flashinfer_python-0.6.13.dist-info"),
        Some(("flashinfer-python".into(), "0.6.13".into()))
    );
    assert_eq!(
        g("flashinfer_cubin-0.7.0rc1.dist-info"),
        Some(("flashinfer-cubin".into(), "0.7.0rc1".into()))
    );
    for other in [
        "numpy-2.1.0.dist-info",
        "flashinfer_python-0.6.13.egg-info",
        "flashinfer_python-...dist-info",
        "flashinfer_python-..\n.dist-info",
    ] {
        assert_eq!(g(other), None, "{other:?}");
    }
}
