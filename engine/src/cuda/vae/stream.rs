//! The decoder as a stream of frame batches with bounded buffers.
//!
//! Every op but the 3x3x3 convolutions is local to one frame. A convolution
//! with the released (non-causal, edge-replicating) time padding emits output
//! frame `t` once input `t + 1` has arrived, so each convolution keeps the
//! last two frames of its input in a window buffer and, per push of `n`
//! frames, convolves `[kept, new]` (`n` outputs; one fewer on the first push,
//! whose window starts with a copy of frame 0; one more on the last, whose
//! window ends with a copy of the last frame). A resnet keeps its skip frames
//! until its second convolution catches up (a delay of 2 frames), an upsampler
//! its input frames for the residual (a delay of 1).
//!
//! Each node accepts at most `max_in` frames per push (`chunk` latent frames
//! at the latent resolution, doubled at each upsampler); a node's output is
//! fed to the next in slices of at most that many, depth first, so the final
//! flush (the frames every node still holds) never needs more than the
//! per-node buffers. Device memory therefore grows with the chunk, not with
//! the clip, and the pixels of a chunked decode equal a one-piece decode.

use super::super::CudaError;
use super::ops::{DecoderW, Frames, HasBias, Loc, Mutation, NormOp, ResnetW, VaeOps};
use crate::models::vae::VaeConfig;

/// A 3x3x3 convolution over the stream.
#[derive(Debug)]
struct ConvStream {
    ci: usize,
    co: usize,
    h: usize,
    w: usize,
    /// Window: up to `max_in + 3` input frames.
    win: usize,
    /// Output: up to `max_in + 1` frames.
    out: usize,
    max_in: usize,
    kept: usize,
    received: usize,
    total: usize,
}

fn alloc_frames(
    alloc: &mut dyn FnMut(usize, &str) -> Result<usize, CudaError>,
    frames: usize,
    frame: usize,
    what: &str,
) -> Result<usize, CudaError> {
    alloc(frames * frame, what)
}

impl ConvStream {
    #[allow(clippy::too_many_arguments)]
    fn new(
        alloc: &mut dyn FnMut(usize, &str) -> Result<usize, CudaError>,
        ci: usize,
        co: usize,
        h: usize,
        w: usize,
        max_in: usize,
        total: usize,
    ) -> Result<ConvStream, CudaError> {
        Ok(ConvStream {
            ci,
            co,
            h,
            w,
            win: alloc_frames(alloc, max_in + 3, h * w * ci, "a VAE convolution window")?,
            out: alloc_frames(alloc, max_in + 1, h * w * co, "a VAE convolution output")?,
            max_in,
            kept: 0,
            received: 0,
            total,
        })
    }

    fn frame_in(&self) -> usize {
        self.h * self.w * self.ci
    }

    /// Where the next input frames go.
    fn slot(&self) -> Loc {
        let lead = if self.received == 0 { 1 } else { self.kept };
        Loc {
            buf: self.win,
            off: lead * self.frame_in(),
        }
    }

    /// Convolves after `n` frames were written at [`ConvStream::slot`];
    /// returns the frames emitted (in the output buffer).
    fn run<O: VaeOps>(
        &mut self,
        ops: &mut O,
        conv: &O::Conv,
        n: usize,
    ) -> Result<Frames, CudaError> {
        let fi = self.frame_in();
        let win = Loc {
            buf: self.win,
            off: 0,
        };
        let mut out = Frames {
            at: Loc {
                buf: self.out,
                off: 0,
            },
            n: 0,
            h: self.h,
            w: self.w,
            c: self.co,
        };
        if n == 0 {
            return Ok(out);
        }
        if n > self.max_in || self.received + n > self.total {
            return Err(CudaError::Invalid(format!(
                "VAE stream: {n} frames pushed into a convolution of capacity {} with {} of {} received",
                self.max_in,
                self.received,
                self.total
            )));
        }
        let lead = if self.received == 0 {
            // Frame -1 repeats frame 0.
            ops.copy(win.at(fi), win, fi)?;
            1
        } else {
            self.kept
        };
        let mut len = lead + n;
        self.received += n;
        if self.received == self.total {
            // Frame T repeats frame T - 1.
            ops.copy(win.at((len - 1) * fi), win.at(len * fi), fi)?;
            len += 1;
        }
        if len >= 3 {
            out.n = len - 2;
            ops.conv3(conv, win, len, self.h, self.w, out.at)?;
        }
        // Keep the last two frames at the front, copied in ascending order
        // (source and destination frames never coincide).
        let keep = len.min(2);
        let from = len - keep;
        if from > 0 {
            for f in 0..keep {
                ops.copy(win.at((from + f) * fi), win.at(f * fi), fi)?;
            }
        }
        self.kept = keep;
        Ok(out)
    }
}

