//! The denoise loop's boundary: one [`Denoiser`] per device arm (the CPU
//! arm's in [`crate::cpu::denoise`], the CUDA arm's in `cuda::denoise`), driven step by
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
    /// The device arm failed (the arm's own error inside, shown as it is: the
    /// CUDA arm's `CudaError`).
    #[error(transparent)]
    Device(#[from] anyhow::Error),
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

    /// Forwards a step runs, each reported to `wait`'s `on_forward`: 2 with
    /// guidance, 1 without, and 1 where a guided step runs both samples in one
    /// forward (the CUDA arm's `guidance-batch = batched`).
    fn forwards_per_step(&self) -> usize;
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
