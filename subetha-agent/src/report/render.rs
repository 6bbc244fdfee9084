//! One storm's picture, drawn with plotters on any backend (SVG, PNG).
//!
//! Layout, top to bottom: a title (storm, process, thread, drops, cause and
//! its summary); the drop rate of each ring in the window (drops/ms, one
//! line per ring, the storm's own ring first, a legend naming the threads);
//! three lanes — `scanner` (running / runnable-waiting / blocked, the task
//! that held the CPU written on its wait), `scans` (each scan a box) and
//! `producer CPU`; a legend of the lane colours and what each lane rests
//! on. The x axis is milliseconds since the storm's first drop; the storm is
//! shaded in every panel. Lanes whose data the agent did not have (no
//! probes) say so instead of showing nothing.
//!
//! Every string from the snapshot comes from observed processes: it is cut
//! and stripped of control characters here; the SVG backend escapes it.

use anyhow::{Context, Result, anyhow};
use plotters::coord::Shift;
use plotters::coord::combinators::WithKeyPoints;
use plotters::coord::types::{RangedCoordf64, RangedCoordi32};
use plotters::prelude::*;

use crate::model::{Interval, StormDetail, StormReport, StormTimeline};

/// Picture size in pixels.
pub const SIZE: (u32, u32) = (1280, 760);
/// Width of the plotting area of both panels, px (picture width less the
/// margins and the y label area), and an average character's width at the
/// lane labels' size: for placing labels without overlap.
const PLOT_WIDTH_PX: f64 = (SIZE.0 - 12 - 24 - 120) as f64;
const CHAR_WIDTH_PX: f64 = 6.6;
/// The font family every text uses (registered by [`ensure_font`]).
const FONT: &str = "sans-serif";
/// The TTF registered for text (Debian: `fonts-dejavu-core`).
pub const DEFAULT_FONT_PATH: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
/// Overrides [`DEFAULT_FONT_PATH`].
pub const FONT_ENV: &str = "SUBETHA_REPORT_FONT";

const RUNNING: RGBColor = RGBColor(120, 190, 120);
const WAITING: RGBColor = RGBColor(235, 130, 40);
const BLOCKED: RGBColor = RGBColor(90, 120, 200);
const SCAN: RGBColor = RGBColor(90, 90, 90);
const UNKNOWN: RGBColor = RGBColor(210, 210, 210);
const STORM: RGBColor = RGBColor(220, 40, 40);
const STORM_LIGHT: RGBColor = RGBColor(247, 200, 200);
const RING_COLORS: [RGBColor; 8] = [
    RGBColor(200, 30, 30),
    RGBColor(30, 100, 200),
    RGBColor(40, 150, 60),
    RGBColor(150, 60, 170),
    RGBColor(200, 130, 0),
    RGBColor(0, 150, 150),
    RGBColor(120, 80, 40),
    RGBColor(100, 100, 100),
];
const CPU_COLORS: [RGBColor; 4] = [
    RGBColor(170, 200, 235),
    RGBColor(240, 200, 150),
    RGBColor(190, 225, 170),
    RGBColor(225, 185, 225),
];

/// Registers the TTF plotters draws text with (once per process). Without
/// it plotters cannot even measure text, for SVG too.
pub fn ensure_font() -> Result<()> {
    static REGISTERED: std::sync::OnceLock<std::result::Result<(), String>> = std::sync::OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            let path = std::env::var_os(FONT_ENV).map_or_else(|| DEFAULT_FONT_PATH.into(), std::path::PathBuf::from);
            let bytes = std::fs::read(&path).map_err(|error| {
                format!(
                    "cannot read the font {} ({error}): install fonts-dejavu-core (Debian/Ubuntu) or set {FONT_ENV} \
                     to a TrueType font",
                    path.display()
                )
            })?;
            // Plotters keeps fonts for the life of the process.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            plotters::style::register_font(FONT, FontStyle::Normal, bytes)
                .map_err(|_| format!("{} is not a TrueType font plotters can use", path.display()))
        })
        .clone()
        .map_err(|message| anyhow!(message))
}

/// The picture of `detail` as an SVG document.
pub fn svg(detail: &StormDetail) -> Result<String> {
    ensure_font()?;
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, SIZE).into_drawing_area();
        draw(&root, detail)?;
        root.present().context("finishing the SVG")?;
    }
    Ok(out)
}

