//! `subetha-agent top` driven for real in a tmux pane (160×45): against a
//! running agent draining a `subetha-workload`, the screen shows the
//! workload's instances with nonzero per-second rates; the sort keys
//! reorder the instances table (checked on the numbers shown); Enter opens
//! an instance (its op kinds) and a process (its rings); Esc comes back; a
//! storm appears in the storms panel with its detail. Then the exits: `q`,
//! Ctrl-C, SIGTERM from `kill`, and a deliberate panic each leave the pane
//! out of the alternate screen with the tty back in canonical mode (checked
//! by `stty` run in the same pane after `top` returns), with exit status 0
//! (101 for the panic). An agent that stops answering is reported on
//! screen while `top` keeps running. And stdout that is not a terminal is
//! refused with a clear message.
//!
//! Without tmux these tests skip loudly, unless `SUBETHA_REQUIRE_TOOLS=1`.

use std::process::{Command, Stdio};

use subetha_tests::agent::{AgentProcess, ScratchDir, Workload, agent_exe};
use subetha_tests::tmux::Tmux;
use subetha_tests::{TIMEOUT, wait_for};

const WORKLOAD: &str = env!("CARGO_BIN_EXE_subetha-workload");
const INSTANCES: [&str; 3] = ["orders_lock", "cache_lock", "jobs"];

/// Runs `top` in the pane, then reports its exit status and whether the
/// tty was left raw, and stays (so the screen can be read afterwards).
const WRAPPER: &str = r#"
"$1" top --addr "$2" --interval 500ms
status=$?
if stty -a | grep -q -- -icanon; then tty=raw; else tty=cooked; fi
echo "top-exited status=$status tty=$tty"
exec sleep 3600
"#;

/// A workload with bursts (so storms happen), the agent draining only it,
/// and `top` in a tmux pane.
struct Rig {
    // Dropped in this order: the pane first, then the agent, then the workload.
    tmux: Tmux,
    agent: AgentProcess,
    workload: Workload,
    _scratch: ScratchDir,
}

impl Rig {
    fn start(test: &str, env: &str) -> Option<Self> {
        Self::start_sized(test, env, (160, 45))
    }

    fn start_sized(test: &str, env: &str, (width, height): (u16, u16)) -> Option<Self> {
        if !Tmux::available(test) {
            return None;
        }
        let scratch = ScratchDir::new(test);
        let mut workload = Workload::spawn(
            WORKLOAD,
            &[
                "run",
                "--threads",
                "2",
                "--rate",
                "2000",
                "--burst",
                "20000",
                "--burst-every-ms",
                "700",
            ],
            &[],
        );
        let pid = workload.pid().to_string();
        let agent = AgentProcess::start(
            agent_exe(),
            &["--pid", &pid, "--no-socket", "--probes", "off"],
            scratch.join("agent.log"),
        );
        agent.wait_snapshot("the agent to attach to the workload", |s| {
            s.processes
                .iter()
                .any(|p| p.pid == workload.pid() && p.state == "attached")
                .then_some(())
        });
        assert!(workload.cmd("go").is_empty());
        let exe = agent_exe().to_str().expect("UTF-8 path").to_owned();
        let addr = agent.addr().to_string();
        let script = format!("{env}{WRAPPER}");
        let tmux = Tmux::start(test, width, height, &["sh", "-c", &script, "sh", &exe, &addr]);
        Some(Self {
            tmux,
            agent,
            workload,
            _scratch: scratch,
        })
    }

    fn context(&self) -> String {
        format!("--- agent log ---\n{}", self.agent.log())
    }

    /// Waits until every workload instance shows a nonzero ops/s.
    fn wait_live_rates(&self) -> String {
        self.tmux.wait_screen(
            "every instance with a nonzero ops/s",
            |screen| {
                INSTANCES
                    .iter()
                    .all(|name| {
                        instance_cell(screen, name, "ops/s")
                            .and_then(|c| parse_rate(&c))
                            .is_some_and(|r| r > 0.0)
                    })
                    .then(|| screen.to_owned())
            },
            || self.context(),
        )
    }

