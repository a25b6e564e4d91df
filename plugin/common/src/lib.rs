//! Shared FFI door for the plugins.
