//! The report's page (`index.html`): one self-contained HTML file, its CSS
//! inline, the forest plot inline as SVG, no script and no URL outside the
//! report's own directory. Sections: the ranking at the reference rung, the
//! forest plot, the verdicts, the other rungs, the hosts (each host's own effect
//! and the heterogeneity figure, where a lever's pairs ran on two or more hosts),
//! the phase-scaling fit (or what is
//! missing for one), every pair with links to both bundles' timelines and their
//! diff, every excluded bundle with its reason, every bundle used, the method.
//!
//! Promise: a pure function of the ranking and the artifacts' links; numbers in
//! the markdown report's fixed formats; no clock is read.

use std::fmt::Write;

use crate::formats::forest::{inline_svg, xml_escape};
use crate::formats::ranking_text::{
    arms_text, fixed, flagged_lines, floor_lines, host_lines, method_lines, multi_host, pair_flags,
    rank_cells, reference_intro, reference_rows, second_rows, sensitive_why, value, verdict_text,
    REFERENCE_HEAD, SECOND_HEAD,
};
use crate::levers_spec::Unit;
use crate::rank::fit::{method_text, ScalingFit, FLAT_EXPONENT};
use crate::rank::stats::CONFIDENCE;
use crate::rank::verdict::{pct, Verdict, MIN_PAIRS};
use crate::rank::{FitOutcome, LeverResult, Ranking, RungResult};
use crate::report::artifacts::Artifacts;
use crate::short_id::short;

