#![no_main]
#![allow(unsafe_code)]
libfuzzer_sys::fuzz_target!(|data: &[u8]| toolgate_fuzz::targets::jwks(data));
