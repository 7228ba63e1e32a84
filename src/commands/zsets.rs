//! The zsets family.
