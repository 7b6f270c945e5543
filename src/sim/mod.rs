//! sim (in progress).
