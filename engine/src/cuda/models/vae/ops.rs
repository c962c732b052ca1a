//! The primitives the streaming VAE decoder is written against, and the walk
//! over the checkpoint that binds its weights.
//!
//! Activations are channels-last: a frame is `[H, W, C]` with `C` contiguous,
//! frames follow each other in time. Buffers are owned by the backend and
//! named by a [`Loc`] (buffer id, element offset). Two backends implement
//! [`VaeOps`]: the device ([`crate::cuda::models::vae::device::DeviceOps`], bf16 storage, f32
//! math) and the host ([`crate::cuda::models::vae::host::HostOps`], f32 throughout), which is the
//! reference the device primitives are checked against and lets the stream's
//! bookkeeping be tested without a GPU.

use crate::cuda::CudaError;
use crate::models::vae::{VaeConfig, TIMESTEP_CHANNELS};

/// A place in a backend buffer: buffer id and element offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loc {
    /// Buffer id (from [`VaeOps::alloc`]).
    pub buf: usize,
    /// Offset in elements.
    pub off: usize,
}

impl Loc {
    /// The place `elems` elements further on.
    pub fn at(self, elems: usize) -> Loc {
        Loc {
            buf: self.buf,
            off: self.off + elems,
        }
    }
}

/// `n` consecutive frames `[h, w, c]` starting at `at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frames {
    /// First element.
    pub at: Loc,
    /// Frames.
    pub n: usize,
    /// Height.
    pub h: usize,
    /// Width.
    pub w: usize,
    /// Channels.
    pub c: usize,
}

impl Frames {
    /// Elements per frame.
    pub fn frame(&self) -> usize {
        self.h * self.w * self.c
    }

    /// Frames `[from, from + n)` of this batch.
    pub fn slice(&self, from: usize, n: usize) -> Frames {
        Frames {
            at: self.at.at(from * self.frame()),
            n,
            ..*self
        }
    }
}

/// A convolution handle that carries its bias.
pub trait HasBias<V> {
    /// The bias vector (`co` values).
    fn bias(&self) -> &V;
}

/// What a per-voxel norm computes (over the `c` channels of each voxel).
pub enum NormOp<'a, O: VaeOps + ?Sized> {
    /// `silu(rms(x) * (1 + scale) + shift)`; without a modulation `silu(rms(x))`.
    RmsSilu(Option<&'a O::Mod>),
    /// `layernorm(x) * weight + bias` (the 0.9.0 shortcut's norm3).
    LayerNorm {
        /// Per-channel weight.
        weight: &'a O::Vec,
        /// Per-channel bias.
        bias: &'a O::Vec,
        /// Epsilon.
        eps: f32,
    },
}

/// The primitives of the decoder. Every method enqueues its work (the device
/// backend) or does it (the host backend); sizes are in elements.
pub trait VaeOps {
    /// A vector (bias, norm weight, time embedding).
    type Vec;
    /// A convolution's weight (in `[co][taps][ci]` order) and bias.
    type Conv: HasBias<Self::Vec>;
    /// One modulation: (shift, scale) per channel.
    type Mod;

    /// A new buffer of `elems` activation elements; returns its id.
    fn alloc(&mut self, elems: usize, what: &str) -> Result<usize, CudaError>;
    /// Copies `elems` elements from `src` to `dst` (ranges do not overlap).
    fn copy(&mut self, src: Loc, dst: Loc, elems: usize) -> Result<(), CudaError>;
    /// Writes host values (channels-last frames) at `dst`.
    fn upload(&mut self, dst: Loc, data: &[f32]) -> Result<(), CudaError>;
    /// A 3x3x3 convolution, no bias: `frames_in` input frames `[h, w, ci]` at
    /// `x` (time already padded: valid in time, zero-padded by 1 in space) to
    /// `frames_in - 2` frames `[h, w, co]` at `y`.
    #[allow(clippy::too_many_arguments)]
    fn conv3(
        &mut self,
        conv: &Self::Conv,
        x: Loc,
        frames_in: usize,
        h: usize,
        w: usize,
        y: Loc,
    ) -> Result<(), CudaError>;
    /// A 1x1x1 convolution with its bias over `rows` voxels.
    fn conv1(&mut self, conv: &Self::Conv, x: Loc, rows: usize, y: Loc) -> Result<(), CudaError>;
    /// A per-voxel norm of `rows` voxels of `c` channels at `x` (plus `bias`
    /// per channel first, when given) into `y`.
    #[allow(clippy::too_many_arguments)]
    fn norm(
        &mut self,
        x: Loc,
        rows: usize,
        c: usize,
        bias: Option<&Self::Vec>,
        op: &NormOp<'_, Self>,
        y: Loc,
    ) -> Result<(), CudaError>;
    /// In place: `y += bias (+ skip)` over `rows` voxels of `c` channels.
    fn bias_add(
        &mut self,
        y: Loc,
        rows: usize,
        c: usize,
        bias: &Self::Vec,
        skip: Option<Loc>,
    ) -> Result<(), CudaError>;
    /// Depth-to-space of `frames` conv frames `[h, w, cy]` at `y` (plus
    /// `bias`) into `[2h, 2w, cy / 8]` frames at `out`: conv channel
    /// `c*8 + a*4 + b*2 + d` of frame `j` is channel `c` of output frame
    /// `2j + a - drop` at `(2y + b, 2x + d)`; with `drop` (the clip's first
    /// frame) the `a = 0` half of frame 0 is not written. With `res = (r, cr)`
    /// the rearranged input frames `[h, w, cr]` at `r`, repeated along channels,
    /// are added.
    #[allow(clippy::too_many_arguments)]
    fn d2s(
        &mut self,
        y: Loc,
        frames: usize,
        h: usize,
        w: usize,
        cy: usize,
        bias: &Self::Vec,
        res: Option<(Loc, usize)>,
        drop: bool,
        out: Loc,
    ) -> Result<(), CudaError>;
    /// The decoder's output: `frames` frames of pixel patches `[h, w, 3 p^2]`
    /// at `y` (plus `bias`) are unpatchified and handed out as pixel frames
    /// `first, first + 1, ...` of the clip.
    #[allow(clippy::too_many_arguments)]
    fn pixels(
        &mut self,
        y: Loc,
        frames: usize,
        h: usize,
        w: usize,
        bias: &Self::Vec,
        p: usize,
        first: usize,
    ) -> Result<(), CudaError>;

