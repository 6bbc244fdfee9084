//! What the screen shows, independent of any terminal: the latest snapshot
//! and the rates since the one before, the connection's health, the sort
//! order, which view is open (overview, one process, one instance), which
//! row of each panel is selected, and what each key does.
//!
//! Selections are remembered by identity (process, instance, storm id), not
//! by row number, so a re-sort or a refresh never moves the cursor to a
//! different thing.

use std::sync::Arc;
use std::time::Instant;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use super::rates::{InstanceKey, ProcessKey, Rates};
use super::source::Update;
use crate::model::{AgentSnapshot, InstanceReport, ProcessReport, StormReport};

/// What the instance and process tables are ordered by (descending).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortKey {
    /// Operations per second.
    Ops,
    /// Contended share over the last interval.
    Contention,
    /// p99 wait (latency).
    Wait,
    /// Drops per second (then total).
    Drops,
}

impl SortKey {
    /// All keys, in the order `s` cycles through them.
    pub const ALL: [SortKey; 4] = [SortKey::Ops, SortKey::Contention, SortKey::Wait, SortKey::Drops];

    /// Header label.
    pub fn label(self) -> &'static str {
        match self {
            SortKey::Ops => "ops/s",
            SortKey::Contention => "contention %",
            SortKey::Wait => "p99 wait",
            SortKey::Drops => "drops",
        }
    }

    fn next(self) -> Self {
        let index = Self::ALL.iter().position(|&k| k == self).unwrap_or(0);
        Self::ALL[(index + 1) % Self::ALL.len()]
    }
}

/// The overview's panels that hold a selection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Panel {
    /// Processes table.
    Processes,
    /// Instances table.
    Instances,
    /// Storms list.
    Storms,
}

/// An open view; the last one of [`App::views`] is on screen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    /// Processes, instances, storms.
    Overview,
    /// One process: its rings and instances.
    Process(ProcessKey),
    /// One instance: its op kinds.
    Instance(InstanceKey),
}

/// Health of the data source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Connection {
    /// Nothing received yet.
    Connecting,
    /// The last fetch succeeded.
    Connected {
        /// When.
        at: Instant,
    },
    /// The last fetches failed (we keep retrying).
    Failing {
        /// The latest error.
        error: String,
        /// Failures in a row.
        attempts: u64,
        /// When the last success was, if ever.
        last_ok: Option<Instant>,
    },
}

/// Whether to keep running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    /// Keep going.
    Continue,
    /// The user asked to quit.
    Quit,
}

/// One instance row (a snapshot's instance with its rates).
#[derive(Clone, Debug)]
pub struct InstanceRow<'a> {
    /// Identity.
    pub key: InstanceKey,
    /// Its process.
    pub process: &'a ProcessReport,
    /// The instance.
    pub instance: &'a InstanceReport,
    /// Ops/s (None: unknown yet).
    pub ops_rate: Option<f64>,
    /// Contended share over the interval.
    pub contention: Option<f64>,
    /// Drops attributed per second.
    pub drops_rate: Option<f64>,
}

/// One process row.
#[derive(Clone, Debug)]
pub struct ProcessRow<'a> {
    /// Identity.
    pub key: ProcessKey,
    /// The process.
    pub process: &'a ProcessReport,
    /// Σ instance ops/s.
    pub ops_rate: Option<f64>,
    /// Σ instance ops.
    pub ops_total: u64,
    /// Contended share over the interval, all instances.
    pub contention: Option<f64>,
    /// Highest instance p99 wait, ns.
    pub p99_ns: u64,
    /// Ring drops per second.
    pub drops_rate: Option<f64>,
    /// Ring drains per second.
    pub drained_rate: Option<f64>,
}

