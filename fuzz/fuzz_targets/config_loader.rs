//! Fuzzes the config loader (YAML parsing, schema, validation, SLO compilation): any text is
//! loaded or rejected with diagnostics, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    if let Ok(text) = std::str::from_utf8(input) {
        let _ = llm_canary::setup::Setup::parse(text, "fuzz.yaml", std::path::Path::new("."));
    }
});