    /// Waits for the wrapper's line after `top` returned; asserts the pane
    /// left the alternate screen and the tty is cooked; returns the status.
    fn wait_exit(&self) -> i32 {
        let status = self.tmux.wait_screen(
            "top to exit",
            |screen| {
                let line = screen.lines().find(|l| l.starts_with("top-exited "))?;
                assert!(
                    line.contains("tty=cooked"),
                    "the tty was left raw: {line}\n{screen}"
                );
                let status = line.split_whitespace().nth(1)?.strip_prefix("status=")?;
                Some(status.parse::<i32>().expect("a numeric status"))
            },
            || self.context(),
        );
        assert!(
            !self.tmux.alternate_screen(),
            "top exited but left the pane in the alternate screen:\n{}",
            self.tmux.capture()
        );
        let screen = self.tmux.capture();
        assert!(
            !screen.contains("subetha top │"),
            "the normal screen must not keep the TUI's frames:\n{screen}"
        );
        assert_eq!(self.tmux.display("#{cursor_flag}"), "1", "cursor left hidden");
        status
    }

    /// The pid of `top` (the wrapper shell's only child).
    fn top_pid(&self) -> i32 {
        let shell = self.tmux.pane_pid();
        wait_for(
            TIMEOUT,
            "the wrapper shell to start top",
            || {
                let children =
                    std::fs::read_to_string(format!("/proc/{shell}/task/{shell}/children")).ok()?;
                let pid: i32 = children.split_whitespace().next()?.parse().ok()?;
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
                (comm.trim() == "subetha-agent").then_some(pid)
            },
            || format!("children of {shell}"),
        )
    }
}

/// The text of column `header` in the instances table's row for `name`.
fn instance_cell(screen: &str, name: &str, header: &str) -> Option<String> {
    let lines: Vec<Vec<char>> = screen.lines().map(|l| l.chars().collect()).collect();
    let header_index = lines.iter().position(|l| {
        let text: String = l.iter().collect();
        text.contains("instance") && text.contains("kind") && text.contains(header)
    })?;
    let header_text: String = lines[header_index].iter().collect();
    let column = header_text[..header_text.find(header)?].chars().count();
    let row = lines[header_index + 1..].iter().find(|l| {
        let text: String = l.iter().collect();
        text.split_whitespace().nth(2) == Some(name) || text.split_whitespace().nth(1) == Some(name)
    })?;
    let cell: String = row.get(column..)?.iter().collect();
    Some(cell.split_whitespace().next()?.to_owned())
}

/// Instance names of the instances table, top to bottom.
fn instance_order(screen: &str) -> Vec<String> {
    screen
        .lines()
        .filter_map(|l| {
            let mut words = l.trim_start_matches('│').split_whitespace();
            let _pid = words.next()?.parse::<u32>().ok()?;
            let _comm = words.next()?;
            let name = words.next()?;
            INSTANCES.contains(&name).then(|| name.to_owned())
        })
        .collect()
}

/// `4.0k` → 4000; `–` (unknown) → None.
fn parse_rate(cell: &str) -> Option<f64> {
    let (number, scale) = match cell.chars().last()? {
        'k' => (&cell[..cell.len() - 1], 1e3),
        'M' => (&cell[..cell.len() - 1], 1e6),
        'G' => (&cell[..cell.len() - 1], 1e9),
        _ => (cell, 1.0),
    };
    number.parse::<f64>().ok().map(|n| n * scale)
}

/// `12.3µs` → 12300 ns; `–` (no samples) → 0.
fn parse_wait(cell: &str) -> f64 {
    if cell == "–" {
        return 0.0;
    }
    for (unit, scale) in [("ns", 1.0), ("µs", 1e3), ("ms", 1e6), ("s", 1e9)] {
        if let Some(number) = cell.strip_suffix(unit)
            && let Ok(n) = number.parse::<f64>()
        {
            return n * scale;
        }
    }
    panic!("not a wait: {cell:?}")
}

