//! Drawing an [`App`] with ratatui: the overview (processes, instances,
//! storms), a process's rings and instances, an instance's op kinds, the
//! status line and the help. Pure functions of the state (plus "now" for
//! ages), so they are tested against ratatui's `TestBackend`.

use std::time::Instant;

use ratatui::Frame;
use ratatui::layout::{Alignment, Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span, Text};
use ratatui::widgets::{Block, Cell, Clear, Paragraph, Row, Table, TableState, Wrap};

use super::columns::{self, Column};
use super::state::{App, Connection, InstanceRow, Panel, SortKey, View};
use crate::model::{AgentSnapshot, ProcessReport, StormReport};

/// Shown for a value not known (yet).
pub const UNKNOWN: &str = "–";

/// `1234567` → `1.23M`.
pub fn compact(value: f64) -> String {
    let magnitude = value.abs();
    if magnitude == 0.0 {
        "0".into()
    } else if magnitude < 10.0 {
        format!("{value:.1}")
    } else if magnitude < 1e3 {
        format!("{value:.0}")
    } else if magnitude < 1e6 {
        format!("{:.1}k", value / 1e3)
    } else if magnitude < 1e9 {
        format!("{:.2}M", value / 1e6)
    } else {
        format!("{:.2}G", value / 1e9)
    }
}

/// A rate, or [`UNKNOWN`].
pub fn rate(value: Option<f64>) -> String {
    value.map(compact).unwrap_or_else(|| UNKNOWN.into())
}

/// A count (`compact`, but exact below 10,000).
pub fn count(value: u64) -> String {
    if value < 10_000 {
        value.to_string()
    } else {
        compact(value as f64)
    }
}

/// A share as a percentage, or [`UNKNOWN`].
pub fn percent(share: Option<f64>) -> String {
    share
        .map(|s| format!("{:.1}%", s * 100.0))
        .unwrap_or_else(|| UNKNOWN.into())
}

/// Nanoseconds, readable; 0 (no samples) is [`UNKNOWN`].
pub fn nanos(ns: u64) -> String {
    match ns {
        0 => UNKNOWN.into(),
        1..1_000 => format!("{ns}ns"),
        1_000..1_000_000 => format!("{:.1}µs", ns as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.2}ms", ns as f64 / 1e6),
        _ => format!("{:.2}s", ns as f64 / 1e9),
    }
}

fn truncate(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        text.to_string()
    } else {
        let mut cut: String = text.chars().take(width.saturating_sub(1)).collect();
        cut.push('…');
        cut
    }
}

const HEADER: Style = Style::new().fg(Color::Yellow).add_modifier(Modifier::BOLD);
const SELECTED: Style = Style::new().add_modifier(Modifier::REVERSED);
const DIM: Style = Style::new().fg(Color::DarkGray);
const BAD: Style = Style::new().fg(Color::Red).add_modifier(Modifier::BOLD);
const GOOD: Style = Style::new().fg(Color::Green);

fn panel(title: String, focused: bool) -> Block<'static> {
    let block = Block::bordered().title(Span::styled(title, HEADER));
    if focused {
        block.border_style(Style::new().fg(Color::Cyan))
    } else {
        block
    }
}

/// Draws the whole screen.
pub fn draw(frame: &mut Frame<'_>, app: &App, now: Instant) {
    let [title, body, status, keys] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(4),
        Constraint::Length(1),
        Constraint::Length(1),
    ])
    .areas(frame.area());
    frame.render_widget(Paragraph::new(title_line(app)), title);
    match (app.snapshot.as_deref(), app.view()) {
        (None, _) => {
            let text = match &app.connection {
                Connection::Failing { error, .. } => format!("waiting for the agent: {error}"),
                _ => format!("connecting to {} …", app.source),
            };
            frame.render_widget(
                Paragraph::new(text)
                    .alignment(Alignment::Center)
                    .block(Block::bordered()),
                body,
            );
        }
        (Some(snapshot), View::Overview) => draw_overview(frame, body, app, snapshot),
        (Some(snapshot), View::Process(key)) => match app.process(key) {
            Some(process) => draw_process(frame, body, app, snapshot, process),
            None => draw_gone(
                frame,
                body,
                &format!("process {} is no longer reported by the agent", key.pid),
            ),
        },
        (Some(snapshot), View::Instance(key)) => match app.instance(key) {
            Some((process, _)) => draw_instance(frame, body, app, snapshot, process, key),
            None => draw_gone(
                frame,
                body,
                &format!(
                    "instance {} of process {} is no longer reported",
                    key.id, key.process.pid
                ),
            ),
        },
    }
    frame.render_widget(Paragraph::new(status_line(app, now, status.width)), status);
    frame.render_widget(
        Paragraph::new(Line::styled(
            " q quit  ? help  Tab panel  ↑↓ select  Enter open  Esc back  s sort  o ops  c contention  w p99 wait  d drops",
            DIM,
        )),
        keys,
    );
    if app.help {
        draw_help(frame);
    }
}

