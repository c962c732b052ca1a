//! Run-time compilation of the kernel sources with NVRTC, once per process,
//! cached on disk.
//!
//! Each module (`kernels/*.cu`, with `kernels/common.cuh` pasted in place of its
//! include) is compiled for the device's own architecture ([`arch`]: `sm_90`
//! on an H100 or H200) straight to a CUBIN, so the driver loads
//! machine code and runs no PTX JIT at start. The cache key is the sha256 of the
//! source, the options and the NVRTC version; the cache lives in
//! `<cache dir>/cuda-kernels/<module>-<key>.cubin` (see [`cache_dir`]). A damaged
//! or unwritable cache only costs a recompile.

use std::ffi::{c_char, CStr, CString};
use std::path::{Path, PathBuf};

use cudarc::nvrtc::sys;
use sha2::{Digest, Sha256};

use crate::cuda::CudaError;

/// The shared header every module includes.
pub const COMMON_CUH: &str = include_str!("kernels/common.cuh");
/// Elementwise and row-wise kernels.
pub const ELEMENTWISE_CU: &str = include_str!("kernels/elementwise.cu");
/// Attention kernels.
pub const ATTENTION_CU: &str = include_str!("kernels/attention.cu");

/// The T5 encoder's kernels (embedding, RMS norm, gated GELU, biased attention).
pub const T5_CU: &str = include_str!("kernels/t5.cu");
/// The video VAE decoder's kernels.
pub const VAE_CU: &str = include_str!("kernels/vae.cu");
/// The `precision = fp8` arm's kernels (row-scaled e4m3 quantization, GELU).
pub const FP8_CU: &str = include_str!("kernels/fp8.cu");

/// Every kernel module: (name, source).
pub const MODULES: &[(&str, &str)] = &[
    ("elementwise", ELEMENTWISE_CU),
    ("attention", ATTENTION_CU),
    ("t5", T5_CU),
    ("vae", VAE_CU),
    ("fp8", FP8_CU),
];

/// The architecture of the project's GPU machines (H100 and H200: compute
/// capability 9.0): what the compile check without a GPU builds for. A render
/// compiles for the device it runs on ([`arch`]).
pub const ARCH: &str = "sm_90";

/// The oldest compute capability the kernels run on: 8.0 (bf16 `mma.sync`,
/// `cvt.rn.bf16x2.f32`, `cp.async`).
pub const MIN_CAPABILITY: (i32, i32) = (8, 0);

/// The NVRTC architecture for a device of compute capability `cap` (major,
/// minor): `sm_<major><minor>`; a device older than [`MIN_CAPABILITY`] is
/// [`CudaError::NotAvailable`], naming both.
pub fn arch(cap: (i32, i32)) -> Result<String, CudaError> {
    if cap < MIN_CAPABILITY || cap.1 < 0 {
        return Err(CudaError::NotAvailable(format!(
            "the engine's kernels need compute capability {}.{} or later (bf16 mma.sync); \
             this GPU has {}.{}",
            MIN_CAPABILITY.0, MIN_CAPABILITY.1, cap.0, cap.1
        )));
    }
    Ok(format!("sm_{}{}", cap.0, cap.1))
}

/// Compiler options for architecture `arch` (e.g. `sm_90`), part of the cache key.
pub fn options(arch: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "-std=c++17".into(),
        "--fmad=true".into(),
        "-lineinfo".into(),
    ]
}

/// The module's source with the common header pasted in.
pub fn full_source(src: &str) -> String {
    src.replace("#include \"common.cuh\"", COMMON_CUH)
}

/// The engine's cache directory for compiled kernels: `$ENGINE_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/ltx-engine`, else `~/.cache/ltx-engine`; `None` when none
/// can be named (then nothing is cached).
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("ENGINE_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("ltx-engine"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("ltx-engine"))
}

/// NVRTC's version (major, minor).
pub fn nvrtc_version() -> Result<(i32, i32), CudaError> {
    let (mut a, mut b) = (0, 0);
    // SAFETY: plain out-parameters.
    let r = unsafe { sys::nvrtcVersion(&mut a, &mut b) };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(CudaError::Compile {
            module: "-".into(),
            log: format!("nvrtcVersion failed: {r:?}"),
        });
    }
    Ok((a, b))
}

