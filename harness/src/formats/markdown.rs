//! The markdown report of a [`Ranking`]: one table a reviewer reads in a minute, then
//! the verdicts, the phase-scaling fit, the method, and every bundle id used or
//! excluded.
//!
//! Promise: a pure function of the ranking; numbers have fixed formats (seconds to 3
//! decimals, bytes as GiB to 3 decimals, shares to 3 decimals, percentages to 1), and
//! `-0` is never printed.

use std::fmt::Write;

use crate::escape::{md_cell, md_code, md_code_cell};
use crate::formats::ranking_text::{
    arms_text, fixed, flagged_lines, floor_lines, host_lines, method_lines, pair_flags, rank_cells,
    reference_intro, reference_rows, second_rows, sensitive_why, value, verdict_text,
    REFERENCE_HEAD, SECOND_HEAD,
};
use crate::levers_spec::Numerics;
use crate::rank::fidelity::{self, db};
use crate::rank::fit::{method_text, ScalingFit, FLAT_EXPONENT};
use crate::rank::stats::CONFIDENCE;
use crate::rank::verdict::{pct, Verdict, MIN_PAIRS};
use crate::rank::{FitOutcome, LeverResult, Ranking, RungResult};
use crate::short_id::short;

/// Render `r` as markdown.
pub fn markdown(r: &Ranking) -> String {
    markdown_with_forest(r, None)
}

/// Render `r` as markdown that shows the forest plot written beside it under the
/// relative name `forest` (`levers-forest.svg`), below the ranking table.
pub fn markdown_with_forest(r: &Ranking, forest: Option<&str>) -> String {
    let mut o = String::new();
    // Writing into a String cannot fail.
    let _ = write_all(&mut o, r, forest);
    o
}

fn write_all(o: &mut String, r: &Ranking, forest: Option<&str>) -> std::fmt::Result {
    write_header(o, r)?;
    write_ranking(o, r)?;
    write_flags(o, r)?;
    if let Some(f) = forest {
        write_forest_link(o, f)?;
    }
    write_verdicts(o, r)?;
    write_other_rungs(o, r)?;
    write_second(o, r)?;
    write_hosts(o, r)?;
    write_flagged(o, r)?;
    write_fidelity(o, r)?;
    write_fit(o, r)?;
    write_method(o, r)?;
    write_pairs(o, r)?;
    write_excluded(o, r)?;
    write_used(o, r)
}

/// The title, the regenerating command and the input.
fn write_header(o: &mut String, r: &Ranking) -> std::fmt::Result {
    writeln!(o, "# Lever ranking")?;
    writeln!(o)?;
    writeln!(o, "Regenerate: `{}`", r.command)?;
    writeln!(o)?;
    writeln!(
        o,
        "Input: {} bundle(s) seen, {} used in pairs, {} excluded; input digest `{}` (sha256 of the sorted ids of the bundles that verified: every bundle is verified before it is read, and its id is the sha256 of a manifest listing every file's sha256).",
        r.bundles_seen,
        r.used.len(),
        r.excluded.len(),
        r.input_digest
    )?;
    writeln!(o)?;
    Ok(())
}

/// The ranking table at the reference rung.
fn write_ranking(o: &mut String, r: &Ranking) -> std::fmt::Result {
    writeln!(o, "## Ranking at rung {}", md_cell(&r.reference_rung))?;
    writeln!(o)?;
    writeln!(
        o,
        "Ranked by fractional saving (point estimate) at the reference rung; only levers with at least {MIN_PAIRS} pairs are ranked. Saving = baseline - treatment; interval = {:.0}% bootstrap.",
        CONFIDENCE * 100.0
    )?;
    writeln!(o)?;
    writeln!(
        o,
        "| rank | prior | lever | arms | metric | pairs | baseline median | saving | saving (abs) | ratio | min effect | verdict | fidelity (PSNR) |"
    )?;
    writeln!(
        o,
        "|---:|---:|---|---|---|---:|---:|---|---|---|---:|---|---|"
    )?;
    for l in &r.levers {
        row(o, l, &l.reference, true)?;
    }
    writeln!(o)?;
    writeln!(o, "Prior ranks: {}.", r.prior_rank_source)?;
    writeln!(o)?;
    Ok(())
}

