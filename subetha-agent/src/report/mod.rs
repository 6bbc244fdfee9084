//! `subetha-agent report`: storm timeline pictures (SVG, PNG) and an HTML report.
//!
//! (Being built: issue 6.)

use anyhow::{Result, bail};

/// Arguments of `subetha-agent report`.
#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// Address of the running agent.
    #[arg(long, default_value = "127.0.0.1:9464")]
    pub addr: std::net::SocketAddr,
    /// The storm to draw (default: all recent storms, for an HTML report).
    #[arg(long)]
    pub storm: Option<u64>,
    /// Output file: `.svg`, `.png` or `.html`.
    #[arg(long)]
    pub out: std::path::PathBuf,
}

/// Renders the requested report.
pub fn run(_args: ReportArgs) -> Result<()> {
    bail!("`report` is not built yet")
}
