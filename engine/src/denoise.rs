//! The denoise loop's boundary: one [`Denoiser`] per device arm, driven step by
//! step by the pipeline ([`crate::pipeline`]), so the pipeline's phases and
//! markers are the same on both arms.
//!
//! A step is *queued* ([`Denoiser::enqueue`]) and then *waited for*
//! ([`Denoiser::wait`]). The pipeline queues step `k + 1` before it waits for step
//! `k`: the CPU arm only records the step when queued and computes it when waited
//! for (inside that step's phase), while the device arm launches the step's work
//! at once and returns, so the GPU always has the next step queued while the host
//! reports the current one. Latents stay inside the denoiser from
//! [`Denoiser::begin`] to [`Denoiser::finish`] (on the device for the CUDA arm:
//! one host copy at the end).

use std::collections::VecDeque;

use crate::models::dit::Transformer;
use crate::schedule;
use crate::tensor::Tensor;

/// One prompt's text conditioning.
#[derive(Debug, Clone)]
pub struct TextCond {
    /// Encoder states `[L, caption_channels]`.
    pub states: Tensor,
    /// `L` values, 1 for a real token and 0 for padding.
    pub mask: Vec<f32>,
}

/// What the denoise loop conditions on: the prompt, and with guidance the negative
/// prompt and the scale (`v = v_uncond + scale * (v_cond - v_uncond)`).
#[derive(Debug, Clone)]
pub struct Conditioning {
    /// The prompt.
    pub cond: TextCond,
    /// The negative prompt, when guidance is on.
    pub uncond: Option<TextCond>,
    /// Guidance scale (used only with `uncond`).
    pub guidance: f32,
}

impl Conditioning {
    /// Forwards per step: 2 with guidance, else 1.
    pub fn forwards_per_step(&self) -> usize {
        if self.uncond.is_some() {
            2
        } else {
            1
        }
    }
}

/// A denoising step failed.
#[derive(Debug, thiserror::Error)]
pub enum DenoiseError {
    /// The device arm failed.
    #[error(transparent)]
    Cuda(#[from] crate::cuda::CudaError),
    /// The CPU transformer refused its inputs.
    #[error("transformer forward, step {step}: {detail}")]
    Forward {
        /// Step (1-based).
        step: usize,
        /// The model's error.
        detail: String,
    },
    /// The step arithmetic (guidance, Euler) refused its inputs.
    #[error("denoise step {step}: {detail}")]
    Step {
        /// Step (1-based).
        step: usize,
        /// What was wrong.
        detail: String,
    },
    /// The latents stopped being finite.
    #[error("latents became non-finite {0}")]
    NonFinite(String),
    /// The pipeline drove the denoiser out of order (a bug in the caller).
    #[error("denoiser driven out of order: {0}")]
    Order(String),
}

/// The denoise loop of one arm.
pub trait Denoiser {
    /// `cpu` or `cuda`.
    fn arm(&self) -> &'static str;

    /// Take the initial latents `[tokens, 128]` (tokens in `(f, h, w)` raster order).
    fn begin(&mut self, latents: Tensor) -> Result<(), DenoiseError>;

    /// Queue step `step` (0-based) from `sigma` to `sigma_next`. At most two
    /// steps are queued and not yet waited for.
    fn enqueue(&mut self, step: usize, sigma: f32, sigma_next: f32) -> Result<(), DenoiseError>;

    /// Wait for step `step`, the oldest queued, calling `on_forward` as each of
    /// its forwards completes (in order, with the forward's device milliseconds
    /// on a device). Returns the step's device milliseconds on a device.
    fn wait(
        &mut self,
        step: usize,
        on_forward: &mut dyn FnMut(Option<f64>),
    ) -> Result<Option<f64>, DenoiseError>;

    /// The final latents on the host, and on a device the milliseconds from the
    /// first step's start to the last step's end.
    fn finish(&mut self) -> Result<(Tensor, Option<f64>), DenoiseError>;

