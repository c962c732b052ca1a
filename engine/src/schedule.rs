//! The denoise loop's arithmetic, as the reference LTX-Video pipeline (diffusers
//! `LTXPipeline` with `FlowMatchEulerDiscreteScheduler`) does it:
//!
//! - the sigma schedule for `(steps, video tokens)`: `linspace(1, 1/steps,
//!   steps)`, then the resolution-dependent exponential time shift with
//!   `mu` interpolated linearly in the token count, then the stretch that makes
//!   the last sigma equal `shift_terminal`, then a final 0;
//! - the Euler update `x += (sigma_next - sigma) * v`;
//! - classifier-free guidance `v = v_uncond + g (v_cond - v_uncond)`;
//! - latent (de)normalisation with the VAE's per-channel statistics and the
//!   decode-timestep noise mix `z = (1 - s) z + s * noise`.
//!
//! Arithmetic is f32 where the reference computes in f32 (numpy f32 arrays and
//! torch f32 tensors), so sigmas agree to the last bit or within one ulp.

use serde::{Deserialize, Serialize};

/// The scheduler's `scheduler_config.json` (diffusers field names). Only the
/// flow-matching Euler variant LTX-Video ships is supported.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SchedulerConfig {
    /// Timesteps per unit sigma (1000): the transformer sees `sigma * 1000`.
    pub num_train_timesteps: usize,
    /// Static shift (used when dynamic shifting is off).
    pub shift: f64,
    /// Whether the shift depends on the token count (LTX-Video: true).
    pub use_dynamic_shifting: bool,
    /// `mu` at `base_image_seq_len` tokens.
    pub base_shift: f64,
    /// `mu` at `max_image_seq_len` tokens.
    pub max_shift: f64,
    /// Token count where `mu = base_shift`.
    pub base_image_seq_len: usize,
    /// Token count where `mu = max_shift`.
    pub max_image_seq_len: usize,
    /// Value the last non-zero sigma is stretched to (LTX-Video: 0.1).
    pub shift_terminal: Option<f64>,
    /// `exponential` (LTX-Video) or `linear`.
    pub time_shift_type: String,
}

/// A schedule that cannot be computed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScheduleError {
    /// Too few steps for this config.
    #[error("{steps} denoising steps: {detail}")]
    Steps {
        /// Steps asked for.
        steps: usize,
        /// Why they do not work.
        detail: &'static str,
    },
    /// The config names a variant that is not implemented.
    #[error("scheduler config field '{field}': {detail}")]
    Config {
        /// The field.
        field: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// The sigmas over this many tokens are not finite and strictly decreasing
    /// (the shift `exp(mu)` grows with the token count).
    #[error(
        "{steps} steps over {tokens} latent tokens: the schedule is not finite and strictly decreasing (sigma {index} = {value}); rungs allow at most {max} tokens"
    )]
    NotFinite {
        /// Steps asked for.
        steps: usize,
        /// Latent tokens.
        tokens: usize,
        /// The first sigma that is not finite or not below its predecessor.
        index: usize,
        /// Its value.
        value: f32,
        /// The rung validator's bound (`evidence::rung::MAX_LATENT_TOKENS`).
        max: u64,
    },
    /// Buffers of different lengths were combined.
    #[error("{what}: lengths {a} and {b} differ")]
    Length {
        /// The operation.
        what: &'static str,
        /// First length.
        a: usize,
        /// Second length.
        b: usize,
    },
}

impl SchedulerConfig {
    /// The scheduler config of the Lightricks LTX-Video diffusers release:
    /// dynamic exponential shift between mu 0.95 (1024 tokens) and 2.05 (4096
    /// tokens), stretched to end at sigma 0.1.
    pub fn ltx_video() -> Self {
        SchedulerConfig {
            num_train_timesteps: 1000,
            shift: 1.0,
            use_dynamic_shifting: true,
            base_shift: 0.95,
            max_shift: 2.05,
            base_image_seq_len: 1024,
            max_image_seq_len: 4096,
            shift_terminal: Some(0.1),
            time_shift_type: "exponential".into(),
        }
    }

    /// The `scheduler_config.json` diffusers writes for this config.
    pub fn to_config_json(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or(serde_json::Value::Null);
        if let Some(m) = v.as_object_mut() {
            m.insert(
                "_class_name".into(),
                "FlowMatchEulerDiscreteScheduler".into(),
            );
            m.insert("_diffusers_version".into(), "0.32.0".into());
            for k in [
                "invert_sigmas",
                "use_karras_sigmas",
                "use_exponential_sigmas",
                "use_beta_sigmas",
                "stochastic_sampling",
            ] {
                m.insert(k.into(), false.into());
            }
        }
        v
    }