/// A frame queue (skip or residual frames waiting for a convolution's output).
#[derive(Debug)]
struct Queue {
    buf: usize,
    frame: usize,
    len: usize,
    cap: usize,
}

impl Queue {
    fn new(
        alloc: &mut dyn FnMut(usize, &str) -> Result<usize, CudaError>,
        cap: usize,
        frame: usize,
        what: &str,
    ) -> Result<Queue, CudaError> {
        Ok(Queue {
            buf: alloc_frames(alloc, cap, frame, what)?,
            frame,
            len: 0,
            cap,
        })
    }

    fn head(&self) -> Loc {
        Loc {
            buf: self.buf,
            off: 0,
        }
    }

    /// Where `n` more frames go.
    fn tail(&mut self, n: usize) -> Result<Loc, CudaError> {
        if self.len + n > self.cap {
            return Err(CudaError::Invalid(format!(
                "VAE stream: a queue of {} frames cannot take {n} more after {}",
                self.cap, self.len
            )));
        }
        let at = self.head().at(self.len * self.frame);
        self.len += n;
        Ok(at)
    }

    /// Drops the first `n` frames (the rest move to the front, in ascending order).
    fn pop<O: VaeOps>(&mut self, ops: &mut O, n: usize) -> Result<(), CudaError> {
        let n = n.min(self.len);
        if n > 0 {
            for f in 0..self.len - n {
                ops.copy(
                    self.head().at((n + f) * self.frame),
                    self.head().at(f * self.frame),
                    self.frame,
                )?;
            }
        }
        self.len -= n;
        Ok(())
    }
}

#[derive(Debug)]
struct ResnetStream {
    conv1: ConvStream,
    conv2: ConvStream,
    skip: Queue,
    /// LayerNorm output of the shortcut (0.9.0 layout).
    tmp: Option<usize>,
    cin: usize,
    cout: usize,
}

#[derive(Debug)]
struct UpsampleStream {
    conv: ConvStream,
    res: Option<Queue>,
    out: usize,
    t: usize,
    cin: usize,
}

/// Which weights a node runs with.
#[derive(Debug, Clone, Copy)]
enum Which {
    Mid(usize),
    UpConvIn(usize),
    UpRes(usize, usize),
}

#[derive(Debug)]
enum Node {
    Resnet(ResnetStream, Which),
    Upsample(UpsampleStream, usize),
    Out(ConvStream),
}

impl Node {
    fn max_in(&self) -> usize {
        match self {
            Node::Resnet(r, _) => r.conv1.max_in,
            Node::Upsample(u, _) => u.conv.max_in,
            Node::Out(c) => c.max_in,
        }
    }
}

fn resnet_w<O: VaeOps>(w: &DecoderW<O>, which: Which) -> &ResnetW<O> {
    match which {
        Which::Mid(j) => &w.mid[j],
        Which::UpConvIn(i) => w.ups[i]
            .conv_in
            .as_ref()
            .expect("a conv_in node exists only where the block has one"),
        Which::UpRes(i, j) => &w.ups[i].resnets[j],
    }
}

/// The decoder's stream state for one clip: every node's buffers, allocated
/// once for the chunk size.
#[derive(Debug)]
pub struct Stream {
    conv_in: ConvStream,
    nodes: Vec<Node>,
    /// Latent frames, height, width.
    pub latent: (usize, usize, usize),
    /// Latent frames per chunk.
    pub chunk: usize,
    /// Pixel frames emitted so far.
    emitted: usize,
    /// Latent frames pushed so far.
    pushed: usize,
    mutation: Mutation,
}