fn non_increasing(values: &[f64]) -> bool {
    values.windows(2).all(|w| w[0] >= w[1])
}

#[test]
fn top_shows_rates_sorts_drills_down_and_quits_cleanly() {
    let Some(rig) = Rig::start("top_main", "") else {
        return;
    };
    let tmux = &rig.tmux;
    let screen = rig.wait_live_rates();
    assert!(tmux.alternate_screen(), "top runs in the alternate screen");
    assert!(screen.contains("sort: ops/s ▼"), "{screen}");
    assert!(
        screen.contains(&format!("agent pid {}", rig.agent.pid())),
        "{screen}"
    );
    assert!(screen.contains("● connected"), "{screen}");
    assert!(
        screen.contains(&format!("{} ", rig.workload.pid())),
        "the process table names the workload:\n{screen}"
    );

    // Sorting: by p99 wait, then back to ops/s; `s` cycles.
    tmux.send_keys(&["w"]);
    tmux.wait_screen(
        "the instances ordered by p99 wait",
        |screen| {
            if !screen.contains("sort: p99 wait ▼") {
                return None;
            }
            let order = instance_order(screen);
            let waits: Vec<f64> = order
                .iter()
                .map(|n| parse_wait(&instance_cell(screen, n, "p99 wait").expect("a p99 cell")))
                .collect();
            assert!(
                non_increasing(&waits),
                "p99 wait descending: {order:?} {waits:?}\n{screen}"
            );
            (order.len() == 3).then_some(())
        },
        || rig.context(),
    );
    tmux.send_keys(&["o"]);
    let screen = tmux.wait_screen(
        "the instances ordered by ops/s",
        |screen| {
            if !screen.contains("sort: ops/s ▼") {
                return None;
            }
            let order = instance_order(screen);
            let rates: Vec<f64> = order
                .iter()
                .map(|n| {
                    instance_cell(screen, n, "ops/s")
                        .and_then(|c| parse_rate(&c))
                        .unwrap_or(0.0)
                })
                .collect();
            assert!(
                non_increasing(&rates),
                "ops/s descending: {order:?} {rates:?}\n{screen}"
            );
            (order.len() == 3).then(|| screen.to_owned())
        },
        || rig.context(),
    );
    assert!(
        screen.contains("ops/s▼"),
        "the sorted column is marked:\n{screen}"
    );
    tmux.send_keys(&["s"]);
    tmux.wait_screen(
        "`s` to move on to contention",
        |s| s.contains("sort: contention % ▼").then_some(()),
        || rig.context(),
    );
    tmux.send_keys(&["d"]);
    tmux.wait_screen(
        "sort by drops",
        |s| s.contains("sort: drops ▼").then_some(()),
        || rig.context(),
    );

    // Drill into the selected instance: its op kinds, consistent with its kind.
    tmux.send_keys(&["Enter"]);
    let (name, screen) = tmux.wait_screen(
        "an instance's operations",
        |screen| {
            let name = INSTANCES
                .iter()
                .find(|n| screen.contains(&format!("operations of {n} ")))?;
            Some((name.to_string(), screen.to_owned()))
        },
        || rig.context(),
    );
    let (kind, ops): (&str, &[&str]) = if name == "jobs" {
        ("channel", &["send", "recv", "try_send", "try_recv"])
    } else if name == "orders_lock" {
        ("mutex", &["lock"])
    } else {
        ("mutex", &["try_lock"])
    };
    assert!(screen.contains(&format!("{kind} {name} (id ")), "{screen}");
    for op in ops {
        assert!(
            screen
                .lines()
                .any(|l| l.trim_start_matches('│').split_whitespace().next() == Some(op)),
            "op row {op:?} for {name}:\n{screen}"
        );
    }
    assert!(screen.contains("wait p50"), "{screen}");

    // Back, then into the process: its rings (worker threads) and instances.
    tmux.send_keys(&["Escape"]);
    tmux.wait_screen(
        "the overview again",
        |s| (s.contains("instances (3)") && s.contains("storms (")).then_some(()),
        || rig.context(),
    );
    tmux.send_keys(&["BTab", "Enter"]);
    let pid = rig.workload.pid();
    let screen = tmux.wait_screen(
        "the process view",
        |s| (s.contains("rings (") && s.contains("worker-0")).then(|| s.to_owned()),
        || rig.context(),
    );
    assert!(screen.contains(&format!("instances of {pid} (3)")), "{screen}");
    assert!(screen.contains("episodes"), "{screen}");
    assert!(screen.contains(&format!("process {pid} (")), "{screen}");
    tmux.send_keys(&["Escape"]);

    // The bursts overflow a ring: a storm with its detail.
    tmux.wait_screen(
        "a storm in the storms panel",
        |s| (s.contains("storm #") && s.contains("first instance: orders_lock")).then_some(()),
        || rig.context(),
    );

    // Help, closed by any key.
    tmux.send_keys(&["?"]);
    tmux.wait_screen(
        "the help",
        |s| s.contains("cycle the sort order").then_some(()),
        || rig.context(),
    );
    tmux.send_keys(&["x"]);
    tmux.wait_screen(
        "the help closed",
        |s| (!s.contains("cycle the sort order")).then_some(()),
        || rig.context(),
    );

    tmux.send_keys(&["q"]);
    assert_eq!(rig.wait_exit(), 0);
}

