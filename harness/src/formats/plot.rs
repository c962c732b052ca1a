//! The timeline picture of a bundle (`harness plot`), as PNG or SVG.
//!
//! Top to bottom, on one time axis (seconds from the timeline origin):
//! * a title: rung and its geometry, profile, levers, the engine binary's sha256
//!   prefix, the exit, completeness, the completion verdict and the bundle id;
//! * the phases as labelled bands, one row per nesting depth (children under their
//!   parent), and a row of tick markers (`dit.forward`) beneath;
//! * GPU utilization (%), GPU power (W), memory (GiB: host RSS, weights in the page
//!   cache, the engine's device memory) and CPU cores, each over the samples,
//!   behind faint bands of the top-level phases. A column with no values says so
//!   in its panel, with the reason from `sensors_unavailable`.
//!
//! Text is drawn with DejaVu Sans embedded in the binary (no system fonts).

use evidence::fragments::{Completion, Engine, Levers, Profile, Rung, RungGeometry};
use std::collections::HashMap;
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::FontStyle;

use super::glyphs::GlyphText;
use super::Format;
use crate::timeline::{PhaseSpan, Timeline};

/// The font family every text is drawn in.
const FONT: &str = "sans-serif";

/// Register DejaVu Sans for plotters' pure-Rust text renderer, once per process.
pub(crate) fn fonts() -> anyhow::Result<()> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular())
            .and_then(|_| {
                plotters::style::register_font(FONT, FontStyle::Bold, dejavu::sans::bold())
            })
            .map_err(|_| "the embedded DejaVu Sans font did not parse".to_string())
    })
    .clone()
    .map_err(anyhow::Error::msg)
}

/// The picture as PNG (RGB8).
#[derive(Debug, Clone, Copy)]
pub struct Png {
    /// Width in pixels.
    pub width: u32,
}

/// The picture as SVG text.
#[derive(Debug, Clone, Copy)]
pub struct Svg {
    /// Width in pixels.
    pub width: u32,
}

/// Default picture width, pixels.
pub const DEFAULT_WIDTH: u32 = 1800;

const TITLE_H: u32 = 78;
const ROW_H: u32 = 30;
const SERIES_H: u32 = 190;
const Y_LABEL_W: u32 = 90;

/// Band colours, assigned to phase names in order of first appearance.
const PALETTE: &[RGBColor] = &[
    RGBColor(78, 121, 167),
    RGBColor(242, 142, 43),
    RGBColor(89, 161, 79),
    RGBColor(225, 87, 89),
    RGBColor(118, 183, 178),
    RGBColor(237, 201, 72),
    RGBColor(176, 122, 161),
    RGBColor(255, 157, 167),
    RGBColor(156, 117, 95),
    RGBColor(186, 176, 172),
];

/// The picture's height for a timeline, pixels (one more panel with GPM).
pub fn height_for(t: &Timeline) -> u32 {
    TITLE_H + phase_panel_h(t) + (4 + u32::from(t.has_gpm())) * SERIES_H + 40
}

fn depth_rows(t: &Timeline) -> u32 {
    t.phases
        .iter()
        .map(|p| p.depth.max(0) as u32 + 1)
        .max()
        .unwrap_or(1)
}

fn phase_panel_h(t: &Timeline) -> u32 {
    (depth_rows(t) + 1) * ROW_H + 50
}