/// Channels, height, width and frames at the output of the decoder.
pub fn output_geometry(
    cfg: &VaeConfig,
    latent: (usize, usize, usize),
) -> (usize, usize, usize, usize) {
    let sc = cfg.spatial_compression();
    let frames = (latent.0.max(1) - 1) * cfg.temporal_compression() + 1;
    (cfg.out_channels, frames, latent.1 * sc, latent.2 * sc)
}

impl Stream {
    /// Allocates (through `alloc`: element counts) every buffer of a decode of
    /// `latent = (frames, height, width)` latent voxels in chunks of `chunk`
    /// latent frames.
    pub fn new(
        cfg: &VaeConfig,
        latent: (usize, usize, usize),
        chunk: usize,
        mutation: Mutation,
        alloc: &mut dyn FnMut(usize, &str) -> Result<usize, CudaError>,
    ) -> Result<Stream, CudaError> {
        cfg.validate()
            .map_err(|e| CudaError::Invalid(format!("VAE config: {e}")))?;
        let (lf, lh, lw) = latent;
        if lf == 0 || lh == 0 || lw == 0 || chunk == 0 {
            return Err(CudaError::Invalid(format!(
                "VAE stream over latent {latent:?} in chunks of {chunk}: every size must be positive"
            )));
        }
        let (first, mid_layers, plan) = cfg.decoder_plan();
        let (mut t, mut h, mut w, mut s) = (lf, lh, lw, chunk.min(lf));
        let conv_in = ConvStream::new(alloc, cfg.latent_channels, first, h, w, s, t)?;
        let mut nodes = Vec::new();
        let resnet = |alloc: &mut dyn FnMut(usize, &str) -> Result<usize, CudaError>,
                      cin: usize,
                      cout: usize,
                      h: usize,
                      w: usize,
                      s: usize,
                      t: usize|
         -> Result<ResnetStream, CudaError> {
            Ok(ResnetStream {
                conv1: ConvStream::new(alloc, cin, cout, h, w, s, t)?,
                conv2: ConvStream::new(alloc, cout, cout, h, w, s + 1, t)?,
                skip: Queue::new(alloc, s + 2, h * w * cout, "a VAE skip queue")?,
                tmp: if cin != cout {
                    Some(alloc(s * h * w * cin, "a VAE shortcut norm")?)
                } else {
                    None
                },
                cin,
                cout,
            })
        };
        for j in 0..mid_layers {
            nodes.push(Node::Resnet(
                resnet(alloc, first, first, h, w, s, t)?,
                Which::Mid(j),
            ));
        }
        let mut c = first;
        for (i, b) in plan.iter().enumerate() {
            if b.in_channels != b.out_channels {
                nodes.push(Node::Resnet(
                    resnet(alloc, c, b.out_channels, h, w, s, t)?,
                    Which::UpConvIn(i),
                ));
                c = b.out_channels;
            }
            if b.upsample {
                let cin = b.out_channels * b.factor;
                if cin != c {
                    return Err(CudaError::Invalid(format!(
                        "VAE up block {i}: the upsampler expects {cin} channels, the stream carries {c}"
                    )));
                }
                let cy = cin * 8 / b.factor;
                let conv = ConvStream::new(alloc, cin, cy, h, w, s, t)?;
                let res = if b.residual {
                    Some(Queue::new(
                        alloc,
                        s + 1,
                        h * w * cin,
                        "a VAE upsampler residual",
                    )?)
                } else {
                    None
                };
                let out = alloc(2 * (s + 1) * 4 * h * w * (cy / 8), "a VAE upsampler output")?;
                nodes.push(Node::Upsample(
                    UpsampleStream {
                        conv,
                        res,
                        out,
                        t: 0,
                        cin,
                    },
                    i,
                ));
                c = cy / 8;
                (t, h, w, s) = (2 * t - 1, 2 * h, 2 * w, 2 * s);
            }
            for j in 0..b.layers {
                nodes.push(Node::Resnet(
                    resnet(alloc, c, c, h, w, s, t)?,
                    Which::UpRes(i, j),
                ));
            }
        }
        let p = cfg.patch_size;
        nodes.push(Node::Out(ConvStream::new(
            alloc,
            c,
            cfg.out_channels * p * p,
            h,
            w,
            s,
            t,
        )?));
        Ok(Stream {
            conv_in,
            nodes,
            latent,
            chunk,
            emitted: 0,
            pushed: 0,
            mutation,
        })
    }

