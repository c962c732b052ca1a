//! Whether the hosts of a lever's pairs measured one effect: the spread of the
//! per-host mean log ratios against the spread of the pairs within each host
//! (`specs/hosts.md` argues the rule; [`crate::rank::hosts`] applies it).
//!
//! With `y` a pair's `ln(treatment / baseline)`, `k` hosts, `n_h` pairs on host
//! `h`, `N` pairs in all, `ȳ_h` a host's mean and `ȳ` the mean of every pair:
//!
//! * between hosts: `SS_b = Σ n_h (ȳ_h − ȳ)²` on `k − 1` degrees of freedom;
//! * within hosts: `SS_w = Σ_h Σ_j (y_hj − ȳ_h)²` on `N − k` degrees of freedom,
//!   one variance `s² = SS_w / (N − k)` pooled over every host;
//! * Cochran's `Q = SS_b / s²` (each host's mean weighted by `n_h / s²`, the
//!   inverse of its variance), `F = Q / (k − 1)`, and the p-value of `F` under
//!   Fisher's F distribution with `(k − 1, N − k)` degrees of freedom (the one-way
//!   analysis of variance with the host as the factor; exact when the log ratios
//!   are normal within a host);
//! * `I² = max(0, (Q − (k − 1)) / Q)`: the share of the spread of the host means
//!   that their pairs' own noise does not explain (Higgins and Thompson, 2002).
//!
//! The hosts disagree when `p <` [`ALPHA`]. Without a within-host degree of
//! freedom (every host has one pair) nothing can be said and every figure is
//! `None`.

use serde::Serialize;

/// The level below which the hosts' effects are taken to differ.
pub const ALPHA: f64 = 0.05;

/// The spread of the per-host effects against their pairs' spread.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Heterogeneity {
    /// Hosts with at least one pair (`k`).
    pub hosts: usize,
    /// Pairs over every host (`N`).
    pub pairs: usize,
    /// Between-host degrees of freedom, `k − 1`.
    pub df_between: usize,
    /// Within-host degrees of freedom, `N − k`.
    pub df_within: usize,
    /// Cochran's Q (dimensionless; `inf` when the pairs agree exactly within each
    /// host but the hosts differ); `None` without a within-host degree of freedom.
    pub q: Option<f64>,
    /// `F = Q / (k − 1)`; `None` as for `q`.
    pub f: Option<f64>,
    /// The p-value of `F` under `F(k − 1, N − k)`, 0..1; `None` as for `q`.
    pub p: Option<f64>,
    /// `I²` as a fraction 0..1; `None` as for `q`.
    pub i2: Option<f64>,
}

impl Heterogeneity {
    /// Whether the test could be made and says the hosts differ (`p <` [`ALPHA`]).
    pub fn disagree(&self) -> bool {
        self.p.is_some_and(|p| p < ALPHA)
    }
}

/// The heterogeneity of `groups`, each host's pairs' log ratios (empty groups are
/// ignored).
pub fn heterogeneity(groups: &[Vec<f64>]) -> Heterogeneity {
    let groups: Vec<&Vec<f64>> = groups.iter().filter(|g| !g.is_empty()).collect();
    let k = groups.len();
    let n: usize = groups.iter().map(|g| g.len()).sum();
    let mut out = Heterogeneity {
        hosts: k,
        pairs: n,
        df_between: k.saturating_sub(1),
        df_within: n.saturating_sub(k),
        q: None,
        f: None,
        p: None,
        i2: None,
    };
    if k < 2 || n <= k {
        return out;
    }
    let grand = groups.iter().flat_map(|g| g.iter()).sum::<f64>() / n as f64;
    let (mut ss_b, mut ss_w) = (0.0, 0.0);
    for g in &groups {
        let m = g.iter().sum::<f64>() / g.len() as f64;
        ss_b += g.len() as f64 * (m - grand).powi(2);
        ss_w += g.iter().map(|y| (y - m).powi(2)).sum::<f64>();
    }
    let (dfb, dfw) = (out.df_between as f64, out.df_within as f64);
    let (q, p) = if ss_w > 0.0 {
        let q = ss_b / (ss_w / dfw);
        (q, f_survival(q / dfb, dfb, dfw))
    } else if ss_b > 0.0 {
        (f64::INFINITY, 0.0)
    } else {
        (0.0, 1.0)
    };
    out.q = Some(q);
    out.f = Some(q / dfb);
    out.p = Some(p);
    out.i2 = Some(if q > dfb { 1.0 - dfb / q } else { 0.0 });
    out
}

