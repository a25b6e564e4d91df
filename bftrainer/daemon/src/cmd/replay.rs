//! `bftrainer replay`.

#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: &Args) -> anyhow::Result<()> {
    anyhow::bail!("`bftrainer replay` is not built yet")
}
