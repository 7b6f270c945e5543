//! Fuzzes the transport's response reader (`client::wire`): any bytes, split into reads at
//! fuzzer-chosen points, never panic and never yield more body than arrived; and a body in
//! chunked coding, cut into chunks and reads the fuzzer chooses, decodes to itself with what
//! follows it left over.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use llm_canary::client::{BodyDecoder, parse_head};

fuzz_target!(|input: &[u8]| {
    // The first byte picks the property (its low bit) and the read size (the rest).
    let Some((&first, data)) = input.split_first() else {
        return;
    };
    let read = usize::from(first >> 1).max(1);
    if first & 1 == 0 {
        any_response(data, read);
    } else {
        chunked_round_trip(data, read);
    }
});

/// The head, then the body its framing says, as the transport reads them.
fn any_response(data: &[u8], read: usize) {
    let mut buf = BytesMut::new();
    let mut head = None;
    let mut body = 0usize;
    for piece in data.chunks(read) {
        buf.extend_from_slice(piece);
        if head.is_none() {
            match parse_head(&mut buf) {
                Ok(Some(parsed)) => head = Some(parsed),
                Ok(None) => continue,
                Err(_) => return,
            }
        }
        let Some(head) = head.as_mut() else { continue };
        loop {
            match head.body.decode(&mut buf) {
                Ok(Some(bytes)) => {
                    assert!(!bytes.is_empty());
                    body += bytes.len();
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
    assert!(body <= data.len());
    if let Some(head) = head {
        assert!(!(head.persistent && head.body.ends_at_close()));
    }
}

/// The first four bytes name chunk sizes (1 to 256, in turn), the rest is the body.
fn chunked_round_trip(data: &[u8], read: usize) {
    let (sizes, body) = data.split_at(data.len().min(4));
    let sizes: Vec<usize> = sizes.iter().map(|&s| usize::from(s) + 1).collect();
    let mut wire = Vec::new();
    let mut rest = body;
    for &size in sizes.iter().cycle() {
        if rest.is_empty() {
            break;
        }
        let n = size.min(rest.len());
        wire.extend_from_slice(format!("{n:x}\r\n").as_bytes());
        wire.extend_from_slice(&rest[..n]);
        wire.extend_from_slice(b"\r\n");
        rest = &rest[n..];
    }
    wire.extend_from_slice(b"0\r\n\r\nNEXT");
    let mut decoder = BodyDecoder::chunked();
    let mut buf = BytesMut::new();
    let mut got = Vec::new();
    for piece in wire.chunks(read) {
        buf.extend_from_slice(piece);
        while let Some(bytes) = decoder.decode(&mut buf).expect("well-formed chunked coding") {
            got.extend_from_slice(&bytes);
        }
    }
    assert!(decoder.is_done());
    assert_eq!(got, body);
    assert_eq!(&buf[..], b"NEXT");
}
