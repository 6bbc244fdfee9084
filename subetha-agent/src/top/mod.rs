//! `subetha-agent top`: a live terminal view of a running agent.
//!
//! (Being built: issue 6.)

use anyhow::{Result, bail};

/// Arguments of `subetha-agent top`.
#[derive(Debug, clap::Args)]
pub struct TopArgs {
    /// Address of the running agent.
    #[arg(long, default_value = "127.0.0.1:9464")]
    pub addr: std::net::SocketAddr,
}

/// Runs the terminal view until the user quits.
pub fn run(_args: TopArgs) -> Result<()> {
    bail!("`top` is not built yet")
}
