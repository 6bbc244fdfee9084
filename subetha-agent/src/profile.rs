//! `subetha-agent profile`: attach to processes, drain them for a while and
//! write their contention profile ([`crate::pprof`]) as gzipped pprof, as
//! collapsed stacks, or as a flame graph SVG (rendered by `inferno`).
//!
//! The profile covers exactly the window: the agent attaches at the start,
//! so everything it drains happened after (what the sidecar drained before
//! the takeover is not in it).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result};

use crate::agent::{Agent, AgentConfig};
use crate::config::ScanArgs;
use crate::pprof::{self, ProfileKind};

/// Output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Gzipped pprof protobuf (`go tool pprof`, Pyroscope, Parca).
    Pprof,
    /// One `frame;frame value` line per stack (delay in ns).
    Collapsed,
    /// A flame graph (delay in ns).
    Svg,
}

/// Which view.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum View {
    /// Waits by the call site of the hold waited for (Go's mutex profile).
    Mutex,
    /// Waits by the call site that waited (Go's block profile).
    Block,
}

/// Arguments of `profile`.
#[derive(clap::Args, Debug)]
pub struct ProfileArgs {
    #[command(flatten)]
    scan: ScanArgs,
    /// How long to profile.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Where to write it.
    #[arg(long)]
    out: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Pprof)]
    format: Format,
    /// Which view.
    #[arg(long, value_enum, default_value_t = View::Mutex)]
    view: View,
}

/// Runs `profile`.
pub fn run(args: ProfileArgs) -> Result<()> {
    let config = AgentConfig {
        publish_interval: Duration::from_secs(3600),
        ..args.scan.agent_config()?
    };
    let start_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64);
    let agent = Agent::new(config).spawn().context("starting the scan thread")?;
    std::thread::sleep(args.duration);
    let snapshot = agent.stop();
    let kind = match args.view {
        View::Mutex => ProfileKind::Mutex,
        View::Block => ProfileKind::Block,
    };
    let profile = pprof::profile(
        &pprof::samples(&snapshot, kind),
        start_ns,
        args.duration.as_nanos() as i64,
    );
    let bytes = match args.format {
        Format::Pprof => pprof::encode_gzip(&profile),
        Format::Collapsed => pprof::collapsed(&profile, false).into_bytes(),
        Format::Svg => flame_graph(&pprof::collapsed(&profile, false))?,
    };
    std::fs::write(&args.out, bytes).with_context(|| format!("writing {}", args.out.display()))?;
    eprintln!(
        "{} samples over {:?} written to {}",
        profile.sample.len(),
        args.duration,
        args.out.display()
    );
    Ok(())
}

/// The flame graph of collapsed stacks.
fn flame_graph(collapsed: &str) -> Result<Vec<u8>> {
    let mut options = inferno::flamegraph::Options::default();
    options.title = "subetha contention (delay, ns)".into();
    options.count_name = "ns".into();
    let mut svg = Vec::new();
    if collapsed.is_empty() {
        anyhow::bail!("no contention recorded in the window: nothing to draw");
    }
    inferno::flamegraph::from_lines(&mut options, collapsed.lines(), &mut svg)
        .context("rendering the flame graph")?;
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collapsed_stacks_render_as_a_flame_graph() {
        let svg = String::from_utf8(flame_graph("mutex_orders;src/app.rs:10:5 3000000\n").unwrap()).unwrap();
        assert!(svg.contains("<svg") && svg.contains("src/app.rs:10:5"), "{svg}");
        assert!(
            flame_graph("").is_err(),
            "an empty window is an error, not an empty picture"
        );
    }
}
