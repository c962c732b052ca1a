//! Hostile input costs bounded memory (issue 27 items 2 and 4): tar extension
//! headers claiming gigabytes, a 32 MiB long name, zstd bombs in `log.zst`, and
//! `unpack` over a corrupted copy already in the store.
//!
//! Each bomb runs the real `harness` as a child and reads its peak RSS from
//! `wait4`'s `ru_maxrss`; the child also runs under a [`AS_GUARD`] address-space
//! limit, so that a regression fails the test by an allocation failure instead of
//! taking the machine's memory. The bound, [`RSS_BOUND_KIB`] (200 MiB): `harness
//! unpack`/`verify` of a genuine bundle peaks near 20 MiB (the binary and its
//! tables); the bounded readers add at most a 16 MiB zstd window (2^24, the limit
//! for packs and logs) and 64 KiB buffers, and a Parquet table read whole is under
//! 1 MB here. Every bomb decompresses to at least 1 GiB, so an unbounded reader
//! exceeds the bound five times over.
//!
//! `ru_maxrss` of a forked child also counts the test process's resident set at
//! the fork (Linux carries the old mm's high-water mark across exec), so each
//! figure is an upper bound on the child's own peak; the tests keep their buffers
//! small (no bomb is ever held decompressed) to keep it close.
//!
//! The bombs are concatenated zstd frames (a stream of frames decodes to their
//! concatenation): one frame of 32 MiB of one byte (zstd level 3: a few KB),
//! repeated, built in well under a second.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::support::bins::{harness, HARNESS};
use crate::support::dirs::{fresh_dir, fresh_store};
use crate::support::render::seal_render;
use evidence::manifest::{sha256_hex, Manifest};
use evidence::store::Store;

/// Peak RSS allowed to a child fed a bomb: 200 MiB, in KiB (`ru_maxrss`'s unit).
const RSS_BOUND_KIB: i64 = 200 * 1024;
/// The child's address-space limit: 2 GiB (the hostile tester's setting).
const AS_GUARD: u64 = 2 << 30;
/// One frame's worth of a repeated byte: 32 MiB.
const FRAME_BYTES: u64 = 32 << 20;

/// What a measured child did.
struct Measured {
    code: i32,
    stdout: String,
    stderr: String,
    /// Peak resident set, KiB.
    max_rss_kib: i64,
}

/// Run `harness args` with stdout and stderr to files under `dir`, under the
/// address-space guard, and reap it with wait4 for its peak RSS.
fn measured(dir: &Path, args: &[&str]) -> Measured {
    let out = dir.join("child.stdout");
    let err = dir.join("child.stderr");
    let mut c = Command::new(HARNESS);
    c.args(args)
        .env_remove("HARNESS_STORE")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap());
    // SAFETY: setrlimit is async-signal-safe; nothing else runs in the child.
    unsafe {
        c.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: AS_GUARD,
                rlim_max: AS_GUARD,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    // Reaped below by wait4 (for its rusage), not by Child::wait.
    #[allow(clippy::zombie_processes)]
    let child = c.spawn().expect("start harness");
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it for our own child.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = child.id() as libc::pid_t;
    let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    assert_eq!(rc, pid, "wait4: {}", std::io::Error::last_os_error());
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        -libc::WTERMSIG(status)
    };
    Measured {
        code,
        stdout: std::fs::read_to_string(&out).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err).unwrap_or_default(),
        max_rss_kib: ru.ru_maxrss,
    }
}

/// Assert the exit code, the peak RSS bound and that stderr holds each needle.
fn check(name: &str, m: &Measured, code: i32, needles: &[&str]) {
    eprintln!(
        "{name}: exit {}, peak RSS {} KiB ({:.1} MiB)",
        m.code,
        m.max_rss_kib,
        m.max_rss_kib as f64 / 1024.0
    );
    assert_eq!(
        m.code, code,
        "{name}: stdout {}\nstderr {}",
        m.stdout, m.stderr
    );
    assert!(
        m.max_rss_kib < RSS_BOUND_KIB,
        "{name}: peak RSS {} KiB, bound {RSS_BOUND_KIB} KiB",
        m.max_rss_kib
    );
    for n in needles {
        assert!(
            m.stderr.contains(n),
            "{name}: stderr lacks {n:?}: {}",
            m.stderr
        );
    }
}

/// A zstd stream of `n` bytes of `byte` (a multiple of [`FRAME_BYTES`]), as repeated
/// frames: a few KB per GiB.
fn zstd_repeated(byte: u8, n: u64) -> Vec<u8> {
    assert_eq!(n % FRAME_BYTES, 0);
    let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
    let block = vec![byte; 1 << 20];
    for _ in 0..FRAME_BYTES >> 20 {
        enc.write_all(&block).unwrap();
    }
    let frame = enc.finish().unwrap();
    frame.repeat((n / FRAME_BYTES) as usize)
}