    /// The convolution `{name}.weight [co, ci, k, k, k]`, `{name}.bias [co]`.
    fn conv_weight(
        &mut self,
        name: &str,
        ci: usize,
        co: usize,
        k: usize,
    ) -> Result<Self::Conv, CudaError>;
    /// The vector `name` of `len` values.
    fn vector(&mut self, name: &str, len: usize) -> Result<Self::Vec, CudaError>;
    /// The scalar `name` (shape `[]`).
    fn scalar(&mut self, name: &str) -> Result<f32, CudaError>;
    /// The time embedding `linear_2(silu(linear_1(sinusoid(t))))` of the
    /// embedder under `prefix` (`{prefix}.time_embedder.timestep_embedder`), `dim` wide.
    fn time_embedding(&mut self, prefix: &str, dim: usize, t: f32) -> Result<Self::Vec, CudaError>;
    /// Modulation `k` of a table `[rows, c]` named `table` and an embedding
    /// `[rows * c]`: shift = table\[2k\] + emb\[2k c ..\], scale = table\[2k+1\] +
    /// emb[(2k+1) c ..].
    fn modulation(
        &mut self,
        table: &str,
        rows: usize,
        c: usize,
        emb: &Self::Vec,
        k: usize,
    ) -> Result<Self::Mod, CudaError>;
}

/// A resnet's weights.
pub struct ResnetW<O: VaeOps> {
    /// Input channels.
    pub cin: usize,
    /// Output channels.
    pub cout: usize,
    /// First convolution.
    pub conv1: O::Conv,
    /// Second convolution.
    pub conv2: O::Conv,
    /// norm3 (weight, bias) and the 1x1x1 shortcut when channels change.
    pub shortcut: Option<(O::Vec, O::Vec, O::Conv)>,
    /// The modulations before conv1 and conv2 (timestep-conditioned decoders).
    pub mods: Option<[O::Mod; 2]>,
}

/// An up block's weights.
pub struct UpW<O: VaeOps> {
    /// The channel-changing resnet (0.9.0 layout).
    pub conv_in: Option<ResnetW<O>>,
    /// The upsampler's convolution, whether residual, its channel factor.
    pub upsampler: Option<(O::Conv, bool, usize)>,
    /// The resnets after the upsampler.
    pub resnets: Vec<ResnetW<O>>,
    /// Input channels of the upsampler.
    pub up_in: usize,
}

/// Every weight of one decode (the modulations depend on the timestep).
pub struct DecoderW<O: VaeOps> {
    /// conv_in (latent channels to the first width).
    pub conv_in: O::Conv,
    /// Mid-block resnets.
    pub mid: Vec<ResnetW<O>>,
    /// Up blocks in execution order.
    pub ups: Vec<UpW<O>>,
    /// The output norm's modulation.
    pub tail: Option<O::Mod>,
    /// conv_out (last width to 3 p^2).
    pub conv_out: O::Conv,
    /// First width (after conv_in).
    pub first: usize,
    /// Last width (before conv_out).
    pub last: usize,
    /// Pixel patch.
    pub patch: usize,
    /// Epsilon of the shortcut LayerNorms.
    pub ln_eps: f32,
}

/// Which deliberate defect a check runs with (to prove the check can fail).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mutation {
    /// The decoder as specified.
    None,
    /// Resnets skip their timestep modulation.
    SkipModulation,
    /// Upsamplers skip their residual.
    SkipUpsampleResidual,
    /// The device's RGB8 download moves frames out of its pinned halves
    /// without waiting for their copies (the device decoder only; the CPU
    /// arm has no download).
    SkipFrameWait,
}