/// The title's two lines.
pub fn title_lines(t: &Timeline) -> (String, String) {
    let dash = || "-".to_string();
    let rung_fragment = t.fragment::<Rung>();
    let rung = rung_fragment
        .as_ref()
        .and_then(|r| r.name.clone())
        .unwrap_or_else(dash);
    let geo = rung_fragment
        .and_then(|r| r.config)
        .map(|c| {
            let g = RungGeometry::of(&c);
            let n = |v: Option<u64>| v.map_or_else(dash, |x| x.to_string());
            let s = |v: Option<String>| v.unwrap_or_else(dash);
            format!(
                " ({} {}x{}x{}, {} steps, {})",
                s(g.preset),
                n(g.width),
                n(g.height),
                n(g.frames),
                n(g.steps),
                s(g.device)
            )
        })
        .unwrap_or_default();
    let profile = t.fragment::<Profile>().map_or_else(dash, |p| p.0);
    let levers = match t.fragment::<Levers>() {
        Some(m) if !m.0.is_empty() => {
            m.0.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(", ")
        }
        _ => "defaults".into(),
    };
    let line1 = format!("rung {rung}{geo} · profile {profile} · levers: {levers}");
    let engine = t
        .fragment::<Engine>()
        .and_then(|e| e.sha256)
        .map(|s| crate::short_id::short(&s).to_string())
        .unwrap_or_else(dash);
    let exit = match t.manifest.exit() {
        Some(e) => format!(
            "exit {}{}",
            e.reason.as_deref().unwrap_or_default(),
            e.code.map(|c| format!(" (code {c})")).unwrap_or_default()
        ),
        None => "exit not recorded".into(),
    };
    let completion = t
        .fragment::<Completion>()
        .and_then(|c| c.verdict)
        .unwrap_or_else(|| "not recorded".into());
    let line2 = format!(
        "engine sha256 {engine} · {exit} · {} · completion {completion} · bundle {}",
        if t.manifest.complete {
            "complete"
        } else {
            "INCOMPLETE"
        },
        &t.id[..16.min(t.id.len())]
    );
    (line1, line2)
}

/// Band label size, pixels.
const LABEL_PX: f32 = 13.0;

/// A label for a band, the first that fits in `px`: the name (with its step or
/// chunk number), then its last dotted part (`text_encoder`), then the number
/// alone, then the name cut short with an ellipsis; each first with ` (open)` when
/// the phase never closed. `None` when nothing fits.
pub fn band_label(p: &PhaseSpan, px: f64) -> Option<String> {
    let open = p.attrs.get("open");
    let number = ["step", "chunk"].iter().find_map(|k| {
        open.and_then(|o| o.get(*k))
            .and_then(|v| v.as_i64())
            .map(|n| (*k, n))
    });
    let last = p.name.rsplit('.').next().unwrap_or(&p.name).to_string();
    let mut candidates: Vec<String> = match number {
        Some((kind, n)) => vec![
            format!("{} {n}", p.name),
            format!("{kind} {n}"),
            format!("{n}"),
        ],
        None => vec![p.name.clone(), last],
    };
    let chars: Vec<char> = p.name.chars().collect();
    for keep in (3..chars.len()).rev() {
        candidates.push(format!("{}…", chars[..keep].iter().collect::<String>()));
    }
    if p.close_ns.is_none() {
        // A phase that never closed says so when there is room.
        let marked: Vec<String> = candidates.iter().map(|c| format!("{c} (open)")).collect();
        candidates.splice(0..0, marked);
    }
    let fits = |c: &str| {
        let w =
            super::glyphs::text_width(c, LABEL_PX, false).unwrap_or(c.chars().count() as f32 * 7.5);
        f64::from(w) + 6.0 <= px
    };
    candidates.into_iter().find(|c| fits(c))
}

type DrawResult<E> = Result<(), DrawingAreaErrorKind<E>>;