fn title_line(app: &App) -> Line<'static> {
    let mut crumbs = vec!["overview".to_string()];
    for view in app.views.iter().skip(1) {
        crumbs.push(match *view {
            View::Overview => "overview".into(),
            View::Process(key) => match app.process(key) {
                Some(p) => format!("process {} ({})", p.pid, p.comm),
                None => format!("process {}", key.pid),
            },
            View::Instance(key) => match app.instance(key) {
                Some((_, i)) => format!("instance {}", i.name),
                None => format!("instance {}", key.id),
            },
        });
    }
    let interval = match &app.rates {
        Some(rates) => format!("rates over {:.2}s", rates.interval.as_secs_f64()),
        None => "rates: waiting for a second snapshot".into(),
    };
    Line::from(vec![
        Span::styled(" subetha top ", HEADER),
        Span::raw(format!("│ {} │ ", app.source)),
        Span::styled(
            format!("sort: {} ▼", app.sort.label()),
            Style::new().fg(Color::Cyan),
        ),
        Span::raw(format!(" │ {interval} │ {}", crumbs.join(" › "))),
    ])
}

/// The connection state, then as many of the agent's fields as fit in
/// `width` whole (a field is left out, never cut).
fn status_line(app: &App, now: Instant, width: u16) -> Line<'static> {
    let mut spans = Vec::new();
    match &app.connection {
        Connection::Connecting => spans.push(Span::styled(format!(" connecting to {} ", app.source), DIM)),
        Connection::Connected { at } => spans.push(Span::styled(
            format!(
                " ● connected, updated {:.1}s ago ",
                now.saturating_duration_since(*at).as_secs_f64()
            ),
            GOOD,
        )),
        Connection::Failing {
            error,
            attempts,
            last_ok,
        } => {
            let data_age = match last_ok {
                Some(at) => format!(
                    "; data from {:.0}s ago",
                    now.saturating_duration_since(*at).as_secs_f64()
                ),
                None => String::new(),
            };
            spans.push(Span::styled(
                format!(
                    " ✖ AGENT NOT ANSWERING ({attempts} failed attempt(s), retrying every {:?}{data_age}): {} ",
                    app.interval,
                    truncate(error, 80)
                ),
                BAD,
            ));
        }
    }
    if let Some(snapshot) = &app.snapshot {
        let a = &snapshot.agent;
        let fields = [
            format!("│ agent pid {} ", a.pid),
            format!("│ scans {} ", a.scans),
            format!("│ scan interval {}µs ", a.scan_interval_us),
            format!(
                "│ probes: {} ({} events, {} lost)",
                truncate(&a.probes, 32),
                count(a.probe_events),
                count(a.probe_losses)
            ),
        ];
        let mut used: usize = spans.iter().map(Span::width).sum();
        for field in fields {
            let field = Span::raw(field);
            if used + field.width() > usize::from(width) {
                break;
            }
            used += field.width();
            spans.push(field);
        }
    }
    Line::from(spans)
}

fn draw_gone(frame: &mut Frame<'_>, area: Rect, text: &str) {
    frame.render_widget(
        Paragraph::new(format!("{text} — Esc to go back"))
            .style(BAD)
            .block(Block::bordered()),
        area,
    );
}

fn sort_header(label: &'static str, key: SortKey, sort: SortKey) -> Cell<'static> {
    if key == sort {
        Cell::from(format!("{label}▼")).style(HEADER.fg(Color::Cyan))
    } else {
        Cell::from(label)
    }
}

/// A table whose columns fit `area` (see [`columns`]): `header` and each
/// row hold one cell per column of `spec`; `labels` are the header texts.
fn fitted_table(
    spec: &[Column],
    header: Vec<Cell<'static>>,
    labels: Vec<String>,
    rows: Vec<(Vec<String>, Style)>,
    area: Rect,
) -> Table<'static> {
    let mut cells = vec![labels];
    cells.extend(rows.iter().map(|(row, _)| row.clone()));
    let (kept, constraints) = columns::fit(spec, &cells, area.width.saturating_sub(2));
    let header = Row::new(columns::pick(&header, &kept)).style(HEADER);
    let body: Vec<Row<'static>> = rows
        .into_iter()
        .map(|(row, style)| Row::new(columns::pick(&row, &kept)).style(style))
        .collect();
    Table::new(body, constraints).header(header)
}

