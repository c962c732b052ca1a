//! The decoder as a stream of frame batches with bounded buffers.
//!
//! Every op but the 3x3x3 convolutions is local to one frame. A convolution
//! with the released (non-causal, edge-replicating) time padding emits output
//! frame `t` once input `t + 1` has arrived, so each convolution carries the
//! last two frames of its input from one push to the next and, per push of
//! `n` frames, convolves `[carried, new]` (`n` outputs; one fewer on the first
//! push, whose window starts with a copy of frame 0; one more on the last,
//! whose window ends with a copy of the last frame). A resnet carries the skip
//! frames its second convolution has not reached yet (at most 2), an upsampler
//! the input frames its residual still needs (at most 1).
//!
//! Each node accepts at most `max_in` frames per push (`chunk` latent frames
//! at the latent resolution, doubled at each upsampler); a node's output is
//! fed to the next in slices of at most that many, depth first, so the final
//! flush (the frames every node still holds) never needs more than the
//! per-node buffers. The convolution windows and the outputs consumed within
//! the same push are shared by all the nodes of a resolution stage; a node
//! owns only its carried frames and its output. Device memory therefore grows
//! with the chunk, not with the clip, and the pixels of a chunked decode
//! equal a one-piece decode.

use crate::cuda::models::vae::ops::{
    DecoderW, Frames, HasBias, Loc, Mutation, NormOp, ResnetW, VaeOps,
};
use crate::cuda::CudaError;
use crate::models::vae::VaeConfig;

type Alloc<'a> = &'a mut dyn FnMut(usize, &str) -> Result<usize, CudaError>;

fn at(buf: usize) -> Loc {
    Loc { buf, off: 0 }
}

/// A 3x3x3 convolution over the stream.
#[derive(Debug)]
struct ConvStream {
    ci: usize,
    co: usize,
    h: usize,
    w: usize,
    /// The stage's shared window (at least `max_in + 3` frames of `ci`).
    win: usize,
    /// The output (at least `max_in + 1` frames of `co`): own or the stage's.
    out: usize,
    /// The carried input frames (2 of `ci`).
    carry: usize,
    max_in: usize,
    kept: usize,
    received: usize,
    total: usize,
}

impl ConvStream {
    #[allow(clippy::too_many_arguments)]
    fn new(
        alloc: Alloc<'_>,
        (ci, co): (usize, usize),
        (h, w): (usize, usize),
        max_in: usize,
        total: usize,
        win: usize,
        out: Option<usize>,
        what: &str,
    ) -> Result<ConvStream, CudaError> {
        let out = match out {
            Some(o) => o,
            None => alloc((max_in + 1) * h * w * co, what)?,
        };
        Ok(ConvStream {
            ci,
            co,
            h,
            w,
            win,
            out,
            carry: alloc(2 * h * w * ci, "a VAE convolution's carried frames")?,
            max_in,
            kept: 0,
            received: 0,
            total,
        })
    }

    fn frame_in(&self) -> usize {
        self.h * self.w * self.ci
    }

    /// Where the next input frames go (in the stage's window).
    fn slot(&self) -> Loc {
        let lead = if self.received == 0 { 1 } else { self.kept };
        at(self.win).at(lead * self.frame_in())
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
        let win = at(self.win);
        let mut out = Frames {
            at: at(self.out),
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
                self.max_in, self.received, self.total
            )));
        }
        let lead = if self.received == 0 {
            // Frame -1 repeats frame 0.
            ops.copy(win.at(fi), win, fi)?;
            1
        } else {
            if self.kept > 0 {
                ops.copy(at(self.carry), win, self.kept * fi)?;
            }
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
        let keep = len.min(2);
        ops.copy(win.at((len - keep) * fi), at(self.carry), keep * fi)?;
        self.kept = keep;
        Ok(out)
    }
}

/// Frames a node carries to its next push (skip or residual frames its
/// convolutions have not reached yet).
#[derive(Debug)]
struct Carry {
    buf: usize,
    frame: usize,
    len: usize,
    cap: usize,
}

