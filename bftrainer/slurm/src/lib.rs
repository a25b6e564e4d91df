//! Safe layer over slurm-sys: every call frees what Slurm allocated and maps errors.
