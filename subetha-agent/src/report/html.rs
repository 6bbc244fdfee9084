//! The HTML report: recent storms, newest first, each with its facts, its
//! cause and evidence and its picture inline (SVG).
//!
//! Everything taken from the snapshot is escaped (it comes from observed,
//! possibly hostile processes); the pictures are SVG the plotters backend
//! wrote, whose text it escaped.

use std::fmt::Write as _;

use anyhow::Result;

use super::render;
use crate::model::{AgentInfo, StormDetail};

/// `text` safe inside HTML text and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() && c != '\n' => out.push('?'),
            c => out.push(c),
        }
    }
    out
}

/// The report of `storms` (newest first) from the agent described by `agent`.
pub fn report(agent: &AgentInfo, storms: &[StormDetail]) -> Result<String> {
    let mut out = String::new();
    out.push_str(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>subetha drop storms</title>\n<style>\n\
         body { font-family: sans-serif; margin: 1.5em; color: #222; }\n\
         table { border-collapse: collapse; }\n\
         th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }\n\
         th { background: #f0f0f0; }\n\
         td.num { text-align: right; }\n\
         section { margin-top: 2em; border-top: 2px solid #ddd; padding-top: 0.5em; }\n\
         figure { margin: 0.5em 0; }\n\
         figure svg { max-width: 100%; height: auto; }\n\
         </style>\n</head>\n<body>\n<h1>subetha drop storms</h1>\n",
    );
    writeln!(
        out,
        "<p>Agent pid {} (version {}), {} scans; probes: {}. {} storm(s), newest first.</p>",
        agent.pid,
        escape(&agent.version),
        agent.scans,
        escape(&agent.probes),
        storms.len()
    )?;
    if storms.is_empty() {
        out.push_str("<p>The agent has seen no drop storms.</p>\n</body>\n</html>\n");
        return Ok(out);
    }
    out.push_str(
        "<table>\n<tr><th>storm</th><th>process</th><th>thread</th><th>dropped</th><th>duration</th>\
         <th>cause</th></tr>\n",
    );
    for detail in storms {
        let storm = &detail.storm;
        writeln!(
            out,
            "<tr><td><a href=\"#storm-{id}\">#{id}</a></td><td>{comm} (pid {pid})</td>\
             <td>{thread} (tid {tid}, slot {slot})</td><td class=\"num\">{dropped}</td>\
             <td class=\"num\">{duration:.3} ms{ongoing}</td><td>{cause}</td></tr>",
            id = storm.id,
            comm = escape(&storm.comm),
            pid = storm.pid,
            thread = escape(&storm.thread_name),
            tid = storm.tid,
            slot = storm.slot,
            dropped = storm.dropped,
            duration = storm.duration_ns as f64 / 1e6,
            ongoing = if storm.end_mono_ns.is_none() {
                " (going on)"
            } else {
                ""
            },
            cause = storm.cause.as_ref().map_or_else(
                || "not diagnosed yet".to_string(),
                |c| format!("{} ({})", escape(&c.kind), escape(c.confidence.as_str()))
            ),
        )?;
    }
    out.push_str("</table>\n");
    for detail in storms {
        let storm = &detail.storm;
        writeln!(out, "<section id=\"storm-{}\">", storm.id)?;
        let (title, summary) = render::title_lines(storm);
        writeln!(out, "<h2>{}</h2>", escape(&title))?;
        if !summary.is_empty() {
            writeln!(out, "<p>{}</p>", escape(&summary))?;
        }
        if let Some(cause) = &storm.cause {
            if !cause.evidence.is_empty() {
                out.push_str("<ul>\n");
                for fact in &cause.evidence {
                    writeln!(out, "<li>{}</li>", escape(fact))?;
                }
                out.push_str("</ul>\n");
            }
            if !storm.cause_settled {
                out.push_str("<p><em>The cause may still change (evidence is still arriving).</em></p>\n");
            }
        }
        writeln!(out, "<figure>\n{}\n</figure>\n</section>", render::svg(detail)?)?;
    }
    out.push_str("</body>\n</html>\n");
    Ok(out)
}
