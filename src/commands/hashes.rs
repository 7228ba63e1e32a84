//! The hash family.