    /// Host milliseconds spent capturing the loop's CUDA graphs (at load), when
    /// the steps replay captured graphs (lever `denoise-graph = on`); `None`
    /// when every step is launched eagerly (and on the CPU arm).
    fn graph_capture_ms(&self) -> Option<f64> {
        None
    }
}

/// Steps queued and not yet waited for, oldest first: at most [`IN_FLIGHT`],
/// waited for in the order they were queued.
#[derive(Debug)]
pub struct StepQueue<T>(VecDeque<(usize, T)>);

/// Steps a denoiser holds queued at most.
pub const IN_FLIGHT: usize = 2;

impl<T> Default for StepQueue<T> {
    fn default() -> Self {
        StepQueue(VecDeque::new())
    }
}

impl<T> StepQueue<T> {
    /// Queue `step` with its data; an error when [`IN_FLIGHT`] are pending.
    pub fn push(&mut self, step: usize, v: T) -> Result<(), DenoiseError> {
        if self.0.len() >= IN_FLIGHT {
            return Err(DenoiseError::Order(format!(
                "step {} queued while {IN_FLIGHT} are pending",
                step + 1
            )));
        }
        self.0.push_back((step, v));
        Ok(())
    }

    /// Take the oldest step, which must be `step`.
    pub fn pop(&mut self, step: usize) -> Result<T, DenoiseError> {
        match self.0.front() {
            Some((k, _)) if *k == step => {}
            other => {
                return Err(DenoiseError::Order(format!(
                    "waiting for step {} but the oldest queued is {:?}",
                    step + 1,
                    other.map(|q| q.0 + 1)
                )))
            }
        }
        self.0
            .pop_front()
            .map(|(_, v)| v)
            .ok_or_else(|| DenoiseError::Order("empty queue".into()))
    }

    /// An error naming the steps never waited for, if any.
    pub fn check_empty(&self) -> Result<(), DenoiseError> {
        match self.0.len() {
            0 => Ok(()),
            n => Err(DenoiseError::Order(format!(
                "{n} steps queued and never waited for"
            ))),
        }
    }
}

/// The CPU reference arm: the `models` transformer in f32.
pub struct CpuDenoiser {
    model: Transformer,
    cond: Conditioning,
    grid: (usize, usize, usize),
    fps: f32,
    lat: Option<Tensor>,
    queued: StepQueue<(f32, f32)>,
}

impl CpuDenoiser {
    /// Denoise with `model` under `cond` over the latent `grid` at `fps`.
    pub fn new(
        model: Transformer,
        cond: Conditioning,
        grid: (usize, usize, usize),
        fps: f32,
    ) -> CpuDenoiser {
        CpuDenoiser {
            model,
            cond,
            grid,
            fps,
            lat: None,
            queued: StepQueue::default(),
        }
    }
}

impl Denoiser for CpuDenoiser {
    fn arm(&self) -> &'static str {
        "cpu"
    }

    fn begin(&mut self, latents: Tensor) -> Result<(), DenoiseError> {
        self.lat = Some(latents);
        Ok(())
    }

    fn enqueue(&mut self, step: usize, sigma: f32, sigma_next: f32) -> Result<(), DenoiseError> {
        self.queued.push(step, (sigma, sigma_next))
    }

    fn wait(
        &mut self,
        step: usize,
        on_forward: &mut dyn FnMut(Option<f64>),
    ) -> Result<Option<f64>, DenoiseError> {
        let (s, s_next) = self.queued.pop(step)?;
        let k = step;
        let lat = self
            .lat
            .as_mut()
            .ok_or_else(|| DenoiseError::Order("a step before begin".into()))?;
        let mut forward = |text: &TextCond| -> Result<Tensor, DenoiseError> {
            let v = self
                .model
                .forward(lat, s, &text.states, &text.mask, self.grid, self.fps)
                .map_err(|e| DenoiseError::Forward {
                    step: k + 1,
                    detail: e.to_string(),
                })?;
            on_forward(None);
            Ok(v)
        };
        let sampler = |e: schedule::ScheduleError| DenoiseError::Step {
            step: k + 1,
            detail: e.to_string(),
        };
        let v_un = match &self.cond.uncond {
            Some(u) => Some(forward(u)?),
            None => None,
        };
        let v_cond = forward(&self.cond.cond)?;
        let v = match v_un {
            Some(u) => schedule::cfg_combine(u.data(), v_cond.data(), self.cond.guidance)
                .map_err(sampler)?,
            None => v_cond.into_data(),
        };
        schedule::euler_step(lat.data_mut(), &v, s, s_next).map_err(sampler)?;
        if !lat.data().iter().all(|x| x.is_finite()) {
            return Err(DenoiseError::NonFinite(format!("at step {}", k + 1)));
        }
        Ok(None)
    }