impl Mutation {
    /// Parse `none | skip-modulation | skip-upsample-residual | skip-frame-wait`.
    pub fn parse(s: &str) -> Option<Mutation> {
        match s {
            "none" | "" => Some(Mutation::None),
            "skip-modulation" => Some(Mutation::SkipModulation),
            "skip-upsample-residual" => Some(Mutation::SkipUpsampleResidual),
            "skip-frame-wait" => Some(Mutation::SkipFrameWait),
            _ => None,
        }
    }
}

fn resnet<O: VaeOps>(
    ops: &mut O,
    p: &str,
    cin: usize,
    cout: usize,
    temb: Option<&O::Vec>,
) -> Result<ResnetW<O>, CudaError> {
    let shortcut = if cin != cout {
        Some((
            ops.vector(&format!("{p}.norm3.weight"), cin)?,
            ops.vector(&format!("{p}.norm3.bias"), cin)?,
            ops.conv_weight(&format!("{p}.conv_shortcut.conv"), cin, cout, 1)?,
        ))
    } else {
        None
    };
    let mods = match temb {
        Some(e) => {
            let t = format!("{p}.scale_shift_table");
            Some([
                ops.modulation(&t, 4, cin, e, 0)?,
                ops.modulation(&t, 4, cin, e, 1)?,
            ])
        }
        None => None,
    };
    Ok(ResnetW {
        cin,
        cout,
        conv1: ops.conv_weight(&format!("{p}.conv1.conv"), cin, cout, 3)?,
        conv2: ops.conv_weight(&format!("{p}.conv2.conv"), cout, cout, 3)?,
        shortcut,
        mods,
    })
}

impl<O: VaeOps> DecoderW<O> {
    /// Binds every decoder weight of `cfg` through `ops` for a decode at
    /// `timestep`, walking the checkpoint exactly as
    /// [`crate::models::vae::VaeDecoder::load`] does (names, shapes, which
    /// resnets are modulated by which embedding).
    pub fn bind(ops: &mut O, cfg: &VaeConfig, timestep: f32) -> Result<Self, CudaError> {
        cfg.validate()
            .map_err(|e| CudaError::Invalid(format!("VAE config: {e}")))?;
        let tc = cfg.timestep_conditioning;
        let (first, mid_layers, plan) = cfg.decoder_plan();
        let t = if tc {
            Some(timestep * ops.scalar("decoder.timestep_scale_multiplier")?)
        } else {
            None
        };
        let conv_in = ops.conv_weight("decoder.conv_in.conv", cfg.latent_channels, first, 3)?;
        let mid_temb = match t {
            Some(t) => Some(ops.time_embedding("decoder.mid_block", 4 * first, t)?),
            None => None,
        };
        let mut mid = Vec::new();
        for j in 0..mid_layers {
            mid.push(resnet(
                ops,
                &format!("decoder.mid_block.resnets.{j}"),
                first,
                first,
                mid_temb.as_ref(),
            )?);
        }
        let mut ups = Vec::new();
        for (i, b) in plan.iter().enumerate() {
            let p = format!("decoder.up_blocks.{i}");
            let temb = match t {
                Some(t) => Some(ops.time_embedding(&p, 4 * b.in_channels, t)?),
                None => None,
            };
            let conv_in = if b.in_channels != b.out_channels {
                // The reference hands this resnet no modulation (validated:
                // it cannot exist with timestep conditioning).
                Some(resnet(
                    ops,
                    &format!("{p}.conv_in"),
                    b.in_channels,
                    b.out_channels,
                    None,
                )?)
            } else {
                None
            };
            let up_in = b.out_channels * b.factor;
            let upsampler = if b.upsample {
                let conv = ops.conv_weight(
                    &format!("{p}.upsamplers.0.conv.conv"),
                    up_in,
                    up_in * 8 / b.factor,
                    3,
                )?;
                Some((conv, b.residual, b.factor))
            } else {
                None
            };
            let mut resnets = Vec::new();
            for j in 0..b.layers {
                resnets.push(resnet(
                    ops,
                    &format!("{p}.resnets.{j}"),
                    b.out_channels,
                    b.out_channels,
                    temb.as_ref(),
                )?);
            }
            ups.push(UpW {
                conv_in,
                upsampler,
                resnets,
                up_in,
            });
        }
        let last = plan.last().map(|b| b.out_channels).unwrap_or(first);
        let tail = match t {
            Some(t) => {
                let e = ops.time_embedding("decoder", 2 * last, t)?;
                Some(ops.modulation("decoder.scale_shift_table", 2, last, &e, 0)?)
            }
            None => None,
        };
        let p = cfg.patch_size;
        Ok(DecoderW {
            conv_in,
            mid,
            ups,
            tail,
            conv_out: ops.conv_weight(
                "decoder.conv_out.conv",
                last,
                cfg.out_channels * p * p,
                3,
            )?,
            first,
            last,
            patch: p,
            ln_eps: cfg.resnet_norm_eps as f32,
        })
    }
}

/// Width of the sinusoid the time embedders read (re-exported for the backends).
pub const SINUSOID: usize = TIMESTEP_CHANNELS;