impl Carry {
    fn new(alloc: Alloc<'_>, cap: usize, frame: usize, what: &str) -> Result<Carry, CudaError> {
        Ok(Carry {
            buf: alloc(cap * frame, what)?,
            frame,
            len: 0,
            cap,
        })
    }

    /// Frame `j` of `[carried, new]`, `new` being `n` frames at `x`.
    fn frame(&self, x: Loc, j: usize) -> Loc {
        if j < self.len {
            at(self.buf).at(j * self.frame)
        } else {
            x.at((j - self.len) * self.frame)
        }
    }

    /// After the first `used` frames of `[carried, new]` (`n` new at `x`) were
    /// consumed, carries the rest (copied in ascending order: a carried frame
    /// only moves down).
    fn advance<O: VaeOps>(
        &mut self,
        ops: &mut O,
        x: Loc,
        n: usize,
        used: usize,
    ) -> Result<(), CudaError> {
        let rest = self.len + n - used;
        if rest > self.cap {
            return Err(CudaError::Invalid(format!(
                "VAE stream: {rest} frames to carry in a carry of {}",
                self.cap
            )));
        }
        for i in 0..rest {
            let j = used + i;
            if j != i || j >= self.len {
                ops.copy(
                    self.frame(x, j),
                    at(self.buf).at(i * self.frame),
                    self.frame,
                )?;
            }
        }
        self.len = rest;
        Ok(())
    }
}

#[derive(Debug)]
struct ResnetStream {
    conv1: ConvStream,
    conv2: ConvStream,
    skip: Carry,
    /// LayerNorm output and shortcut output of the 0.9.0 layout's shortcut.
    shortcut: Option<(usize, usize)>,
    cin: usize,
    cout: usize,
}