/// One line of a panel: sampler column, legend label, divisor to the panel's unit.
type Column = (&'static str, &'static str, f64);
/// One panel: caption, its lines, a fixed top of the y axis (else from the data).
type Panel = (&'static str, Vec<Column>, Option<f64>);

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    t: &Timeline,
) -> DrawResult<DB::ErrorType> {
    root.fill(&WHITE)?;
    let (w, _) = root.dim_in_pixel();
    let x_max = (t.rel_s(t.end_ns())).max(1e-3) * 1.01;
    let (title, body) = root.split_vertically(TITLE_H);
    let (l1, l2) = title_lines(t);
    title.draw_text(
        &l1,
        &(FONT, 22).into_font().style(FontStyle::Bold).color(&BLACK),
        (16, 10),
    )?;
    title.draw_text(
        &l2,
        &(FONT, 16).into_font().color(&RGBColor(60, 60, 60)),
        (16, 44),
    )?;

    let (phase_area, rest) = body.split_vertically(phase_panel_h(t));
    let mut colour: HashMap<&str, RGBColor> = HashMap::new();
    for p in &t.phases {
        let n = colour.len();
        colour
            .entry(p.name.as_str())
            .or_insert(PALETTE[n % PALETTE.len()]);
    }
    draw_phases(&phase_area, t, x_max, &colour, w)?;

    let gib = 1024.0 * 1024.0 * 1024.0;
    let mut specs: Vec<Panel> = vec![
        (
            "GPU utilization (%)",
            vec![("gpu_util_pct", "GPU util", 1.0)],
            Some(100.0),
        ),
        (
            "GPU power (W)",
            vec![("gpu_power_mw", "power", 1000.0)],
            None,
        ),
        (
            "memory (GiB)",
            vec![
                ("rss_bytes", "host RSS (engine tree)", gib),
                ("weights_cached_bytes", "weights in page cache", gib),
                ("engine_gpu_mem_bytes", "engine device memory", gib),
            ],
            None,
        ),
        (
            "CPU (cores, engine tree)",
            vec![("cpu_cores", "CPU cores", 1.0)],
            None,
        ),
    ];
    // GPM, where the bundle has it: each figure drawn over its own window.
    if t.has_gpm() {
        specs.insert(
            1,
            (
                "GPM activity (%, over each window)",
                vec![
                    ("gpm_tensor_active_pct", "tensor pipes", 1.0),
                    ("gpm_sm_active_pct", "SMs", 1.0),
                    ("gpm_dram_bw_pct", "DRAM bandwidth", 1.0),
                ],
                Some(100.0),
            ),
        );
    }
    let panels = rest.split_evenly((specs.len(), 1));
    let n = specs.len();
    for (i, ((caption, cols, y_fixed), area)) in specs.into_iter().zip(panels.iter()).enumerate() {
        draw_series_panel(area, t, x_max, caption, &cols, y_fixed, &colour, i + 1 == n)?;
    }
    Ok(())
}

