//! The forest plot of a [`Ranking`]: one row per lever and rung, the saving's point
//! estimate and 95% interval on one shared axis, the lever's minimum effect as a
//! dashed tick, colour and marker shape by verdict, and the same facts as text in
//! columns beside the plot (so colour is never the only carrier). `harness rank
//! --out F.md` writes it beside the report as `F-forest.svg` ([`file_beside`]) and
//! the report links it; `harness report` inlines it ([`inline_svg`]).
//!
//! Rows: the levers in the ranking's order, each lever's reference rung first and
//! then its other rungs as [`Ranking::levers`] lists them: exactly the rows of the
//! markdown report's ranking and other-rungs tables. A row with no estimate (no
//! pairs, one arm missing, n/a, hosts that disagree) says so in the plot area and
//! draws no interval. Where a lever's pairs at a rung ran on two or more hosts
//! ([`RungResult::hosts`]), one host row per host follows its row: the host's
//! own saving and interval, drawn thinner, and its saving judged alone; the
//! row's verdict cell carries `I²`. A plot without such rows is what it was
//! before hosts were blocked, byte for byte.
//!
//! Fidelity: [`RungResult::fidelity`] is one more entry of `RIGHT_COLUMNS`, between
//! the interval and the verdict ([`crate::rank::fidelity::cell`]: `identical`,
//! `FLAGGED ...` for a preserving lever whose frames differ, or the median PSNR with
//! its interval for a changing one); widths and the header follow from that list.
//!
//! Promise: a pure function of the ranking; coordinates have one decimal, numbers
//! the report's fixed formats, and no clock or map order enters, so the bytes are
//! the same on every run (`harness rank --check` compares them).
//!
//! Hooks for tests and the browser check: every row is a `<g class="row">` with
//! `data-lever`, `data-rung` and `data-verdict` (a host row is a `<g
//! class="host-row">` with `data-host` too); its interval is a `<line
//! class="ci">` drawn from the low end (`x1`) to the high end (`x2`), with `data-lo`
//! and `data-hi`; its point a `<path class="est">` placed by `transform`; its
//! minimum effect a `<line class="min">`.

use std::fmt::Write;
use std::path::{Path, PathBuf};

use crate::formats::glyphs::text_width;
use crate::formats::ranking_text::{arms_text, fixed, value};
use crate::rank::hosts::{self, HostEffect};
use crate::rank::stats::CONFIDENCE;
use crate::rank::verdict::{pct, Verdict, MIN_PAIRS};
use crate::rank::{LeverResult, Ranking, RungResult};

/// The plot's width in pixels, between the label and the text columns.
const PLOT_W: f64 = 440.0;
/// Room at both ends of the axis, so a marker at an end stays inside the plot.
const INSET: f64 = 10.0;
/// One row's height.
const ROW_H: f64 = 24.0;
/// Outer margin.
const PAD: f64 = 16.0;
/// Gap between columns.
const GAP: f64 = 14.0;
/// Text size of cells, pixels.
const FONT_PX: f32 = 12.0;
/// Where the rows start (below title, subtitle, legend and header).
const ROWS_Y: f64 = 128.0;
/// The axis is clipped to this saving in both directions (an arrow marks a clipped
/// end), so one wild interval cannot squash every other row into a point.
const CLIP: f64 = 3.0;
/// The font every text is set in (DejaVu's metrics size the columns).
const FONT_FAMILY: &str = "DejaVu Sans, Verdana, Arial, sans-serif";

/// The name of the forest plot written beside the report `out`: `levers.md` ->
/// `levers-forest.svg`, in the same directory.
pub fn file_beside(out: &Path) -> PathBuf {
    let stem = out
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "levers".into());
    out.with_file_name(format!("{stem}-forest.svg"))
}

/// The forest plot as a standalone SVG file (XML declaration, namespace).
pub fn svg(r: &Ranking) -> String {
    render(r, true)
}

/// The forest plot for inlining in an HTML page: no XML declaration and no
/// namespace URL (HTML parsers supply it), so the page names no URL at all.
pub fn inline_svg(r: &Ranking) -> String {
    render(r, false)
}

/// One row of the plot: a lever at one rung.
#[derive(Debug, Clone, Copy)]
pub struct ForestRow<'a> {
    /// The lever.
    pub lever: &'a LeverResult,
    /// Its result at this rung.
    pub at: &'a RungResult,
    /// Whether this is the ranking's reference rung.
    pub reference: bool,
    /// Whether this is the lever's first row (its name is printed there).
    pub first_of_lever: bool,
    /// The host this row shows, for a host row under its lever and rung.
    pub host: Option<&'a HostEffect>,
}

