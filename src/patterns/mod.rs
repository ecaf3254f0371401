//! The family's patterns, one module each.