fn draw_phases<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    t: &Timeline,
    x_max: f64,
    colour: &HashMap<&str, RGBColor>,
    width_px: u32,
) -> DrawResult<DB::ErrorType> {
    let rows = depth_rows(t) as f64 + 1.0; // + the ticks row
    let mut chart = ChartBuilder::on(area)
        .margin_left(10)
        .margin_right(24)
        .margin_top(4)
        .caption(
            "phases (nested phases in the rows below their parent) and tick markers",
            (FONT, 16),
        )
        .x_label_area_size(0)
        .y_label_area_size(Y_LABEL_W)
        .build_cartesian_2d(0.0..x_max, 0.0..rows)?;
    let tick_row_label = |y: &f64| -> String {
        let r = rows - y.floor() - 1.0;
        if (y.fract() - 0.5).abs() > 1e-9 {
            String::new()
        } else if r as u32 == depth_rows(t) {
            "ticks".into()
        } else {
            format!("depth {r}")
        }
    };
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels((rows * 2.0) as usize + 1)
        .y_label_formatter(&tick_row_label)
        .light_line_style(RGBColor(235, 235, 235))
        .label_style((FONT, 13))
        .draw()?;
    let plot_px = width_px.saturating_sub(Y_LABEL_W + 34) as f64;
    let px_per_s = plot_px / x_max;
    for p in &t.phases {
        let d = p.depth.max(0) as f64;
        let (y1, y0) = (rows - d - 0.08, rows - d - 0.92);
        let (x0, x1) = (t.rel_s(p.open_ns), t.rel_s(p.end_ns()));
        let c = colour.get(p.name.as_str()).copied().unwrap_or(PALETTE[0]);
        chart.draw_series(std::iter::once(Rectangle::new(
            [(x0, y0), (x1, y1)],
            c.mix(if p.close_ns.is_some() { 0.85 } else { 0.4 })
                .filled(),
        )))?;
        chart.draw_series(std::iter::once(Rectangle::new(
            [(x0, y0), (x1, y1)],
            RGBColor(40, 40, 40).stroke_width(1),
        )))?;
        if let Some(label) = band_label(p, (x1 - x0) * px_per_s) {
            chart.draw_series(std::iter::once(Text::new(
                label,
                (x0 + 3.0 / px_per_s, rows - d - 0.5),
                (FONT, f64::from(LABEL_PX))
                    .into_font()
                    .color(&BLACK)
                    .pos(Pos::new(HPos::Left, VPos::Center)),
            )))?;
        }
    }
    let tick_row = rows - depth_rows(t) as f64 - 1.0;
    chart.draw_series(t.ticks.iter().map(|k| {
        let x = t.rel_s(k.t_ns);
        PathElement::new(
            vec![(x, tick_row + 0.15), (x, tick_row + 0.85)],
            RGBColor(30, 30, 30).stroke_width(2),
        )
    }))?;
    if let Some(first) = t.ticks.first() {
        let name = &first.name;
        let same = t.ticks.iter().filter(|k| &k.name == name).count();
        chart.draw_series(std::iter::once(Text::new(
            format!("{same} x {name}"),
            (x_max * 0.995, tick_row + 0.5),
            (FONT, 12)
                .into_font()
                .color(&RGBColor(80, 80, 80))
                .pos(Pos::new(HPos::Right, VPos::Center)),
        )))?;
    }
    Ok(())
}

/// Decimals for the labels of an axis from 0 to `y_max` with about five ticks:
/// enough that neighbouring labels differ (0.0123 GiB of RSS reads 0.002, 0.004, ...,
/// not 0.00, 0.00, 0.01), none beyond that.
pub fn axis_decimals(y_max: f64) -> usize {
    let step = y_max / 5.0;
    if !(step.is_finite() && step > 0.0) {
        return 0;
    }
    (-step.log10()).ceil().clamp(0.0, 9.0) as usize
}

