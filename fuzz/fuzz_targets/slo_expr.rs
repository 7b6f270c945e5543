//! Fuzzes the SLO expression and SLI parsers: any text is parsed or rejected with a position,
//! never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    if let Ok(text) = std::str::from_utf8(input) {
        let _ = llm_canary::slo::parse_condition(text);
        let _ = llm_canary::slo::parse_sli(text);
    }
});
