//! `test-engine`: a small engine that speaks the marker protocol, for driving the
//! real `harness run` in tests. It is never measured.
//!
//! It answers the subcommands `harness run` and `harness campaign` call on an engine
//! (`render`, `plan`, `synth-weights`, `levers`; see `engine/src/main.rs` for the
//! real engine's) and, given anything else, runs its arguments as a script of
//! steps, in order:
//!
//! ```text
//! --hello                      announce the engine (protocol hello)
//! --pid                        print "test-engine pid=<pid>" on stderr
//! --open NAME | --close NAME   open / close a phase
//! --close-attrs NAME JSON      close a phase with attributes (a JSON object,
//!                              e.g. burn.load's {"gemms":64,"tflops":642.5})
//! --write FILE TEXT            write TEXT to FILE (a fake GPU's utilization) in
//!                              one rename, so a reader polling FILE never sees
//!                              it truncated and empty
//! --tick NAME K/N              a tick with step K of N and a running forward index
//! --info KEY=VALUE             an info marker
//! --sleep-ms MS                sleep
//! --work N                     a fixed CPU load: N rounds of sha256 over 1 MiB,
//!                              printing "test-engine work=N ns=<elapsed>" on stderr
//!                              (the observer-overhead benchmark's workload)
//! --alloc BYTES                allocate and touch BYTES (kept until exit); 4GiB-style
//! --runaway STEP/MS            allocate STEP bytes every MS ms, forever
//! --exit CODE                  exit now with CODE
//! --abort                      die by SIGABRT
//! --hang                       sleep forever
//! --ignore-sigterm             ignore SIGTERM from now on
//! --frames KIND WxH N          write N frames (KIND good|black|static) into the
//!                              frames dir ($HARNESS_FRAMES_DIR): video.y4m (C444),
//!                              first/middle/last.png, then the frames_written info
//! --garbage N                  write N malformed lines to the marker channel
//! --raw LINE                   write LINE verbatim to the marker channel
//! --stdout TEXT | --stderr TEXT  print a line
//! --render STEPS FORWARDS      the engine's phase sequence with STEPS denoise
//!                              steps of FORWARDS DiT forwards each
//! ```
//!
//! `render` runs `--hello --render <steps> <forwards> --frames good <W>x<H> <F>` from
//! its rung, or, when `TEST_ENGINE_SCRIPT` is set, that script (whitespace separated)
//! instead. `burn` runs `TEST_ENGINE_SCRIPT` (a burn's markers, for `harness
//! control`'s tests) and without it fails: there is no GPU arm. `levers --json`
//! lists no levers. `plan` reports `TEST_ENGINE_PLAN_HOST_PEAK` (default 64 MiB) as the host
//! peak. Exit codes follow the engine: 0 done, 1 failure, 2 bad arguments.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use evidence::attrs;
use evidence::marker::{Attrs, Emitter, FRAMES_DIR_ENV, MARKER_FD_ENV};
use evidence::rung::Rung;
use harness::completion::y4m::{header_line, Chroma, Header};
use harness::units::parse_bytes;

/// A usage error: message and exit code 2.
struct Usage(String);

type Res<T> = Result<T, Usage>;

fn usage<T>(msg: impl Into<String>) -> Res<T> {
    Err(Usage(msg.into()))
}

/// The marker channel: the emitter, plus a raw handle for garbage lines.
struct Channel {
    emitter: Emitter,
    raw: Option<File>,
    forward: u64,
    last_tick: Option<std::time::Instant>,
}

fn open_channel() -> Res<Channel> {
    use std::os::fd::FromRawFd;
    let Ok(v) = std::env::var(MARKER_FD_ENV) else {
        return Ok(Channel {
            emitter: Emitter::human_only(),
            raw: None,
            forward: 0,
            last_tick: None,
        });
    };
    let fd: i32 = match v.parse() {
        Ok(fd) if fd >= 3 => fd,
        _ => return usage(format!("{MARKER_FD_ENV}={v:?} is not a descriptor >= 3")),
    };
    // SAFETY: the harness handed this descriptor to this process; it is taken once.
    let file = unsafe { File::from_raw_fd(fd) };
    let raw = file
        .try_clone()
        .map_err(|e| Usage(format!("{MARKER_FD_ENV}={fd}: {e}")))?;
    Ok(Channel {
        emitter: Emitter::to_writer(Box::new(file), true),
        raw: Some(raw),
        forward: 0,
        last_tick: None,
    })
}