#[allow(clippy::too_many_arguments)]
fn draw_series_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    t: &Timeline,
    x_max: f64,
    caption: &str,
    cols: &[Column],
    y_fixed: Option<f64>,
    colour: &HashMap<&str, RGBColor>,
    last: bool,
) -> DrawResult<DB::ErrorType> {
    let xs: Vec<f64> = t.sample_t_ns.iter().map(|&n| t.rel_s(n)).collect();
    let mut y_max: f64 = 0.0;
    for (name, _, scale) in cols {
        if let Some(s) = t.series(name) {
            for v in s.values.iter().flatten() {
                y_max = y_max.max(v / scale);
            }
        }
    }
    let y_max = y_fixed.unwrap_or(if y_max > 0.0 { y_max * 1.12 } else { 1.0 });
    let mut chart = ChartBuilder::on(area)
        .margin_left(10)
        .margin_right(24)
        .margin_top(6)
        .caption(caption, (FONT, 16))
        .x_label_area_size(if last { 40 } else { 0 })
        .y_label_area_size(Y_LABEL_W)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
    // Faint bands of the top-level phases, so each panel reads against them.
    chart.draw_series(t.phases.iter().filter(|p| p.depth == 0).map(|p| {
        let c = colour.get(p.name.as_str()).copied().unwrap_or(PALETTE[0]);
        Rectangle::new(
            [(t.rel_s(p.open_ns), 0.0), (t.rel_s(p.end_ns()), y_max)],
            c.mix(0.10).filled(),
        )
    }))?;
    let decimals = axis_decimals(y_max);
    let fmt = |v: &f64| format!("{v:.decimals$}");
    let mut mesh = chart.configure_mesh();
    mesh.y_labels(5)
        .y_label_formatter(&fmt)
        .light_line_style(RGBColor(235, 235, 235))
        .label_style((FONT, 13));
    if last {
        mesh.x_desc("seconds since the run started")
            .axis_desc_style((FONT, 14));
    }
    mesh.draw()?;
    let line_colours = [
        RGBColor(31, 119, 180),
        RGBColor(214, 39, 40),
        RGBColor(44, 160, 44),
    ];
    let mut missing = Vec::new();
    let mut drew = false;
    for (k, (name, label, scale)) in cols.iter().enumerate() {
        let Some(s) = t.series(name).filter(|s| s.any()) else {
            let why = t
                .unavailable_reason(name)
                .unwrap_or_else(|| "no value in any sample".into());
            missing.push(format!("{label}: unavailable ({why})"));
            continue;
        };
        let c = line_colours[k % line_colours.len()];
        // One line per run of consecutive values: a null (no reading) breaks the line.
        let mut segments: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
        let windows = t.windowed(name);
        if windows.is_empty() {
            for (x, v) in xs.iter().zip(&s.values) {
                match (v, segments.last_mut()) {
                    (Some(v), Some(seg)) => seg.push((*x, v / scale)),
                    (None, Some(seg)) if !seg.is_empty() => segments.push(Vec::new()),
                    _ => {}
                }
            }
        } else {
            // A windowed figure holds over its window: a step from start to end;
            // a gap between windows breaks the line.
            let mut prev_end = None;
            for (start, end, v) in windows {
                if prev_end.is_some_and(|p| p != start) {
                    segments.push(Vec::new());
                }
                if let Some(seg) = segments.last_mut() {
                    seg.push((t.rel_s(start), v / scale));
                    seg.push((t.rel_s(end), v / scale));
                }
                prev_end = Some(end);
            }
        }
        let mut first = true;
        for seg in segments.into_iter().filter(|s| !s.is_empty()) {
            let series = if seg.len() == 1 {
                chart.draw_series(std::iter::once(Circle::new(seg[0], 2, c.filled())))?
            } else {
                chart.draw_series(LineSeries::new(seg, c.stroke_width(2)))?
            };
            if first {
                series.label(label.to_string()).legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(3))
                });
                first = false;
            }
        }
        drew = true;
    }
    if drew && cols.len() > 1 {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(180, 180, 180))
            .label_font((FONT, 13))
            .draw()?;
    }
    for (i, m) in missing.iter().enumerate() {
        chart.draw_series(std::iter::once(Text::new(
            m.clone(),
            (x_max * 0.5, y_max * (0.6 - 0.18 * i as f64)),
            (FONT, 14)
                .into_font()
                .color(&RGBColor(120, 120, 120))
                .pos(Pos::new(HPos::Center, VPos::Center)),
        )))?;
    }
    Ok(())
}

fn draw_err<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> anyhow::Error {
    anyhow::anyhow!("drawing the timeline: {e}")
}

impl Format for Png {
    fn name(&self) -> &'static str {
        "png"
    }
    fn extension(&self) -> &'static str {
        "png"
    }
    fn encode(&self, t: &Timeline) -> anyhow::Result<Vec<u8>> {
        fonts()?;
        let (w, h) = (self.width, height_for(t));
        let mut rgb = vec![0u8; w as usize * h as usize * 3];
        {
            let root =
                GlyphText::new(BitMapBackend::with_buffer(&mut rgb, (w, h))).into_drawing_area();
            draw(&root, t).map_err(draw_err)?;
            root.present().map_err(draw_err)?;
        }
        let mut out = Vec::new();
        let mut enc = png::Encoder::new(&mut out, w, h);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut writer = enc.write_header()?;
        writer.write_image_data(&rgb)?;
        writer.finish()?;
        Ok(out)
    }
}