/// The header texts of `cells` (the sorted column's with its mark).
fn labels(names: &[&str], sorted: Option<&str>) -> Vec<String> {
    names
        .iter()
        .map(|name| {
            if Some(*name) == sorted {
                format!("{name}▼")
            } else {
                name.to_string()
            }
        })
        .collect()
}

/// The header label of the column `sort` orders by.
fn sorted_label(sort: SortKey) -> &'static str {
    match sort {
        SortKey::Ops => "ops/s",
        SortKey::Contention => "cont%",
        SortKey::Wait => "p99 wait",
        SortKey::Drops => "drops/s",
    }
}

fn draw_overview(frame: &mut Frame<'_>, area: Rect, app: &App, snapshot: &AgentSnapshot) {
    let rows = app.instance_rows(None);
    // Processes: up to 6 rows; instances: as many as they need, leaving the
    // storms panel at least 10 lines; storms: the rest.
    let process_height = (snapshot.processes.len() as u16).clamp(1, 6) + 3;
    let room = area
        .height
        .saturating_sub(process_height)
        .saturating_sub(10)
        .max(5);
    let instance_height = (rows.len() as u16 + 3).clamp(5, room);
    let [processes, instances, storms] = Layout::vertical([
        Constraint::Length(process_height),
        Constraint::Length(instance_height),
        Constraint::Min(3),
    ])
    .areas(area);
    draw_process_table(frame, processes, app);
    let selected = app.instance_index(&rows);
    draw_instance_table(
        frame,
        instances,
        app,
        &rows,
        selected,
        format!("instances ({})", rows.len()),
        app.focus == Panel::Instances,
    );
    draw_storms(frame, storms, app);
}

fn draw_process_table(frame: &mut Frame<'_>, area: Rect, app: &App) {
    let rows = app.process_rows();
    let sort = app.sort;
    let names = [
        "pid",
        "command",
        "state",
        "inst",
        "rings",
        "ops/s",
        "ops",
        "cont%",
        "p99 wait",
        "drained/s",
        "drops/s",
        "dropped",
        "lost",
        "storms",
    ];
    let header = vec![
        Cell::from("pid"),
        Cell::from("command"),
        Cell::from("state"),
        Cell::from("inst"),
        Cell::from("rings"),
        sort_header("ops/s", SortKey::Ops, sort),
        Cell::from("ops"),
        sort_header("cont%", SortKey::Contention, sort),
        sort_header("p99 wait", SortKey::Wait, sort),
        Cell::from("drained/s"),
        sort_header("drops/s", SortKey::Drops, sort),
        Cell::from("dropped"),
        Cell::from("lost"),
        Cell::from("storms"),
    ];
    let body = rows
        .iter()
        .map(|row| {
            let p = row.process;
            let state = match &p.note {
                Some(note) => format!("{} ({})", p.state, truncate(note, 30)),
                None => p.state.clone(),
            };
            let cells = vec![
                p.pid.to_string(),
                truncate(&p.comm, 16),
                state,
                p.instances.len().to_string(),
                p.rings.iter().filter(|r| r.state != "free").count().to_string(),
                rate(row.ops_rate),
                count(row.ops_total),
                percent(row.contention),
                nanos(row.p99_ns),
                rate(row.drained_rate),
                rate(row.drops_rate),
                count(p.dropped),
                count(p.lost_no_ring),
                p.storms.to_string(),
            ];
            let style = if p.state == "exited" { DIM } else { Style::new() };
            (cells, style)
        })
        .collect();
    // Narrow screens lose the totals and counts first, never the rates.
    let spec = [
        Column::keep(3),
        Column::text(7),
        Column::text(8),
        Column::optional(4, 7),
        Column::optional(5, 8),
        Column::keep(5),
        Column::optional(3, 5),
        Column::keep(5),
        Column::keep(5),
        Column::optional(9, 6),
        Column::keep(7),
        Column::optional(7, 4),
        Column::optional(4, 9),
        Column::optional(6, 3),
    ];
    let table = fitted_table(
        &spec,
        header,
        labels(&names, Some(sorted_label(sort))),
        body,
        area,
    )
    .row_highlight_style(SELECTED)
    .block(panel(
        format!("processes ({})", rows.len()),
        app.focus == Panel::Processes && app.view() == View::Overview,
    ));
    let mut state = TableState::default().with_selected(
        (app.focus == Panel::Processes)
            .then(|| app.process_index(&rows))
            .flatten(),
    );
    frame.render_stateful_widget(table, area, &mut state);
}