    /// Chunks of the clip.
    pub fn chunks(&self) -> usize {
        self.latent.0.div_ceil(self.chunk)
    }

    /// The most pixel frames one [`VaeOps::pixels`] call hands out.
    pub fn pixel_frames_cap(&self) -> usize {
        match self.nodes.last() {
            Some(Node::Out(c)) => c.max_in + 1,
            _ => 0,
        }
    }

    /// Pixel frames handed out so far.
    pub fn emitted(&self) -> usize {
        self.emitted
    }

    /// Pushes the next chunk: `frames` latent frames, channels-last `[f, h, w,
    /// C]` f32 values. Every pixel frame it completes goes to
    /// [`VaeOps::pixels`]. Returns the pixel frames emitted by this chunk.
    pub fn push_chunk<O: VaeOps>(
        &mut self,
        ops: &mut O,
        w: &DecoderW<O>,
        frames: usize,
        data: &[f32],
    ) -> Result<usize, CudaError> {
        let (lf, lh, lw) = self.latent;
        let c = self.conv_in.ci;
        if frames == 0
            || frames > self.chunk
            || self.pushed + frames > lf
            || data.len() != frames * lh * lw * c
        {
            return Err(CudaError::Invalid(format!(
                "VAE stream: a chunk of {frames} frames ({} values) after {} of {lf} (chunk {}, {c} channels)",
                data.len(),
                self.pushed,
                self.chunk
            )));
        }
        let before = self.emitted;
        ops.upload(self.conv_in.slot(), data)?;
        let y = self.conv_in.run(ops, &w.conv_in, frames)?;
        self.pushed += frames;
        if y.n > 0 {
            ops.bias_add(y.at, y.n * lh * lw, y.c, w.conv_in.bias(), None)?;
            let mut emitted = self.emitted;
            feed(ops, w, &mut self.nodes, y, self.mutation, &mut emitted)?;
            self.emitted = emitted;
        }
        Ok(self.emitted - before)
    }
}

fn feed<O: VaeOps>(
    ops: &mut O,
    w: &DecoderW<O>,
    nodes: &mut [Node],
    x: Frames,
    mutation: Mutation,
    emitted: &mut usize,
) -> Result<(), CudaError> {
    let Some((node, rest)) = nodes.split_first_mut() else {
        return Ok(());
    };
    let m = node.max_in();
    let mut done = 0;
    while done < x.n {
        let k = (x.n - done).min(m);
        let y = push(ops, w, node, x.slice(done, k), mutation, emitted)?;
        if y.n > 0 {
            feed(ops, w, rest, y, mutation, emitted)?;
        }
        done += k;
    }
    Ok(())
}