impl Format for Svg {
    fn name(&self) -> &'static str {
        "svg"
    }
    fn extension(&self) -> &'static str {
        "svg"
    }
    fn encode(&self, t: &Timeline) -> anyhow::Result<Vec<u8>> {
        fonts()?;
        let (w, h) = (self.width, height_for(t));
        let mut text = String::new();
        {
            let root = SVGBackend::with_string(&mut text, (w, h)).into_drawing_area();
            draw(&root, t).map_err(draw_err)?;
            root.present().map_err(draw_err)?;
        }
        Ok(text.into_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn span(name: &str, open_attrs: serde_json::Value, closed: bool) -> PhaseSpan {
        PhaseSpan {
            seq: 0,
            name: name.into(),
            depth: 0,
            parent_seq: None,
            open_ns: 0,
            close_ns: closed.then_some(1_000_000_000),
            duration_s: 1.0,
            attrs: json!({ "open": open_attrs, "close": {} }),
        }
    }

    #[test]
    fn axis_labels_have_enough_decimals_to_differ() {
        assert_eq!(axis_decimals(100.0), 0);
        assert_eq!(axis_decimals(2.24), 1);
        assert_eq!(axis_decimals(0.0123), 3);
        assert_eq!(axis_decimals(0.0), 0);
        assert_eq!(axis_decimals(f64::NAN), 0);
        // Five ticks across any range are distinct at the chosen precision.
        for y_max in [0.0007, 0.0123, 0.2, 1.0, 3.7, 17.0, 640.0] {
            let d = axis_decimals(y_max);
            let labels: Vec<String> = (0..=5)
                .map(|k| format!("{:.d$}", y_max * f64::from(k) / 5.0))
                .collect();
            let mut uniq = labels.clone();
            uniq.dedup();
            assert_eq!(uniq, labels, "y_max {y_max}");
        }
    }

    #[test]
    fn band_labels_shrink_to_fit_the_band() {
        let step = span("denoise.step", json!({"step": 3, "steps": 30}), true);
        assert_eq!(band_label(&step, 400.0).as_deref(), Some("denoise.step 3"));
        assert_eq!(band_label(&step, 60.0).as_deref(), Some("step 3"));
        assert_eq!(band_label(&step, 20.0).as_deref(), Some("3"));
        assert_eq!(band_label(&step, 5.0), None);
        let chunk = span("decode.video.chunk", json!({"chunk": 1}), true);
        assert_eq!(band_label(&chunk, 70.0).as_deref(), Some("chunk 1"));
        let enc = span("load.text_encoder", json!({}), true);
        assert_eq!(
            band_label(&enc, 400.0).as_deref(),
            Some("load.text_encoder")
        );
        assert_eq!(band_label(&enc, 100.0).as_deref(), Some("text_encoder"));
        let cut = band_label(&enc, 50.0).unwrap();
        assert!(cut.starts_with("load") && cut.ends_with('…'), "{cut}");
        // Every label returned fits its band.
        for px in [30.0, 50.0, 80.0, 120.0, 200.0] {
            for p in [&step, &chunk, &enc] {
                if let Some(l) = band_label(p, px) {
                    let w =
                        f64::from(super::super::glyphs::text_width(&l, LABEL_PX, false).unwrap());
                    assert!(w + 6.0 <= px, "{l:?} ({w} px) in {px} px");
                }
            }
        }
        let open = span("artifacts.frames", json!({}), false);
        assert_eq!(
            band_label(&open, 400.0).as_deref(),
            Some("artifacts.frames (open)")
        );
        assert_eq!(band_label(&open, 110.0).as_deref(), Some("frames (open)"));
    }
}
