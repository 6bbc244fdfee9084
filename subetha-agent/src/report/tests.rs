//! Rendering hand-built storms: what the pictures and the page must show.

use std::path::Path;

use super::*;
use crate::model::{
    AgentInfo, Cause, CpuSpan, Culprit, DropSample, Interval, RingDrops, ScannerSpan, StormReport,
    StormTimeline, TaskRef,
};

const MS: u64 = 1_000_000;
const BEGIN: u64 = 10_000 * MS;

fn preempted_storm() -> StormDetail {
    let storm = StormReport {
        id: 42,
        pid: 777,
        comm: "subetha-flood".into(),
        slot: 1,
        tid: 778,
        thread_name: "flood-worker".into(),
        begin_mono_ns: BEGIN,
        end_mono_ns: Some(BEGIN + 48 * MS),
        duration_ns: 48 * MS,
        dropped: 96_000,
        cause: Some(Cause {
            kind: "scanner_preempted".into(),
            summary: "the scanner was runnable but off-CPU for 50.0 ms on CPU 1, preempted by subetha-hog (pid 4242)"
                .into(),
            confidence: crate::model::Confidence::High,
            evidence: vec!["runqueue wait 50.0 ms".into()],
            interval: Some(Interval {
                begin_mono_ns: BEGIN - 2 * MS,
                end_mono_ns: BEGIN + 48 * MS,
            }),
            culprit: Some(Culprit {
                pid: 4242,
                comm: "subetha-hog".into(),
                cpu: 1,
            }),
            ..Cause::default()
        }),
        cause_settled: true,
        ..StormReport::default()
    };
    let samples = |ring_rate: u64, from: u64, to: u64| -> Vec<DropSample> {
        let mut dropped = 0;
        let mut out = vec![DropSample {
            at_mono_ns: BEGIN + from * MS - MS / 10,
            dropped: 0,
        }];
        for ms in from..=to {
            dropped += ring_rate;
            out.push(DropSample {
                at_mono_ns: BEGIN + ms * MS,
                dropped,
            });
        }
        out
    };
    let timeline = StormTimeline {
        window: Interval {
            begin_mono_ns: BEGIN - 48 * MS,
            end_mono_ns: BEGIN + 96 * MS,
        },
        rings: vec![
            RingDrops {
                slot: 1,
                tid: 778,
                thread_name: "flood-worker".into(),
                storm_ring: true,
                samples: samples(2000, 0, 48),
            },
            RingDrops {
                slot: 2,
                tid: 779,
                thread_name: "side-thread".into(),
                storm_ring: false,
                samples: samples(300, 10, 40),
            },
        ],
        scans: (0..40)
            .map(|i| {
                let at = if i < 20 {
                    BEGIN - 48 * MS + i * MS
                } else {
                    BEGIN + 48 * MS + (i - 20) * MS
                };
                Interval {
                    begin_mono_ns: at,
                    end_mono_ns: at + MS / 5,
                }
            })
            .collect(),
        scan_resolution_ns: 0,
        scanner: Some(vec![
            ScannerSpan {
                begin_mono_ns: BEGIN - 2 * MS,
                end_mono_ns: BEGIN + 48 * MS,
                state: "runnable_waiting".into(),
                cpu: 1,
                holder: Some(TaskRef {
                    pid: 4242,
                    comm: "subetha-hog".into(),
                }),
            },
            ScannerSpan {
                begin_mono_ns: BEGIN + 60 * MS,
                end_mono_ns: BEGIN + 70 * MS,
                state: "blocked".into(),
                cpu: 1,
                holder: None,
            },
        ]),
        scanner_note: "from the sched probes".into(),
        producer_cpu: Some(vec![CpuSpan {
            begin_mono_ns: BEGIN - 48 * MS,
            end_mono_ns: BEGIN + 96 * MS,
            cpu: 0,
        }]),
        producer_cpu_note: "from probe events".into(),
    };
    StormDetail {
        storm,
        timeline: Some(timeline),
    }
}

#[test]
fn the_svg_shows_lanes_legend_and_the_preemptor() {
    let svg = render::svg(&preempted_storm()).expect("render");
    assert!(svg.starts_with("<svg"), "{}", &svg[..100.min(svg.len())]);
    for needle in [
        "Drop storm #42",
        "scanner_preempted",
        "drop rate per ring",
        "\nscanner\n",
        "\nscans\n",
        "\nproducer CPU\n",
        "storm ring: slot 1 · flood-worker (tid 778)",
        "slot 2 · side-thread (tid 779)",
        "preempted by subetha-hog (pid 4242) on CPU 1",
        "CPU 0",
        "runnable-waiting (preempted)",
        "blocked (asleep)",
        "ms since the storm&apos;s first drop",
    ] {
        assert!(svg.contains(needle), "the SVG lacks {needle:?}:\n{svg}");
    }
    assert!(!svg.contains("unknown —"), "every lane has data");
}

#[test]
fn without_probes_the_lanes_say_unknown() {
    let mut detail = preempted_storm();
    let timeline = detail.timeline.as_mut().unwrap();
    timeline.scanner = None;
    timeline.scanner_note = "scanner states unknown: eBPF sched probes not running (probes: off)".into();
    timeline.producer_cpu = None;
    timeline.producer_cpu_note = "producer CPU unknown: eBPF probes not running (probes: off)".into();
    let svg = render::svg(&detail).unwrap();
    assert!(
        svg.contains("unknown — scanner states unknown: eBPF sched probes not running"),
        "{svg}"
    );
    assert!(svg.contains("unknown — producer CPU unknown"), "{svg}");
    assert!(
        !svg.contains("(pid 4242) on CPU 1"),
        "no lane data, no label: {svg}"
    );
}

