//! Fuzzes the SSE parser: any bytes, split into reads at fuzzer-chosen points, never panic and
//! never yield an event over the cap.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use llm_canary::client::SseParser;

const LIMIT: usize = 4096;

fuzz_target!(|input: &[u8]| {
    // The first byte picks the read size, so the fuzzer explores splits too.
    let Some((&split, data)) = input.split_first() else {
        return;
    };
    let read = usize::from(split).max(1);
    let mut parser = SseParser::new(LIMIT);
    for chunk in data.chunks(read) {
        parser.feed(Bytes::copy_from_slice(chunk));
        loop {
            match parser.next_event() {
                Ok(Some(event)) => assert!(event.data.len() <= LIMIT),
                Ok(None) | Err(_) => break,
            }
        }
    }
    let _ = parser.finish();
});