fn draw_instance_table(
    frame: &mut Frame<'_>,
    area: Rect,
    app: &App,
    rows: &[InstanceRow<'_>],
    selected: Option<usize>,
    title: String,
    focused: bool,
) {
    let sort = app.sort;
    let names = [
        "process",
        "instance",
        "kind",
        "ops/s",
        "ops",
        "cont%",
        "contended",
        "misses",
        "p50 wait",
        "p99 wait",
        "drops/s",
        "drops",
        "threads",
    ];
    let header = vec![
        Cell::from("process"),
        Cell::from("instance"),
        Cell::from("kind"),
        sort_header("ops/s", SortKey::Ops, sort),
        Cell::from("ops"),
        sort_header("cont%", SortKey::Contention, sort),
        Cell::from("contended"),
        Cell::from("misses"),
        Cell::from("p50 wait"),
        sort_header("p99 wait", SortKey::Wait, sort),
        sort_header("drops/s", SortKey::Drops, sort),
        Cell::from("drops"),
        Cell::from("threads"),
    ];
    let body = rows
        .iter()
        .map(|row| {
            let i = row.instance;
            let name = if i.retired {
                format!("{} (retired)", i.name)
            } else {
                i.name.clone()
            };
            let cells = vec![
                truncate(&format!("{} {}", row.process.pid, row.process.comm), 22),
                truncate(&name, 28),
                truncate(&i.kind, 10),
                rate(row.ops_rate),
                count(i.ops),
                percent(row.contention),
                count(i.contended),
                count(i.misses),
                nanos(i.latency_ns.p50),
                nanos(i.latency_ns.p99),
                rate(row.drops_rate),
                count(i.drops_attributed),
                i.threads.to_string(),
            ];
            (cells, if i.retired { DIM } else { Style::new() })
        })
        .collect();
    let spec = [
        Column::text(10),
        Column::text(11),
        Column::optional(4, 4),
        Column::keep(5),
        Column::optional(3, 6),
        Column::keep(5),
        Column::optional(9, 7),
        Column::optional(6, 8),
        Column::optional(8, 5),
        Column::keep(8),
        Column::keep(7),
        Column::optional(5, 3),
        Column::optional(7, 9),
    ];
    let table = fitted_table(
        &spec,
        header,
        labels(&names, Some(sorted_label(sort))),
        body,
        area,
    )
    .row_highlight_style(SELECTED)
    .block(panel(title, focused));
    let mut state = TableState::default().with_selected(if focused { selected } else { None });
    frame.render_stateful_widget(table, area, &mut state);
}

fn storm_line(storm: &StormReport) -> String {
    let cause = match &storm.cause {
        Some(c) => format!(
            "{} ({}{})",
            c.kind,
            c.confidence,
            if storm.cause_settled { "" } else { ", provisional" }
        ),
        None => "cause pending".into(),
    };
    format!(
        "#{}{} {} · {} dropped in {} · {} {}/{}",
        storm.id,
        if storm.end_mono_ns.is_none() {
            " ONGOING"
        } else {
            ""
        },
        cause,
        count(storm.dropped),
        nanos(storm.duration_ns),
        storm.pid,
        truncate(&storm.comm, 15),
        truncate(&storm.thread_name, 16),
    )
}

fn draw_storms(frame: &mut Frame<'_>, area: Rect, app: &App) {
    let storms = app.storms();
    let focused = app.focus == Panel::Storms;
    let [list, detail] =
        Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(area);
    let selected = app.storm_index(&storms);
    let rows = storms.iter().map(|s| {
        let row = Row::new(vec![storm_line(s)]);
        if s.end_mono_ns.is_none() {
            row.style(BAD)
        } else {
            row
        }
    });
    let table = Table::new(rows, [Constraint::Percentage(100)])
        .row_highlight_style(SELECTED)
        .block(panel(format!("storms ({}), newest first", storms.len()), focused));
    let mut state = TableState::default().with_selected(selected);
    frame.render_stateful_widget(table, list, &mut state);
    let text = match selected.map(|i| storms[i]) {
        Some(storm) => storm_detail(storm),
        None => Text::styled("no drop storms", DIM),
    };
    let title = match selected.map(|i| storms[i]) {
        Some(storm) => format!("storm #{}", storm.id),
        None => "storm".into(),
    };
    frame.render_widget(
        Paragraph::new(text)
            .wrap(Wrap { trim: false })
            .block(panel(title, false)),
        detail,
    );
}

fn storm_detail(storm: &StormReport) -> Text<'static> {
    let mut lines = vec![Line::from(format!(
        "pid {} ({}) thread {} [{}] slot {}: {} dropped over {}{}",
        storm.pid,
        storm.comm,
        storm.tid,
        storm.thread_name,
        storm.slot,
        count(storm.dropped),
        nanos(storm.duration_ns),
        if storm.end_mono_ns.is_none() {
            " — ONGOING"
        } else {
            ""
        }
    ))];
    lines.push(Line::from(format!(
        "first instance: {} · longest scan gap {} · {} episode(s) merged",
        storm.first_instance.as_deref().unwrap_or("?"),
        nanos(storm.max_scan_gap_ns),
        storm.merged
    )));
    match &storm.cause {
        None => lines.push(Line::styled("cause: not known yet", DIM)),
        Some(cause) => {
            lines.push(Line::from(vec![
                Span::styled("cause: ", HEADER),
                Span::styled(cause.kind.clone(), Style::new().add_modifier(Modifier::BOLD)),
                Span::raw(format!(
                    " ({} confidence{})",
                    cause.confidence,
                    if storm.cause_settled {
                        ", settled"
                    } else {
                        ", provisional"
                    }
                )),
            ]));
            lines.push(Line::from(cause.summary.clone()));
            if let Some(culprit) = &cause.culprit {
                lines.push(Line::from(format!(
                    "culprit: {} (pid {}) on CPU {}",
                    culprit.comm, culprit.pid, culprit.cpu
                )));
            }
            for evidence in &cause.evidence {
                lines.push(Line::styled(format!("• {evidence}"), DIM.fg(Color::Gray)));
            }
        }
    }
    Text::from(lines)
}