/// The whole UI state.
pub struct App {
    /// Where the data comes from (for the screen).
    pub source: String,
    /// Latest snapshot.
    pub snapshot: Option<Arc<AgentSnapshot>>,
    /// Rates from the snapshot before it.
    pub rates: Option<Rates>,
    /// Source health.
    pub connection: Connection,
    /// Current order.
    pub sort: SortKey,
    /// View stack (never empty).
    pub views: Vec<View>,
    /// Focused overview panel.
    pub focus: Panel,
    /// Help overlay shown.
    pub help: bool,
    /// Selected process (overview).
    pub selected_process: Option<ProcessKey>,
    /// Selected instance (overview, and inside a process view).
    pub selected_instance: Option<InstanceKey>,
    /// Selected storm id (None: the newest).
    pub selected_storm: Option<u64>,
    /// Retry period, for the status line.
    pub interval: std::time::Duration,
}

fn cmp_option(a: Option<f64>, b: Option<f64>) -> std::cmp::Ordering {
    // None (unknown) sorts below every number.
    match (a, b) {
        (Some(a), Some(b)) => a.total_cmp(&b),
        (Some(_), None) => std::cmp::Ordering::Greater,
        (None, Some(_)) => std::cmp::Ordering::Less,
        (None, None) => std::cmp::Ordering::Equal,
    }
}

impl App {
    /// An empty state for `source`, refreshed every `interval`.
    pub fn new(source: String, interval: std::time::Duration) -> Self {
        Self {
            source,
            snapshot: None,
            rates: None,
            connection: Connection::Connecting,
            sort: SortKey::Ops,
            views: vec![View::Overview],
            focus: Panel::Instances,
            help: false,
            selected_process: None,
            selected_instance: None,
            selected_storm: None,
            interval,
        }
    }

    /// The view on screen.
    pub fn view(&self) -> View {
        *self.views.last().unwrap_or(&View::Overview)
    }

    /// Takes in one fetch's outcome.
    pub fn apply(&mut self, update: Update) {
        match update.result {
            Ok(snapshot) => {
                self.connection = Connection::Connected { at: update.at };
                self.push_snapshot(snapshot);
            }
            Err(error) => {
                let (attempts, last_ok) = match &self.connection {
                    Connection::Failing {
                        attempts, last_ok, ..
                    } => (attempts + 1, *last_ok),
                    Connection::Connected { at } => (1, Some(*at)),
                    Connection::Connecting => (1, None),
                };
                self.connection = Connection::Failing {
                    error,
                    attempts,
                    last_ok,
                };
            }
        }
    }

    /// Takes in a snapshot: rates against the previous one (kept when the
    /// agent has not published a new one since).
    pub fn push_snapshot(&mut self, snapshot: AgentSnapshot) {
        if let Some(previous) = &self.snapshot {
            if previous.agent.pid == snapshot.agent.pid
                && previous.agent.taken_mono_ns == snapshot.agent.taken_mono_ns
            {
                return;
            }
            self.rates = Rates::between(previous, &snapshot);
        }
        self.snapshot = Some(Arc::new(snapshot));
    }

    /// A process in the current snapshot.
    pub fn process(&self, key: ProcessKey) -> Option<&ProcessReport> {
        self.snapshot
            .as_deref()?
            .processes
            .iter()
            .find(|p| ProcessKey::of(p) == key)
    }

    /// An instance in the current snapshot, with its process.
    pub fn instance(&self, key: InstanceKey) -> Option<(&ProcessReport, &InstanceReport)> {
        let process = self.process(key.process)?;
        Some((process, process.instances.iter().find(|i| i.id == key.id)?))
    }