/// A deterministic xorshift stream.
struct Rng(u32);

impl Rng {
    fn next(&mut self) -> u8 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 17;
        self.0 ^= self.0 << 5;
        (self.0 >> 24) as u8
    }
}

/// Frame `t` of a `kind` video as (Y, U, V) planes of `w*h` bytes each.
fn frame(kind: &str, t: u32, w: u32, h: u32) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let n = (w * h) as usize;
    match kind {
        "black" => (vec![0; n], vec![128; n], vec![128; n]),
        _ => {
            // `static` repeats frame 0; `good` moves a gradient and re-draws noise.
            let t = if kind == "static" { 0 } else { t };
            let mut r = Rng(0x9E37_79B9 ^ (t + 1).wrapping_mul(0x85EB_CA6B));
            let mut y = Vec::with_capacity(n);
            let mut u = Vec::with_capacity(n);
            let mut v = Vec::with_capacity(n);
            for j in 0..h {
                for i in 0..w {
                    let base = (i * 3 + j * 2 + t * 9) % 200;
                    y.push((30 + base + (r.next() as u32 % 25)) as u8);
                    u.push((96 + (i + t) % 64) as u8);
                    v.push((96 + (j + 2 * t) % 64) as u8);
                }
            }
            (y, u, v)
        }
    }
}

/// BT.601 full-range YUV to RGB8.
fn to_rgb(y: &[u8], u: &[u8], v: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(y.len() * 3);
    for i in 0..y.len() {
        let (yy, uu, vv) = (y[i] as f32, u[i] as f32 - 128.0, v[i] as f32 - 128.0);
        for c in [
            yy + 1.402 * vv,
            yy - 0.344_136 * uu - 0.714_136 * vv,
            yy + 1.772 * uu,
        ] {
            out.push(c.round().clamp(0.0, 255.0) as u8);
        }
    }
    out
}

