//! measure (in progress).