fn draw_process(
    frame: &mut Frame<'_>,
    area: Rect,
    app: &App,
    snapshot: &AgentSnapshot,
    process: &ProcessReport,
) {
    let key = super::rates::ProcessKey::of(process);
    let rings_height = (process.rings.len() as u16).clamp(1, 12) + 3;
    let [info, rings, instances] = Layout::vertical([
        Constraint::Length(5),
        Constraint::Length(rings_height),
        Constraint::Min(5),
    ])
    .areas(area);
    let rates = app.rates.as_ref().and_then(|r| r.process(key));
    let age = |mono: u64| nanos(snapshot.agent.taken_mono_ns.saturating_sub(mono));
    let causes: Vec<String> = process
        .storm_causes
        .iter()
        .map(|(k, n)| format!("{k} ×{n}"))
        .collect();
    let lines = vec![
        Line::from(format!(
            "pid {} ({}) uid {} · {}{} · attached {} ago{}",
            process.pid,
            process.comm,
            process.uid,
            process.state,
            process
                .note
                .as_deref()
                .map(|n| format!(" ({n})"))
                .unwrap_or_default(),
            age(process.attached_mono_ns),
            process
                .exited_mono_ns
                .map(|e| format!(" · exited {} ago", age(e)))
                .unwrap_or_default()
        )),
        Line::from(format!(
            "service {} · container {} · pod {} · pid {} in its namespace",
            process.service.as_deref().unwrap_or("-"),
            process
                .container_id
                .as_deref()
                .map_or("-", |id| id.get(..12).unwrap_or(id)),
            process.pod_uid.as_deref().unwrap_or("-"),
            process.nspid.last().copied().unwrap_or(process.pid),
        )),
        Line::from(format!(
            "drained {} ({}/s) · dropped {} ({}/s) · lost (no ring) {} · unattributed {}",
            count(process.drained),
            rate(rates.map(|r| r.drained)),
            count(process.dropped),
            rate(rates.map(|r| r.dropped)),
            count(process.lost_no_ring),
            count(process.unattributed)
        )),
        Line::from(format!(
            "segment {} KiB, {} KiB resident · storms {}{}",
            process.segment_bytes / 1024,
            process.segment_resident_bytes / 1024,
            process.storms,
            if causes.is_empty() {
                String::new()
            } else {
                format!(" ({})", causes.join(", "))
            }
        )),
    ];
    frame.render_widget(
        Paragraph::new(lines).block(panel(
            format!("process {} ({})", process.pid, process.comm),
            false,
        )),
        info,
    );
    let names = [
        "slot",
        "state",
        "tid",
        "thread",
        "gen",
        "drained/s",
        "drained",
        "dropped/s",
        "dropped",
        "episodes",
        "note",
    ];
    let header = names.iter().map(|n| Cell::from(*n)).collect();
    let ring_rows = process
        .rings
        .iter()
        .map(|ring| {
            let r = app
                .rates
                .as_ref()
                .and_then(|rates| rates.ring(key, ring.slot, ring.generation));
            let cells = vec![
                ring.slot.to_string(),
                ring.state.clone(),
                ring.tid.to_string(),
                truncate(&ring.thread_name, 16),
                ring.generation.to_string(),
                rate(r.map(|r| r.drained)),
                count(ring.drained),
                rate(r.map(|r| r.dropped)),
                count(ring.dropped),
                ring.episodes.to_string(),
                ring.corrupt.clone().unwrap_or_default(),
            ];
            let style = if ring.corrupt.is_some() {
                BAD
            } else if ring.state == "free" {
                DIM
            } else {
                Style::new()
            };
            (cells, style)
        })
        .collect();
    let spec = [
        Column::keep(4),
        Column::optional(5, 6),
        Column::keep(3),
        Column::text(8),
        Column::optional(3, 7),
        Column::keep(9),
        Column::optional(7, 4),
        Column::keep(9),
        Column::optional(7, 3),
        Column::optional(8, 5),
        Column::optional_text(4, 2),
    ];
    let table = fitted_table(&spec, header, labels(&names, None), ring_rows, rings)
        .block(panel(format!("rings ({})", process.rings.len()), false));
    frame.render_widget(table, rings);
    let rows = app.instance_rows(Some(key));
    let selected = app.instance_index(&rows);
    draw_instance_table(
        frame,
        instances,
        app,
        &rows,
        selected,
        format!("instances of {} ({}) — Enter opens one", process.pid, rows.len()),
        true,
    );
}