fn write_png(path: &Path, w: u32, h: u32, rgb: &[u8]) -> std::io::Result<()> {
    let f = std::io::BufWriter::new(File::create(path)?);
    let mut enc = png::Encoder::new(f, w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut wr = enc.write_header().map_err(std::io::Error::other)?;
    wr.write_image_data(rgb).map_err(std::io::Error::other)?;
    wr.finish().map_err(std::io::Error::other)
}

fn write_frames(ch: &Channel, dir: &Path, kind: &str, w: u32, h: u32, n: u32) -> Res<()> {
    if !matches!(kind, "good" | "black" | "static") || n == 0 {
        return usage(format!(
            "--frames {kind} {w}x{h} {n}: KIND is good|black|static, N >= 1"
        ));
    }
    let fail = |e: std::io::Error| Usage(format!("{}: {e}", dir.display()));
    std::fs::create_dir_all(dir).map_err(fail)?;
    let header = Header {
        width: w,
        height: h,
        fps: Some((25, 1)),
        chroma: Chroma::C444,
    };
    let mut video = std::io::BufWriter::new(File::create(dir.join("video.y4m")).map_err(fail)?);
    video
        .write_all(header_line(&header).as_bytes())
        .map_err(fail)?;
    let middle = (n - 1) / 2;
    for t in 0..n {
        let (y, u, v) = frame(kind, t, w, h);
        video.write_all(b"FRAME\n").map_err(fail)?;
        for plane in [&y, &u, &v] {
            video.write_all(plane).map_err(fail)?;
        }
        for (name, at) in [
            ("first.png", 0),
            ("middle.png", middle),
            ("last.png", n - 1),
        ] {
            if t == at {
                write_png(&dir.join(name), w, h, &to_rgb(&y, &u, &v)).map_err(fail)?;
            }
        }
    }
    video.flush().map_err(fail)?;
    ch.emitter.info(attrs! {
        "frames_written" => n, "video" => "video.y4m", "width" => w, "height" => h
    });
    Ok(())
}

fn frames_dir(out: &Option<PathBuf>) -> Res<PathBuf> {
    if let Some(o) = out {
        return Ok(o.clone());
    }
    std::env::var_os(FRAMES_DIR_ENV)
        .map(PathBuf::from)
        .ok_or_else(|| Usage(format!("--frames needs --out or {FRAMES_DIR_ENV}")))
}

fn parse_size(s: &str) -> Res<(u32, u32)> {
    let (w, h) = s
        .split_once('x')
        .ok_or_else(|| Usage(format!("{s:?}: expected WxH")))?;
    match (w.parse(), h.parse()) {
        (Ok(w), Ok(h)) if w > 0 && h > 0 => Ok((w, h)),
        _ => usage(format!("{s:?}: expected WxH with positive numbers")),
    }
}

fn num<T: std::str::FromStr>(flag: &str, v: &str) -> Res<T> {
    v.parse()
        .map_err(|_| Usage(format!("{flag} {v:?}: expected a number")))
}

fn tick(ch: &mut Channel, name: &str, step: u64, steps: u64) {
    ch.forward += 1;
    let now = std::time::Instant::now();
    let mut a: Attrs = attrs! {"step" => step, "steps" => steps, "forward" => ch.forward};
    if let Some(prev) = ch.last_tick {
        a.insert(
            "last_s".into(),
            serde_json::json!((now - prev).as_secs_f64()),
        );
    }
    ch.last_tick = Some(now);
    ch.emitter.tick(name, a);
}

/// The engine's phase sequence, a few milliseconds per leaf.
fn render_phases(ch: &mut Channel, steps: u64, forwards: u64) {
    let nap = |ms| std::thread::sleep(Duration::from_millis(ms));
    for load in ["load.text_encoder", "load.dit", "load.vae"] {
        ch.emitter.open(load, Attrs::new());
        nap(5);
        ch.emitter
            .close(load, attrs! {"peak_host_bytes" => 1u64 << 20});
    }
    ch.emitter.open("conditioning", Attrs::new());
    nap(5);
    ch.emitter.close("conditioning", Attrs::new());
    ch.emitter.open("denoise", Attrs::new());
    for k in 1..=steps {
        ch.emitter
            .open("denoise.step", attrs! {"step" => k, "steps" => steps});
        for _ in 0..forwards {
            nap(3);
            tick(ch, "dit.forward", k, steps);
        }
        ch.emitter.close("denoise.step", Attrs::new());
    }
    ch.emitter.close("denoise", Attrs::new());
    ch.emitter.open("decode.video", Attrs::new());
    for c in 0..2u64 {
        ch.emitter.open("decode.video.chunk", attrs! {"chunk" => c});
        nap(3);
        ch.emitter.close("decode.video.chunk", Attrs::new());
    }
    ch.emitter.close("decode.video", Attrs::new());
}

/// Run `script` in order; returns the exit code.
fn run_script(script: &[String], out: &Option<PathBuf>) -> Res<u8> {
    let mut ch = open_channel()?;
    let mut held: Vec<Vec<u8>> = Vec::new();
    let mut it = script.iter();
    let arg = |flag: &str, it: &mut std::slice::Iter<String>| -> Res<String> {
        it.next()
            .cloned()
            .ok_or_else(|| Usage(format!("{flag} needs an argument")))
    };
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--hello" => ch
                .emitter
                .hello("test-engine", env!("CARGO_PKG_VERSION"), Attrs::new()),
            "--pid" => eprintln!("test-engine pid={}", std::process::id()),
            "--open" => ch.emitter.open(&arg(flag, &mut it)?, Attrs::new()),
            "--close" => ch.emitter.close(&arg(flag, &mut it)?, Attrs::new()),
            "--close-attrs" => {
                let name = arg(flag, &mut it)?;
                let json = arg(flag, &mut it)?;
                let a: Attrs = serde_json::from_str(&json).map_err(|e| {
                    Usage(format!(
                        "--close-attrs {name} {json:?}: not a JSON object: {e}"
                    ))
                })?;
                ch.emitter.close(&name, a);
            }
            "--write" => {
                let file = arg(flag, &mut it)?;
                let text = arg(flag, &mut it)?;
                // A sibling then a rename: the harness's fake sensors poll FILE
                // every tick, and a plain write truncates it first (CI once read
                // "" there and called the fake GPM unreadable).
                let part = format!("{file}.part");
                std::fs::write(&part, text)
                    .and_then(|()| std::fs::rename(&part, &file))
                    .map_err(|e| Usage(format!("--write {file}: {e}")))?;
            }
            "--tick" => {
                let name = arg(flag, &mut it)?;
                let kn = arg(flag, &mut it)?;
                let (k, n) = kn
                    .split_once('/')
                    .ok_or_else(|| Usage(format!("--tick {name} {kn:?}: expected K/N")))?;
                tick(&mut ch, &name, num(flag, k)?, num(flag, n)?);
            }
            "--info" => {
                let kv = arg(flag, &mut it)?;
                let (k, v) = kv
                    .split_once('=')
                    .ok_or_else(|| Usage(format!("--info {kv:?}: expected KEY=VALUE")))?;
                ch.emitter.info(attrs! {k => v});
            }
            "--sleep-ms" => {
                std::thread::sleep(Duration::from_millis(num(flag, &arg(flag, &mut it)?)?))
            }
            "--work" => {
                let rounds: u64 = num(flag, &arg(flag, &mut it)?)?;
                let ns = work(rounds);
                eprintln!("test-engine work={rounds} ns={ns}");
            }
            "--alloc" => {
                let v = arg(flag, &mut it)?;
                let n = parse_bytes(&v).map_err(|e| Usage(format!("--alloc: {e}")))?;
                held.push(vec![0x5a; n as usize]);
            }
            "--runaway" => {
                let v = arg(flag, &mut it)?;
                let (step, ms) = v
                    .split_once('/')
                    .ok_or_else(|| Usage(format!("--runaway {v:?}: expected STEP/MS")))?;
                let step = parse_bytes(step).map_err(|e| Usage(format!("--runaway: {e}")))?;
                let ms: u64 = num(flag, ms)?;
                loop {
                    held.push(vec![0x5a; step as usize]);
                    std::thread::sleep(Duration::from_millis(ms));
                }
            }
            "--exit" => return num(flag, &arg(flag, &mut it)?),
            "--abort" => std::process::abort(),
            "--hang" => loop {
                std::thread::sleep(Duration::from_secs(3600));
            },
            "--ignore-sigterm" => {
                // SAFETY: setting a signal's disposition to ignore is always sound.
                unsafe { libc::signal(libc::SIGTERM, libc::SIG_IGN) };
            }
            "--frames" => {
                let kind = arg(flag, &mut it)?;
                let (w, h) = parse_size(&arg(flag, &mut it)?)?;
                let n = num(flag, &arg(flag, &mut it)?)?;
                write_frames(&ch, &frames_dir(out)?, &kind, w, h, n)?;
            }
            "--garbage" => {
                let n: u32 = num(flag, &arg(flag, &mut it)?)?;
                if let Some(raw) = &mut ch.raw {
                    for i in 0..n {
                        let line = match i % 3 {
                            0 => format!("this is not json #{i}\n"),
                            1 => format!("{{\"ev\":\"open\",\"t_ns\":-{i}}}\n"),
                            _ => format!("{{\"ev\":\"warp\",\"t_ns\":{i}}}\n"),
                        };
                        let _ = raw.write_all(line.as_bytes());
                    }
                }
            }
            "--raw" => {
                // One line written verbatim to the marker channel (hostile stamps).
                let line = arg(flag, &mut it)?;
                if let Some(raw) = &mut ch.raw {
                    let _ = raw.write_all(format!("{line}\n").as_bytes());
                }
            }
            "--stdout" => println!("{}", arg(flag, &mut it)?),
            "--stderr" => eprintln!("{}", arg(flag, &mut it)?),
            "--render" => {
                let steps = num(flag, &arg(flag, &mut it)?)?;
                let forwards = num(flag, &arg(flag, &mut it)?)?;
                render_phases(&mut ch, steps, forwards);
            }
            other => return usage(format!("unknown step {other:?}")),
        }
    }
    std::hint::black_box(&held);
    Ok(0)
}