/// The forest plot, shown as an image (a link where images are not shown).
fn write_forest_link(o: &mut String, file: &str) -> std::fmt::Result {
    writeln!(
        o,
        "Every lever at every rung, with its interval, minimum effect and verdict ([{file}]({file})):"
    )?;
    writeln!(o)?;
    writeln!(
        o,
        "![Forest plot: the saving of every lever at every rung, point estimate and {:.0}% interval, the minimum effect dashed, coloured and shaped by verdict]({file})",
        CONFIDENCE * 100.0
    )?;
    writeln!(o)?;
    Ok(())
}

/// One line per lever: its verdict at the reference rung and why.
fn write_verdicts(o: &mut String, r: &Ranking) -> std::fmt::Result {
    writeln!(o, "## Verdicts")?;
    writeln!(o)?;
    for l in &r.levers {
        let v = &l.reference.verdict;
        write!(
            o,
            "- **{}** ({}) at rung {}: **{}**",
            l.id,
            l.seed_issue,
            md_cell(&r.reference_rung),
            v.label()
        )?;
        match v {
            Verdict::Confirmed => {
                if let Some((_, ci)) = l.reference.saving_fraction {
                    write!(
                        o,
                        " — the whole interval of the saving [{}, {}] is at or above {}.",
                        pct(ci.lo),
                        pct(ci.hi),
                        pct(l.min_effect)
                    )?;
                }
            }
            Verdict::Refuted { next_hypothesis } => {
                if let Some((_, ci)) = l.reference.saving_fraction {
                    write!(
                        o,
                        " — the whole interval of the saving [{}, {}] is below {}. Next hypothesis: {next_hypothesis}",
                        pct(ci.lo),
                        pct(ci.hi),
                        pct(l.min_effect)
                    )?;
                }
            }
            Verdict::RefutedFidelity { why } => write!(
                o,
                " — the saving clears its minimum but the frames fail the fidelity rule: {}.",
                md_cell(why)
            )?,
            Verdict::Insufficient { missing } => write!(o, " — missing: {}.", md_cell(missing))?,
            Verdict::NotApplicable { why } => write!(o, " — not applicable: {}.", md_cell(why))?,
            Verdict::Sensitive { .. } => {
                write!(o, " — {}.", md_cell(&sensitive_why(&l.reference)))?
            }
            Verdict::HostsDisagree { why } => write!(o, " — {}.", md_cell(why))?,
        }
        writeln!(o)?;
    }
    Ok(())
}

/// The table of results at rungs other than the reference, when there are any.
fn write_other_rungs(o: &mut String, r: &Ranking) -> std::fmt::Result {
    let others: Vec<(&LeverResult, &RungResult)> = r
        .levers
        .iter()
        .flat_map(|l| l.other_rungs.iter().map(move |x| (l, x)))
        .collect();
    if !others.is_empty() {
        writeln!(o)?;
        writeln!(o, "## Other rungs")?;
        writeln!(o)?;
        writeln!(
            o,
            "| rung | voxels | lever | arms | metric | pairs | baseline median | saving | saving (abs) | ratio | min effect | verdict | fidelity (PSNR) |"
        )?;
        writeln!(
            o,
            "|---|---:|---|---|---|---:|---:|---|---|---|---:|---|---|"
        )?;
        for (l, x) in others {
            write!(o, "| {} | {} ", md_cell(&x.rung), x.voxels)?;
            row(o, l, x, false)?;
        }
    }
    Ok(())
}

/// The levers' second metrics over the same pairs, described and not judged;
/// nothing when no lever names one.
fn write_second(o: &mut String, r: &Ranking) -> std::fmt::Result {
    let rows = second_rows(r);
    if rows.is_empty() {
        return Ok(());
    }
    writeln!(o)?;
    writeln!(o, "## Second metrics")?;
    writeln!(o)?;
    writeln!(
        o,
        "Read off the same pairs as each lever's metric; described, not judged (the verdict is the first metric's)."
    )?;
    writeln!(o)?;
    writeln!(o, "| {} |", SECOND_HEAD.join(" | "))?;
    writeln!(o, "|---|---|---|---:|---:|---:|---|---|---|")?;
    for row in rows {
        let cells: Vec<String> = row.iter().map(|c| md_cell(c)).collect();
        writeln!(o, "| {} |", cells.join(" | "))?;
    }
    Ok(())
}