/// The picture of `detail` as a PNG file at `path`.
pub fn png(detail: &StormDetail, path: &std::path::Path) -> Result<()> {
    ensure_font()?;
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    draw(&root, detail)?;
    root.present()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Text from a snapshot, safe to draw: control characters replaced, cut to
/// `max` characters.
pub fn clean(text: &str, max: usize) -> String {
    let mut out: String = text
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .take(max)
        .collect();
    if text.chars().count() > max {
        out.push('…');
    }
    out
}

fn plot_error<E: std::fmt::Debug>(error: E) -> anyhow::Error {
    anyhow!("drawing the picture: {error:?}")
}

/// Milliseconds of `ns` relative to the storm's first drop.
fn ms(storm: &StormReport, ns: u64) -> f64 {
    (ns as f64 - storm.begin_mono_ns as f64) / 1e6
}

/// The storm's title lines.
pub fn title_lines(storm: &StormReport) -> (String, String) {
    let cause = storm.cause.as_ref();
    let title = format!(
        "Drop storm #{} — {} (pid {}), thread {} (tid {}): {} dropped in {:.2} ms — {}",
        storm.id,
        clean(&storm.comm, 32),
        storm.pid,
        clean(&storm.thread_name, 32),
        storm.tid,
        storm.dropped,
        storm.duration_ns as f64 / 1e6,
        cause.map_or_else(
            || "cause not diagnosed yet".to_string(),
            |c| format!(
                "{} ({} confidence)",
                clean(&c.kind, 40),
                clean(c.confidence.as_str(), 10)
            )
        ),
    );
    let summary = cause.map_or_else(String::new, |c| clean(&c.summary, 400));
    (title, summary)
}

/// Splits `text` into lines of at most `width` characters at spaces.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = vec![String::new()];
    for word in text.split(' ') {
        let line = lines.last_mut().expect("never empty");
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            lines.push(word.to_string());
        } else {
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str(word);
        }
    }
    lines
}

