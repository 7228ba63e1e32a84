//! The streams family.
