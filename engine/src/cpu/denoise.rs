//! The CPU reference arm's denoise loop: the `models` transformer in f32 on
//! the host, behind [`Denoiser`]. A step is only recorded when queued and is
//! computed when waited for, inside that step's phase.

use crate::denoise::{Conditioning, DenoiseError, Denoiser, StepQueue, TextCond};
use crate::models::dit::Transformer;
use crate::schedule;
use crate::tensor::Tensor;

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

    fn forwards_per_step(&self) -> usize {
        self.cond.forwards_per_step()
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
