//! client (in progress).