    /// The shift parameter `mu` for a video of `tokens` latent tokens.
    pub fn mu(&self, tokens: usize) -> f64 {
        let m = (self.max_shift - self.base_shift)
            / (self.max_image_seq_len as f64 - self.base_image_seq_len as f64);
        let b = self.base_shift - m * self.base_image_seq_len as f64;
        tokens as f64 * m + b
    }
}

/// The `steps + 1` sigmas of a denoise over `tokens` latent tokens, from 1.0
/// (pure noise) down to the terminal sigma, then 0. Step `i` evaluates the
/// transformer at `sigmas[i]` and moves the latents to `sigmas[i + 1]`.
pub fn sigmas(
    cfg: &SchedulerConfig,
    steps: usize,
    tokens: usize,
) -> Result<Vec<f32>, ScheduleError> {
    if steps == 0 {
        return Err(ScheduleError::Steps {
            steps,
            detail: "at least one step is needed",
        });
    }
    if cfg.shift_terminal.is_some() && steps < 2 {
        return Err(ScheduleError::Steps {
            steps,
            detail: "the terminal stretch needs at least 2 steps (the reference divides by zero)",
        });
    }
    // As diffusers does: numpy.linspace(1.0, 1/steps, steps), the time shift and
    // the terminal stretch all in f64, cast to f32 at the end.
    let stop = 1.0 / steps as f64;
    let step = if steps > 1 {
        (stop - 1.0) / (steps - 1) as f64
    } else {
        0.0
    };
    let mut s: Vec<f64> = (0..steps)
        .map(|i| {
            if i + 1 == steps {
                stop
            } else {
                1.0 + i as f64 * step
            }
        })
        .collect();
    if cfg.use_dynamic_shifting {
        let mu = cfg.mu(tokens);
        let e = match cfg.time_shift_type.as_str() {
            "exponential" => mu.exp(),
            "linear" => mu,
            other => {
                return Err(ScheduleError::Config {
                    field: "time_shift_type",
                    detail: format!("'{other}' is neither 'exponential' nor 'linear'"),
                })
            }
        };
        for x in &mut s {
            *x = e / (e + (1.0 / *x - 1.0));
        }
    } else {
        let sh = cfg.shift;
        for x in &mut s {
            *x = sh * *x / (1.0 + (sh - 1.0) * *x);
        }
    }
    if let Some(term) = cfg.shift_terminal {
        let last = 1.0 - s[steps - 1];
        let scale = last / (1.0 - term);
        for x in &mut s {
            *x = 1.0 - (1.0 - *x) / scale;
        }
    }
    let mut out: Vec<f32> = s.iter().map(|&x| x as f32).collect();
    out.push(0.0);
    // A schedule the loop can follow: finite, and every sigma below the last.
    for i in 0..out.len() {
        let bad = !out[i].is_finite() || (i > 0 && out[i] >= out[i - 1]);
        if bad {
            return Err(ScheduleError::NotFinite {
                steps,
                tokens,
                index: i,
                value: out[i],
                max: evidence::rung::MAX_LATENT_TOKENS,
            });
        }
    }
    Ok(out)
}

/// One Euler step of the flow ODE: `x += (sigma_next - sigma) * velocity`.
pub fn euler_step(
    latents: &mut [f32],
    velocity: &[f32],
    sigma: f32,
    sigma_next: f32,
) -> Result<(), ScheduleError> {
    if latents.len() != velocity.len() {
        return Err(ScheduleError::Length {
            what: "euler_step",
            a: latents.len(),
            b: velocity.len(),
        });
    }
    let dt = sigma_next - sigma;
    for (x, v) in latents.iter_mut().zip(velocity) {
        *x += dt * *v;
    }
    Ok(())
}

/// Classifier-free guidance: `uncond + scale * (cond - uncond)`.
pub fn cfg_combine(uncond: &[f32], cond: &[f32], scale: f32) -> Result<Vec<f32>, ScheduleError> {
    if uncond.len() != cond.len() {
        return Err(ScheduleError::Length {
            what: "cfg_combine",
            a: uncond.len(),
            b: cond.len(),
        });
    }
    Ok(uncond
        .iter()
        .zip(cond)
        .map(|(u, c)| u + scale * (c - u))
        .collect())
}

