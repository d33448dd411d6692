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