fn draw_instance(
    frame: &mut Frame<'_>,
    area: Rect,
    app: &App,
    snapshot: &AgentSnapshot,
    process: &ProcessReport,
    key: super::rates::InstanceKey,
) {
    let Some(instance) = process.instances.iter().find(|i| i.id == key.id) else {
        return;
    };
    let [info, ops] = Layout::vertical([Constraint::Length(6), Constraint::Min(4)]).areas(area);
    let rates = app.rates.as_ref().and_then(|r| r.instance(key));
    let q = &instance.latency_ns;
    let seen = |mono: Option<u64>| match mono {
        Some(m) => format!(
            "{} ago",
            nanos(snapshot.agent.taken_mono_ns.saturating_sub(m).max(1))
        ),
        None => "never".into(),
    };
    let lines = vec![
        Line::from(format!(
            "{} {} (id {}) in pid {} ({}){} · policy {:#x} · {} thread(s), slowest op on thread {}",
            instance.kind,
            instance.name,
            instance.id,
            process.pid,
            process.comm,
            if instance.retired { " · RETIRED" } else { "" },
            instance.policy,
            instance.threads,
            instance
                .max_latency_thread
                .map(|t| t.to_string())
                .unwrap_or_else(|| UNKNOWN.into())
        )),
        Line::from(format!(
            "ops {} ({}/s) · contended {} ({}/s, {} of the interval) · misses {} ({}/s) · drops attributed {} ({}/s)",
            count(instance.ops),
            rate(rates.map(|r| r.ops)),
            count(instance.contended),
            rate(rates.map(|r| r.contended)),
            percent(rates.and_then(|r| r.contention)),
            count(instance.misses),
            rate(rates.map(|r| r.misses)),
            count(instance.drops_attributed),
            rate(rates.map(|r| r.drops)),
        )),
        Line::from(format!(
            "wait p50 {} · p90 {} · p99 {} · p99.9 {} · max {} ({} samples)",
            nanos(q.p50),
            nanos(q.p90),
            nanos(q.p99),
            nanos(q.p999),
            nanos(q.max),
            count(q.count)
        )),
        Line::from(format!(
            "first seen {} · last seen {}",
            seen(instance.first_seen_mono_ns),
            seen(instance.last_seen_mono_ns)
        )),
    ];
    frame.render_widget(
        Paragraph::new(lines).block(panel(format!("instance {}", instance.name), false)),
        info,
    );
    let names = [
        "op",
        "ops/s",
        "ops",
        "contended/s",
        "contended",
        "cont%",
        "misses/s",
        "misses",
        "p50",
        "p90",
        "p99",
        "max",
        "threads",
    ];
    let header = names.iter().map(|n| Cell::from(*n)).collect();
    let rows = instance
        .per_op
        .iter()
        .map(|op| {
            let r = app.rates.as_ref().and_then(|rates| rates.op(key, op.op));
            let cells = vec![
                op.name.clone(),
                rate(r.map(|r| r.ops)),
                count(op.ops),
                rate(r.map(|r| r.contended)),
                count(op.contended),
                percent(r.and_then(|r| r.contention)),
                rate(r.map(|r| r.misses)),
                count(op.misses),
                nanos(op.latency_ns.p50),
                nanos(op.latency_ns.p90),
                nanos(op.latency_ns.p99),
                nanos(op.latency_ns.max),
                op.threads.to_string(),
            ];
            (cells, Style::new())
        })
        .collect();
    let spec = [
        Column::text(6),
        Column::keep(5),
        Column::optional(3, 4),
        Column::optional(11, 6),
        Column::optional(9, 3),
        Column::keep(5),
        Column::optional(8, 7),
        Column::optional(6, 5),
        Column::keep(3),
        Column::optional(3, 8),
        Column::keep(3),
        Column::optional(3, 2),
        Column::optional(7, 9),
    ];
    let table = fitted_table(&spec, header, labels(&names, None), rows, ops).block(panel(
        format!("operations of {} (Esc: back)", instance.name),
        true,
    ));
    frame.render_widget(table, ops);
}