/// The page's CSS (inline; no web font, no external sheet).
const CSS: &str = "\
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,'DejaVu Sans',sans-serif;margin:0;color:#1a1a1a;background:#fff}
main{max-width:1320px;margin:0 auto;padding:1.2em 1.5em 3em}
h1{font-size:1.6em;margin:.2em 0}
h2{font-size:1.25em;margin:1.6em 0 .5em;border-bottom:1px solid #ddd;padding-bottom:.2em}
p,li{line-height:1.45}
code{font-family:'DejaVu Sans Mono',Menlo,Consolas,monospace;font-size:.9em;background:#f3f3f3;padding:0 .2em;border-radius:3px}
nav a{margin-right:1em}
table{border-collapse:collapse;font-size:13px;margin:.4em 0}
th,td{border:1px solid #d4d4d4;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f3f3f3}
small{color:#555}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.scroll{overflow-x:auto}
tr:nth-child(even) td{background:#fafafa}
.verdict{font-weight:bold}
.v-confirmed{color:#00765a}
.v-refuted{color:#b84f00}
.v-insufficient{color:#005f96}
.v-sensitive{color:#9a4d00}
.v-disagree{color:#000}
tr.host td{color:#444}
.flagged{color:#9a4d00}
.v-na{color:#666}
.figure{overflow-x:auto;border:1px solid #e4e4e4;padding:4px;background:#fff}
.figure svg{max-width:100%;height:auto}
.muted{color:#666}
";

/// The page.
pub fn html(r: &Ranking, art: &Artifacts, store: &str) -> String {
    let mut o = String::new();
    // Writing into a String cannot fail.
    let _ = write_page(&mut o, r, art, store);
    o
}

fn write_page(o: &mut String, r: &Ranking, art: &Artifacts, store: &str) -> std::fmt::Result {
    writeln!(o, "<!DOCTYPE html>")?;
    writeln!(o, r#"<html lang="en">"#)?;
    writeln!(o, "<head>")?;
    writeln!(o, r#"<meta charset="utf-8">"#)?;
    writeln!(
        o,
        r#"<meta name="viewport" content="width=device-width, initial-scale=1">"#
    )?;
    writeln!(o, "<title>Lever report: {}</title>", e(store))?;
    writeln!(o, "<style>\n{CSS}</style>")?;
    writeln!(o, "</head>")?;
    writeln!(o, "<body>")?;
    writeln!(o, "<main>")?;
    write_header(o, r, store)?;
    write_ranking(o, r)?;
    writeln!(o, r#"<h2 id="forest">Forest plot</h2>"#)?;
    writeln!(o, r#"<div class="figure">{}</div>"#, inline_svg(r))?;
    write_verdicts(o, r)?;
    write_other_rungs(o, r)?;
    write_second(o, r)?;
    write_fidelity(o, r)?;
    write_hosts(o, r)?;
    write_flagged(o, r)?;
    write_fit(o, r)?;
    write_pairs(o, r, art)?;
    write_excluded(o, r, art)?;
    write_used(o, r, art)?;
    writeln!(o, r#"<h2 id="method">Method</h2>"#)?;
    writeln!(o, "<ul>")?;
    for line in method_lines(r) {
        writeln!(o, "<li>{}</li>", e(&line))?;
    }
    writeln!(o, "</ul>")?;
    writeln!(
        o,
        r#"<p class="muted">The same ranking as markdown: <a href="levers.md">levers.md</a>, its forest plot: <a href="levers-forest.svg">levers-forest.svg</a>.</p>"#
    )?;
    writeln!(o, "</main>")?;
    writeln!(o, "</body>")?;
    writeln!(o, "</html>")
}

/// HTML-escaped text.
fn e(s: &str) -> String {
    xml_escape(s)
}

/// The CSS class of a verdict.
fn verdict_class(v: &Verdict) -> &'static str {
    match v {
        Verdict::Confirmed => "v-confirmed",
        Verdict::Refuted { .. } => "v-refuted",
        Verdict::Insufficient { .. } => "v-insufficient",
        Verdict::NotApplicable { .. } => "v-na",
        Verdict::RefutedFidelity { .. } => "v-refuted",
        Verdict::Sensitive { .. } => "v-sensitive",
        Verdict::HostsDisagree { .. } => "v-disagree",
    }
}

/// A result's verdict cell, with the hosts and `I²` where two or more hosts
/// contributed pairs.
fn verdict_cell(x: &RungResult) -> String {
    format!(
        r#"<td class="verdict {}">{}</td>"#,
        verdict_class(&x.verdict),
        e(&verdict_text(x))
    )
}

fn write_header(o: &mut String, r: &Ranking, store: &str) -> std::fmt::Result {
    writeln!(o, "<h1>Lever report</h1>")?;
    writeln!(
        o,
        "<p>Store <code>{}</code>: {} bundle(s) seen, {} used in pairs, {} excluded; input digest <code>{}</code> (sha256 of the sorted ids of the bundles that verified; every bundle is verified before it is read).</p>",
        e(store),
        r.bundles_seen,
        r.used.len(),
        r.excluded.len(),
        e(&r.input_digest)
    )?;
    writeln!(o, "<p>Regenerate: <code>{}</code></p>", e(&r.command))?;
    let hosts = multi_host(r);
    writeln!(
        o,
        "<nav>{}</nav>",
        [
            ("ranking", "Ranking", true),
            ("forest", "Forest plot", true),
            ("verdicts", "Verdicts", true),
            ("other-rungs", "Other rungs", true),
            ("second", "Second metrics", true),
            ("fidelity", "Fidelity", true),
            ("hosts", "Hosts", hosts),
            ("fit", "Phase scaling", true),
            ("pairs", "Pairs", true),
            ("excluded", "Excluded", true),
            ("used", "Used", true),
            ("method", "Method", true),
        ]
        .iter()
        .filter(|(_, _, shown)| *shown)
        .map(|(id, t, _)| format!(r##"<a href="#{id}">{t}</a>"##))
        .collect::<Vec<_>>()
        .join("")
    )
}

const ROW_HEAD: &str = "<th>lever</th><th>arms</th><th>metric</th><th>pairs</th><th>baseline median</th><th>saving [95%]</th><th>saving (abs) [95%]</th><th>ratio [95%]</th><th>min effect</th><th>verdict</th><th>fidelity (PSNR)</th>";

fn write_ranking(o: &mut String, r: &Ranking) -> std::fmt::Result {
    writeln!(
        o,
        r#"<h2 id="ranking">Ranking at rung {}</h2>"#,
        e(&r.reference_rung)
    )?;
    writeln!(
        o,
        "<p>Ranked by fractional saving (point estimate) at the reference rung; only levers with at least {MIN_PAIRS} pairs are ranked. Saving = baseline − treatment; intervals are {:.0}% bootstrap intervals.</p>",
        CONFIDENCE * 100.0
    )?;
    writeln!(o, "<div class=\"scroll\"><table class=\"ranking\">")?;
    writeln!(o, "<tr><th>rank</th><th>prior</th>{ROW_HEAD}</tr>")?;
    for l in &r.levers {
        let (rank, prior) = rank_cells(l);
        write!(
            o,
            r#"<tr><td class="num">{rank}</td><td class="num">{}</td>"#,
            e(&prior)
        )?;
        row_cells(o, l, &l.reference)?;
        writeln!(o, "</tr>")?;
    }
    writeln!(o, "</table></div>")?;
    writeln!(
        o,
        "<p class=\"muted\">Prior ranks: {}.</p>",
        e(&r.prior_rank_source)
    )
}

/// The cells from `lever` to `verdict` of one row.
fn row_cells(o: &mut String, l: &LeverResult, x: &RungResult) -> std::fmt::Result {
    write!(
        o,
        r#"<td>{}</td><td>{}</td><td>{}</td><td class="num">{}</td>"#,
        e(&l.id),
        e(&arms_text(l)),
        e(&l.metric),
        x.rounds.len()
    )?;
    match (&x.effect, x.saving_fraction) {
        (Some(ef), Some((s, ci))) => write!(
            o,
            r#"<td class="num">{}</td><td class="num">{}<br><small>[{}, {}]</small></td><td class="num">{}<br><small>[{}, {}]</small></td><td class="num">{}<br><small>[{}, {}]</small></td>"#,
            e(&value(ef.baseline_median, l.unit)),
            pct(s),
            pct(ci.lo),
            pct(ci.hi),
            e(&value(ef.saving, l.unit)),
            e(&value(ef.saving_ci.lo, l.unit)),
            e(&value(ef.saving_ci.hi, l.unit)),
            fixed(ef.ratio, 3),
            fixed(ef.ratio_ci.lo, 3),
            fixed(ef.ratio_ci.hi, 3)
        )?,
        _ => write!(o, "<td>—</td><td>—</td><td>—</td><td>—</td>")?,
    }
    write!(
        o,
        r#"<td class="num">{}</td>{}<td>{}</td>"#,
        pct(l.min_effect),
        verdict_cell(x),
        e(&crate::rank::fidelity::cell(&x.fidelity))
    )
}

fn write_verdicts(o: &mut String, r: &Ranking) -> std::fmt::Result {
    writeln!(o, r#"<h2 id="verdicts">Verdicts</h2>"#)?;
    writeln!(o, "<ul>")?;
    for l in &r.levers {
        let v = &l.reference.verdict;
        let why = match (v, l.reference.saving_fraction) {
            (Verdict::Confirmed, Some((_, ci))) => format!(
                "the whole interval of the saving [{}, {}] is at or above {}.",
                pct(ci.lo),
                pct(ci.hi),
                pct(l.min_effect)
            ),
            (Verdict::Refuted { next_hypothesis }, Some((_, ci))) => format!(
                "the whole interval of the saving [{}, {}] is below {}. Next hypothesis: {next_hypothesis}",
                pct(ci.lo),
                pct(ci.hi),
                pct(l.min_effect)
            ),
            (Verdict::Insufficient { missing }, _) => format!("missing: {missing}."),
            (Verdict::NotApplicable { why }, _) => format!("not applicable: {why}."),
            (Verdict::RefutedFidelity { why }, _) => format!(
                "the saving clears its minimum but the frames fail the fidelity rule: {why}."
            ),
            (Verdict::Sensitive { .. }, _) => format!("{}.", sensitive_why(&l.reference)),
            (Verdict::HostsDisagree { why }, _) => format!("{why}."),
            _ => String::new(),
        };
        writeln!(
            o,
            r#"<li><b>{}</b> ({}) at rung {}: <span class="verdict {}">{}</span> — {}</li>"#,
            e(&l.id),
            e(&l.seed_issue),
            e(&r.reference_rung),
            verdict_class(v),
            e(&v.label()),
            e(&why)
        )?;
    }
    writeln!(o, "</ul>")
}

/// Where a lever's pairs at a rung ran on two or more hosts: one row per host
/// (its own effect and its saving judged alone), then the heterogeneity figure
/// and what rank did with it; nothing when every lever's pairs ran on one host.
fn write_hosts(o: &mut String, r: &Ranking) -> std::fmt::Result {
    let lines = host_lines(r);
    if lines.is_empty() {
        return Ok(());
    }
    writeln!(o, r#"<h2 id="hosts">Hosts</h2>"#)?;
    writeln!(
        o,
        "<p>Pairs are formed within one host. Where two or more hosts contributed a lever's pairs at a rung: each host's effect from its own pairs, then whether the hosts agree (specs/hosts.md); only then are the pairs pooled.</p>"
    )?;
    writeln!(o, "<div class=\"scroll\"><table class=\"hosts\">")?;
    writeln!(o, "<tr><th>lever</th><th>rung</th><th>host</th><th>pairs</th><th>baseline median</th><th>saving [95%]</th><th>ratio [95%]</th><th>verdict (this host alone)</th></tr>")?;
    for l in &r.levers {
        for x in std::iter::once(&l.reference).chain(&l.other_rungs) {
            let Some(b) = &x.hosts else { continue };
            for h in &b.hosts {
                write!(
                    o,
                    r#"<tr class="host"><td>{}</td><td>{}</td><td><code>{}</code></td><td class="num">{}</td>"#,
                    e(&l.id),
                    e(&x.rung),
                    e(&h.label),
                    h.pairs
                )?;
                match (&h.effect, h.saving_fraction) {
                    (Some(ef), Some((s, ci))) => write!(
                        o,
                        r#"<td class="num">{}</td><td class="num">{}<br><small>[{}, {}]</small></td><td class="num">{}<br><small>[{}, {}]</small></td>"#,
                        e(&value(ef.baseline_median, l.unit)),
                        pct(s),
                        pct(ci.lo),
                        pct(ci.hi),
                        fixed(ef.ratio, 3),
                        fixed(ef.ratio_ci.lo, 3),
                        fixed(ef.ratio_ci.hi, 3)
                    )?,
                    _ => write!(o, "<td>—</td><td>—</td><td>—</td>")?,
                }
                writeln!(
                    o,
                    r#"<td class="verdict {}">{}</td></tr>"#,
                    verdict_class(&h.verdict),
                    e(&h.verdict.label())
                )?;
            }
        }
    }
    writeln!(o, "</table></div>")?;
    writeln!(o, "<ul>")?;
    for line in lines {
        writeln!(o, "<li>{}</li>", e(&line))?;
    }
    writeln!(o, "</ul>")
}

/// Runs flagged as outliers or first-init, with the verdict with and without
/// their pairs; nothing when none is flagged.
fn write_flagged(o: &mut String, r: &Ranking) -> std::fmt::Result {
    let lines = flagged_lines(r);
    if lines.is_empty() {
        return Ok(());
    }
    writeln!(o, r#"<h2 id="flagged">Flagged runs ({})</h2>"#, lines.len())?;
    writeln!(o, "<ul>")?;
    for l in lines {
        writeln!(o, r#"<li class="flagged">{}</li>"#, e(&l))?;
    }
    writeln!(o, "</ul>")
}

fn write_other_rungs(o: &mut String, r: &Ranking) -> std::fmt::Result {
    writeln!(o, r#"<h2 id="other-rungs">Other rungs</h2>"#)?;
    let others: Vec<(&LeverResult, &RungResult)> = r
        .levers
        .iter()
        .flat_map(|l| l.other_rungs.iter().map(move |x| (l, x)))
        .collect();
    if others.is_empty() {
        return writeln!(
            o,
            "<p>None: every lever was measured at the reference rung only.</p>"
        );
    }
    writeln!(o, "<div class=\"scroll\"><table class=\"other-rungs\">")?;
    writeln!(o, "<tr><th>rung</th><th>voxels</th>{ROW_HEAD}</tr>")?;
    for (l, x) in others {
        write!(
            o,
            r#"<tr><td>{}</td><td class="num">{}</td>"#,
            e(&x.rung),
            x.voxels
        )?;
        row_cells(o, l, x)?;
        writeln!(o, "</tr>")?;
    }
    writeln!(o, "</table></div>")
}

fn write_second(o: &mut String, r: &Ranking) -> std::fmt::Result {
    writeln!(o, r#"<h2 id="second">Second metrics</h2>"#)?;
    let rows = second_rows(r);
    if rows.is_empty() {
        return writeln!(o, "<p>None: no lever names a second metric.</p>");
    }
    writeln!(
        o,
        "<p>Read off the same pairs as each lever's metric; described, not judged (the verdict is the first metric's).</p>"
    )?;
    write_table(o, "second", &SECOND_HEAD, &rows)
}

/// A table of text cells (escaped) in a scrolling box, of CSS class `class`.
fn write_table<const N: usize>(
    o: &mut String,
    class: &str,
    head: &[&str; N],
    rows: &[[String; N]],
) -> std::fmt::Result {
    writeln!(o, "<div class=\"scroll\"><table class=\"{class}\">")?;
    let head: String = head.iter().map(|h| format!("<th>{}</th>", e(h))).collect();
    writeln!(o, "<tr>{head}</tr>")?;
    for row in rows {
        let cells: String = row.iter().map(|c| format!("<td>{}</td>", e(c))).collect();
        writeln!(o, "<tr>{cells}</tr>")?;
    }
    writeln!(o, "</table></div>")
}

/// The floors the changing levers' rule reads, and each changing lever's arms
/// against the reference (the ranking's fidelity column is per pair).
fn write_fidelity(o: &mut String, r: &Ranking) -> std::fmt::Result {
    writeln!(o, r#"<h2 id="fidelity">Fidelity</h2>"#)?;
    writeln!(o, "<ul>")?;
    for line in floor_lines(r) {
        writeln!(o, "<li>{}</li>", e(&line))?;
    }
    writeln!(o, "</ul>")?;
    let rows = reference_rows(r);
    if rows.is_empty() {
        return Ok(());
    }
    writeln!(o, "<p>{}</p>", e(&reference_intro()))?;
    write_table(o, "reference", &REFERENCE_HEAD, &rows)
}

fn write_fit(o: &mut String, r: &Ranking) -> std::fmt::Result {
    writeln!(
        o,
        r#"<h2 id="fit">Phase scaling (fixed + per-voxel, least squares)</h2>"#
    )?;
    let fits = match &r.fit {
        FitOutcome::Missing(m) => {
            return writeln!(o, "<p>No fit: missing {}.</p>", e(&m.missing));
        }
        FitOutcome::Fit(f) => f,
    };
    writeln!(o, "<p>{}</p>", e(&method_text()))?;
    for f in fits {
        write_one_fit(o, f)?;
    }
    Ok(())
}

/// One model's fit: its group and the phase table.
fn write_one_fit(o: &mut String, f: &ScalingFit) -> std::fmt::Result {
    let rungs: Vec<String> = f
        .rungs
        .iter()
        .map(|(v, n)| format!("rung {n} ({v} voxels)"))
        .collect();
    writeln!(
        o,
        "<p>Group: engine <code>{}</code>, host <code>{}</code>, weights <code>{}</code>, config <code>{}</code>; {}; {} bundle(s). A phase does not scale when its scaling exponent (0 = constant, 1 = proportional to voxels) is below {}.</p>",
        e(short(&f.engine_sha256)),
        e(&f.host),
        e(&f.model),
        e(&f.config),
        e(&rungs.join(", ")),
        f.bundle_ids.len(),
        fixed(FLAT_EXPONENT, 2)
    )?;
    writeln!(o, "<div class=\"scroll\"><table class=\"fit\">")?;
    writeln!(o, "<tr><th>phase</th><th>points</th><th>fixed</th><th>per Mvoxel</th><th>R²</th><th>exponent</th><th>mean at largest rung</th><th>share of wall</th><th>scales</th><th>left out (outlier at its rung)</th></tr>")?;
    for p in &f.phases {
        writeln!(
            o,
            r#"<tr><td>{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td>{}</td><td>{}</td></tr>"#,
            e(&p.phase),
            p.points,
            value(p.fixed_s, Unit::Seconds),
            value(p.per_mvoxel_s, Unit::Seconds),
            fixed(p.r2, 3),
            p.exponent.map_or("n/a".into(), |x| fixed(x, 3)),
            value(p.mean_at_max_s, Unit::Seconds),
            pct(p.share_of_wall_at_max),
            if p.does_not_scale { "<b>no</b>" } else { "yes" },
            if p.left_out.is_empty() {
                "—".to_string()
            } else {
                p.left_out
                    .iter()
                    .map(|id| format!("<code>{}</code>", e(short(id))))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        )?;
    }
    writeln!(o, "</table></div>")
}

/// A bundle id linked to its timeline, or with the reason it has none.
fn bundle_link(id: &str, art: &Artifacts) -> String {
    match art.timeline(id) {
        Ok(p) => format!(
            r#"<a href="{}" title="timeline of {}"><code>{}</code></a>"#,
            e(p),
            e(id),
            e(short(id))
        ),
        Err(why) => format!(
            r#"<code title="{}">{}</code> <span class="muted">({})</span>"#,
            e(id),
            e(short(id)),
            e(why)
        ),
    }
}

fn write_pairs(o: &mut String, r: &Ranking, art: &Artifacts) -> std::fmt::Result {
    writeln!(o, r#"<h2 id="pairs">Pairs</h2>"#)?;
    writeln!(
        o,
        "<p>Each bundle id links to its timeline (phases, GPU, power, memory, CPU); the diff is <code>harness diff BASELINE TREATMENT</code>.</p>"
    )?;
    writeln!(o, "<div class=\"scroll\"><table class=\"pairs\">")?;
    writeln!(o, "<tr><th>lever</th><th>rung</th><th>round</th><th>campaign</th><th>baseline</th><th>treatment</th><th>baseline value</th><th>treatment value</th><th>flagged</th><th>diff</th></tr>")?;
    for l in &r.levers {
        for x in std::iter::once(&l.reference).chain(&l.other_rungs) {
            for p in &x.rounds {
                let diff = match art.diff(&p.baseline_id, &p.treatment_id) {
                    Ok(f) => format!(r#"<a class="diff" href="{}">diff</a>"#, e(f)),
                    Err(why) => format!(r#"<span class="muted">{}</span>"#, e(why)),
                };
                writeln!(
                    o,
                    r#"<tr><td>{}</td><td>{}</td><td class="num">{}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td class="num">{}</td><td class="num">{}</td><td class="flagged">{}</td><td>{diff}</td></tr>"#,
                    e(&l.id),
                    e(&x.rung),
                    p.cell.round,
                    e(short(&p.cell.campaign)),
                    bundle_link(&p.baseline_id, art),
                    bundle_link(&p.treatment_id, art),
                    e(&value(p.pair.baseline, l.unit)),
                    e(&value(p.pair.treatment, l.unit)),
                    e(&pair_flags(x, p, l.unit)),
                )?;
            }
        }
    }
    writeln!(o, "</table></div>")
}

fn write_excluded(o: &mut String, r: &Ranking, art: &Artifacts) -> std::fmt::Result {
    writeln!(
        o,
        r#"<h2 id="excluded">Excluded bundles ({})</h2>"#,
        r.excluded.len()
    )?;
    if r.excluded.is_empty() {
        return writeln!(o, "<p>None.</p>");
    }
    writeln!(o, "<div class=\"scroll\"><table class=\"excluded\">")?;
    writeln!(o, "<tr><th>bundle</th><th>reason</th></tr>")?;
    for x in &r.excluded {
        writeln!(
            o,
            "<tr><td>{}</td><td>{}</td></tr>",
            bundle_link(&x.id, art),
            e(&x.reason)
        )?;
    }
    writeln!(o, "</table></div>")
}

fn write_used(o: &mut String, r: &Ranking, art: &Artifacts) -> std::fmt::Result {
    writeln!(o, r#"<h2 id="used">Bundles used ({})</h2>"#, r.used.len())?;
    writeln!(o, "<ul class=\"used\">")?;
    for id in &r.used {
        writeln!(
            o,
            "<li>{} <code>{}</code></li>",
            bundle_link(id, art),
            e(id)
        )?;
    }
    writeln!(o, "</ul>")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::forest::tests::sample_ranking;

    #[test]
    fn the_page_is_self_contained_and_deterministic() {
        let r = sample_ranking();
        let art = Artifacts::default();
        let page = html(&r, &art, "store <x>");
        assert_eq!(page, html(&r, &art, "store <x>"));
        assert!(page.starts_with("<!DOCTYPE html>"));
        for banned in ["http:", "https:", "<script", "<link", "@import", "url("] {
            assert!(!page.contains(banned), "{banned} in the page");
        }
        assert!(page.contains("store &lt;x&gt;"));
        assert!(page.contains("<svg class=\"forest\""));
        assert!(page.contains("No fit: missing runs."));
        assert_eq!(page.matches("<g class=\"row\"").count(), 6);
        // One host everywhere: no Hosts section, no link to one.
        assert!(!page.contains("id=\"hosts\"") && !page.contains("href=\"#hosts\""));
    }

    /// The Fidelity section: the floors (here none) and, where a changing
    /// lever's arms were measured against the reference, one row per lever
    /// and rung with both arms. Red when the section or its rows are dropped.
    #[test]
    fn the_page_shows_the_floors_and_each_arm_against_the_reference() {
        use crate::rank::fidelity::{ArmDistance, VsReference};
        let mut r = sample_ranking();
        let page = html(&r, &Artifacts::default(), "s");
        assert!(
            page.contains(r##"<a href="#fidelity">Fidelity</a>"##),
            "nav"
        );
        assert!(page.contains("<li>Floor: no floor measured"), "{page}");
        assert!(!page.contains("<table class=\"reference\">"));
        let d = |db: f64| ArmDistance {
            runs: 3,
            median_psnr_db: db,
            min_psnr_db: db,
            max_psnr_db: db,
        };
        r.levers[0].reference.fidelity.vs_reference = Some(VsReference {
            reference_ids: vec!["2762bdbe9696aaaa".into()],
            baseline: Some(d(20.43)),
            treatment: None,
        });
        let page = html(&r, &Artifacts::default(), "s");
        let l = &r.levers[0];
        let row = format!(
            "<tr><td>{}</td><td>{}</td><td>2762bdbe9696</td><td>{}: 20.43 dB (3 runs)</td><td>{}: no run with a reference</td></tr>",
            l.id, l.reference.rung, l.baseline, l.treatment
        );
        assert!(page.contains(&row), "{row} not in the page");
    }

    /// Two hosts that disagree (host a saves 50%, b nothing): the verdict cell
    /// names it with I², the Hosts section has a row per host with its own
    /// verdict and the figure, and the forest plot a host row per host.
    #[test]
    fn the_page_shows_each_host_where_two_hosts_contributed() {
        let mut r = sample_ranking();
        r.levers = vec![crate::rank::tests::two_hosts(0.5, 1.0)];
        let page = html(&r, &Artifacts::default(), "s3://b/p");
        assert!(page.contains(r##"<a href="#hosts">Hosts</a>"##), "nav");
        assert!(page.contains(r#"<h2 id="hosts">Hosts</h2>"#));
        assert!(
            page.contains(
                r#"<td class="verdict v-disagree">hosts-disagree (2 hosts, I² 100.0%)</td>"#
            ),
            "{page}"
        );
        let rows: Vec<&str> = page
            .lines()
            .filter(|l| l.starts_with(r#"<tr class="host">"#))
            .collect();
        assert_eq!(rows.len(), 2, "{page}");
        assert!(
            rows[0].contains("<code>a</code>") && rows[0].contains("v-confirmed"),
            "{}",
            rows[0]
        );
        assert!(
            rows[1].contains("<code>b</code>") && rows[1].contains("v-refuted"),
            "{}",
            rows[1]
        );
        assert!(page.contains("the hosts disagree (p &lt; 0.05): no pooled effect or verdict."));
        assert_eq!(page.matches(r#"<g class="host-row""#).count(), 2);
        assert!(page.contains("<li>Hosts (specs/hosts.md): a pair is formed within one host"));
    }
}
