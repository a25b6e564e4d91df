//! `bftrainer bench-alloc`.

#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: &Args) -> anyhow::Result<()> {
    anyhow::bail!("`bftrainer bench-alloc` is not built yet")
}