impl ForestRow<'_> {
    /// The saving's point estimate and interval, when there is an estimate (the
    /// host's own for a host row).
    pub fn saving(&self) -> Option<(f64, f64, f64)> {
        match self.host {
            Some(h) => h.saving_fraction,
            None => self.at.saving_fraction,
        }
        .map(|(s, ci)| (s, ci.lo, ci.hi))
    }

    /// The verdict this row is drawn by: the host's own for a host row.
    fn verdict(&self) -> &Verdict {
        self.host.map_or(&self.at.verdict, |h| &h.verdict)
    }
}

/// The rows in plot order (see the module doc).
pub fn rows(r: &Ranking) -> Vec<ForestRow<'_>> {
    let mut out = Vec::new();
    for l in &r.levers {
        for (i, x) in std::iter::once(&l.reference)
            .chain(&l.other_rungs)
            .enumerate()
        {
            let row = ForestRow {
                lever: l,
                at: x,
                reference: i == 0,
                first_of_lever: i == 0,
                host: None,
            };
            out.push(row);
            for h in x.hosts.iter().flat_map(|b| &b.hosts) {
                out.push(ForestRow {
                    first_of_lever: false,
                    host: Some(h),
                    ..row
                });
            }
        }
    }
    out
}

/// A text column: its header and what it prints for a row.
struct Column {
    header: &'static str,
    cell: fn(&ForestRow) -> String,
}

/// The columns left of the plot.
const LEFT_COLUMNS: &[Column] = &[
    Column {
        header: "lever (baseline→treatment)",
        cell: lever_cell,
    },
    Column {
        header: "rung",
        cell: rung_cell,
    },
];

/// The columns right of the plot, the fidelity between the interval and the
/// verdict (module doc).
const RIGHT_COLUMNS: &[Column] = &[
    Column {
        header: "saving [95% interval]",
        cell: saving_cell,
    },
    Column {
        header: "absolute saving",
        cell: abs_cell,
    },
    Column {
        header: "pairs",
        cell: pairs_cell,
    },
    Column {
        header: "min",
        cell: min_cell,
    },
    Column {
        header: "fidelity (PSNR)",
        cell: fidelity_cell,
    },
    Column {
        header: "verdict",
        cell: verdict_cell,
    },
];

fn lever_cell(r: &ForestRow) -> String {
    if r.first_of_lever {
        format!("{} ({})", r.lever.id, arms_text(r.lever))
    } else {
        String::new()
    }
}

fn rung_cell(r: &ForestRow) -> String {
    if let Some(h) = r.host {
        format!("· host {}", h.label)
    } else if r.reference {
        format!("{} (reference)", r.at.rung)
    } else {
        r.at.rung.clone()
    }
}

fn saving_cell(r: &ForestRow) -> String {
    match r.saving() {
        Some((s, lo, hi)) => format!("{} [{}, {}]", pct(s), pct(lo), pct(hi)),
        None => "—".into(),
    }
}

fn abs_cell(r: &ForestRow) -> String {
    match r.host.map_or(&r.at.effect, |h| &h.effect) {
        Some(e) => value(e.saving, r.lever.unit),
        None => "—".into(),
    }
}

fn pairs_cell(r: &ForestRow) -> String {
    r.host.map_or(r.at.rounds.len(), |h| h.pairs).to_string()
}

fn min_cell(r: &ForestRow) -> String {
    pct(r.lever.min_effect)
}

fn fidelity_cell(r: &ForestRow) -> String {
    match r.host {
        Some(_) => String::new(),
        None => crate::rank::fidelity::cell(&r.at.fidelity),
    }
}

fn verdict_cell(r: &ForestRow) -> String {
    match (r.host, &r.at.hosts) {
        (Some(h), _) => format!("{} (this host alone)", h.verdict.name()),
        (None, Some(b)) => format!("{} ({})", r.at.verdict.name(), hosts::short_figure(b)),
        (None, None) => r.at.verdict.name().to_string(),
    }
}

/// How a verdict is drawn: colour (Okabe-Ito, distinguishable with the common
/// colour-vision deficiencies), marker path around (0, 0), and its legend text.
#[derive(Clone)]
struct Style {
    name: &'static str,
    colour: &'static str,
    marker: &'static str,
    meaning: String,
}