    /// Instance rows (of one process, or all), in the current order.
    pub fn instance_rows(&self, only: Option<ProcessKey>) -> Vec<InstanceRow<'_>> {
        let Some(snapshot) = self.snapshot.as_deref() else {
            return Vec::new();
        };
        let mut rows: Vec<InstanceRow<'_>> = snapshot
            .processes
            .iter()
            .filter(|p| only.is_none_or(|k| ProcessKey::of(p) == k))
            .flat_map(|process| {
                process.instances.iter().map(move |instance| {
                    let key = InstanceKey::of(process, instance);
                    let rates = self.rates.as_ref().and_then(|r| r.instance(key));
                    InstanceRow {
                        key,
                        process,
                        instance,
                        ops_rate: rates.map(|r| r.ops),
                        contention: rates.and_then(|r| r.contention),
                        drops_rate: rates.map(|r| r.drops),
                    }
                })
            })
            .collect();
        let sort = self.sort;
        rows.sort_by(|a, b| {
            let primary = match sort {
                SortKey::Ops => cmp_option(a.ops_rate, b.ops_rate).then(a.instance.ops.cmp(&b.instance.ops)),
                SortKey::Contention => cmp_option(a.contention, b.contention)
                    .then(a.instance.contended.cmp(&b.instance.contended)),
                SortKey::Wait => a
                    .instance
                    .latency_ns
                    .p99
                    .cmp(&b.instance.latency_ns.p99)
                    .then(a.instance.latency_ns.max.cmp(&b.instance.latency_ns.max)),
                SortKey::Drops => cmp_option(a.drops_rate, b.drops_rate)
                    .then(a.instance.drops_attributed.cmp(&b.instance.drops_attributed)),
            };
            primary.reverse().then(a.key.cmp(&b.key))
        });
        rows
    }

    /// Process rows, in the current order.
    pub fn process_rows(&self) -> Vec<ProcessRow<'_>> {
        let Some(snapshot) = self.snapshot.as_deref() else {
            return Vec::new();
        };
        let mut rows: Vec<ProcessRow<'_>> = snapshot
            .processes
            .iter()
            .map(|process| {
                let key = ProcessKey::of(process);
                let rates = self.rates.as_ref().and_then(|r| r.process(key));
                ProcessRow {
                    key,
                    process,
                    ops_rate: rates.map(|r| r.instances.ops),
                    ops_total: process.instances.iter().map(|i| i.ops).sum(),
                    contention: rates.and_then(|r| r.instances.contention),
                    p99_ns: process
                        .instances
                        .iter()
                        .map(|i| i.latency_ns.p99)
                        .max()
                        .unwrap_or(0),
                    drops_rate: rates.map(|r| r.dropped),
                    drained_rate: rates.map(|r| r.drained),
                }
            })
            .collect();
        let sort = self.sort;
        rows.sort_by(|a, b| {
            let primary = match sort {
                SortKey::Ops => cmp_option(a.ops_rate, b.ops_rate).then(a.ops_total.cmp(&b.ops_total)),
                SortKey::Contention => cmp_option(a.contention, b.contention),
                SortKey::Wait => a.p99_ns.cmp(&b.p99_ns),
                SortKey::Drops => {
                    cmp_option(a.drops_rate, b.drops_rate).then(a.process.dropped.cmp(&b.process.dropped))
                }
            };
            primary.reverse().then(a.key.cmp(&b.key))
        });
        rows
    }

    /// Storms, newest first.
    pub fn storms(&self) -> Vec<&StormReport> {
        self.snapshot
            .as_deref()
            .map(|s| s.storms.iter().rev().collect())
            .unwrap_or_default()
    }

    /// Index of the selected process row.
    pub fn process_index(&self, rows: &[ProcessRow<'_>]) -> Option<usize> {
        selected_index(rows.iter().map(|r| r.key), self.selected_process, rows.len())
    }

    /// Index of the selected instance row.
    pub fn instance_index(&self, rows: &[InstanceRow<'_>]) -> Option<usize> {
        selected_index(rows.iter().map(|r| r.key), self.selected_instance, rows.len())
    }

    /// Index of the selected storm (newest first).
    pub fn storm_index(&self, storms: &[&StormReport]) -> Option<usize> {
        selected_index(storms.iter().map(|s| s.id), self.selected_storm, storms.len())
    }

    /// Reacts to a key.
    pub fn handle_key(&mut self, key: KeyEvent) -> Flow {
        if key.modifiers.contains(KeyModifiers::CONTROL) && matches!(key.code, KeyCode::Char('c' | 'C')) {
            return Flow::Quit;
        }
        if self.help {
            // Any key closes the help (q still quits).
            self.help = false;
            return if key.code == KeyCode::Char('q') {
                Flow::Quit
            } else {
                Flow::Continue
            };
        }
        match key.code {
            KeyCode::Char('q') => return Flow::Quit,
            KeyCode::Char('?') | KeyCode::F(1) => self.help = true,
            KeyCode::Esc | KeyCode::Backspace | KeyCode::Left if self.views.len() > 1 => {
                self.views.pop();
            }
            KeyCode::Char('s') => self.sort = self.sort.next(),
            KeyCode::Char('o') => self.sort = SortKey::Ops,
            KeyCode::Char('c') => self.sort = SortKey::Contention,
            KeyCode::Char('w') => self.sort = SortKey::Wait,
            KeyCode::Char('d') => self.sort = SortKey::Drops,
            KeyCode::Tab => self.cycle_focus(true),
            KeyCode::BackTab => self.cycle_focus(false),
            KeyCode::Up | KeyCode::Char('k') => self.move_selection(-1),
            KeyCode::Down | KeyCode::Char('j') => self.move_selection(1),
            KeyCode::PageUp => self.move_selection(-10),
            KeyCode::PageDown => self.move_selection(10),
            KeyCode::Home | KeyCode::Char('g') => self.move_selection(isize::MIN / 2),
            KeyCode::End | KeyCode::Char('G') => self.move_selection(isize::MAX / 2),
            KeyCode::Enter | KeyCode::Right => self.drill(),
            _ => {}
        }
        Flow::Continue
    }

    fn cycle_focus(&mut self, forwards: bool) {
        if self.view() != View::Overview {
            return;
        }
        let order = [Panel::Processes, Panel::Instances, Panel::Storms];
        let index = order.iter().position(|&p| p == self.focus).unwrap_or(0);
        let step = if forwards { 1 } else { order.len() - 1 };
        self.focus = order[(index + step) % order.len()];
    }

    fn move_selection(&mut self, delta: isize) {
        match (self.view(), self.focus) {
            (View::Overview, Panel::Processes) => {
                let keys: Vec<ProcessKey> = self.process_rows().iter().map(|r| r.key).collect();
                self.selected_process = moved(&keys, self.selected_process, delta);
            }
            (View::Overview, Panel::Instances) => {
                let keys: Vec<InstanceKey> = self.instance_rows(None).iter().map(|r| r.key).collect();
                self.selected_instance = moved(&keys, self.selected_instance, delta);
            }
            (View::Overview, Panel::Storms) => {
                let ids: Vec<u64> = self.storms().iter().map(|s| s.id).collect();
                self.selected_storm = moved(&ids, self.selected_storm, delta);
            }
            (View::Process(process), _) => {
                let keys: Vec<InstanceKey> =
                    self.instance_rows(Some(process)).iter().map(|r| r.key).collect();
                self.selected_instance = moved(&keys, self.selected_instance, delta);
            }
            (View::Instance(_), _) => {}
        }
    }

    fn drill(&mut self) {
        let next = match (self.view(), self.focus) {
            (View::Overview, Panel::Processes) => {
                let rows = self.process_rows();
                self.process_index(&rows).map(|i| View::Process(rows[i].key))
            }
            (View::Overview, Panel::Instances) => {
                let rows = self.instance_rows(None);
                self.instance_index(&rows).map(|i| View::Instance(rows[i].key))
            }
            (View::Process(process), _) => {
                let rows = self.instance_rows(Some(process));
                self.instance_index(&rows).map(|i| View::Instance(rows[i].key))
            }
            (View::Overview, Panel::Storms) | (View::Instance(_), _) => None,
        };
        if let Some(view) = next {
            if let View::Instance(key) = view {
                self.selected_instance = Some(key);
            }
            self.views.push(view);
        }
    }
}

/// Where `selected` is among `keys` (the first row when it is gone or
/// none is selected).
fn selected_index<K: PartialEq>(
    keys: impl Iterator<Item = K>,
    selected: Option<K>,
    len: usize,
) -> Option<usize> {
    if len == 0 {
        return None;
    }
    let found = selected.and_then(|s| keys.into_iter().position(|k| k == s));
    Some(found.unwrap_or(0))
}

fn moved<K: PartialEq + Copy>(keys: &[K], selected: Option<K>, delta: isize) -> Option<K> {
    let index = selected_index(keys.iter().copied(), selected, keys.len())?;
    let target = index.saturating_add_signed(delta).min(keys.len() - 1);
    Some(keys[target])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::top::rates::tests::{InstanceSpec, snapshot};
    use crossterm::event::KeyEventKind;

    fn press(code: KeyCode) -> KeyEvent {
        KeyEvent::new_with_kind(code, KeyModifiers::NONE, KeyEventKind::Press)
    }

    /// Two snapshots one second apart: `busy` has the most ops/s, `slow` the
    /// highest p99, `contended` the highest contention share, `droppy` the
    /// most drops — and `old` the most ops in total but no new ones.
    fn app() -> App {
        let mut app = App::new("test".into(), std::time::Duration::from_secs(1));
        let instances_before: &[InstanceSpec<'_>] = &[
            (1, "busy", 1000, 0, 0, 1_000),
            (2, "slow", 1000, 10, 0, 90_000),
            (3, "contended", 1000, 0, 0, 2_000),
            (4, "droppy", 1000, 0, 0, 3_000),
            (5, "old", 1_000_000, 0, 0, 500),
        ];
        let instances_after: &[InstanceSpec<'_>] = &[
            (1, "busy", 51_000, 100, 0, 1_000),
            (2, "slow", 2000, 20, 0, 90_000),
            (3, "contended", 3000, 1000, 0, 2_000),
            (4, "droppy", 2000, 0, 700, 3_000),
            (5, "old", 1_000_000, 0, 0, 500),
        ];
        app.push_snapshot(snapshot(9, 1.0, &[(10, "app", instances_before)]));
        app.push_snapshot(snapshot(9, 2.0, &[(10, "app", instances_after)]));
        app
    }

    fn names(app: &App) -> Vec<String> {
        app.instance_rows(None)
            .iter()
            .map(|r| r.instance.name.clone())
            .collect()
    }

    #[test]
    fn every_sort_key_orders_by_its_own_column() {
        let mut app = app();
        assert_eq!(app.sort, SortKey::Ops);
        assert_eq!(names(&app), ["busy", "contended", "slow", "droppy", "old"]);
        app.handle_key(press(KeyCode::Char('c')));
        assert_eq!(app.sort, SortKey::Contention);
        // 50 %, 1 %, 0.2 %, 0 %; `old` did nothing this interval: unknown, last.
        assert_eq!(names(&app)[..3], ["contended", "slow", "busy"]);
        assert_eq!(names(&app).last().unwrap(), "old");
        app.handle_key(press(KeyCode::Char('w')));
        assert_eq!(names(&app), ["slow", "droppy", "contended", "busy", "old"]);
        app.handle_key(press(KeyCode::Char('d')));
        assert_eq!(names(&app)[0], "droppy");
        app.handle_key(press(KeyCode::Char('o')));
        assert_eq!(names(&app)[0], "busy");
        // `s` cycles through all four and back.
        let mut seen = Vec::new();
        for _ in 0..4 {
            app.handle_key(press(KeyCode::Char('s')));
            seen.push(app.sort);
        }
        assert_eq!(
            seen,
            [SortKey::Contention, SortKey::Wait, SortKey::Drops, SortKey::Ops]
        );
    }

    #[test]
    fn selection_follows_the_thing_not_the_row() {
        let mut app = app();
        app.handle_key(press(KeyCode::Down));
        let rows = app.instance_rows(None);
        let index = app.instance_index(&rows).unwrap();
        assert_eq!(rows[index].instance.name, "contended");
        drop(rows);
        app.handle_key(press(KeyCode::Char('w')));
        let rows = app.instance_rows(None);
        assert_eq!(
            rows[app.instance_index(&rows).unwrap()].instance.name,
            "contended"
        );
        drop(rows);
        // Moving past either end stays on the end row.
        app.handle_key(press(KeyCode::PageDown));
        let rows = app.instance_rows(None);
        assert_eq!(app.instance_index(&rows), Some(rows.len() - 1));
        drop(rows);
        app.handle_key(press(KeyCode::Home));
        let rows = app.instance_rows(None);
        assert_eq!(app.instance_index(&rows), Some(0));
    }

    #[test]
    fn enter_drills_down_and_esc_comes_back() {
        let mut app = app();
        app.handle_key(press(KeyCode::Enter));
        let View::Instance(key) = app.view() else {
            panic!("Enter on an instance opens it: {:?}", app.views)
        };
        assert_eq!(app.instance(key).unwrap().1.name, "busy");
        // Enter in an instance view goes no deeper.
        app.handle_key(press(KeyCode::Enter));
        assert_eq!(app.views.len(), 2);
        app.handle_key(press(KeyCode::Esc));
        assert_eq!(app.view(), View::Overview);
        app.handle_key(press(KeyCode::Esc));
        assert_eq!(app.view(), View::Overview, "Esc on the overview stays");
        app.handle_key(press(KeyCode::BackTab));
        assert_eq!(app.focus, Panel::Processes);
        app.handle_key(press(KeyCode::Enter));
        assert!(matches!(app.view(), View::Process(k) if k.pid == 10));
        // Inside the process: pick its second instance, open it.
        app.handle_key(press(KeyCode::Down));
        app.handle_key(press(KeyCode::Enter));
        let View::Instance(key) = app.view() else {
            panic!("{:?}", app.views)
        };
        assert_eq!(app.instance(key).unwrap().1.name, "contended");
        assert_eq!(app.views.len(), 3);
    }

    #[test]
    fn quit_keys_and_help() {
        let mut app = app();
        assert_eq!(app.handle_key(press(KeyCode::Char('?'))), Flow::Continue);
        assert!(app.help);
        assert_eq!(app.handle_key(press(KeyCode::Char('x'))), Flow::Continue);
        assert!(!app.help, "any key closes the help");
        assert_eq!(app.handle_key(press(KeyCode::Char('q'))), Flow::Quit);
        let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
        assert_eq!(app.handle_key(ctrl_c), Flow::Quit);
    }

    #[test]
    fn failures_are_counted_and_a_success_clears_them() {
        let mut app = App::new("test".into(), std::time::Duration::from_secs(1));
        let at = Instant::now();
        let fail = |text: &str| Update {
            result: Err(text.into()),
            at,
        };
        app.apply(fail("refused"));
        app.apply(fail("refused again"));
        assert_eq!(
            app.connection,
            Connection::Failing {
                error: "refused again".into(),
                attempts: 2,
                last_ok: None
            }
        );
        app.apply(Update {
            result: Ok(snapshot(1, 1.0, &[])),
            at,
        });
        assert_eq!(app.connection, Connection::Connected { at });
        app.apply(fail("gone"));
        assert!(matches!(
            app.connection,
            Connection::Failing {
                attempts: 1,
                last_ok: Some(_),
                ..
            }
        ));
        assert!(app.snapshot.is_some(), "the last picture stays on screen");
    }

    #[test]
    fn a_republished_snapshot_keeps_the_rates() {
        let mut app = app();
        let rates = app.rates.clone();
        assert!(rates.is_some());
        let same = AgentSnapshot::clone(app.snapshot.as_ref().unwrap());
        app.push_snapshot(same);
        assert_eq!(app.rates, rates);
    }

    #[test]
    fn process_rows_sum_their_instances() {
        let app = app();
        let rows = app.process_rows();
        assert_eq!(rows.len(), 1);
        let row = &rows[0];
        assert_eq!(row.ops_rate, Some(50_000.0 + 1000.0 + 2000.0 + 1000.0));
        assert_eq!(row.p99_ns, 90_000);
        assert_eq!(row.drops_rate, Some(700.0));
    }
}