/// Where a lever's pairs at a rung ran on two or more hosts: each host's own
/// effect and verdict, and the heterogeneity figure with what rank did with it;
/// nothing when every lever's pairs ran on one host.
fn write_hosts(o: &mut String, r: &Ranking) -> std::fmt::Result {
    let lines = host_lines(r);
    if lines.is_empty() {
        return Ok(());
    }
    writeln!(o)?;
    writeln!(o, "## Hosts")?;
    writeln!(o)?;
    writeln!(
        o,
        "Pairs are formed within one host. Where two or more hosts contributed a lever's pairs at a rung: each host's effect from its own pairs (its saving judged alone against the hypothesis), then whether the hosts agree (specs/hosts.md); only then are the pairs pooled."
    )?;
    writeln!(o)?;
    writeln!(
        o,
        "| lever | rung | host | pairs | baseline median | saving | ratio | verdict (this host alone) |"
    )?;
    writeln!(o, "|---|---|---|---:|---:|---|---|---|")?;
    for l in &r.levers {
        for x in std::iter::once(&l.reference).chain(&l.other_rungs) {
            let Some(b) = &x.hosts else { continue };
            for h in &b.hosts {
                write!(
                    o,
                    "| {} | {} | {} | {} | ",
                    md_cell(&l.id),
                    md_cell(&x.rung),
                    md_code_cell(&h.label),
                    h.pairs
                )?;
                match (&h.effect, h.saving_fraction) {
                    (Some(e), Some((s, ci))) => write!(
                        o,
                        "{} | {} [{}, {}] | {} [{}, {}] ",
                        value(e.baseline_median, l.unit),
                        pct(s),
                        pct(ci.lo),
                        pct(ci.hi),
                        fixed(e.ratio, 3),
                        fixed(e.ratio_ci.lo, 3),
                        fixed(e.ratio_ci.hi, 3)
                    )?,
                    _ => write!(o, "— | — | — ")?,
                }
                writeln!(o, "| {} |", md_cell(&h.verdict.label()))?;
            }
        }
    }
    writeln!(o)?;
    for line in lines {
        writeln!(o, "- {}", md_cell(&line))?;
    }
    Ok(())
}

/// Runs flagged as outliers or first-init, per lever and rung, with the verdict
/// with and without their pairs; nothing when none is flagged.
fn write_flagged(o: &mut String, r: &Ranking) -> std::fmt::Result {
    let lines = flagged_lines(r);
    if lines.is_empty() {
        return Ok(());
    }
    writeln!(o)?;
    writeln!(o, "## Flagged runs ({})", lines.len())?;
    writeln!(o)?;
    for l in lines {
        writeln!(o, "- {}", md_cell(&l))?;
    }
    Ok(())
}

/// Pairs of numerics-preserving levers whose frames differ, right below the
/// ranking (a bug detector); nothing when there are none.
fn write_flags(o: &mut String, r: &Ranking) -> std::fmt::Result {
    if r.fidelity_flags.is_empty() {
        return Ok(());
    }
    writeln!(o, "## Fidelity flags ({})", r.fidelity_flags.len())?;
    writeln!(o)?;
    writeln!(
        o,
        "Levers declared numerics-preserving whose treatment frames differ from the baseline's: a bug in the lever or a wrong declaration in specs/levers.toml."
    )?;
    writeln!(o)?;
    for f in &r.fidelity_flags {
        writeln!(o, "- **FLAGGED** {}", md_cell(f))?;
    }
    writeln!(o)?;
    Ok(())
}