/// Cache key of a module: sha256 over source, options and NVRTC version.
pub fn cache_key(src: &str, opts: &[String], version: (i32, i32)) -> String {
    let mut h = Sha256::new();
    h.update(src.as_bytes());
    for o in opts {
        h.update([0u8]);
        h.update(o.as_bytes());
    }
    h.update(format!("nvrtc {}.{}", version.0, version.1).as_bytes());
    let d = h.finalize();
    d.iter().take(12).map(|b| format!("{b:02x}")).collect()
}

/// How a module's machine code was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Read from the disk cache.
    Cache,
    /// Compiled now (and written to the cache when possible).
    Compiled,
}

/// Compile `name` (source `src` without the common header pasted) to a CUBIN for
/// `arch` ([`arch`]), using the cache under `cache` when given.
pub fn compile_cached(
    name: &str,
    src: &str,
    arch: &str,
    cache: Option<&Path>,
) -> Result<(Vec<u8>, Origin), CudaError> {
    let full = full_source(src);
    let opts = options(arch);
    let version = nvrtc_version()?;
    let key = cache_key(&full, &opts, version);
    let path = cache.map(|d| d.join("cuda-kernels").join(format!("{name}-{key}.cubin")));
    if let Some(p) = &path {
        if let Ok(bytes) = std::fs::read(p) {
            // A CUBIN is an ELF image; anything else is a damaged entry.
            if bytes.len() > 4 && &bytes[..4] == b"\x7fELF" {
                return Ok((bytes, Origin::Cache));
            }
        }
    }
    let cubin = compile(name, &full, &opts)?;
    if let Some(p) = &path {
        if let Some(dir) = p.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        // Write to a unique temporary then rename, so a concurrent reader never
        // sees half a file.
        let tmp = p.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, &cubin).is_ok() {
            let _ = std::fs::rename(&tmp, p);
        }
    }
    Ok((cubin, Origin::Compiled))
}

fn nvrtc_err(name: &str, what: &str, r: sys::nvrtcResult) -> CudaError {
    CudaError::Compile {
        module: name.into(),
        log: format!("{what} failed: {r:?}"),
    }
}

/// Compile `full` (complete source) with `opts` and return the CUBIN.
pub fn compile(name: &str, full: &str, opts: &[String]) -> Result<Vec<u8>, CudaError> {
    let src = CString::new(full).map_err(|_| CudaError::Compile {
        module: name.into(),
        log: "source contains a NUL byte".into(),
    })?;
    let cname = CString::new(format!("{name}.cu")).map_err(|_| CudaError::Compile {
        module: name.into(),
        log: "module name contains a NUL byte".into(),
    })?;
    let copts: Vec<CString> = opts
        .iter()
        .map(|o| CString::new(o.as_str()).unwrap_or_default())
        .collect();
    let ptrs: Vec<*const c_char> = copts.iter().map(|c| c.as_ptr()).collect();
    let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: valid C strings that outlive the program; no headers passed.
    let r = unsafe {
        sys::nvrtcCreateProgram(
            &mut prog,
            src.as_ptr(),
            cname.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(nvrtc_err(name, "nvrtcCreateProgram", r));
    }
    let result = (|| {
        // SAFETY: `prog` was created above; options are valid C strings.
        let r = unsafe { sys::nvrtcCompileProgram(prog, ptrs.len() as i32, ptrs.as_ptr()) };
        if r != sys::nvrtcResult::NVRTC_SUCCESS {
            return Err(CudaError::Compile {
                module: name.into(),
                log: program_log(prog),
            });
        }
        let mut n = 0usize;
        // SAFETY: out-parameter, then a buffer of the reported size.
        let r = unsafe { sys::nvrtcGetCUBINSize(prog, &mut n) };
        if r != sys::nvrtcResult::NVRTC_SUCCESS || n == 0 {
            return Err(nvrtc_err(name, "nvrtcGetCUBINSize", r));
        }
        let mut buf = vec![0u8; n];
        let r = unsafe { sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut c_char) };
        if r != sys::nvrtcResult::NVRTC_SUCCESS {
            return Err(nvrtc_err(name, "nvrtcGetCUBIN", r));
        }
        Ok(buf)
    })();
    // SAFETY: destroyed once.
    unsafe { sys::nvrtcDestroyProgram(&mut prog) };
    result
}

