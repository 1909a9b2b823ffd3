//! Fuzz target: the GGUF header parser on arbitrary bytes must return Ok or a typed error, never
//! panic or read out of bounds; on Ok, every getter and tensor range must behave too.
//! Run with `cargo +nightly fuzz run gguf_parse` from `model/` (seed with tests/data/*.gguf).
#![no_main]

use libfuzzer_sys::fuzz_target;
use nightshift_model::gguf::check_image;

fuzz_target!(|data: &[u8]| {
    if let Ok((md, tensors)) = check_image(data) {
        for (key, _) in md.iter() {
            let _ = md.get_u32(key);
            let _ = md.get_f32(key);
            let _ = md.get_str_array(key);
            let _ = md.get_i32_array(key);
        }
        for t in &tensors {
            assert!(t.offset() + t.size() <= data.len() as u64);
        }
    }
});