    fn finish(&mut self) -> Result<(Tensor, Option<f64>), DenoiseError> {
        self.queued.check_empty()?;
        let lat = self
            .lat
            .take()
            .ok_or_else(|| DenoiseError::Order("finish before begin".into()))?;
        Ok((lat, None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::{dit, init};
    use crate::presets::dit_tiny;
    use crate::rng::Gaussian;
    use crate::weights::VarBuilder;

    fn tiny(guided: bool) -> (CpuDenoiser, Tensor, Transformer, Conditioning) {
        let cfg = dit_tiny();
        let src = init::source(&dit::tensor_specs(&cfg), 5);
        let load = || Transformer::load(&VarBuilder::new(&src), &cfg).unwrap();
        let text = |s: &str| TextCond {
            states: Tensor::new(&[6, 64], Gaussian::new(1, s).vec(6 * 64)).unwrap(),
            mask: vec![1.0, 1.0, 1.0, 1.0, 0.0, 0.0],
        };
        let cond = Conditioning {
            cond: text("c"),
            uncond: guided.then(|| text("u")),
            guidance: 3.0,
        };
        let lat = Tensor::new(&[12, 128], Gaussian::new(2, "lat").vec(12 * 128)).unwrap();
        (
            CpuDenoiser::new(load(), cond.clone(), (2, 2, 3), 25.0),
            lat,
            load(),
            cond,
        )
    }

    #[test]
    fn steps_compute_guidance_then_euler_in_order_with_a_tick_per_forward() {
        let (mut d, lat, model, cond) = tiny(true);
        // By hand: the same forwards, cfg_combine, euler_step.
        let mut want = lat.clone();
        for (s, sn) in [(1.0f32, 0.6f32), (0.6, 0.0)] {
            let u = cond.uncond.as_ref().unwrap();
            let vu = model
                .forward(&want, s, &u.states, &u.mask, (2, 2, 3), 25.0)
                .unwrap();
            let vc = model
                .forward(
                    &want,
                    s,
                    &cond.cond.states,
                    &cond.cond.mask,
                    (2, 2, 3),
                    25.0,
                )
                .unwrap();
            let v = schedule::cfg_combine(vu.data(), vc.data(), 3.0).unwrap();
            schedule::euler_step(want.data_mut(), &v, s, sn).unwrap();
        }
        d.begin(lat).unwrap();
        d.enqueue(0, 1.0, 0.6).unwrap();
        d.enqueue(1, 0.6, 0.0).unwrap();
        assert!(d.enqueue(2, 0.0, 0.0).is_err(), "a third pending step");
        let mut ticks = 0;
        let mut tick = |ms: Option<f64>| {
            assert!(ms.is_none());
            ticks += 1;
        };
        assert!(d.wait(1, &mut tick).is_err(), "out of order");
        // The failed wait consumed nothing it should not have: start over.
        let (mut d, lat, _, _) = tiny(true);
        d.begin(lat).unwrap();
        d.enqueue(0, 1.0, 0.6).unwrap();
        d.enqueue(1, 0.6, 0.0).unwrap();
        assert_eq!(d.wait(0, &mut tick).unwrap(), None);
        assert_eq!(d.wait(1, &mut tick).unwrap(), None);
        assert_eq!(ticks, 4);
        let (got, ms) = d.finish().unwrap();
        assert!(ms.is_none());
        assert_eq!(got.data(), want.data());
    }

    #[test]
    fn without_guidance_one_forward_per_step_and_finish_checks_the_queue() {
        let (mut d, lat, _, _) = tiny(false);
        assert_eq!(d.cond.forwards_per_step(), 1);
        let before = lat.clone();
        d.begin(lat).unwrap();
        d.enqueue(0, 1.0, 0.5).unwrap();
        d.enqueue(1, 0.5, 0.0).unwrap();
        let mut ticks = 0;
        d.wait(0, &mut |_| ticks += 1).unwrap();
        assert_eq!(ticks, 1);
        assert!(d.finish().is_err(), "step 2 never waited for");
        d.wait(1, &mut |_| ticks += 1).unwrap();
        let (got, _) = d.finish().unwrap();
        assert_ne!(got.data(), before.data());
    }
}