/// A GNU-format header: `name` raw in the name field, type `ty`, declared `size`.
fn header(name: &[u8], ty: tar::EntryType, size: u64) -> [u8; 512] {
    let mut h = tar::Header::new_gnu();
    h.as_old_mut().name[..name.len()].copy_from_slice(name);
    h.set_entry_type(ty);
    h.set_size(size);
    h.set_mode(0o644);
    h.set_cksum();
    let mut b = [0u8; 512];
    b.copy_from_slice(h.as_bytes());
    b
}

/// The tar of the bundle `dir` (as `harness pack` writes it, end blocks included).
fn bundle_tar(dir: &Path, id: &str) -> Vec<u8> {
    harness::pack::tar_bytes(dir, id).unwrap()
}

/// A pack whose first entry is an extension header of type `ty` declaring `size`
/// bytes, followed by that body (`size` bytes of `byte`, a multiple of
/// [`FRAME_BYTES`]) and then a genuine bundle: every part its own zstd frame.
fn pack_with_extension(ty: tar::EntryType, size: u64, byte: u8, rest: &[u8]) -> Vec<u8> {
    let mut out = zstd::stream::encode_all(&header(b"././@LongLink", ty, size)[..], 3).unwrap();
    out.extend(zstd_repeated(byte, size));
    out.extend(zstd::stream::encode_all(rest, 3).unwrap());
    out
}

fn store_arg(s: &Store) -> String {
    s.root().to_string_lossy().into_owned()
}

fn staging_is_empty(s: &Store) -> bool {
    std::fs::read_dir(s.staging_root())
        .unwrap()
        .next()
        .is_none()
}

#[test]
fn unpack_refuses_a_gnu_long_name_header_claiming_5_gib_in_bounded_memory() {
    let src = fresh_store("bounded-longname-src");
    let p = seal_render(&src, 61, 2, false);
    let dir = fresh_dir("bounded-longname");
    let f = dir.join("longname.tar.zst");
    let pack = pack_with_extension(
        tar::EntryType::GNULongName,
        5 << 30,
        0,
        &bundle_tar(&p.dir, &p.id),
    );
    assert!(pack.len() < 1 << 20, "{} bytes", pack.len());
    std::fs::write(&f, &pack).unwrap();
    let dst = fresh_store("bounded-longname-dst");
    let m = measured(
        &dir,
        &["unpack", f.to_str().unwrap(), "--store", &store_arg(&dst)],
    );
    check(
        "long-name 5 GiB",
        &m,
        2,
        &[
            f.to_str().unwrap(),
            "GNU long-name header",
            "5368709120 bytes",
        ],
    );
    assert!(staging_is_empty(&dst) && dst.bundle_ids().unwrap().is_empty());
}

#[test]
fn unpack_refuses_a_pax_header_with_a_huge_size_in_bounded_memory() {
    let src = fresh_store("bounded-pax-src");
    let p = seal_render(&src, 62, 2, false);
    let dir = fresh_dir("bounded-pax");
    let f = dir.join("pax.tar.zst");
    let pack = pack_with_extension(
        tar::EntryType::XHeader,
        5 << 30,
        0,
        &bundle_tar(&p.dir, &p.id),
    );
    std::fs::write(&f, &pack).unwrap();
    let dst = fresh_store("bounded-pax-dst");
    let m = measured(
        &dir,
        &["unpack", f.to_str().unwrap(), "--store", &store_arg(&dst)],
    );
    check(
        "PAX 5 GiB",
        &m,
        2,
        &[
            f.to_str().unwrap(),
            "PAX extended header",
            "5368709120 bytes",
        ],
    );
    assert!(staging_is_empty(&dst) && dst.bundle_ids().unwrap().is_empty());
}

/// A 32 MiB long name once made a 128 MiB message; now the message is one short line.
#[test]
fn unpack_of_a_32_mib_long_name_gives_a_short_message() {
    let src = fresh_store("bounded-longmsg-src");
    let p = seal_render(&src, 63, 2, false);
    let dir = fresh_dir("bounded-longmsg");
    let f = dir.join("longmsg.tar.zst");
    let pack = pack_with_extension(
        tar::EntryType::GNULongName,
        32 << 20,
        b'a',
        &bundle_tar(&p.dir, &p.id),
    );
    std::fs::write(&f, &pack).unwrap();
    let dst = fresh_store("bounded-longmsg-dst");
    let m = measured(
        &dir,
        &["unpack", f.to_str().unwrap(), "--store", &store_arg(&dst)],
    );
    check(
        "32 MiB long name",
        &m,
        2,
        &[f.to_str().unwrap(), "GNU long-name"],
    );
    // The pack's path, the header's own 13-byte name and the fixed text.
    let bound = f.to_str().unwrap().len() + 400;
    assert!(
        m.stderr.len() < bound,
        "message of {} bytes (bound {bound})",
        m.stderr.len()
    );
    assert!(staging_is_empty(&dst) && dst.bundle_ids().unwrap().is_empty());
}