/// Latents `[C, F, H, W]` (channel-first) from the VAE's space to the
/// transformer's: `(z - mean[c]) * scaling_factor / std[c]`.
pub fn normalize_latents(
    z: &mut [f32],
    mean: &[f32],
    std: &[f32],
    scaling_factor: f32,
) -> Result<(), ScheduleError> {
    per_channel(z, mean, std, "normalize_latents", |x, m, s| {
        (x - m) * scaling_factor / s
    })
}

/// Latents `[C, F, H, W]` from the transformer's space to the VAE's:
/// `z * std[c] / scaling_factor + mean[c]`.
pub fn denormalize_latents(
    z: &mut [f32],
    mean: &[f32],
    std: &[f32],
    scaling_factor: f32,
) -> Result<(), ScheduleError> {
    per_channel(z, mean, std, "denormalize_latents", |x, m, s| {
        x * s / scaling_factor + m
    })
}

fn per_channel(
    z: &mut [f32],
    mean: &[f32],
    std: &[f32],
    what: &'static str,
    f: impl Fn(f32, f32, f32) -> f32,
) -> Result<(), ScheduleError> {
    let c = mean.len();
    if std.len() != c {
        return Err(ScheduleError::Length {
            what,
            a: c,
            b: std.len(),
        });
    }
    if c == 0 || z.len() % c != 0 {
        return Err(ScheduleError::Length {
            what,
            a: z.len(),
            b: c,
        });
    }
    let per = z.len() / c;
    for (ch, plane) in z.chunks_mut(per).enumerate() {
        for x in plane {
            *x = f(*x, mean[ch], std[ch]);
        }
    }
    Ok(())
}