/// Draws the picture of `detail` on `root`.
pub fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, detail: &StormDetail) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let storm = &detail.storm;
    let fallback;
    let timeline = match &detail.timeline {
        Some(timeline) => timeline,
        None => {
            fallback = StormTimeline {
                window: crate::report::timeline::window(
                    storm,
                    storm.end_mono_ns.unwrap_or(storm.begin_mono_ns),
                ),
                scanner_note: "the agent kept no timeline for this storm (only the newest storms have one)"
                    .into(),
                producer_cpu_note: "the agent kept no timeline for this storm".into(),
                ..StormTimeline::default()
            };
            &fallback
        }
    };
    let x0 = ms(storm, timeline.window.begin_mono_ns);
    let mut x1 = ms(storm, timeline.window.end_mono_ns);
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    let storm_end = ms(storm, storm.end_mono_ns.unwrap_or(timeline.window.end_mono_ns)).max(0.0);

    root.fill(&WHITE).map_err(plot_error)?;
    let (height, width) = (SIZE.1 as i32, SIZE.0 as i32);
    let (header, rest) = root.split_vertically(78);
    let (rates_area, rest) = rest.split_vertically((height - 78) * 50 / 100);
    let (lanes_area, footer) = rest.split_vertically((height - 78) * 50 / 100 - 70);

    // Title.
    let (title, summary) = title_lines(storm);
    header
        .draw(&Text::new(clean(&title, 160), (12, 8), (FONT, 19).into_font()))
        .map_err(plot_error)?;
    for (index, line) in wrap(&summary, 150).iter().take(2).enumerate() {
        header
            .draw(&Text::new(
                line.clone(),
                (12, 34 + 19 * index as i32),
                (FONT, 15).into_font().color(&RGBColor(60, 60, 60)),
            ))
            .map_err(plot_error)?;
    }

    // Drop rate per ring.
    let series: Vec<(String, Vec<(f64, f64)>)> = timeline
        .rings
        .iter()
        .map(|ring| {
            let label = format!(
                "{}slot {} · {} (tid {})",
                if ring.storm_ring { "storm ring: " } else { "" },
                ring.slot,
                clean(&ring.thread_name, 32),
                ring.tid
            );
            (label, rate_steps(storm, &ring.samples, x0, x1))
        })
        .collect();
    let max_rate = series
        .iter()
        .flat_map(|(_, points)| points.iter().map(|p| p.1))
        .fold(0.0f64, f64::max);
    let y_max = if max_rate > 0.0 { max_rate * 1.15 } else { 1.0 };
    let mut rates = ChartBuilder::on(&rates_area)
        .margin_left(12)
        .margin_right(24)
        .margin_top(6)
        .x_label_area_size(34)
        .y_label_area_size(120)
        .caption("drop rate per ring (drops/ms)", (FONT, 15))
        .build_cartesian_2d(x0..x1, 0.0..y_max)
        .map_err(plot_error)?;
    rates
        .configure_mesh()
        .x_desc("ms since the storm's first drop")
        .y_desc("drops/ms")
        .y_label_formatter(&|v: &f64| {
            if y_max > 10.0 {
                format!("{v:.0}")
            } else {
                format!("{v:.2}")
            }
        })
        .label_style((FONT, 12))
        .axis_desc_style((FONT, 13))
        .draw()
        .map_err(plot_error)?;
    rates
        .draw_series(std::iter::once(Rectangle::new(
            [(0.0, 0.0), (storm_end.max(0.0), y_max)],
            STORM.mix(0.10).filled(),
        )))
        .map_err(plot_error)?
        .label("storm")
        .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 16, y + 5)], STORM.mix(0.25).filled()));
    for (index, (label, points)) in series.into_iter().enumerate() {
        let color = RING_COLORS[index % RING_COLORS.len()];
        let width = if index == 0 { 2 } else { 1 };
        rates
            .draw_series(LineSeries::new(points, color.stroke_width(width)))
            .map_err(plot_error)?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2)));
    }
    rates
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font((FONT, 12))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .draw()
        .map_err(plot_error)?;

    // Lanes (y in hundredths): scanner (200..300), scans (100..200), producer CPU (0..100).
    let mut lanes = ChartBuilder::on(&lanes_area)
        .margin_left(12)
        .margin_right(24)
        .margin_top(8)
        .x_label_area_size(34)
        .y_label_area_size(120)
        .build_cartesian_2d(x0..x1, (0..300).with_key_points(vec![50, 150, 250]))
        .map_err(plot_error)?;
    lanes
        .configure_mesh()
        .disable_y_mesh()
        .y_label_formatter(&|y: &i32| {
            match y {
                250 => "scanner",
                150 => "scans",
                50 => "producer CPU",
                _ => "",
            }
            .to_string()
        })
        .x_desc("ms since the storm's first drop")
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 13))
        .draw()
        .map_err(plot_error)?;
    lanes
        .draw_series([
            Rectangle::new([(0.0, 0), (storm_end, 300)], STORM.mix(0.08).filled()),
            Rectangle::new([(x0, 100), (x1, 100)], BLACK.mix(0.2).stroke_width(1)),
            Rectangle::new([(x0, 200), (x1, 200)], BLACK.mix(0.2).stroke_width(1)),
        ])
        .map_err(plot_error)?;
    let min_width = (x1 - x0) / 1200.0;
    let small = (FONT, 12).into_font();
    let lane_text = |text: String, x: f64, y: i32| Text::new(text, (x, y), small.clone().color(&BLACK));

    // Scanner lane.
    match &timeline.scanner {
        Some(spans) => {
            // Known only where seen: running during the agent's own scans,
            // off-CPU where the probes saw it; unknown in between.
            let mut boxes = vec![Rectangle::new([(x0, 220), (x1, 280)], UNKNOWN.filled())];
            for scan in &timeline.scans {
                let begin = ms(storm, scan.begin_mono_ns).max(x0);
                let end = ms(storm, scan.end_mono_ns).min(x1).max(begin + min_width);
                boxes.push(Rectangle::new([(begin, 220), (end, 280)], RUNNING.filled()));
            }
            for span in spans {
                let color = if span.state == "blocked" { BLOCKED } else { WAITING };
                let begin = ms(storm, span.begin_mono_ns).max(x0);
                let end = ms(storm, span.end_mono_ns).min(x1).max(begin + min_width);
                boxes.push(Rectangle::new([(begin, 220), (end, 280)], color.filled()));
            }
            lanes.draw_series(boxes).map_err(plot_error)?;
            // Name who held the CPU on the longest waits, as many as fit
            // without overlapping (the longest always).
            let mut waits: Vec<_> = spans.iter().filter(|s| s.holder.is_some()).collect();
            waits.sort_by_key(|s| std::cmp::Reverse(s.end_mono_ns - s.begin_mono_ns));
            let ms_per_char = (x1 - x0) / PLOT_WIDTH_PX * CHAR_WIDTH_PX;
            let mut placed: Vec<(f64, f64)> = Vec::new();
            let mut labels = Vec::new();
            for span in waits.iter().take(8) {
                let holder = span.holder.as_ref().expect("filtered");
                let who = format!("{} (pid {})", clean(&holder.comm, 32), holder.pid);
                let full = format!(
                    "preempted by {who} on CPU {}, {:.2} ms",
                    span.cpu,
                    (span.end_mono_ns - span.begin_mono_ns) as f64 / 1e6
                );
                let begin = ms(storm, span.begin_mono_ns).max(x0) + (x1 - x0) * 0.004;
                let candidates = [full, format!("preempted by {who}"), who];
                let fits = candidates.into_iter().find_map(|text| {
                    let width = text.chars().count() as f64 * ms_per_char;
                    // Only the first (longest) label moves left to fit;
                    // the others stay at their span or are left out.
                    let start = if placed.is_empty() {
                        begin.min(x1 - width).max(x0)
                    } else {
                        begin
                    };
                    let end = start + width;
                    let free = end <= x1 && placed.iter().all(|&(a, b)| end < a || start > b);
                    (free || placed.is_empty()).then_some((text, start, end))
                });
                if let Some((text, start, end)) = fits {
                    placed.push((start, end));
                    labels.push(lane_text(text, start, 266));
                }
            }
            lanes.draw_series(labels).map_err(plot_error)?;
        }
        None => {
            lanes
                .draw_series([Rectangle::new([(x0, 220), (x1, 280)], UNKNOWN.filled())])
                .map_err(plot_error)?;
            lanes
                .draw_series([lane_text(
                    format!("unknown — {}", clean(&timeline.scanner_note, 150)),
                    x0 + (x1 - x0) * 0.01,
                    262,
                )])
                .map_err(plot_error)?;
        }
    }

    // Scans lane.
    let scans: Vec<_> = timeline
        .scans
        .iter()
        .map(|scan| {
            let begin = ms(storm, scan.begin_mono_ns).max(x0);
            let end = ms(storm, scan.end_mono_ns).min(x1).max(begin + min_width);
            Rectangle::new([(begin, 125), (end, 175)], SCAN.filled())
        })
        .collect();
    if scans.is_empty() {
        lanes
            .draw_series([lane_text(
                "no scans recorded in this window".into(),
                x0 + (x1 - x0) * 0.01,
                162,
            )])
            .map_err(plot_error)?;
    }
    lanes.draw_series(scans).map_err(plot_error)?;
    if let Some(gap) = storm.scan_gaps.first() {
        let begin = ms(storm, gap.begin_mono_ns);
        let end = ms(storm, gap.end_mono_ns);
        if end > x0 && begin < x1 {
            lanes
                .draw_series([lane_text(
                    format!(
                        "longest gap {:.2} ms",
                        (gap.end_mono_ns - gap.begin_mono_ns) as f64 / 1e6
                    ),
                    begin.max(x0),
                    197,
                )])
                .map_err(plot_error)?;
        }
    }

    // Producer CPU lane.
    match timeline.producer_cpu.as_deref() {
        Some(spans) if !spans.is_empty() => {
            let boxes: Vec<_> = spans
                .iter()
                .map(|span| {
                    let begin = ms(storm, span.begin_mono_ns).max(x0);
                    let end = ms(storm, span.end_mono_ns).min(x1).max(begin + min_width);
                    let color = CPU_COLORS[span.cpu as usize % CPU_COLORS.len()];
                    Rectangle::new([(begin, 20), (end, 80)], color.filled())
                })
                .collect();
            lanes.draw_series(boxes).map_err(plot_error)?;
            let labels: Vec<_> = spans
                .iter()
                .filter(|s| ms(storm, s.end_mono_ns) - ms(storm, s.begin_mono_ns) > (x1 - x0) * 0.04)
                .map(|span| {
                    lane_text(
                        format!("CPU {}", span.cpu),
                        ms(storm, span.begin_mono_ns).max(x0) + (x1 - x0) * 0.005,
                        62,
                    )
                })
                .collect();
            lanes.draw_series(labels).map_err(plot_error)?;
        }
        _ => {
            lanes
                .draw_series([Rectangle::new([(x0, 20), (x1, 80)], UNKNOWN.filled())])
                .map_err(plot_error)?;
            lanes
                .draw_series([lane_text(
                    format!("unknown — {}", clean(&timeline.producer_cpu_note, 150)),
                    x0 + (x1 - x0) * 0.01,
                    62,
                )])
                .map_err(plot_error)?;
        }
    }
    if let Some(interval) = storm.cause.as_ref().and_then(|c| c.interval) {
        draw_cause_interval(&mut lanes, storm, interval, x0, x1)?;
    }

    // Footer: lane legend and notes.
    let items = [
        (RUNNING, "running"),
        (WAITING, "runnable-waiting (preempted)"),
        (BLOCKED, "blocked (asleep)"),
        (UNKNOWN, "unknown"),
        (SCAN, "scan"),
        (STORM_LIGHT, "storm"),
    ];
    let mut x = 140;
    for (color, label) in items {
        footer
            .draw(&Rectangle::new([(x, 6), (x + 14, 18)], color.filled()))
            .map_err(plot_error)?;
        footer
            .draw(&Text::new(label, (x + 19, 5), (FONT, 13).into_font()))
            .map_err(plot_error)?;
        x += 34 + 8 * label.len() as i32;
    }
    let notes = [
        format!("scanner: {}", clean(&timeline.scanner_note, 170)),
        format!(
            "scans: {}; producer CPU: {}",
            if timeline.scan_resolution_ns > 0 {
                format!(
                    "scans less than {:.3} ms apart drawn as one box",
                    timeline.scan_resolution_ns as f64 / 1e6
                )
            } else {
                "each scan a box".to_string()
            },
            clean(&timeline.producer_cpu_note, 110)
        ),
    ];
    for (index, note) in notes.iter().enumerate() {
        footer
            .draw(&Text::new(
                clean(note, (width as usize) / 7),
                (12, 26 + 18 * index as i32),
                (FONT, 12).into_font().color(&RGBColor(80, 80, 80)),
            ))
            .map_err(plot_error)?;
    }
    Ok(())
}

