//! A [`Diff`] as markdown: the manifest fields that differ, exit and completion,
//! the frames compared, the phase table with deltas and ratios, the engine's
//! facts that differ, and the whole-run summaries.

use std::fmt::Write;

use crate::diff::{Diff, FieldDiff, FramesDiff};
use crate::escape::{md_cell, md_code, terminal};
use crate::formats::ranking_text::{fixed, value};
use crate::levers_spec::Unit;

fn opt(x: Option<f64>, f: impl Fn(f64) -> String) -> String {
    x.map_or("—".to_string(), f)
}

/// Render `d` as markdown.
pub fn markdown(d: &Diff) -> String {
    let mut o = String::new();
    // Writing into a String cannot fail.
    let _ = write_md(&mut o, d);
    o
}

fn write_md(o: &mut String, d: &Diff) -> std::fmt::Result {
    writeln!(o, "# Diff")?;
    writeln!(o)?;
    writeln!(o, "- A: {}", md_code(&d.a))?;
    writeln!(o, "- B: {}", md_code(&d.b))?;
    writeln!(o)?;
    let differing: Vec<&FieldDiff> = d.fields.iter().filter(|f| f.differs).collect();
    writeln!(
        o,
        "## Manifest differences ({} of {} fields compared)",
        differing.len(),
        d.fields.len()
    )?;
    writeln!(o)?;
    if differing.is_empty() {
        writeln!(o, "None: same binary, weights, levers, host, driver, cadence, contention, gates, exit and completion.")?;
    } else {
        writeln!(o, "| field | A | B |")?;
        writeln!(o, "|---|---|---|")?;
        for f in differing {
            writeln!(
                o,
                "| {} | `{}` | `{}` |",
                f.label,
                cell(&f.a_view),
                cell(&f.b_view)
            )?;
        }
    }
    writeln!(o)?;
    writeln!(o, "## Exit and completion")?;
    writeln!(o)?;
    for f in d.fields.iter().filter(|f| {
        matches!(
            f.field.as_str(),
            "exit.reason" | "exit.code" | "completion.verdict" | "completion.frames" | "complete"
        )
    }) {
        writeln!(
            o,
            "- {}: A `{}`, B `{}`",
            f.label,
            cell(&f.a_view),
            cell(&f.b_view)
        )?;
    }
    writeln!(o)?;
    writeln!(o, "## Frames")?;
    writeln!(o)?;
    writeln!(o, "{}", frames_line(&d.frames))?;
    writeln!(o)?;
    writeln!(o, "## Phases")?;
    writeln!(o)?;
    writeln!(
        o,
        "| phase | A n | A | B n | B | B - A | B / A | A peak rss | B peak rss |"
    )?;
    writeln!(o, "|---|---:|---:|---:|---:|---:|---:|---:|---:|")?;
    for p in &d.phases {
        let gib = |x: Option<i64>| opt(x.map(|v| v as f64), |v| value(v, Unit::Bytes));
        writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            md_cell(&p.phase),
            p.a_count,
            opt(p.a_s, |v| value(v, Unit::Seconds)),
            p.b_count,
            opt(p.b_s, |v| value(v, Unit::Seconds)),
            opt(p.delta_s, |v| value(v, Unit::Seconds)),
            opt(p.ratio, |v| fixed(v, 3)),
            gib(p.a_peak_rss_bytes),
            gib(p.b_peak_rss_bytes)
        )?;
    }
    writeln!(o)?;
    writeln!(
        o,
        "## Engine facts that differ ({} of {} compared)",
        d.facts.len(),
        d.facts_compared
    )?;
    writeln!(o)?;
    writeln!(
        o,
        "A phase's close attributes that are facts, not readings (an arm, a digest, a \
         count), for the phases that run once in each bundle."
    )?;
    writeln!(o)?;
    if !d.facts.is_empty() {
        writeln!(o, "| phase | attribute | A | B |")?;
        writeln!(o, "|---|---|---|---|")?;
        let v = |x: &Option<String>| {
            x.as_deref()
                .map_or("—".to_string(), |s| format!("`{}`", cell(s)))
        };
        for f in &d.facts {
            writeln!(
                o,
                "| {} | {} | {} | {} |",
                md_cell(&f.phase),
                md_cell(&f.attr),
                v(&f.a),
                v(&f.b)
            )?;
        }
        writeln!(o)?;
    }
    writeln!(o, "## Samples")?;
    writeln!(o)?;
    writeln!(o, "| summary | A | B | B / A |")?;
    writeln!(o, "|---|---:|---:|---:|")?;
    for s in &d.summaries {
        let f = |x: f64| {
            if s.name == "samples" {
                fixed(x, 0)
            } else {
                value(x, s.unit)
            }
        };
        writeln!(
            o,
            "| {} | {} | {} | {} |",
            s.name,
            opt(s.a, f),
            opt(s.b, f),
            opt(s.ratio, |v| fixed(v, 3))
        )?;
    }
    Ok(())
}

/// What the frames comparison found, in one paragraph.
fn frames_line(f: &FramesDiff) -> String {
    let p = match f {
        FramesDiff::NotCompared(why) => return format!("Not compared: {}.", terminal(why)),
        FramesDiff::Compared(p) => p,
    };
    let stills = p.images.join(", ");
    let images = if p.max_abs_error == 0 {
        format!("The stills ({stills}) are identical sample for sample.")
    } else {
        format!(
            "PSNR of B against A over the stills ({stills}): {} dB; the largest sample \
             difference is {} of 255.",
            fixed(p.psnr_db, 2),
            p.max_abs_error
        )
    };
    let hashes = match (p.frames_compared, p.first_differing_frame) {
        (0, _) => "No frame sha256 held by both.".to_string(),
        (n, None) => format!("Every frame's sha256 agrees ({n} compared)."),
        (n, Some(first)) => format!(
            "{} of {n} frames' sha256 differ (the first: frame {first}).",
            p.frames_differing
        ),
    };
    format!("{images} {hashes}")
}

/// A value for a code span in a table cell: `|` escaped, a backtick as `'`,
/// control characters (a newline included) visible.
fn cell(s: &str) -> String {
    terminal(&s.replace('|', "\\|").replace('`', "'"))
}
