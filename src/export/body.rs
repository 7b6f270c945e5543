//! The response body of the HTTP surface: the chunks of an answer, written one after the other
//! with an exact length, holding the `/metrics` slot of the response until it is written or
//! dropped.

use std::convert::Infallible;
use std::pin::Pin;

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};

use super::admission::Slot;

/// A response body written chunk by chunk with an exact length (so a `content-length`). `/metrics`
/// hands over the exposition's chunks as they are kept (megabytes of latency series, shared, not
/// joined), and hyper writes them with vectored writes; every other answer is one chunk.
#[derive(Debug, Default)]
pub struct ChunksBody {
    chunks: std::collections::VecDeque<Bytes>,
    remaining: u64,
    /// A `/metrics` body's place among the responses in flight, given back when the body is
    /// written or dropped.
    _slot: Option<Slot>,
}

impl ChunksBody {
    pub fn new(chunks: Vec<Bytes>) -> Self {
        let chunks: std::collections::VecDeque<Bytes> =
            chunks.into_iter().filter(|c| !c.is_empty()).collect();
        let remaining = chunks.iter().map(|c| c.len() as u64).sum();
        Self {
            chunks,
            remaining,
            _slot: None,
        }
    }

    pub(super) fn holding(mut self, slot: Slot) -> Self {
        self._slot = Some(slot);
        self
    }
}

impl Body for ChunksBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        let chunk = this.chunks.pop_front().map(|chunk| {
            this.remaining -= chunk.len() as u64;
            Ok(Frame::data(chunk))
        });
        std::task::Poll::Ready(chunk)
    }

    fn is_end_stream(&self) -> bool {
        self.chunks.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}
