//! `cargo xtask bench` (being written).

use anyhow::Result;

/// Options of `cargo xtask bench`.
#[derive(clap::Args)]
pub struct BenchArgs {}

pub fn run(_args: &BenchArgs) -> Result<()> {
    anyhow::bail!("not written yet")
}
