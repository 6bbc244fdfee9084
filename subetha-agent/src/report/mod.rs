//! `subetha-agent report`: storm timeline pictures (SVG, PNG) and an HTML
//! report of recent storms, from a running agent.
//!
//! * [`timeline`]: what the agent collects around each storm (drop rates
//!   of the process's rings, scans, the scanner's scheduler states, the
//!   producer's CPU), bounded; served by `/api/v1/storms/{id}`.
//! * [`render`]: one storm's picture, drawn with plotters.
//! * [`html`]: the HTML page listing storms with their pictures inline.
//!
//! The output format follows the `--out` file's extension (`.svg`, `.png`,
//! `.html`); anything else, an unknown storm id, or an agent that does not
//! answer is an error naming the problem, and nothing is written.

pub mod html;
pub mod render;
pub mod timeline;

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::client;
use crate::model::{AgentSnapshot, StormDetail};

/// Arguments of `subetha-agent report`.
#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// Address of the running agent.
    #[arg(long, default_value = "127.0.0.1:9464")]
    pub addr: SocketAddr,
    /// The storm to draw (default: the newest for a picture, the newest
    /// `--limit` for an HTML report).
    #[arg(long)]
    pub storm: Option<u64>,
    /// Output file: `.svg` or `.png` (one storm's picture) or `.html` (a
    /// report of recent storms with their pictures).
    #[arg(long)]
    pub out: PathBuf,
    /// Storms in an HTML report, newest first.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub limit: u64,
}

/// What `--out` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// One picture as SVG.
    Svg,
    /// One picture as PNG.
    Png,
    /// The HTML report.
    Html,
}

impl Format {
    /// The format `path`'s extension names.
    pub fn of(path: &Path) -> Result<Self> {
        let extension = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase)
            .unwrap_or_default();
        Ok(match extension.as_str() {
            "svg" => Self::Svg,
            "png" => Self::Png,
            "html" | "htm" => Self::Html,
            _ => bail!(
                "cannot tell what to write from {:?}: --out must end in .svg, .png or .html",
                path.display().to_string()
            ),
        })
    }
}

/// Renders the requested report.
pub fn run(args: ReportArgs) -> Result<()> {
    let format = Format::of(&args.out)?;
    // Fail on a missing font before asking the agent anything.
    render::ensure_font()?;
    let snapshot: AgentSnapshot = serde_json::from_str(
        &client::get(args.addr, "/api/v1/snapshot")
            .with_context(|| format!("no snapshot from the agent at {}", args.addr))?,
    )
    .context("the agent's snapshot does not parse")?;
    let ids = storm_ids(&snapshot, args.storm, format, args.limit as usize, args.addr)?;
    let details = ids
        .iter()
        .map(|&id| fetch_storm(args.addr, id))
        .collect::<Result<Vec<_>>>()?;
    match format {
        Format::Svg => write(&args.out, render::svg(&details[0])?.as_bytes())?,
        Format::Png => render::png(&details[0], &args.out)?,
        Format::Html => write(&args.out, html::report(&snapshot.agent, &details)?.as_bytes())?,
    }
    let which: Vec<String> = ids.iter().map(|id| format!("#{id}")).collect();
    // A closed stdout is an error for main to treat quietly, not a panic.
    writeln!(
        std::io::stdout(),
        "wrote {} (storm{} {})",
        args.out.display(),
        if ids.len() == 1 { "" } else { "s" },
        if which.is_empty() {
            "none".to_string()
        } else {
            which.join(", ")
        }
    )?;
    Ok(())
}

/// The storms to draw, newest first.
fn storm_ids(
    snapshot: &AgentSnapshot,
    wanted: Option<u64>,
    format: Format,
    limit: usize,
    addr: SocketAddr,
) -> Result<Vec<u64>> {
    if let Some(id) = wanted {
        if !snapshot.storms.iter().any(|s| s.id == id) {
            match (snapshot.storms.first(), snapshot.storms.last()) {
                (Some(oldest), Some(newest)) => bail!(
                    "the agent at {addr} has no storm {id}: it keeps storms #{} to #{} ({} of them)",
                    oldest.id,
                    newest.id,
                    snapshot.storms.len()
                ),
                _ => bail!("the agent at {addr} has no storm {id}: it has seen no drop storms"),
            }
        }
        return Ok(vec![id]);
    }
    let newest_first = snapshot.storms.iter().rev().map(|s| s.id);
    match format {
        Format::Html => Ok(newest_first.take(limit).collect()),
        Format::Svg | Format::Png => match newest_first.take(1).next() {
            Some(id) => Ok(vec![id]),
            None => bail!("the agent at {addr} has seen no drop storms: nothing to draw"),
        },
    }
}

/// One storm with its timeline.
fn fetch_storm(addr: SocketAddr, id: u64) -> Result<StormDetail> {
    let body = client::get(addr, &format!("/api/v1/storms/{id}"))
        .with_context(|| format!("fetching storm {id} from the agent at {addr}"))?;
    let detail: StormDetail =
        serde_json::from_str(&body).with_context(|| format!("storm {id} from the agent does not parse"))?;
    if detail.storm.id != id {
        bail!("asked the agent for storm {id}, got storm {}", detail.storm.id);
    }
    Ok(detail)
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests;