/// The values of `--name` options of an engine command line.
struct EngineArgs {
    rung: Option<PathBuf>,
    out: Option<PathBuf>,
    preset: Option<String>,
}

fn engine_args(args: &[String]) -> Res<EngineArgs> {
    let mut e = EngineArgs {
        rung: None,
        out: None,
        preset: None,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || {
            it.next()
                .cloned()
                .ok_or_else(|| Usage(format!("{a} needs a value")))
        };
        match a.as_str() {
            "--rung" => e.rung = Some(val()?.into()),
            "--out" => e.out = Some(val()?.into()),
            "--preset" => e.preset = Some(val()?),
            "--weights" | "--lever" | "--profile" | "--device" | "--threads" | "--seconds" => {
                val()?;
            }
            "--json" | "--all-frames" => {}
            other => return usage(format!("unknown option {other:?}")),
        }
    }
    Ok(e)
}

fn load_rung(e: &EngineArgs) -> Res<Rung> {
    let p = e
        .rung
        .as_ref()
        .ok_or_else(|| Usage("--rung is required".into()))?;
    Rung::load(p).map_err(|err| Usage(err.to_string()))
}

fn synth_weights(e: &EngineArgs) -> Res<u8> {
    let (Some(preset), Some(out)) = (&e.preset, &e.out) else {
        return usage("synth-weights needs --preset and --out");
    };
    let fail = |err: std::io::Error| Usage(format!("{}: {err}", out.display()));
    let mut r = Rng(preset
        .bytes()
        .fold(7u32, |a, b| a.wrapping_mul(31) ^ b as u32)
        | 1);
    for (rel, size) in [
        ("transformer/diffusion_pytorch_model.safetensors", 96 << 10),
        ("vae/diffusion_pytorch_model.safetensors", 32 << 10),
        ("text_encoder/model.safetensors", 48 << 10),
        ("tokenizer/tokenizer.json", 1 << 10),
    ] {
        let p = out.join(rel);
        std::fs::create_dir_all(p.parent().unwrap_or(out)).map_err(fail)?;
        let bytes: Vec<u8> = (0..size).map(|_| r.next()).collect();
        std::fs::write(&p, bytes).map_err(fail)?;
    }
    let files = harness::weights::list_files(out).map_err(|e| Usage(e.to_string()))?;
    let digest = harness::weights::compute_digest(out, &files).map_err(|e| Usage(e.to_string()))?;
    std::fs::write(
        out.join(harness::weights::DIGEST_FILE),
        format!("{digest}\n"),
    )
    .map_err(fail)?;
    println!("{digest}");
    Ok(0)
}