/// Per lever and rung with pairs: numerics, the PSNR figures, the rule and its
/// threshold, and the floors measured.
fn write_fidelity(o: &mut String, r: &Ranking) -> std::fmt::Result {
    writeln!(o)?;
    writeln!(o, "## Fidelity")?;
    writeln!(o)?;
    writeln!(
        o,
        "Each pair's treatment frames against its baseline's: PSNR over the 8-bit RGB samples of the frame images both bundles keep (first, middle, last; pooled), `inf` when identical; max abs = the largest difference of one sample (0-255); frames = the frames whose sha256 (frames.parquet) both bundles hold, and how many differ. Median over pairs with a {:.0}% bootstrap interval.",
        CONFIDENCE * 100.0
    )?;
    writeln!(o)?;
    writeln!(
        o,
        "| lever | numerics | rung | pairs compared | median PSNR [95%] | min PSNR | max abs | frames differing | rule |"
    )?;
    writeln!(o, "|---|---|---|---:|---|---|---:|---:|---|")?;
    for l in &r.levers {
        for x in std::iter::once(&l.reference).chain(&l.other_rungs) {
            let f = &x.fidelity;
            if f.pairs.is_empty() && f.not_compared.is_empty() {
                continue;
            }
            let (fc, fd): (usize, usize) = f.pairs.iter().fold((0, 0), |(c, d), p| {
                (c + p.frames_compared, d + p.frames_differing)
            });
            let rule = match (l.numerics, &f.threshold, &f.rule) {
                (Numerics::Preserving, ..) if f.flagged.is_empty() => "identical".to_string(),
                (Numerics::Preserving, ..) => "**FLAGGED**: identical frames expected".to_string(),
                (Numerics::Changing, Some(t), Some(c)) => format!(
                    "lower end >= {} dB ({}): {}",
                    db(t.psnr_db),
                    t.source,
                    match c {
                        fidelity::RuleCheck::Passes => "passes".to_string(),
                        fidelity::RuleCheck::Fails { why } => format!("fails: {why}"),
                        fidelity::RuleCheck::Undecided { why } => format!("undecided: {why}"),
                    }
                ),
                _ => "—".to_string(),
            };
            writeln!(
                o,
                "| {} | {} | {} | {} of {} | {} | {} | {} | {fd} of {fc} | {} |",
                l.id,
                match l.numerics {
                    Numerics::Preserving => "preserving",
                    Numerics::Changing => "changing",
                },
                md_cell(&x.rung),
                f.pairs.len(),
                f.pairs.len() + f.not_compared.len(),
                match (f.median_psnr_db, f.median_psnr_ci) {
                    (Some(m), Some(ci)) => format!("{} [{}, {}] dB", db(m), db(ci.lo), db(ci.hi)),
                    _ => "—".into(),
                },
                f.min_psnr_db
                    .map_or("—".into(), |m| format!("{} dB", db(m))),
                f.max_abs_error.map_or("—".into(), |m| m.to_string()),
                md_cell(&rule)
            )?;
        }
    }
    writeln!(o)?;
    for line in floor_lines(r) {
        writeln!(o, "{line}")?;
    }
    write_vs_reference(o, r)?;
    let uncompared: Vec<String> = r
        .levers
        .iter()
        .flat_map(|l| {
            std::iter::once(&l.reference)
                .chain(&l.other_rungs)
                .map(move |x| (l, x))
        })
        .flat_map(|(l, x)| {
            x.fidelity.not_compared.iter().map(move |n| {
                format!(
                    "{} at rung {} (`{}`/`{}`): {}",
                    l.id,
                    md_cell(&x.rung),
                    short(&n.baseline_id),
                    short(&n.treatment_id),
                    md_cell(&n.why)
                )
            })
        })
        .collect();
    if !uncompared.is_empty() {
        writeln!(o)?;
        writeln!(o, "Pairs whose frames were not compared:")?;
        writeln!(o)?;
        for u in uncompared {
            writeln!(o, "- {u}")?;
        }
    }
    Ok(())
}

/// The phase-scaling fit, or what is missing for one.
fn write_fit(o: &mut String, r: &Ranking) -> std::fmt::Result {
    writeln!(o)?;
    writeln!(o, "## Phase scaling (fixed + per-voxel, least squares)")?;
    writeln!(o)?;
    match &r.fit {
        FitOutcome::Missing(m) => writeln!(o, "No fit: missing {}.", m.missing)?,
        FitOutcome::Fit(fits) => {
            writeln!(o, "{}", method_text())?;
            for f in fits.iter() {
                writeln!(o)?;
                write_one_fit(o, f)?;
            }
        }
    }
    Ok(())
}