/// Copy the sealed bundle `p` into `store` with `log.zst` replaced by `log` (which
/// the manifest lists with `rows` lines), self-consistent: manifest re-hashed, the
/// id recomputed. Returns (id, directory).
fn bundle_with_log(store: &Store, from: &Path, log: &[u8], rows: u64) -> (String, PathBuf) {
    let mtext = std::fs::read_to_string(from.join("manifest.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&mtext).unwrap();
    v["files"]["log.zst"] = serde_json::json!({
        "sha256": sha256_hex(log),
        "bytes": log.len(),
        "rows": rows,
    });
    let m = Manifest::from_json(&v.to_string()).unwrap();
    let mbytes = m.canonical_bytes();
    let id = sha256_hex(&mbytes);
    let dir = store.bundles_dir().join(&id);
    std::fs::create_dir(&dir).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        let bytes = match name.as_str() {
            "manifest.json" => mbytes.clone(),
            "log.zst" => log.to_vec(),
            _ => std::fs::read(e.path()).unwrap(),
        };
        std::fs::write(dir.join(&name), bytes).unwrap();
    }
    (id, dir)
}

/// 4 GiB of zeros in `log.zst` (one endless line): unpack stops after one line's
/// limit (256 KiB) of output; the refusal names the file.
#[test]
fn unpack_refuses_a_log_zst_bomb_of_4_gib_of_zeros_in_bounded_memory() {
    let src = fresh_store("bounded-zbomb-src");
    let p = seal_render(&src, 64, 2, false);
    let bomb = zstd_repeated(0, 4 << 30);
    assert!(bomb.len() < 1 << 20, "{} bytes", bomb.len());
    let (id, bdir) = bundle_with_log(&src, &p.dir, &bomb, 1000);
    let dir = fresh_dir("bounded-zbomb");
    let f = dir.join("zbomb.tar.zst");
    let pack = zstd::stream::encode_all(bundle_tar(&bdir, &id).as_slice(), 3).unwrap();
    std::fs::write(&f, &pack).unwrap();
    let dst = fresh_store("bounded-zbomb-dst");
    let m = measured(
        &dir,
        &["unpack", f.to_str().unwrap(), "--store", &store_arg(&dst)],
    );
    check(
        "log.zst bomb (unpack)",
        &m,
        1,
        &[
            f.to_str().unwrap(),
            "log.zst: line 1 is longer than 262144 bytes",
        ],
    );
    assert!(staging_is_empty(&dst) && dst.bundle_ids().unwrap().is_empty());
}

/// 4 GiB of newlines in `log.zst`, listed as 4 Gi lines (fully self-consistent):
/// verify reads at most 1 GiB of it (MAX_LOG_BYTES), in bounded memory, and fails it.
#[test]
fn verify_refuses_a_self_consistent_log_zst_bomb_of_4_gib_of_newlines_in_bounded_memory() {
    let store = fresh_store("bounded-nlbomb");
    let p = seal_render(&store, 65, 2, false);
    let bomb = zstd_repeated(b'\n', 4 << 30);
    let (id, bdir) = bundle_with_log(&store, &p.dir, &bomb, 4 << 30);
    let dir = fresh_dir("bounded-nlbomb-scratch");
    let m = measured(&dir, &["verify", &id, "--store", &store_arg(&store)]);
    eprintln!("{}", m.stdout);
    assert!(
        m.stdout
            .contains("log.zst: decompresses to more than 1073741824 bytes"),
        "{}",
        m.stdout
    );
    assert!(
        m.stdout.contains(&id) && bdir.ends_with(&id),
        "{}",
        m.stdout
    );
    check("log.zst newline bomb (verify)", &m, 1, &[]);
}

/// A copy in the store that fails verification is replaced by the verified copy
/// from the pack, and unpack says so and why; an intact copy stays.
#[test]
fn unpack_over_a_corrupted_existing_copy_replaces_it() {
    let src = fresh_store("bounded-corrupt-src");
    let p = seal_render(&src, 66, 2, false);
    let dir = fresh_dir("bounded-corrupt");
    let f = dir.join("b.tar.zst");
    std::fs::write(&f, harness::pack::pack_bytes(&p.dir, &p.id).unwrap()).unwrap();
    let dst = fresh_store("bounded-corrupt-dst");
    let unpack = || {
        crate::support::bins::run(harness().args([
            "unpack",
            f.to_str().unwrap(),
            "--store",
            &store_arg(&dst),
        ]))
    };
    let (code, _, err) = unpack();
    assert_eq!(code, 0, "{err}");
    let landed = dst.bundles_dir().join(&p.id);
    let victim = landed.join("samples.parquet");
    let mut b = std::fs::read(&victim).unwrap();
    let mid = b.len() / 2;
    b[mid] ^= 0x10;
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::write(&victim, &b).unwrap();
    assert!(!evidence::verify::verify_dir(&landed).ok());

    let (code, out, err) = unpack();
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("replacing a corrupt copy"), "{out}");
    assert!(err.contains("failed verification"), "{err}");
    assert!(err.contains("samples.parquet: sha256"), "{err}");
    assert!(evidence::verify::verify_dir(&landed).ok());
    assert!(staging_is_empty(&dst), "the corrupt copy is removed");
    assert_eq!(dst.bundle_ids().unwrap(), vec![p.id.clone()]);

    // Intact now: the existing message stands.
    let (code, out, err) = unpack();
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("already in the store"), "{out}");
    assert!(!out.contains("replacing"), "{out}");
}