fn styles() -> [Style; 7] {
    [
        Style {
            name: "confirmed",
            colour: "#009E73",
            marker: "M0,-5.5A5.5,5.5 0 1 1 0,5.5A5.5,5.5 0 1 1 0,-5.5Z",
            meaning: "whole interval at or above the minimum".into(),
        },
        Style {
            name: "refuted",
            colour: "#D55E00",
            marker: "M-5,-5H5V5H-5Z",
            meaning: "whole interval below the minimum".into(),
        },
        Style {
            name: "insufficient",
            colour: "#0072B2",
            marker: "M0,-6L6,0L0,6L-6,0Z",
            meaning: format!("straddles the minimum, or under {MIN_PAIRS} pairs"),
        },
        Style {
            name: "n/a",
            colour: "#777777",
            marker: "M-5,-1.5H5V1.5H-5Z",
            meaning: "the lever does not apply at the rung".into(),
        },
        Style {
            name: "refuted-fidelity",
            colour: "#CC79A7",
            marker: "M0,-6L6,5H-6Z",
            meaning: "saving confirmed, frames below the fidelity threshold".into(),
        },
        Style {
            name: "sensitive",
            colour: "#E69F00",
            marker: "M-6,-2H-2V-6H2V-2H6V2H2V6H-2V2H-6Z",
            meaning: "the verdict differs without the flagged runs".into(),
        },
        Style {
            name: "hosts-disagree",
            colour: "#000000",
            marker: "M-5,-6L0,-1L5,-6L6,-5L1,0L6,5L5,6L0,1L-5,6L-6,5L-1,0L-6,-5Z",
            meaning: "the hosts' effects differ: no pooled verdict (host rows below)".into(),
        },
    ]
}

/// The index in [`styles`] of a verdict's style.
fn style_index(v: &Verdict) -> usize {
    match v {
        Verdict::Confirmed => 0,
        Verdict::Refuted { .. } => 1,
        Verdict::Insufficient { .. } => 2,
        Verdict::NotApplicable { .. } => 3,
        Verdict::RefutedFidelity { .. } => 4,
        Verdict::Sensitive { .. } => 5,
        Verdict::HostsDisagree { .. } => 6,
    }
}

fn style_of(v: &Verdict) -> Style {
    styles()[style_index(v)].clone()
}

/// `s` with the five XML special characters escaped (text and attribute values).
pub fn xml_escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

/// The width `text` takes at the cell size, from DejaVu Sans's metrics (a fixed
/// 8 px per character should the embedded font ever fail to parse). SVG's
/// `font-size` is the em size while [`text_width`] takes the glyph height
/// (ascent - descent, 1.164 em for DejaVu Sans), hence [`EM_TO_HEIGHT`].
fn width_of(text: &str, bold: bool) -> f64 {
    text_width(text, FONT_PX * EM_TO_HEIGHT, bold)
        .map_or(text.chars().count() as f64 * 8.0, f64::from)
}

/// DejaVu Sans's (ascent - descent) / units per em, rounded up: a browser that
/// falls back to a narrower sans-serif then leaves room rather than overlapping.
const EM_TO_HEIGHT: f32 = 1.17;

/// One column's width: its widest cell or header, plus nothing (gaps are added).
fn column_width(c: &Column, rows: &[ForestRow]) -> f64 {
    rows.iter()
        .map(|r| width_of(&(c.cell)(r), false))
        .fold(width_of(c.header, true), f64::max)
        .ceil()
}

/// The axis: its domain `[lo, hi]` (fractions) and the tick step.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Axis {
    lo: f64,
    hi: f64,
    step: f64,
}

impl Axis {
    /// A domain holding zero, every estimate, interval end and minimum effect
    /// (clipped to +-[`CLIP`]), widened to whole ticks of a step that gives at most
    /// ten ticks.
    fn for_rows(rows: &[ForestRow]) -> Axis {
        let mut lo: f64 = 0.0;
        let mut hi: f64 = 0.0;
        for r in rows {
            let mut vals = vec![r.lever.min_effect];
            if let Some((s, a, b)) = r.saving() {
                vals.extend([s, a, b]);
            }
            for v in vals.into_iter().filter(|v| v.is_finite()) {
                lo = lo.min(v.max(-CLIP));
                hi = hi.max(v.min(CLIP));
            }
        }
        if hi - lo < 0.1 {
            hi = lo + 0.1;
        }
        let step = [0.02, 0.05, 0.1, 0.2, 0.25, 0.5, 1.0]
            .into_iter()
            .find(|s| ((hi / s).ceil() - (lo / s).floor()) <= 10.0)
            .unwrap_or(1.0);
        Axis {
            lo: (lo / step).floor() * step,
            hi: (hi / step).ceil() * step,
            step,
        }
    }

    /// Ticks from `lo` to `hi`.
    fn ticks(&self) -> Vec<f64> {
        let n = ((self.hi - self.lo) / self.step).round() as i64;
        (0..=n).map(|i| self.lo + i as f64 * self.step).collect()
    }
}

/// The plot's horizontal scale.
struct Scale {
    axis: Axis,
    x0: f64,
}

impl Scale {
    /// The x of fraction `v` (clamped into the domain) and whether it was clipped.
    fn x(&self, v: f64) -> (f64, bool) {
        let c = v.clamp(self.axis.lo, self.axis.hi);
        let span = PLOT_W - 2.0 * INSET;
        let x = self.x0 + INSET + (c - self.axis.lo) / (self.axis.hi - self.axis.lo) * span;
        (x, c != v)
    }
}

/// Coordinates with one decimal, never `-0.0`.
fn c(x: f64) -> String {
    fixed(x, 1)
}