/// One model's fit: its group, the phase table and the phases that do not scale.
fn write_one_fit(o: &mut String, f: &ScalingFit) -> std::fmt::Result {
    let rungs: Vec<String> = f
        .rungs
        .iter()
        .map(|(v, n)| format!("rung {} ({v} voxels)", md_cell(n)))
        .collect();
    writeln!(
        o,
        "Group: engine `{}`, host {}, weights {}, config {}; {}; {} bundle(s). A phase does not scale when its scaling exponent (0 = constant, 1 = proportional to voxels) is below {}.",
        short(&f.engine_sha256),
        md_code(&f.host),
        md_code(&f.model),
        md_code(&f.config),
        rungs.join(", "),
        f.bundle_ids.len(),
        fixed(FLAT_EXPONENT, 2)
    )?;
    writeln!(o)?;
    writeln!(
        o,
        "| phase | points | fixed | per Mvoxel | R² | exponent | mean at largest rung | share of wall | scales | left out (outlier at its rung) |"
    )?;
    writeln!(o, "|---|---:|---:|---:|---:|---:|---:|---:|---|---|")?;
    for p in &f.phases {
        writeln!(
            o,
            "| {} | {} | {} s | {} s | {} | {} | {} s | {} | {} | {} |",
            md_cell(&p.phase),
            p.points,
            fixed(p.fixed_s, 3),
            fixed(p.per_mvoxel_s, 3),
            fixed(p.r2, 3),
            p.exponent.map_or("n/a".into(), |e| fixed(e, 3)),
            fixed(p.mean_at_max_s, 3),
            pct(p.share_of_wall_at_max),
            if p.does_not_scale { "**no**" } else { "yes" },
            if p.left_out.is_empty() {
                "—".to_string()
            } else {
                p.left_out
                    .iter()
                    .map(|id| format!("`{}`", short(id)))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        )?;
    }
    let flat: Vec<String> = f
        .phases
        .iter()
        .filter(|p| p.does_not_scale)
        .map(|p| {
            format!(
                "{} ({} s fixed, {} of wall at the largest rung)",
                md_code(&p.phase),
                fixed(p.fixed_s, 3),
                pct(p.share_of_wall_at_max)
            )
        })
        .collect();
    writeln!(o)?;
    if flat.is_empty() {
        writeln!(o, "Phases that do not scale: none.")?;
    } else {
        writeln!(o, "Phases that do not scale: {}.", flat.join("; "))?;
    }
    Ok(())
}

/// How pairs, effects, intervals and verdicts are formed.
fn write_method(o: &mut String, r: &Ranking) -> std::fmt::Result {
    writeln!(o)?;
    writeln!(o, "## Method")?;
    writeln!(o)?;
    for line in method_lines(r) {
        writeln!(o, "- {line}")?;
    }
    Ok(())
}

/// Every pair used, with both bundle ids and values.
fn write_pairs(o: &mut String, r: &Ranking) -> std::fmt::Result {
    writeln!(o)?;
    writeln!(o, "## Pairs")?;
    writeln!(o)?;
    writeln!(o, "| lever | rung | round | campaign | baseline | treatment | baseline value | treatment value | flagged |")?;
    writeln!(o, "|---|---|---:|---|---|---|---:|---:|---|")?;
    for l in &r.levers {
        for x in std::iter::once(&l.reference).chain(&l.other_rungs) {
            for p in &x.rounds {
                writeln!(
                    o,
                    "| {} | {} | {} | {} | `{}` | `{}` | {} | {} | {} |",
                    l.id,
                    md_cell(&x.rung),
                    p.cell.round,
                    md_code_cell(short(&p.cell.campaign)),
                    short(&p.baseline_id),
                    short(&p.treatment_id),
                    value(p.pair.baseline, l.unit),
                    value(p.pair.treatment, l.unit),
                    md_cell(&pair_flags(x, p, l.unit))
                )?;
            }
        }
    }
    Ok(())
}

/// Every bundle not used, with the reason.
fn write_excluded(o: &mut String, r: &Ranking) -> std::fmt::Result {
    writeln!(o)?;
    writeln!(o, "## Excluded bundles ({})", r.excluded.len())?;
    writeln!(o)?;
    if r.excluded.is_empty() {
        writeln!(o, "None.")?;
    } else {
        writeln!(o, "| bundle | reason |")?;
        writeln!(o, "|---|---|")?;
        for e in &r.excluded {
            writeln!(o, "| {} | {} |", md_code_cell(&e.id), md_cell(&e.reason))?;
        }
    }
    Ok(())
}

/// Every bundle used in a pair.
fn write_used(o: &mut String, r: &Ranking) -> std::fmt::Result {
    writeln!(o)?;
    writeln!(o, "## Bundles used ({})", r.used.len())?;
    writeln!(o)?;
    for id in &r.used {
        writeln!(o, "- `{id}`")?;
    }
    Ok(())
}

/// The columns from `lever` to `verdict` of one ranking row.
fn row(o: &mut String, l: &LeverResult, x: &RungResult, with_rank: bool) -> std::fmt::Result {
    if with_rank {
        let (rank, prior) = rank_cells(l);
        write!(o, "| {rank} | {prior} ")?;
    }
    write!(
        o,
        "| {} | {} | {} | {} | ",
        md_cell(&l.id),
        md_cell(&arms_text(l)),
        md_cell(&l.metric),
        x.rounds.len()
    )?;
    match (&x.effect, x.saving_fraction) {
        (Some(e), Some((s, ci))) => write!(
            o,
            "{} | {} [{}, {}] | {} [{}, {}] | {} [{}, {}] ",
            value(e.baseline_median, l.unit),
            pct(s),
            pct(ci.lo),
            pct(ci.hi),
            value(e.saving, l.unit),
            value(e.saving_ci.lo, l.unit),
            value(e.saving_ci.hi, l.unit),
            fixed(e.ratio, 3),
            fixed(e.ratio_ci.lo, 3),
            fixed(e.ratio_ci.hi, 3)
        )?,
        _ => write!(o, "— | — | — | — ")?,
    }
    writeln!(
        o,
        "| {} | {} | {} |",
        pct(l.min_effect),
        md_cell(&verdict_text(x)),
        fidelity::cell(&x.fidelity)
    )
}

/// The changing levers' arms against the reference's f32 frames
/// ([`fidelity::VsReference`]), one row per lever and rung that has them.
fn write_vs_reference(o: &mut String, r: &Ranking) -> std::fmt::Result {
    let rows = reference_rows(r);
    if rows.is_empty() {
        return Ok(());
    }
    writeln!(o)?;
    writeln!(o, "{}", reference_intro())?;
    writeln!(o)?;
    writeln!(o, "| {} |", REFERENCE_HEAD.join(" | "))?;
    writeln!(o, "|---|---|---|---|---|")?;
    for [id, rung, refs, b, t] in rows {
        let refs: Vec<String> = refs.split(", ").map(|i| format!("`{i}`")).collect();
        writeln!(
            o,
            "| {id} | {} | {} | {} | {} |",
            md_cell(&rung),
            refs.join(", "),
            md_cell(&b),
            md_cell(&t)
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::ranking_text::GIB;
    use crate::levers_spec::Unit;

    /// A lever measured `with` another lever's arm shows it in the arms cell of
    /// the ranking table; a lever without one renders as before, and the runs
    /// outside the condition are listed among the excluded bundles. Mutation that
    /// turns this red: the row printing `baseline→treatment` alone (or
    /// [`arms_text`] ignoring `with`).
    #[test]
    fn a_levers_with_is_shown_in_its_arms_cell() {
        use crate::rank::pairing::tests::spec;
        use crate::rank::tests::on_host;
        use std::collections::BTreeMap;
        let mut bundles = Vec::new();
        for (round, arm, s) in [
            (1, "serial", 10.0),
            (1, "batched", 5.0),
            (2, "serial", 10.0),
            (2, "batched", 5.1),
            (3, "serial", 10.0),
            (3, "batched", 4.9),
        ] {
            let mut b = on_host("a", round, arm, s);
            b.levers.insert("vae".into(), "device".into());
            bundles.push(b);
        }
        let mut off = on_host("a", 4, "serial", 10.0);
        off.levers.insert("vae".into(), "host".into());
        bundles.push(off);

        let plain = markdown(&crate::rank::rank(&spec(), &bundles, &[], &[], "t"));
        assert!(
            plain.contains("| staging | serial→batched | wall(load.dit) | 3 |"),
            "{plain}"
        );
        let mut s = spec();
        s.levers[0].with = BTreeMap::from([("vae".to_string(), "device".to_string())]);
        let md = markdown(&crate::rank::rank(&s, &bundles, &[], &[], "t"));
        assert!(
            md.contains("| staging | serial→batched (vae=device) | wall(load.dit) | 3 |"),
            "{md}"
        );
        assert!(
            md.contains(
                "| `a-4-serial` | not under the lever's with: staging is measured with \
                 vae=device in both arms, and this run lacks vae=device (it ran vae=host) |"
            ),
            "{md}"
        );
    }

    #[test]
    fn fixed_formats_never_print_negative_zero() {
        assert_eq!(fixed(-0.0001, 3), "0.000");
        assert_eq!(fixed(-0.0, 1), "0.0");
        assert_eq!(fixed(-1.26, 1), "-1.3");
        assert_eq!(fixed(f64::NAN, 2), "n/a");
        assert_eq!(value(1.5 * GIB, Unit::Bytes), "1.500 GiB");
        assert_eq!(value(GIB, Unit::Bytes), "1.000 GiB");
        assert_eq!(value(18.5 * 1024.0 * 1024.0, Unit::Bytes), "18.500 MiB");
        assert_eq!(value(-3.0 * 1024.0 * 1024.0, Unit::Bytes), "-3.000 MiB");
        assert_eq!(value(2.0, Unit::Seconds), "2.000 s");
    }
}