fn push<O: VaeOps>(
    ops: &mut O,
    w: &DecoderW<O>,
    node: &mut Node,
    x: Frames,
    mutation: Mutation,
    emitted: &mut usize,
) -> Result<Frames, CudaError> {
    let hw = x.h * x.w;
    match node {
        Node::Resnet(r, which) => {
            let rw = resnet_w(w, *which);
            debug_assert_eq!((rw.cin, rw.cout), (r.cin, r.cout));
            let mods = match (&rw.mods, mutation) {
                (_, Mutation::SkipModulation) => [None, None],
                (Some([a, b]), _) => [Some(a), Some(b)],
                (None, _) => [None, None],
            };
            ops.norm(
                x.at,
                x.n * hw,
                r.cin,
                None,
                &NormOp::RmsSilu(mods[0]),
                r.conv1.slot(),
            )?;
            let q = r.skip.tail(x.n)?;
            match (&rw.shortcut, r.tmp) {
                (Some((lw, lb, conv)), Some(tmp)) => {
                    let tmp = Loc { buf: tmp, off: 0 };
                    ops.norm(
                        x.at,
                        x.n * hw,
                        r.cin,
                        None,
                        &NormOp::LayerNorm {
                            weight: lw,
                            bias: lb,
                            eps: w.ln_eps,
                        },
                        tmp,
                    )?;
                    ops.conv1(conv, tmp, x.n * hw, q)?;
                }
                _ => ops.copy(x.at, q, x.n * hw * r.cin)?,
            }
            let y1 = r.conv1.run(ops, &rw.conv1, x.n)?;
            if y1.n == 0 {
                return Ok(Frames { n: 0, ..y1 });
            }
            ops.norm(
                y1.at,
                y1.n * hw,
                r.cout,
                Some(rw.conv1.bias()),
                &NormOp::RmsSilu(mods[1]),
                r.conv2.slot(),
            )?;
            let y2 = r.conv2.run(ops, &rw.conv2, y1.n)?;
            if y2.n > 0 {
                ops.bias_add(
                    y2.at,
                    y2.n * hw,
                    r.cout,
                    rw.conv2.bias(),
                    Some(r.skip.head()),
                )?;
                r.skip.pop(ops, y2.n)?;
            }
            Ok(y2)
        }
        Node::Upsample(u, i) => {
            let (conv, residual, _) = w.ups[*i]
                .upsampler
                .as_ref()
                .ok_or_else(|| CudaError::Invalid(format!("up block {i} has no upsampler")))?;
            debug_assert_eq!(*residual, u.res.is_some());
            ops.copy(x.at, u.conv.slot(), x.n * hw * u.cin)?;
            if let Some(q) = &mut u.res {
                let at = q.tail(x.n)?;
                ops.copy(x.at, at, x.n * hw * u.cin)?;
            }
            let y = u.conv.run(ops, conv, x.n)?;
            let cy = u.conv.co;
            let mut out = Frames {
                at: Loc { buf: u.out, off: 0 },
                n: 0,
                h: 2 * x.h,
                w: 2 * x.w,
                c: cy / 8,
            };
            if y.n == 0 {
                return Ok(out);
            }
            let drop = u.t == 0;
            let res = match (&u.res, mutation) {
                (_, Mutation::SkipUpsampleResidual) => None,
                (Some(q), _) => Some((q.head(), u.cin)),
                (None, _) => None,
            };
            ops.d2s(y.at, y.n, x.h, x.w, cy, conv.bias(), res, drop, out.at)?;
            out.n = 2 * y.n - usize::from(drop);
            u.t += y.n;
            if let Some(q) = &mut u.res {
                q.pop(ops, y.n)?;
            }
            Ok(out)
        }
        Node::Out(c) => {
            ops.norm(
                x.at,
                x.n * hw,
                x.c,
                None,
                &NormOp::RmsSilu(w.tail.as_ref()),
                c.slot(),
            )?;
            let y = c.run(ops, &w.conv_out, x.n)?;
            if y.n > 0 {
                ops.pixels(y.at, y.n, x.h, x.w, w.conv_out.bias(), w.patch, *emitted)?;
                *emitted += y.n;
            }
            Ok(Frames { n: 0, ..y })
        }
    }
}

/// Element counts of every buffer a decode of `latent` in chunks of `chunk`
/// allocates (in allocation order).
pub fn buffer_elems(
    cfg: &VaeConfig,
    latent: (usize, usize, usize),
    chunk: usize,
) -> Result<Vec<usize>, CudaError> {
    let mut v = Vec::new();
    Stream::new(cfg, latent, chunk, Mutation::None, &mut |n, _| {
        v.push(n);
        Ok(v.len() - 1)
    })?;
    Ok(v)
}

/// Channels-last frames `[t0, t0 + n)` of channel-first latents `[C, F, H, W]`.
pub fn latent_frames(z: &[f32], c: usize, f: usize, hw: usize, t0: usize, n: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; n * hw * c];
    for t in 0..n {
        for ch in 0..c {
            let src = &z[(ch * f + t0 + t) * hw..(ch * f + t0 + t + 1) * hw];
            for (i, v) in src.iter().enumerate() {
                out[(t * hw + i) * c + ch] = *v;
            }
        }
    }
    out
}