/// Outlines the interval the cause rests on across the lanes.
fn draw_cause_interval<DB: DrawingBackend>(
    lanes: &mut ChartContext<'_, DB, Cartesian2d<RangedCoordf64, WithKeyPoints<RangedCoordi32>>>,
    storm: &StormReport,
    interval: Interval,
    x0: f64,
    x1: f64,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let begin = ms(storm, interval.begin_mono_ns).clamp(x0, x1);
    let end = ms(storm, interval.end_mono_ns).clamp(x0, x1);
    if end <= begin {
        return Ok(());
    }
    lanes
        .draw_series([Rectangle::new([(begin, 212), (end, 288)], BLACK.stroke_width(2))])
        .map_err(plot_error)?;
    Ok(())
}

/// The drop rate between consecutive samples as steps (drops/ms), zero
/// before the first and after the last sample.
fn rate_steps(
    storm: &StormReport,
    samples: &[crate::model::DropSample],
    x0: f64,
    x1: f64,
) -> Vec<(f64, f64)> {
    let mut points = Vec::with_capacity(samples.len() * 2 + 4);
    let Some(first) = samples.first() else {
        return vec![(x0, 0.0), (x1, 0.0)];
    };
    points.push((x0, 0.0));
    points.push((ms(storm, first.at_mono_ns).max(x0), 0.0));
    for pair in samples.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        let (ta, tb) = (ms(storm, a.at_mono_ns), ms(storm, b.at_mono_ns));
        let rate = if tb > ta {
            b.dropped.saturating_sub(a.dropped) as f64 / (tb - ta)
        } else {
            0.0
        };
        points.push((ta.max(x0), rate));
        points.push((tb.min(x1), rate));
    }
    let last = ms(storm, samples[samples.len() - 1].at_mono_ns).min(x1);
    points.push((last, 0.0));
    points.push((x1, 0.0));
    points
}
