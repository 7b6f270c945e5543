//! The configuration: typed schema, strict parsing with source locations, validation that reports
//! every error as `FILE:LINE:COL: message`, and the defaults of the source document.

mod target;

pub use target::{Api, Dialect, LengthControl, ServingMode};