fn render(r: &Ranking, standalone: bool) -> String {
    let mut o = String::new();
    // Writing into a String cannot fail.
    let _ = write_svg(&mut o, r, standalone);
    o
}

fn write_svg(o: &mut String, r: &Ranking, standalone: bool) -> std::fmt::Result {
    let rows = rows(r);
    let left: Vec<f64> = LEFT_COLUMNS
        .iter()
        .map(|col| column_width(col, &rows))
        .collect();
    let right: Vec<f64> = RIGHT_COLUMNS
        .iter()
        .map(|col| column_width(col, &rows))
        .collect();
    let x0 = PAD + left.iter().map(|w| w + GAP).sum::<f64>();
    let scale = Scale {
        axis: Axis::for_rows(&rows),
        x0,
    };
    let right_x0 = x0 + PLOT_W + GAP;
    let content_w = right_x0 + right.iter().map(|w| w + GAP).sum::<f64>() - GAP + PAD;
    let width = content_w.max(720.0).ceil();
    let rows_end = ROWS_Y + ROW_H * rows.len() as f64;
    let height = (rows_end + 60.0).ceil();

    if standalone {
        writeln!(o, r#"<?xml version="1.0" encoding="UTF-8"?>"#)?;
        write!(o, r#"<svg xmlns="http://www.w3.org/2000/svg" "#)?;
    } else {
        write!(o, "<svg ")?;
    }
    writeln!(
        o,
        r#"class="forest" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="{FONT_FAMILY}" font-size="{FONT_PX}" role="img" aria-labelledby="forest-title forest-desc">"#,
        w = c(width),
        h = c(height),
    )?;
    let title = format!(
        "Saving of every lever at every rung: point estimate and {:.0}% bootstrap interval",
        CONFIDENCE * 100.0
    );
    writeln!(
        o,
        r#"<title id="forest-title">{}</title>"#,
        xml_escape(&title)
    )?;
    writeln!(
        o,
        r#"<desc id="forest-desc">{} row(s); reference rung {}; saving = 1 - treatment/baseline for a hypothesised decrease, treatment/baseline - 1 for an increase; the dashed tick is the lever's minimum effect.</desc>"#,
        rows.len(),
        xml_escape(&r.reference_rung)
    )?;
    writeln!(
        o,
        r##"<rect x="0" y="0" width="{}" height="{}" fill="#ffffff"/>"##,
        c(width),
        c(height)
    )?;
    writeln!(
        o,
        r#"<text x="{}" y="26" font-size="16" font-weight="bold">{}</text>"#,
        c(PAD),
        xml_escape(&title)
    )?;
    writeln!(
        o,
        r##"<text x="{}" y="46" fill="#444444">Saving = 1 − treatment/baseline (hypothesised decrease) or treatment/baseline − 1 (increase); the dashed tick is the lever's minimum effect; rank at rung {}.</text>"##,
        c(PAD),
        xml_escape(&r.reference_rung)
    )?;
    write_legend(o, width, &rows)?;
    write_header(o, &left, &right, &scale, right_x0)?;
    write_grid(o, &scale, rows_end)?;
    for (i, row) in rows.iter().enumerate() {
        let y = ROWS_Y + ROW_H * i as f64;
        write_row(o, row, y, &left, &right, &scale, right_x0, width)?;
    }
    write_axis(o, &scale, rows_end)?;
    if rows.is_empty() {
        writeln!(
            o,
            r##"<text x="{}" y="{}" fill="#444444">No levers in the spec.</text>"##,
            c(scale.x0),
            c(ROWS_Y + 16.0)
        )?;
    }
    writeln!(o, "</svg>")
}

/// The legend: each verdict's marker, name and meaning (`hosts-disagree` only
/// where a row has it), then the minimum-effect tick and, where there are host
/// rows, what a host row is; wrapped to the picture's width.
fn write_legend(o: &mut String, width: f64, rows: &[ForestRow]) -> std::fmt::Result {
    writeln!(o, r#"<g class="legend">"#)?;
    let mut x = PAD;
    let mut y = 70.0;
    let disagree = style_index(&Verdict::HostsDisagree { why: String::new() });
    let used = |i: usize| i != disagree || rows.iter().any(|r| style_index(r.verdict()) == i);
    let host_rows = rows.iter().any(|r| r.host.is_some());
    let items: Vec<(String, String, String)> = styles()
        .iter()
        .enumerate()
        .filter(|(i, _)| used(*i))
        .map(|(_, s)| {
            (
                format!(
                    r#"<path d="{}" fill="{}" transform="translate({{X}},{{Y}})"/>"#,
                    s.marker, s.colour
                ),
                s.name.to_string(),
                s.meaning.clone(),
            )
        })
        .chain(std::iter::once((
            r##"<line x1="{X}" y1="{Y0}" x2="{X}" y2="{Y1}" stroke="#222222" stroke-width="1.5" stroke-dasharray="3,2"/>"##.to_string(),
            "minimum effect".to_string(),
            "the lever's hypothesised saving".to_string(),
        )))
        .chain(host_rows.then(|| {
            (
                r##"<line x1="{XL}" y1="{Y}" x2="{XR}" y2="{Y}" stroke="#444444" stroke-width="1"/>"##
                    .to_string(),
                "· host".to_string(),
                "one host's pairs alone, under its lever's row".to_string(),
            )
        }))
        .collect();
    for (mark, name, meaning) in items {
        let text = format!("{name}: {meaning}");
        let w = 16.0 + width_of(&text, false) + 22.0;
        if x + w > width - PAD && x > PAD {
            x = PAD;
            y += 20.0;
        }
        let mark = mark
            .replace("{XL}", &c(x))
            .replace("{XR}", &c(x + 12.0))
            .replace("{X}", &c(x + 6.0))
            .replace("{Y0}", &c(y - 7.0))
            .replace("{Y1}", &c(y + 7.0))
            .replace("{Y}", &c(y));
        writeln!(
            o,
            r#"{mark}<text x="{}" y="{}"><tspan font-weight="bold">{}</tspan>: {}</text>"#,
            c(x + 16.0),
            c(y + 4.0),
            xml_escape(&name),
            xml_escape(&meaning)
        )?;
        x += w;
    }
    writeln!(o, "</g>")
}

/// Column headers above the rows, and the plot's own header.
fn write_header(
    o: &mut String,
    left: &[f64],
    right: &[f64],
    scale: &Scale,
    right_x0: f64,
) -> std::fmt::Result {
    let y = ROWS_Y - 8.0;
    write_column_headers(o, LEFT_COLUMNS, left, PAD, y)?;
    writeln!(
        o,
        r#"<text x="{}" y="{}" font-weight="bold" text-anchor="middle">saving (fraction of baseline)</text>"#,
        c(scale.x0 + PLOT_W / 2.0),
        c(y)
    )?;
    write_column_headers(o, RIGHT_COLUMNS, right, right_x0, y)
}

/// The headers of `cols` (widths `widths`) from `x0` at height `y`.
fn write_column_headers(
    o: &mut String,
    cols: &[Column],
    widths: &[f64],
    x0: f64,
    y: f64,
) -> std::fmt::Result {
    let mut x = x0;
    for (col, w) in cols.iter().zip(widths) {
        writeln!(
            o,
            r#"<text x="{}" y="{}" font-weight="bold">{}</text>"#,
            c(x),
            c(y),
            xml_escape(col.header)
        )?;
        x += w + GAP;
    }
    Ok(())
}

/// Faint vertical lines at every tick, and a solid one at zero.
fn write_grid(o: &mut String, scale: &Scale, rows_end: f64) -> std::fmt::Result {
    writeln!(o, r#"<g class="grid">"#)?;
    for t in scale.axis.ticks() {
        let (x, _) = scale.x(t);
        let zero = t.abs() < 1e-9;
        writeln!(
            o,
            r#"<line x1="{x}" y1="{}" x2="{x}" y2="{}" stroke="{}" stroke-width="{}"/>"#,
            c(ROWS_Y - 2.0),
            c(rows_end + 2.0),
            if zero { "#555555" } else { "#e2e2e2" },
            if zero { "1.2" } else { "1" },
            x = c(x)
        )?;
    }
    writeln!(o, "</g>")
}

/// One row: its band, labels, interval, estimate, minimum tick and text cells.
#[allow(clippy::too_many_arguments)]
fn write_row(
    o: &mut String,
    row: &ForestRow,
    y: f64,
    left: &[f64],
    right: &[f64],
    scale: &Scale,
    right_x0: f64,
    width: f64,
) -> std::fmt::Result {
    let style = style_of(row.verdict());
    let mid = y + ROW_H / 2.0;
    let text_y = c(mid + 4.0);
    let summary = format!(
        "{} at rung {}{}: saving {}, minimum effect {}, {} pair(s), {}",
        row.lever.id,
        row.at.rung,
        row.host
            .map_or(String::new(), |h| format!(" on host {}", h.label)),
        saving_cell(row),
        pct(row.lever.min_effect),
        pairs_cell(row),
        verdict_cell(row)
    );
    match row.host {
        Some(h) => writeln!(
            o,
            r#"<g class="host-row" data-lever="{}" data-rung="{}" data-host="{}" data-verdict="{}">"#,
            xml_escape(&row.lever.id),
            xml_escape(&row.at.rung),
            xml_escape(&h.label),
            style.name
        )?,
        None => writeln!(
            o,
            r#"<g class="row" data-lever="{}" data-rung="{}" data-verdict="{}">"#,
            xml_escape(&row.lever.id),
            xml_escape(&row.at.rung),
            style.name
        )?,
    }
    writeln!(o, "<title>{}</title>", xml_escape(&summary))?;
    if row.first_of_lever {
        writeln!(
            o,
            r##"<line x1="{}" y1="{y}" x2="{}" y2="{y}" stroke="#bbbbbb"/>"##,
            c(PAD),
            c(width - PAD),
            y = c(y)
        )?;
    }
    let mut x = PAD;
    for (col, w) in LEFT_COLUMNS.iter().zip(left) {
        let t = (col.cell)(row);
        if !t.is_empty() {
            writeln!(
                o,
                r#"<text class="cell" x="{}" y="{text_y}"{}>{}</text>"#,
                c(x),
                if row.first_of_lever && x == PAD {
                    r#" font-weight="bold""#
                } else {
                    ""
                },
                xml_escape(&t)
            )?;
        }
        x += w + GAP;
    }
    let (mx, _) = scale.x(row.lever.min_effect);
    writeln!(
        o,
        r##"<line class="min" x1="{mx}" y1="{}" x2="{mx}" y2="{}" stroke="#222222" stroke-width="1.5" stroke-dasharray="3,2"/>"##,
        c(y + 3.0),
        c(y + ROW_H - 3.0),
        mx = c(mx)
    )?;
    match row.saving() {
        Some((s, lo, hi)) => {
            let (xlo, clip_lo) = scale.x(lo);
            let (xhi, clip_hi) = scale.x(hi);
            let (xs, _) = scale.x(s);
            writeln!(
                o,
                r#"<line class="ci" x1="{}" y1="{m}" x2="{}" y2="{m}" data-lo="{}" data-hi="{}" stroke="{col}" stroke-width="{}"/>"#,
                c(xlo),
                c(xhi),
                fixed(lo, 4),
                fixed(hi, 4),
                if row.host.is_some() { "1.2" } else { "2.5" },
                m = c(mid),
                col = style.colour
            )?;
            for (x, clipped, dir) in [(xlo, clip_lo, -1.0), (xhi, clip_hi, 1.0)] {
                if clipped {
                    // An arrowhead: the interval goes on past the axis.
                    writeln!(
                        o,
                        r#"<path d="M{},{}L{},{}L{},{}Z" fill="{}"/>"#,
                        c(x + dir * 6.0),
                        c(mid),
                        c(x),
                        c(mid - 4.0),
                        c(x),
                        c(mid + 4.0),
                        style.colour
                    )?;
                } else {
                    writeln!(
                        o,
                        r#"<line x1="{x}" y1="{}" x2="{x}" y2="{}" stroke="{}" stroke-width="1.5"/>"#,
                        c(mid - 4.0),
                        c(mid + 4.0),
                        style.colour,
                        x = c(x)
                    )?;
                }
            }
            writeln!(
                o,
                r##"<path class="est" d="{}" transform="translate({},{})" fill="{}" stroke="#ffffff" stroke-width="1"/>"##,
                style.marker,
                c(xs),
                c(mid),
                style.colour
            )?;
        }
        None => {
            writeln!(
                o,
                r##"<text class="none" x="{}" y="{text_y}" fill="#777777" font-style="italic">no estimate ({})</text>"##,
                c(scale.x0 + 6.0),
                xml_escape(style.name)
            )?;
        }
    }
    let mut x = right_x0;
    for (i, (col, w)) in RIGHT_COLUMNS.iter().zip(right).enumerate() {
        let last = i + 1 == RIGHT_COLUMNS.len();
        writeln!(
            o,
            r#"<text class="cell" x="{}" y="{text_y}"{}>{}</text>"#,
            c(x),
            if last {
                format!(r#" fill="{}" font-weight="bold""#, style.colour)
            } else {
                String::new()
            },
            xml_escape(&(col.cell)(row))
        )?;
        x += w + GAP;
    }
    writeln!(o, "</g>")
}

/// The axis line, tick labels in percent and the axis title.
fn write_axis(o: &mut String, scale: &Scale, rows_end: f64) -> std::fmt::Result {
    let y = rows_end + 4.0;
    writeln!(o, r#"<g class="axis">"#)?;
    writeln!(
        o,
        r##"<line x1="{}" y1="{y}" x2="{}" y2="{y}" stroke="#555555"/>"##,
        c(scale.x0),
        c(scale.x0 + PLOT_W),
        y = c(y)
    )?;
    for t in scale.axis.ticks() {
        let (x, _) = scale.x(t);
        writeln!(
            o,
            r#"<text x="{}" y="{}" text-anchor="middle">{}%</text>"#,
            c(x),
            c(y + 16.0),
            fixed(t * 100.0, 0)
        )?;
    }
    writeln!(
        o,
        r#"<text x="{}" y="{}" text-anchor="middle">saving (positive = the treatment helps)</text>"#,
        c(scale.x0 + PLOT_W / 2.0),
        c(y + 36.0)
    )?;
    writeln!(o, "</g>")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::levers_spec::{Direction, Unit};
    use crate::rank::fit::NoFit;
    use crate::rank::stats::{Interval, PairedEffect};
    use crate::rank::FitOutcome;

    fn rung(name: &str, saving: Option<(f64, f64, f64)>, verdict: Verdict) -> RungResult {
        RungResult {
            rung: name.into(),
            voxels: 1000,
            baseline_runs: 3,
            treatment_runs: 3,
            effect: saving.map(|(s, lo, hi)| PairedEffect {
                n: 3,
                ratio: 1.0 - s,
                ratio_ci: Interval {
                    lo: 1.0 - hi,
                    hi: 1.0 - lo,
                },
                saving: s * 10.0,
                saving_ci: Interval {
                    lo: lo * 10.0,
                    hi: hi * 10.0,
                },
                baseline_median: 10.0,
                treatment_median: 10.0 * (1.0 - s),
                lower: 3,
                higher: 0,
                sign_p: 0.25,
            }),
            saving_fraction: saving.map(|(s, lo, hi)| (s, Interval { lo, hi })),
            verdict,
            rounds: Vec::new(),
            fidelity: crate::rank::fidelity::RungFidelity::empty(
                crate::levers_spec::Numerics::Preserving,
            ),
            flagged: Vec::new(),
            without_flagged: None,
            second: None,
            hosts: None,
        }
    }

    fn lever(id: &str, reference: RungResult, others: Vec<RungResult>) -> LeverResult {
        LeverResult {
            id: id.into(),
            seed_issue: "#1".into(),
            metric: "wall(x)".into(),
            unit: Unit::Seconds,
            baseline: "off".into(),
            treatment: "on".into(),
            with: Default::default(),
            direction: Direction::Decrease,
            min_effect: 0.2,
            prior_rank: None,
            numerics: crate::levers_spec::Numerics::Preserving,
            measured_rank: None,
            reference,
            other_rungs: others,
        }
    }

    /// Four levers, six rows, five with an estimate (one clipped past -300%).
    pub(crate) fn sample_ranking() -> Ranking {
        let refuted = || Verdict::Refuted {
            next_hypothesis: "n".into(),
        };
        let insufficient = || Verdict::Insufficient {
            missing: "m".into(),
        };
        Ranking {
            command: "harness rank".into(),
            reference_rung: "2".into(),
            prior_rank_source: "test".into(),
            fidelity_flags: Vec::new(),
            floors: Vec::new(),
            levers: vec![
                lever(
                    "fast",
                    rung("2", Some((0.5, 0.4, 0.6)), Verdict::Confirmed),
                    vec![rung("3", Some((0.45, 0.3, 0.55)), Verdict::Confirmed)],
                ),
                lever(
                    "null<&>",
                    rung("2", Some((0.01, -0.05, 0.07)), refuted()),
                    vec![],
                ),
                lever(
                    "wild",
                    rung("2", Some((-2.0, -4.5, 0.25)), insufficient()),
                    vec![rung("0", Some((0.1, 0.0, 0.3)), insufficient())],
                ),
                lever(
                    "none",
                    rung(
                        "2",
                        None,
                        Verdict::NotApplicable {
                            why: "cpu only".into(),
                        },
                    ),
                    vec![],
                ),
            ],
            fit: FitOutcome::Missing(NoFit {
                missing: "runs".into(),
            }),
            bundles_seen: 0,
            input_digest: "sha256:0".into(),
            used: vec![],
            excluded: vec![],
            bootstrap_resamples: 10,
            bootstrap_seed: 1,
        }
    }

    /// The value of attribute `name` in the element text `el`.
    fn attr<'a>(el: &'a str, name: &str) -> Option<&'a str> {
        let key = format!(" {name}=\"");
        let at = el.find(&key)? + key.len();
        el[at..].split('"').next()
    }

    /// Every element `<tag ... class="class" ...>` of `svg`, as its opening tag text.
    fn elements<'a>(svg: &'a str, tag: &str, class: &str) -> Vec<&'a str> {
        svg.split('<')
            .filter(|e| e.starts_with(&format!("{tag} ")))
            .filter(|e| attr(e, "class") == Some(class))
            .map(|e| e.split('>').next().unwrap_or(e))
            .collect()
    }

    fn num(el: &str, name: &str) -> f64 {
        attr(el, name)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no numeric {name} in {el}"))
    }

    #[test]
    fn one_row_per_lever_and_rung_and_one_interval_per_estimate() {
        let r = sample_ranking();
        let svg = svg(&r);
        let want_rows: usize = r.levers.iter().map(|l| 1 + l.other_rungs.len()).sum();
        assert_eq!(elements(&svg, "g", "row").len(), want_rows);
        assert_eq!(rows(&r).len(), want_rows);
        let estimates = rows(&r).iter().filter(|x| x.saving().is_some()).count();
        assert_eq!(estimates, 5);
        assert_eq!(elements(&svg, "line", "ci").len(), estimates);
        assert_eq!(elements(&svg, "path", "est").len(), estimates);
        assert_eq!(elements(&svg, "line", "min").len(), want_rows);
        // The row without an estimate says so.
        assert!(svg.contains("no estimate (n/a)"), "{svg}");
        // Rows in ranking order, reference rung first, with their verdicts.
        let order: Vec<(&str, &str, &str)> = elements(&svg, "g", "row")
            .iter()
            .map(|e| {
                (
                    attr(e, "data-lever").unwrap_or(""),
                    attr(e, "data-rung").unwrap_or(""),
                    attr(e, "data-verdict").unwrap_or(""),
                )
            })
            .collect();
        assert_eq!(
            order,
            vec![
                ("fast", "2", "confirmed"),
                ("fast", "3", "confirmed"),
                ("null&lt;&amp;&gt;", "2", "refuted"),
                ("wild", "2", "insufficient"),
                ("wild", "0", "insufficient"),
                ("none", "2", "n/a"),
            ]
        );
    }

    #[test]
    fn intervals_run_from_the_low_end_to_the_high_end_around_the_estimate() {
        let r = sample_ranking();
        let svg = svg(&r);
        let cis = elements(&svg, "line", "ci");
        let ests = elements(&svg, "path", "est");
        let want: Vec<(f64, f64, f64)> = rows(&r).iter().filter_map(|x| x.saving()).collect();
        assert_eq!(cis.len(), want.len());
        let axis = Axis::for_rows(&rows(&r));
        let scale = Scale {
            axis,
            x0: num(cis[0], "x1") - Scale { axis, x0: 0.0 }.x(want[0].1).0,
        };
        for ((ci, est), (s, lo, hi)) in cis.iter().zip(&ests).zip(&want) {
            let (x1, x2) = (num(ci, "x1"), num(ci, "x2"));
            assert!(x1 < x2, "interval drawn high to low: {ci}");
            assert_eq!(num(ci, "data-lo"), (lo * 1e4).round() / 1e4, "{ci}");
            assert_eq!(num(ci, "data-hi"), (hi * 1e4).round() / 1e4, "{ci}");
            assert!((x1 - scale.x(*lo).0).abs() < 0.06, "{ci}: lo {lo}");
            assert!((x2 - scale.x(*hi).0).abs() < 0.06, "{ci}: hi {hi}");
            let t = attr(est, "transform").unwrap_or("");
            let xs: f64 = t
                .trim_start_matches("translate(")
                .split(',')
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no x in {est}"));
            assert!(x1 <= xs && xs <= x2, "estimate {s} outside {ci}");
        }
        // The wild interval's low end is clipped at -300% and says so with an arrow.
        assert_eq!(axis.lo, -CLIP);
        assert!(
            svg.contains(r#"<path d="M"#),
            "no arrowhead for a clipped end"
        );
    }

    #[test]
    fn the_minimum_effect_and_zero_sit_where_the_scale_puts_them() {
        let r = sample_ranking();
        let svg = svg(&r);
        let mins = elements(&svg, "line", "min");
        let xs: Vec<f64> = mins.iter().map(|m| num(m, "x1")).collect();
        // Every lever here has a minimum effect of 20%: one x for all.
        assert!(xs.windows(2).all(|w| w[0] == w[1]), "{xs:?}");
        let axis = Axis::for_rows(&rows(&r));
        assert!(axis.lo <= 0.0 && axis.hi >= 0.6, "{axis:?}");
        assert!(axis.ticks().iter().any(|t| t.abs() < 1e-9));
        for name in [
            "confirmed",
            "refuted",
            "insufficient",
            "n/a",
            "minimum effect",
        ] {
            assert!(
                svg.contains(&format!(r#"<tspan font-weight="bold">{name}</tspan>"#)),
                "legend lacks {name}"
            );
        }
    }

    #[test]
    fn the_bytes_are_deterministic_and_the_inline_form_names_no_url() {
        let r = sample_ranking();
        assert_eq!(svg(&r), svg(&r.clone()));
        assert!(svg(&r).starts_with("<?xml"));
        let inline = inline_svg(&r);
        assert!(inline.starts_with("<svg class=\"forest\""), "{inline}");
        assert!(!inline.contains("http"), "{inline}");
        assert!(!svg(&r).contains("-0.0\""), "negative zero printed");
        assert_eq!(
            file_beside(Path::new("reports/levers.md")),
            PathBuf::from("reports/levers-forest.svg")
        );
    }

    #[test]
    fn an_empty_ranking_still_draws_an_axis_and_says_so() {
        let mut r = sample_ranking();
        r.levers.clear();
        let svg = svg(&r);
        assert!(elements(&svg, "g", "row").is_empty());
        assert!(svg.contains("No levers in the spec."));
    }
}