fn real_main() -> Res<u8> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("render") => {
            let e = engine_args(&args[1..])?;
            let rung = load_rung(&e)?;
            let script: Vec<String> = match std::env::var("TEST_ENGINE_SCRIPT") {
                Ok(s) => s.split_whitespace().map(String::from).collect(),
                Err(_) => {
                    let forwards = if rung.uses_guidance() { 2 } else { 1 };
                    format!(
                        "--hello --render {} {forwards} --frames good {}x{} {}",
                        rung.steps, rung.width, rung.height, rung.frames
                    )
                    .split(' ')
                    .map(String::from)
                    .collect()
                }
            };
            run_script(&script, &e.out)
        }
        Some("plan") => {
            let e = engine_args(&args[1..])?;
            load_rung(&e)?;
            let host: u64 = match std::env::var("TEST_ENGINE_PLAN_HOST_PEAK") {
                Ok(v) => parse_bytes(&v).map_err(|err| Usage(err.to_string()))?,
                Err(_) => 64 << 20,
            };
            println!(
                "{}",
                serde_json::json!({"host_peak_bytes": host, "device_peak_bytes": 0,
                                   "weights_bytes": 180u64 << 10, "levers": {}})
            );
            Ok(0)
        }
        Some("synth-weights") => synth_weights(&engine_args(&args[1..])?),
        Some("levers") => {
            println!("{{\"levers\": {{}}}}");
            Ok(0)
        }
        Some("burn") => {
            engine_args(&args[1..])?;
            match std::env::var("TEST_ENGINE_SCRIPT") {
                Ok(s) => run_script(
                    &s.split_whitespace().map(String::from).collect::<Vec<_>>(),
                    &None,
                ),
                Err(_) => usage("burn: the test engine has no GPU arm"),
            }
        }
        _ => run_script(&args, &None),
    }
}

fn main() {
    let code = match real_main() {
        Ok(c) => c,
        Err(Usage(m)) => {
            eprintln!("test-engine: {m}");
            2
        }
    };
    std::process::exit(i32::from(code));
}

/// `rounds` sha256 passes over a 1 MiB buffer (each feeding the next); returns the
/// elapsed CLOCK_MONOTONIC nanoseconds. Fixed work, so its wall time shows how much
/// CPU something else took from it.
fn work(rounds: u64) -> u64 {
    use sha2::{Digest, Sha256};
    let mut buf: Vec<u8> = (0..1usize << 20).map(|i| (i * 131 % 251) as u8).collect();
    let t0 = evidence::clock::monotonic_ns();
    for r in 0..rounds {
        let d = Sha256::digest(&buf);
        let at = (r as usize * 32) % (buf.len() - 32);
        buf[at..at + 32].copy_from_slice(&d);
    }
    std::hint::black_box(&buf);
    evidence::clock::monotonic_ns().saturating_sub(t0)
}
