//! SPANK plugin: --elastic.
