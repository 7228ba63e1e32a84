//! The sets family.