/// `P(X > f)` for `X ~ F(d1, d2)`: the regularized incomplete beta function
/// `I_{d2 / (d2 + d1 f)}(d2 / 2, d1 / 2)`.
pub fn f_survival(f: f64, d1: f64, d2: f64) -> f64 {
    if f.is_nan() {
        return f64::NAN;
    }
    if f <= 0.0 {
        return 1.0;
    }
    if f.is_infinite() {
        return 0.0;
    }
    regularized_beta(d2 / (d2 + d1 * f), d2 / 2.0, d1 / 2.0)
}

/// The regularized incomplete beta function `I_x(a, b)` for `a, b > 0` and
/// `0 <= x <= 1`, by its continued fraction (modified Lentz), taken on the side
/// where it converges fast (`x < (a + 1) / (a + b + 2)`, else through
/// `1 − I_{1−x}(b, a)`).
pub fn regularized_beta(x: f64, a: f64, b: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let ln_front = ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln();
    if x < (a + 1.0) / (a + b + 2.0) {
        ln_front.exp() * beta_fraction(x, a, b) / a
    } else {
        1.0 - ln_front.exp() * beta_fraction(1.0 - x, b, a) / b
    }
}

/// The continued fraction of the incomplete beta function (Numerical Recipes'
/// `betacf`), to a relative step of 1e-15 or 300 terms.
fn beta_fraction(x: f64, a: f64, b: f64) -> f64 {
    const TINY: f64 = 1e-300;
    let (qab, qap, qam) = (a + b, a + 1.0, a - 1.0);
    let mut c = 1.0;
    let mut d = 1.0 - qab * x / qap;
    if d.abs() < TINY {
        d = TINY;
    }
    d = 1.0 / d;
    let mut h = d;
    for m in 1..=300 {
        let m = f64::from(m);
        let m2 = 2.0 * m;
        let aa = m * (b - m) * x / ((qam + m2) * (a + m2));
        d = 1.0 + aa * d;
        if d.abs() < TINY {
            d = TINY;
        }
        c = 1.0 + aa / c;
        if c.abs() < TINY {
            c = TINY;
        }
        d = 1.0 / d;
        h *= d * c;
        let aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2));
        d = 1.0 + aa * d;
        if d.abs() < TINY {
            d = TINY;
        }
        c = 1.0 + aa / c;
        if c.abs() < TINY {
            c = TINY;
        }
        d = 1.0 / d;
        let step = d * c;
        h *= step;
        if (step - 1.0).abs() < 1e-15 {
            break;
        }
    }
    h
}

