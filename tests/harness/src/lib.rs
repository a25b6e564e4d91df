//! Test helper for the local Slurm cluster.