fn program_log(prog: sys::nvrtcProgram) -> String {
    let mut n = 0usize;
    // SAFETY: out-parameter, then a buffer of the reported size.
    unsafe {
        if sys::nvrtcGetProgramLogSize(prog, &mut n) != sys::nvrtcResult::NVRTC_SUCCESS || n == 0 {
            return "(no log)".into();
        }
        let mut buf = vec![0u8; n];
        if sys::nvrtcGetProgramLog(prog, buf.as_mut_ptr() as *mut c_char)
            != sys::nvrtcResult::NVRTC_SUCCESS
        {
            return "(log unavailable)".into();
        }
        CStr::from_bytes_until_nul(&buf)
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_key_changes_with_source_options_and_version() {
        let o = options(ARCH);
        let k = cache_key("a", &o, (13, 0));
        assert_eq!(k.len(), 24);
        assert_ne!(k, cache_key("b", &o, (13, 0)));
        assert_ne!(k, cache_key("a", &o[1..], (13, 0)));
        assert_ne!(k, cache_key("a", &o, (13, 1)));
        assert_eq!(k, cache_key("a", &o, (13, 0)));
    }

    /// Red on: a hard-coded architecture (the device's capability ignored), a
    /// pre-Ampere device accepted, or the minor version dropped.
    #[test]
    fn the_architecture_is_the_devices_and_old_devices_are_refused() {
        assert_eq!(arch((9, 0)).unwrap(), "sm_90");
        assert_eq!(arch((8, 9)).unwrap(), "sm_89");
        assert_eq!(arch((10, 0)).unwrap(), "sm_100");
        let e = arch((7, 5)).unwrap_err().to_string();
        assert!(e.contains("8.0") && e.contains("7.5"), "{e}");
        assert_ne!(
            cache_key("a", &options("sm_90"), (13, 0)),
            cache_key("a", &options("sm_89"), (13, 0))
        );
    }

    #[test]
    fn every_module_pastes_the_common_header() {
        for (name, src) in MODULES {
            let full = full_source(src);
            assert!(!full.contains("#include"), "{name} still includes a file");
            assert!(full.contains("bf2f"), "{name} lacks the common helpers");
        }
    }

    /// Where libnvrtc is present (a developer machine with the CUDA 13 NVRTC, the
    /// GPU machine), every module must compile for sm_90 to an ELF image; a
    /// compile error fails here, before any device time is spent. Without
    /// libnvrtc (CI) there is nothing to compile with: the test says so.
    /// Set (to anything) where NVRTC must be found: `just test` sets it with
    /// the pip wheel's NVRTC on LD_LIBRARY_PATH (scripts/nvrtc-lib.sh), so a
    /// machine without a GPU still compiles every module and this test cannot
    /// pass by skipping there.
    const REQUIRE_NVRTC_ENV: &str = "ENGINE_REQUIRE_NVRTC";

    /// Every CUDA module compiles for [`ARCH`] and gives an ELF CUBIN. Red on
    /// any syntax or type error in a kernel source (a compile error would fail
    /// every CUDA render on the device, which no other CPU test sees).
    #[test]
    fn every_module_compiles_where_nvrtc_exists() {
        if !unsafe { sys::is_culib_present() } {
            assert!(
                std::env::var_os(REQUIRE_NVRTC_ENV).is_none(),
                "{REQUIRE_NVRTC_ENV} is set but libnvrtc.so.13 cannot be loaded: \
                 run scripts/pyenv.sh and put scripts/nvrtc-lib.sh's directory on LD_LIBRARY_PATH"
            );
            eprintln!("libnvrtc not present: kernel compilation not checked here");
            return;
        }
        for (name, src) in MODULES {
            let cubin =
                compile(name, &full_source(src), &options(ARCH)).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(&cubin[..4], b"\x7fELF", "{name}");
        }
    }
}