#[test]
fn a_storm_without_timeline_still_draws_and_says_so() {
    let mut detail = preempted_storm();
    detail.timeline = None;
    let svg = render::svg(&detail).unwrap();
    assert!(svg.contains("kept no timeline"), "{svg}");
    assert!(svg.contains("\nscanner\n"), "{svg}");
}

#[test]
fn hostile_names_are_escaped_everywhere() {
    let mut detail = preempted_storm();
    detail.storm.comm = "<script>alert(1)</script>".into();
    detail.storm.thread_name = "a&b\"c'\u{1}".into();
    detail.timeline.as_mut().unwrap().rings[0].thread_name = "</svg><img src=x onerror=alert(2)>".into();
    if let Some(cause) = detail.storm.cause.as_mut() {
        cause.evidence.push("<b>bold</b>".into());
    }
    let page = html::report(&AgentInfo::default(), &[detail]).unwrap();
    for raw in ["<script>", "</svg><img", "<b>bold", "\u{1}"] {
        assert!(!page.contains(raw), "{raw:?} got through:\n{page}");
    }
    assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "{page}");
    assert!(page.contains("&lt;b&gt;bold&lt;/b&gt;"));
    assert_eq!(page.matches("<svg").count(), 1);
    assert_eq!(page.matches("</svg>").count(), 1);
}

#[test]
fn the_html_lists_storms_newest_first_with_pictures() {
    let newer = preempted_storm();
    let mut older = preempted_storm();
    older.storm.id = 41;
    older.storm.cause.as_mut().unwrap().kind = "producer_burst".into();
    let agent = AgentInfo {
        pid: 9,
        probes: "on: 4/4 sched tracepoints".into(),
        ..AgentInfo::default()
    };
    let page = html::report(&agent, &[newer, older]).unwrap();
    let at = |needle: &str| {
        page.find(needle)
            .unwrap_or_else(|| panic!("no {needle:?} in\n{page}"))
    };
    assert!(at("href=\"#storm-42\"") < at("href=\"#storm-41\""));
    assert!(at("<section id=\"storm-42\">") < at("<section id=\"storm-41\">"));
    assert_eq!(page.matches("<svg").count(), 2);
    assert!(page.contains("runqueue wait 50.0 ms"), "evidence listed");
    assert!(page.contains("producer_burst (high)"));
    assert!(page.contains("96000"));
    let empty = html::report(&agent, &[]).unwrap();
    assert!(empty.contains("no drop storms"));
}

#[test]
fn png_is_a_png() {
    let dir = std::env::temp_dir().join(format!("subetha-report-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("storm.png");
    render::png(&preempted_storm(), &path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(bytes.len() > 10_000, "{} bytes", bytes.len());
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
}

#[test]
fn the_extension_picks_the_format() {
    assert_eq!(Format::of(Path::new("x.svg")).unwrap(), Format::Svg);
    assert_eq!(Format::of(Path::new("dir/X.PNG")).unwrap(), Format::Png);
    assert_eq!(Format::of(Path::new("r.html")).unwrap(), Format::Html);
    for bad in ["x.jpg", "x", "svg"] {
        let error = Format::of(Path::new(bad)).unwrap_err().to_string();
        assert!(error.contains(".svg, .png or .html"), "{bad}: {error}");
    }
}

#[test]
fn an_unknown_storm_is_named_in_the_error() {
    let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let snapshot = AgentSnapshot {
        storms: vec![preempted_storm().storm],
        ..AgentSnapshot::default()
    };
    let error = storm_ids(&snapshot, Some(7), Format::Svg, 20, addr)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("no storm 7") && error.contains("#42 to #42"),
        "{error}"
    );
    assert_eq!(
        storm_ids(&snapshot, None, Format::Png, 20, addr).unwrap(),
        vec![42]
    );
    let empty = AgentSnapshot::default();
    let error = storm_ids(&empty, None, Format::Svg, 20, addr)
        .unwrap_err()
        .to_string();
    assert!(error.contains("no drop storms"), "{error}");
    assert!(
        storm_ids(&empty, None, Format::Html, 20, addr)
            .unwrap()
            .is_empty()
    );
}

#[test]
fn the_scanner_lane_is_running_only_where_scans_were_and_unknown_between() {
    // With the probes on but no off-CPU span kept, the old lane was green
    // ("running") from edge to edge, while the scanner slept between scans.
    let mut detail = preempted_storm();
    let timeline = detail.timeline.as_mut().unwrap();
    timeline.scanner = Some(Vec::new());
    timeline.scans.truncate(3);
    let svg = render::svg(&detail).expect("render");
    let fill = |c: (u8, u8, u8)| format!("fill=\"#{:02X}{:02X}{:02X}\"", c.0, c.1, c.2);
    let running = svg.matches(&fill((120, 190, 120))).count();
    // One box per scan, and the legend's swatch.
    assert_eq!(running, 3 + 1, "running boxes in {svg}");
    assert!(svg.contains(&fill((210, 210, 210))), "an unknown background");
}
