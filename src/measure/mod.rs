//! measure (in progress).

pub mod step;
pub mod window;