#[test]
fn ctrl_c_quits_cleanly_and_a_dead_agent_is_reported_not_fatal() {
    let Some(mut rig) = Rig::start("top_ctrl_c", "") else {
        return;
    };
    rig.wait_live_rates();
    rig.agent.signal(libc::SIGTERM);
    assert!(rig.agent.wait_exit(TIMEOUT).success());
    rig.tmux.wait_screen(
        "the lost agent on screen",
        |s| (s.contains("AGENT NOT ANSWERING") && s.contains("orders_lock")).then_some(()),
        || rig.context(),
    );
    rig.tmux.send_keys(&["C-c"]);
    assert_eq!(rig.wait_exit(), 0);
}

#[test]
fn sigterm_restores_the_terminal() {
    let Some(rig) = Rig::start("top_sigterm", "") else {
        return;
    };
    rig.wait_live_rates();
    let top = rig.top_pid();
    // SAFETY: kill(2) on a pid we just read as our pane's child; no memory.
    assert_eq!(unsafe { libc::kill(top, libc::SIGTERM) }, 0);
    assert_eq!(rig.wait_exit(), 0);
}

/// Numbers on `screen` that were cut: `20.` for `20.76M`, `20.7` for
/// `20.76M`, `1.2` for `1.23µs`. What `top` prints is a whole number, a
/// number with a unit (`k`, `M`, `G`, `%`, `ns`, `µs`, `ms`, `s`), or below
/// 10 one decimal (`4.5`).
fn cut_numbers(screen: &str) -> Vec<String> {
    let units = ["k", "M", "G", "%", "ns", "µs", "ms", "s", "x"];
    screen
        .split(|c: char| c.is_whitespace() || "│┌┐└┘─(),·▼".contains(c))
        .filter(|t| t.starts_with(|c: char| c.is_ascii_digit()) && !t.starts_with("0x"))
        // Addresses, times, ratios and names are not numbers.
        .filter(|t| !t.contains([':', '/', '-', '_', '#']))
        .filter(|token| {
            let number = units
                .iter()
                .find_map(|unit| token.strip_suffix(unit))
                .unwrap_or(token);
            let has_unit = number.len() != token.len();
            let whole = !number.is_empty() && number.chars().all(|c| c.is_ascii_digit());
            let decimal = number.split_once('.').is_some_and(|(int, frac)| {
                !int.is_empty()
                    && !frac.is_empty()
                    && int.chars().all(|c| c.is_ascii_digit())
                    && frac.chars().all(|c| c.is_ascii_digit())
                    && (has_unit || (int.len() == 1 && frac.len() == 1))
            });
            !(whole || decimal)
        })
        .map(str::to_owned)
        .collect()
}