fn draw_help(frame: &mut Frame<'_>) {
    let area = frame.area();
    let width = 64.min(area.width);
    let height = 19.min(area.height);
    let popup = Rect::new(
        area.x + (area.width - width) / 2,
        area.y + (area.height - height) / 2,
        width,
        height,
    );
    let text = vec![
        "q, Ctrl-C      quit",
        "?              this help (any key closes it)",
        "Tab, Shift-Tab next / previous panel (overview)",
        "↑ ↓ j k        select a row; PgUp PgDn Home End",
        "Enter, →       open the selected process or instance",
        "Esc, ←         back",
        "s              cycle the sort order",
        "o c w d        sort by ops/s, contention %, p99 wait, drops",
        "",
        "Rates are per second over the last refresh (the agent's",
        "clock); – means not known yet. Contention % is contended/ops",
        "over that interval. Waits are over the instance's lifetime.",
        "Storms: newest first; ONGOING storms are red; the right",
        "panel shows the selected storm's cause and evidence.",
    ];
    frame.render_widget(Clear, popup);
    frame.render_widget(
        Paragraph::new(text.into_iter().map(Line::from).collect::<Vec<_>>())
            .block(panel("help".into(), true)),
        popup,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Cause, Culprit, StormReport};
    use crate::top::rates::tests::snapshot;
    use crate::top::source::Update;
    use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
    use ratatui::Terminal;
    use ratatui::backend::TestBackend;

    fn screen(app: &App) -> String {
        let mut terminal = Terminal::new(TestBackend::new(160, 45)).unwrap();
        terminal.draw(|frame| draw(frame, app, Instant::now())).unwrap();
        let buffer = terminal.backend().buffer();
        let mut text = String::new();
        for y in 0..buffer.area.height {
            for x in 0..buffer.area.width {
                text.push_str(buffer[(x, y)].symbol());
            }
            text.push('\n');
        }
        text
    }

    fn key(app: &mut App, code: KeyCode) {
        app.handle_key(KeyEvent::new(code, KeyModifiers::NONE));
    }

    fn app_with_storm() -> App {
        let mut app = App::new("127.0.0.1:9464".into(), std::time::Duration::from_secs(1));
        app.push_snapshot(snapshot(
            4242,
            1.0,
            &[(
                77,
                "orders-svc",
                &[(1, "orders_lock", 1000, 10, 0, 25_000), (2, "jobs", 10, 0, 0, 0)],
            )],
        ));
        let mut later = snapshot(
            4242,
            3.0,
            &[(
                77,
                "orders-svc",
                &[
                    (1, "orders_lock", 9000, 2010, 64, 25_000),
                    (2, "jobs", 10, 0, 0, 0),
                ],
            )],
        );
        later.agent.scans = 31337;
        later.agent.probes = "attached: 4 uprobes".into();
        for (id, ongoing) in [(1, false), (2, true)] {
            later.storms.push(StormReport {
                id,
                pid: 77,
                comm: "orders-svc".into(),
                thread_name: format!("worker-{id}"),
                dropped: 4000 * id,
                duration_ns: 4_900_000,
                end_mono_ns: (!ongoing).then_some(5),
                first_instance: Some("orders_lock".into()),
                cause: Some(Cause {
                    kind: format!("kind_{id}"),
                    summary: format!("summary of storm {id}"),
                    confidence: crate::model::Confidence::High,
                    evidence: vec![format!("evidence line of storm {id}")],
                    culprit: Some(Culprit {
                        pid: 88,
                        comm: "kworker/1:2".into(),
                        cpu: 1,
                    }),
                    ..Cause::default()
                }),
                cause_settled: true,
                ..StormReport::default()
            });
        }
        app.apply(Update {
            result: Ok(later),
            at: Instant::now(),
        });
        app
    }

    #[test]
    fn formats() {
        assert_eq!(compact(0.0), "0");
        assert_eq!(compact(2.54), "2.5");
        assert_eq!(compact(999.0), "999");
        assert_eq!(compact(4000.0), "4.0k");
        assert_eq!(compact(1_234_567.0), "1.23M");
        assert_eq!(count(9999), "9999");
        assert_eq!(count(12_345), "12.3k");
        assert_eq!(rate(None), UNKNOWN);
        assert_eq!(percent(Some(0.25)), "25.0%");
        assert_eq!(nanos(0), UNKNOWN);
        assert_eq!(nanos(850), "850ns");
        assert_eq!(nanos(12_345), "12.3µs");
        assert_eq!(nanos(4_900_000), "4.90ms");
        assert_eq!(nanos(1_200_000_000), "1.20s");
    }

    #[test]
    fn overview_shows_rates_sort_storms_and_status() {
        let app = app_with_storm();
        let text = screen(&app);
        assert!(text.contains("sort: ops/s ▼"), "{text}");
        assert!(text.contains("rates over 2.00s"), "{text}");
        let row = text
            .lines()
            .find(|l| l.contains("orders_lock") && l.contains("mutex"))
            .expect(&text);
        // (9000 - 1000) / 2 s, and 2000 of 8000 contended over the interval.
        assert!(row.contains("4.0k"), "{row}");
        assert!(row.contains("25.0%"), "{row}");
        assert!(row.contains("25.0µs"), "{row}");
        // Newest storm first, ongoing marked; its cause, culprit and evidence.
        let first = text.find("#2").expect(&text);
        assert!(first < text.find("#1 ").expect(&text), "{text}");
        assert!(text.contains("ONGOING"), "{text}");
        assert!(text.contains("kind_2 (high)"), "{text}");
        assert!(text.contains("summary of storm 2"), "{text}");
        assert!(text.contains("culprit: kworker/1:2 (pid 88) on CPU 1"), "{text}");
        assert!(text.contains("evidence line of storm 2"), "{text}");
        assert!(
            !text.contains("evidence line of storm 1"),
            "only the selected storm's evidence"
        );
        assert!(text.contains("agent pid 4242"), "{text}");
        assert!(text.contains("scans 31337"), "{text}");
        assert!(text.contains("connected"), "{text}");
    }

    #[test]
    fn selecting_another_storm_shows_its_evidence() {
        let mut app = app_with_storm();
        key(&mut app, KeyCode::Tab); // instances → storms
        key(&mut app, KeyCode::Down);
        let text = screen(&app);
        assert!(text.contains("evidence line of storm 1"), "{text}");
        assert!(text.contains("storm #1"), "{text}");
    }

    #[test]
    fn drill_down_screens() {
        let mut app = app_with_storm();
        key(&mut app, KeyCode::Enter);
        let text = screen(&app);
        assert!(text.contains("instance orders_lock"), "{text}");
        assert!(text.contains("try_lock"), "{text}");
        assert!(text.contains("operations of orders_lock"), "{text}");
        key(&mut app, KeyCode::Esc);
        key(&mut app, KeyCode::BackTab);
        key(&mut app, KeyCode::Enter);
        let text = screen(&app);
        assert!(text.contains("process 77 (orders-svc)"), "{text}");
        assert!(text.contains("rings (1)"), "{text}");
        assert!(text.contains("worker-0"), "{text}");
        assert!(text.contains("episodes"), "{text}");
        assert!(text.contains("instances of 77"), "{text}");
    }

    #[test]
    fn a_dead_agent_is_said_on_screen_and_the_data_stays() {
        let mut app = app_with_storm();
        app.apply(Update {
            result: Err("no agent answering on 127.0.0.1:9464: Connection refused".into()),
            at: Instant::now(),
        });
        let text = screen(&app);
        assert!(text.contains("AGENT NOT ANSWERING"), "{text}");
        assert!(text.contains("Connection refused"), "{text}");
        assert!(text.contains("orders_lock"), "{text}");
        let mut fresh = App::new("127.0.0.1:1".into(), std::time::Duration::from_secs(1));
        fresh.apply(Update {
            result: Err("refused".into()),
            at: Instant::now(),
        });
        assert!(screen(&fresh).contains("waiting for the agent: refused"));
    }

    #[test]
    fn help_overlay() {
        let mut app = app_with_storm();
        key(&mut app, KeyCode::Char('?'));
        let text = screen(&app);
        assert!(text.contains("cycle the sort order"), "{text}");
        key(&mut app, KeyCode::Char(' '));
        assert!(!screen(&app).contains("cycle the sort order"));
    }

    #[test]
    fn tiny_terminals_do_not_panic() {
        let app = app_with_storm();
        for (w, h) in [(1, 1), (20, 5), (60, 10)] {
            let mut terminal = Terminal::new(TestBackend::new(w, h)).unwrap();
            terminal.draw(|frame| draw(frame, &app, Instant::now())).unwrap();
        }
    }
}