/// `ln Γ(x)` for `x > 0` (Lanczos, g = 7, nine coefficients; about 15 digits).
pub fn ln_gamma(x: f64) -> f64 {
    const G: f64 = 7.0;
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection: Γ(x) Γ(1 − x) = π / sin(πx).
        return std::f64::consts::PI.ln()
            - (std::f64::consts::PI * x).sin().abs().ln()
            - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut s = C[0];
    for (i, c) in C.iter().enumerate().skip(1) {
        s += c / (x + i as f64);
    }
    let t = x + G + 0.5;
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + s.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    #[test]
    fn the_f_tail_matches_published_critical_values() {
        // Upper 5% points of F (any statistics table): F(1,2) 18.513,
        // F(1,4) 7.7086, F(2,6) 5.1433, F(3,20) 3.0984, F(1,10) 4.9646; upper 1%:
        // F(1,4) 21.198.
        for (f, d1, d2, p) in [
            (18.513, 1.0, 2.0, 0.05),
            (7.7086, 1.0, 4.0, 0.05),
            (5.1433, 2.0, 6.0, 0.05),
            (3.0984, 3.0, 20.0, 0.05),
            (4.9646, 1.0, 10.0, 0.05),
            (21.198, 1.0, 4.0, 0.01),
        ] {
            let got = f_survival(f, d1, d2);
            assert!(close(got, p, 2e-5), "F({d1},{d2}) > {f}: {got}, want {p}");
        }
        assert_eq!(f_survival(0.0, 1.0, 2.0), 1.0);
        assert_eq!(f_survival(f64::INFINITY, 1.0, 2.0), 0.0);
    }

    #[test]
    fn the_incomplete_beta_and_ln_gamma_match_closed_forms() {
        // I_x(1, 1) = x; I_x(a, 1) = x^a; I_0.5(a, a) = 0.5.
        for x in [0.01, 0.3, 0.5, 0.77, 0.999] {
            assert!(close(regularized_beta(x, 1.0, 1.0), x, 1e-13), "{x}");
            assert!(close(regularized_beta(x, 3.5, 1.0), x.powf(3.5), 1e-13));
        }
        for a in [0.5, 2.0, 7.5] {
            assert!(close(regularized_beta(0.5, a, a), 0.5, 1e-13), "{a}");
        }
        assert!(close(ln_gamma(1.0), 0.0, 1e-13));
        assert!(close(ln_gamma(5.0), 24f64.ln(), 1e-12));
        assert!(close(
            ln_gamma(0.5),
            std::f64::consts::PI.sqrt().ln(),
            1e-12
        ));
    }

    #[test]
    fn hosts_whose_means_differ_beyond_their_spread_disagree() {
        // Host a saves 30% (ln 0.7), host b nothing; each with +-1% noise.
        let a = vec![(0.70f64).ln(), (0.71f64).ln(), (0.69f64).ln()];
        let b = vec![(1.0f64).ln(), (1.01f64).ln(), (0.99f64).ln()];
        let h = heterogeneity(&[a.clone(), b]);
        assert_eq!((h.hosts, h.pairs, h.df_between, h.df_within), (2, 6, 1, 4));
        assert!(h.disagree(), "{h:?}");
        assert!(h.p.unwrap() < 1e-4, "{h:?}");
        assert!(h.i2.unwrap() > 0.99, "{h:?}");
        // The same noise around one effect: no disagreement, I² 0.
        let c = vec![(0.70f64).ln(), (0.69f64).ln(), (0.71f64).ln()];
        let h = heterogeneity(&[a, c]);
        assert!(!h.disagree(), "{h:?}");
        assert!(close(h.p.unwrap(), 1.0, 1e-9), "{h:?}");
        assert_eq!(h.i2, Some(0.0));
    }

    #[test]
    fn hand_computed_q_f_and_i2() {
        // Groups [0, 2] and [4, 6]: means 1 and 5, grand mean 3; SS_b = 2*4 + 2*4
        // = 16 on 1 df, SS_w = 2 + 2 = 4 on 2 df, s² = 2: Q = 8, F = 8,
        // I² = 1 - 1/8; P(F(1,2) > 8) = 1 - sqrt(8/10) (for d1 = 1, d2 = 2 the tail
        // is 1 - sqrt(f / (f + 2))).
        let h = heterogeneity(&[vec![0.0, 2.0], vec![4.0, 6.0]]);
        assert!(close(h.q.unwrap(), 8.0, 1e-12));
        assert!(close(h.f.unwrap(), 8.0, 1e-12));
        assert!(close(h.i2.unwrap(), 0.875, 1e-12));
        assert!(close(h.p.unwrap(), 1.0 - 0.8f64.sqrt(), 1e-12), "{h:?}");
    }

    #[test]
    fn without_a_within_host_degree_of_freedom_nothing_is_said() {
        let h = heterogeneity(&[vec![0.1], vec![-0.3], vec![]]);
        assert_eq!((h.hosts, h.df_within), (2, 0));
        assert_eq!((h.q, h.p, h.i2), (None, None, None));
        assert!(!h.disagree());
        // One host: no heterogeneity at all.
        let h = heterogeneity(&[vec![0.1, 0.2]]);
        assert_eq!((h.hosts, h.df_between, h.p), (1, 0, None));
        // Exact agreement within hosts, different hosts: infinitely heterogeneous.
        let h = heterogeneity(&[vec![0.1, 0.1], vec![0.2, 0.2]]);
        assert_eq!(
            (h.q, h.p, h.i2),
            (Some(f64::INFINITY), Some(0.0), Some(1.0))
        );
        assert!(h.disagree());
        let h = heterogeneity(&[vec![0.1, 0.1], vec![0.1, 0.1]]);
        assert_eq!((h.p, h.i2), (Some(1.0), Some(0.0)));
    }
}