/// The decode-timestep noise mix: `z = (1 - s) z + s * noise`.
pub fn mix_decode_noise(z: &mut [f32], noise: &[f32], s: f32) -> Result<(), ScheduleError> {
    if z.len() != noise.len() {
        return Err(ScheduleError::Length {
            what: "mix_decode_noise",
            a: z.len(),
            b: noise.len(),
        });
    }
    let keep = 1.0 - s;
    for (x, n) in z.iter_mut().zip(noise) {
        *x = keep * *x + s * *n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mu_interpolates_between_base_and_max() {
        let c = SchedulerConfig::ltx_video();
        assert!((c.mu(1024) - 0.95).abs() < 1e-12);
        assert!((c.mu(4096) - 2.05).abs() < 1e-12);
        // 768x512x121 -> 6144 tokens extrapolates past max_shift.
        assert!((c.mu(6144) - (0.95 + 1.1 * 5120.0 / 3072.0)).abs() < 1e-12);
    }

    #[test]
    fn sigmas_by_hand_for_four_steps_at_1024_tokens() {
        // mu = 0.95: shifted s' = e^0.95 / (e^0.95 + 1/s - 1) for s = 1, .75, .5, .25,
        // then stretched so the last equals 0.1: s'' = 1 - (1 - s') * 0.9 / (1 - s'_3).
        let e = 0.95f64.exp();
        let sh: Vec<f64> = [1.0, 0.75, 0.5, 0.25]
            .iter()
            .map(|s| e / (e + 1.0 / s - 1.0))
            .collect();
        let k = 0.9 / (1.0 - sh[3]);
        let want: Vec<f64> = sh.iter().map(|s| 1.0 - (1.0 - s) * k).collect();
        let got = sigmas(&SchedulerConfig::ltx_video(), 4, 1024).unwrap();
        assert_eq!(got.len(), 5);
        assert_eq!(got[0], 1.0);
        assert!((got[3] - 0.1).abs() < 1e-6, "{got:?}");
        assert_eq!(got[4], 0.0);
        for i in 0..4 {
            assert!(
                (got[i] as f64 - want[i]).abs() < 1e-7,
                "{i}: {got:?} vs {want:?}"
            );
        }
        // Strictly decreasing.
        assert!(got.windows(2).all(|w| w[0] > w[1]));
    }

    #[test]
    fn more_tokens_shift_sigmas_up() {
        let c = SchedulerConfig::ltx_video();
        let lo = sigmas(&c, 8, 256).unwrap();
        let hi = sigmas(&c, 8, 6144).unwrap();
        assert!((1..7).all(|i| hi[i] > lo[i]), "{lo:?} {hi:?}");
    }

    #[test]
    fn the_rung_bound_on_tokens_keeps_every_step_count_finite_and_decreasing() {
        let c = SchedulerConfig::ltx_video();
        let max = evidence::rung::MAX_LATENT_TOKENS as usize;
        for steps in 2..=1000 {
            let s = sigmas(&c, steps, max)
                .unwrap_or_else(|e| panic!("{steps} steps at the rung bound: {e}"));
            assert_eq!(s.len(), steps + 1);
        }
        // Far past the bound the schedule is refused, not NaN: the documented
        // maximum geometry 8192x8192x1025 is 129x256x256 tokens.
        let e = sigmas(&c, 2, 129 * 256 * 256).unwrap_err().to_string();
        assert!(e.contains("not finite") && e.contains("8454144"), "{e}");
        let e = sigmas(&c, 1000, 200_000).unwrap_err().to_string();
        assert!(e.contains("not finite and strictly decreasing"), "{e}");
    }

    /// The largest token count (by bisection over 1024..10^6) at which `ok`
    /// holds for every step count in `steps`.
    fn largest_tokens(
        steps: &[usize],
        ok: impl Fn(&Result<Vec<f32>, ScheduleError>) -> bool,
    ) -> usize {
        let c = SchedulerConfig::ltx_video();
        let all = |t: usize| steps.iter().all(|&n| ok(&sigmas(&c, n, t)));
        let (mut lo, mut hi) = (1024usize, 1_000_000usize);
        assert!(all(lo) && !all(hi));
        while hi - lo > 1 {
            let mid = (lo + hi) / 2;
            if all(mid) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// The figures `evidence::rung::MAX_LATENT_TOKENS` is argued from: the f64
    /// schedule stays strictly decreasing for every step count 2..=1000 up to
    /// about 81,600 tokens, and its sigmas stay finite up to about 101,000.
    #[test]
    fn the_schedule_limits_the_rung_bound_is_argued_from() {
        let every: Vec<usize> = (2..=1000).collect();
        let decreasing = largest_tokens(&every, |r| r.is_ok());
        assert!((81_000..82_500).contains(&decreasing), "{decreasing}");
        let finite = largest_tokens(&[2, 3, 10, 1000], |r| match r {
            Ok(_) => true,
            Err(ScheduleError::NotFinite { value, .. }) => value.is_finite(),
            Err(_) => false,
        });
        assert!((100_000..102_000).contains(&finite), "{finite}");
        assert!(evidence::rung::MAX_LATENT_TOKENS < decreasing as u64);
        eprintln!("strictly decreasing up to {decreasing} tokens, finite up to {finite}");
    }

    #[test]
    fn one_step_with_terminal_stretch_is_refused() {
        assert!(matches!(
            sigmas(&SchedulerConfig::ltx_video(), 1, 8),
            Err(ScheduleError::Steps { .. })
        ));
        assert!(sigmas(&SchedulerConfig::ltx_video(), 0, 8).is_err());
    }

    #[test]
    fn euler_cfg_and_latent_maps_by_hand() {
        let mut x = vec![1.0, -2.0];
        euler_step(&mut x, &[0.5, 4.0], 0.75, 0.5).unwrap();
        assert_eq!(x, vec![0.875, -3.0]);
        assert!(euler_step(&mut x, &[1.0], 0.5, 0.0).is_err());

        assert_eq!(
            cfg_combine(&[1.0, 2.0], &[3.0, 0.0], 3.0).unwrap(),
            vec![7.0, -4.0]
        );

        // Two channels, two voxels each.
        let mut z = vec![1.0, 2.0, 3.0, 4.0];
        denormalize_latents(&mut z, &[0.5, -1.0], &[2.0, 0.25], 1.0).unwrap();
        assert_eq!(z, vec![2.5, 4.5, -0.25, 0.0]);
        normalize_latents(&mut z, &[0.5, -1.0], &[2.0, 0.25], 1.0).unwrap();
        assert_eq!(z, vec![1.0, 2.0, 3.0, 4.0]);
        assert!(denormalize_latents(&mut z, &[0.0; 3], &[1.0; 3], 1.0).is_err());

        let mut z = vec![1.0, -1.0];
        mix_decode_noise(&mut z, &[3.0, 1.0], 0.25).unwrap();
        assert_eq!(z, vec![1.5, -0.5]);
    }
}