#[derive(Debug)]
struct UpsampleStream {
    conv: ConvStream,
    res: Option<Carry>,
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

/// Channels, frames, height and width at the output of the decoder.
pub fn output_geometry(
    cfg: &VaeConfig,
    latent: (usize, usize, usize),
) -> (usize, usize, usize, usize) {
    let sc = cfg.spatial_compression();
    let frames = (latent.0.max(1) - 1) * cfg.temporal_compression() + 1;
    (cfg.out_channels, frames, latent.1 * sc, latent.2 * sc)
}

/// One node of the decoder before its buffers exist.
enum Spec {
    Resnet(usize, usize, Which),
    Upsample(usize, usize, bool, usize),
    Out(usize, usize),
}

/// A resolution stage: (frames, height, width, max frames per push) and the
/// nodes that run at it.
struct Stage {
    geom: (usize, usize, usize, usize),
    specs: Vec<Spec>,
}

/// The decoder's nodes grouped by resolution stage.
fn stages(
    cfg: &VaeConfig,
    latent: (usize, usize, usize),
    chunk: usize,
) -> Result<Vec<Stage>, CudaError> {
    let (first, mid_layers, plan) = cfg.decoder_plan();
    let (lf, lh, lw) = latent;
    let mut cur = Stage {
        geom: (lf, lh, lw, chunk.min(lf)),
        specs: (0..mid_layers)
            .map(|j| Spec::Resnet(first, first, Which::Mid(j)))
            .collect(),
    };
    let mut out = Vec::new();
    let mut c = first;
    for (i, b) in plan.iter().enumerate() {
        if b.in_channels != b.out_channels {
            cur.specs
                .push(Spec::Resnet(c, b.out_channels, Which::UpConvIn(i)));
            c = b.out_channels;
        }
        if b.upsample {
            let cin = b.out_channels * b.factor;
            if cin != c {
                return Err(CudaError::Invalid(format!(
                    "VAE up block {i}: the upsampler expects {cin} channels, the stream carries {c}"
                )));
            }
            cur.specs
                .push(Spec::Upsample(cin, cin * 8 / b.factor, b.residual, i));
            let (t, h, w, s) = cur.geom;
            out.push(std::mem::replace(
                &mut cur,
                Stage {
                    geom: (2 * t - 1, 2 * h, 2 * w, 2 * s),
                    specs: Vec::new(),
                },
            ));
            c = cin / b.factor;
        }
        for j in 0..b.layers {
            cur.specs.push(Spec::Resnet(c, c, Which::UpRes(i, j)));
        }
    }
    let p = cfg.patch_size;
    cur.specs.push(Spec::Out(c, cfg.out_channels * p * p));
    out.push(cur);
    Ok(out)
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
        alloc: Alloc<'_>,
    ) -> Result<Stream, CudaError> {
        cfg.validate()
            .map_err(|e| CudaError::Invalid(format!("VAE config: {e}")))?;
        let (lf, lh, lw) = latent;
        if lf == 0 || lh == 0 || lw == 0 || chunk == 0 {
            return Err(CudaError::Invalid(format!(
                "VAE stream over latent {latent:?} in chunks of {chunk}: every size must be positive"
            )));
        }
        let stages = stages(cfg, latent, chunk)?;
        let first = cfg.decoder_plan().0;
        let mut conv_in = None;
        let mut nodes = Vec::new();
        for (k, st) in stages.iter().enumerate() {
            let (t, h, w, s) = st.geom;
            // The stage's shared window and its shared output (the outputs
            // consumed within the push that makes them).
            let mut win_c = if k == 0 { cfg.latent_channels } else { 0 };
            let mut tmp_c = 0;
            for sp in &st.specs {
                let (wc, tc) = match sp {
                    Spec::Resnet(cin, cout, _) => ((*cin).max(*cout), *cout),
                    Spec::Upsample(cin, cy, _, _) => (*cin, *cy),
                    Spec::Out(c, co) => (*c, *co),
                };
                win_c = win_c.max(wc);
                tmp_c = tmp_c.max(tc);
            }
            let win = alloc((s + 4) * h * w * win_c, "a VAE stage's convolution window")?;
            let tmp = alloc((s + 1) * h * w * tmp_c, "a VAE stage's convolution output")?;
            if k == 0 {
                conv_in = Some(ConvStream::new(
                    alloc,
                    (cfg.latent_channels, first),
                    (h, w),
                    s,
                    t,
                    win,
                    None,
                    "the VAE's conv_in output",
                )?);
            }
            for sp in &st.specs {
                nodes.push(match *sp {
                    Spec::Resnet(cin, cout, which) => Node::Resnet(
                        ResnetStream {
                            conv1: ConvStream::new(
                                alloc,
                                (cin, cout),
                                (h, w),
                                s,
                                t,
                                win,
                                Some(tmp),
                                "",
                            )?,
                            conv2: ConvStream::new(
                                alloc,
                                (cout, cout),
                                (h, w),
                                s + 1,
                                t,
                                win,
                                None,
                                "a VAE resnet output",
                            )?,
                            skip: Carry::new(alloc, 2, h * w * cout, "a VAE resnet's skip frames")?,
                            shortcut: if cin != cout {
                                Some((
                                    alloc(s * h * w * cin, "a VAE shortcut norm")?,
                                    alloc(s * h * w * cout, "a VAE shortcut output")?,
                                ))
                            } else {
                                None
                            },
                            cin,
                            cout,
                        },
                        which,
                    ),
                    Spec::Upsample(cin, cy, residual, i) => Node::Upsample(
                        UpsampleStream {
                            conv: ConvStream::new(
                                alloc,
                                (cin, cy),
                                (h, w),
                                s,
                                t,
                                win,
                                Some(tmp),
                                "",
                            )?,
                            res: if residual {
                                Some(Carry::new(
                                    alloc,
                                    1,
                                    h * w * cin,
                                    "a VAE upsampler's residual frame",
                                )?)
                            } else {
                                None
                            },
                            out: alloc(
                                2 * (s + 1) * 4 * h * w * (cy / 8),
                                "a VAE upsampler output",
                            )?,
                            t: 0,
                            cin,
                        },
                        i,
                    ),
                    Spec::Out(c, co) => Node::Out(ConvStream::new(
                        alloc,
                        (c, co),
                        (h, w),
                        s,
                        t,
                        win,
                        Some(tmp),
                        "",
                    )?),
                });
            }
        }
        let conv_in =
            conv_in.ok_or_else(|| CudaError::Invalid("the VAE stream has no stage".into()))?;
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
            // The skip frames of this push: x itself, or its shortcut.
            let skip = match (&rw.shortcut, r.shortcut) {
                (Some((lw, lb, conv)), Some((ln, sx))) => {
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
                        at(ln),
                    )?;
                    ops.conv1(conv, at(ln), x.n * hw, at(sx))?;
                    at(sx)
                }
                _ => x.at,
            };
            let y1 = r.conv1.run(ops, &rw.conv1, x.n)?;
            let y2 = if y1.n > 0 {
                ops.norm(
                    y1.at,
                    y1.n * hw,
                    r.cout,
                    Some(rw.conv1.bias()),
                    &NormOp::RmsSilu(mods[1]),
                    r.conv2.slot(),
                )?;
                r.conv2.run(ops, &rw.conv2, y1.n)?
            } else {
                Frames { n: 0, ..y1 }
            };
            // Output frame j adds skip frame j of [carried, new].
            let carried = r.skip.len.min(y2.n);
            let f = hw * r.cout;
            if carried > 0 {
                ops.bias_add(
                    y2.at,
                    carried * hw,
                    r.cout,
                    rw.conv2.bias(),
                    Some(at(r.skip.buf)),
                )?;
            }
            if y2.n > carried {
                ops.bias_add(
                    y2.at.at(carried * f),
                    (y2.n - carried) * hw,
                    r.cout,
                    rw.conv2.bias(),
                    Some(skip),
                )?;
            }
            r.skip.advance(ops, skip, x.n, y2.n)?;
            Ok(y2)
        }
        Node::Upsample(u, i) => {
            let (conv, residual, _) = w.ups[*i]
                .upsampler
                .as_ref()
                .ok_or_else(|| CudaError::Invalid(format!("up block {i} has no upsampler")))?;
            debug_assert_eq!(*residual, u.res.is_some());
            ops.copy(x.at, u.conv.slot(), x.n * hw * u.cin)?;
            let y = u.conv.run(ops, conv, x.n)?;
            let cy = u.conv.co;
            let mut out = Frames {
                at: at(u.out),
                n: 0,
                h: 2 * x.h,
                w: 2 * x.w,
                c: cy / 8,
            };
            if y.n > 0 {
                let drop = u.t == 0;
                let fo = 4 * hw * (cy / 8);
                match (&u.res, mutation) {
                    (Some(q), m) if m != Mutation::SkipUpsampleResidual => {
                        // Conv frame j pairs with input frame j of [carried, new].
                        let carried = q.len.min(y.n);
                        if carried > 0 {
                            ops.d2s(
                                y.at,
                                carried,
                                x.h,
                                x.w,
                                cy,
                                conv.bias(),
                                Some((at(q.buf), u.cin)),
                                drop,
                                out.at,
                            )?;
                        }
                        if y.n > carried {
                            let skip_out = if carried > 0 {
                                2 * carried - usize::from(drop)
                            } else {
                                0
                            };
                            ops.d2s(
                                y.at.at(carried * hw * cy),
                                y.n - carried,
                                x.h,
                                x.w,
                                cy,
                                conv.bias(),
                                Some((x.at, u.cin)),
                                drop && carried == 0,
                                out.at.at(skip_out * fo),
                            )?;
                        }
                    }
                    _ => ops.d2s(y.at, y.n, x.h, x.w, cy, conv.bias(), None, drop, out.at)?,
                }
                out.n = 2 * y.n - usize::from(drop);
                u.t += y.n;
            }
            if let Some(q) = &mut u.res {
                q.advance(ops, x.at, x.n, y.n)?;
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