#[test]
fn cut_numbers_are_recognised() {
    assert_eq!(
        cut_numbers("│ 20. 20.7 1.2 4.5 20.76M 1.23µs 0.0% 12 3k 127.0.0.1:9464 worker-0 12.3ms"),
        vec!["20.", "20.7"]
    );
}

#[test]
fn an_80_by_24_terminal_shows_whole_numbers() {
    let Some(rig) = Rig::start_sized("top_80x24", "", (80, 24)) else {
        return;
    };
    let tmux = &rig.tmux;
    let check = |what: &str, done: &dyn Fn(&str) -> bool| {
        // Several frames, so rates (which need two snapshots) are on screen.
        let mut frames = 0;
        tmux.wait_screen(
            what,
            |screen| {
                assert!(
                    cut_numbers(screen).is_empty(),
                    "{what}: numbers cut at 80×24: {:?}\n{screen}",
                    cut_numbers(screen)
                );
                frames += done(screen) as u32;
                (frames >= 6).then_some(())
            },
            || rig.context(),
        );
    };
    check("the overview with rates", &|s| {
        s.contains("● connected") && s.contains("orders_lock") && s.contains("/s")
    });
    tmux.send_keys(&["Enter"]);
    check("an instance's operations", &|s| s.contains("operations of "));
    tmux.send_keys(&["Escape", "BTab", "Enter"]);
    check("the process view", &|s| s.contains("rings ("));
    tmux.send_keys(&["q"]);
    assert_eq!(rig.wait_exit(), 0);
}

#[test]
fn sighup_restores_the_terminal() {
    let Some(rig) = Rig::start("top_sighup", "") else {
        return;
    };
    rig.wait_live_rates();
    let top = rig.top_pid();
    // SAFETY: kill(2) on a pid we just read as our pane's child; no memory.
    assert_eq!(unsafe { libc::kill(top, libc::SIGHUP) }, 0);
    assert_eq!(rig.wait_exit(), 0);
}

/// Whether `pid` has exited (gone, or a zombie nobody reaped yet).
fn exited(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
    }
}

#[test]
fn a_terminal_that_goes_away_ends_top() {
    let Some(rig) = Rig::start("top_hangup", "") else {
        return;
    };
    rig.wait_live_rates();
    let top = rig.top_pid();
    // The window closes under it: the pty hangs up (SIGHUP, then EOF/EIO
    // on every read).
    rig.tmux.kill_window();
    let started = std::time::Instant::now();
    let bound = std::time::Duration::from_secs(5);
    while !exited(top) {
        assert!(
            started.elapsed() < bound,
            "top (pid {top}) still runs {bound:?} after its terminal went away"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn a_panic_restores_the_terminal_before_the_message() {
    let Some(rig) = Rig::start("top_panic", "export SUBETHA_TOP_TEST_PANIC=1\n") else {
        return;
    };
    assert_eq!(rig.wait_exit(), 101, "a panic exits with Rust's panic status");
    let screen = rig.tmux.capture();
    assert!(
        screen.contains("panicking on purpose"),
        "the panic message is readable on the normal screen:\n{screen}"
    );
}

#[test]
fn refuses_without_a_terminal() {
    let output = Command::new(agent_exe())
        .args(["top", "--addr", "127.0.0.1:9"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .expect("run subetha-agent top");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("needs a terminal"), "{stderr}");
    let output = Command::new(agent_exe())
        .args(["top", "--interval", "0s"])
        .output()
        .expect("run subetha-agent top");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains("--interval"),
        "{stderr}"
    );
}
