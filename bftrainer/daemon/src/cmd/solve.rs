//! `bftrainer solve`.

#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: &Args) -> anyhow::Result<()> {
    anyhow::bail!("`bftrainer solve` is not built yet")
}
