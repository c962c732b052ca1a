//! The harness's end-to-end tests, one binary: each module was its own test file
//! and keeps its test names (`cargo test -p harness --test it run::NAME`), and
//! [`support`] holds the helpers they share.
//!
//! * [`bounded_input`]: hostile packs and bundles (tar extension headers, zstd
//!   bombs, a corrupted copy in the store) against `unpack`/`verify`, peak RSS bounded.
//! * [`run`]: the real `harness run` driving the test engine; what each bundle says.
//! * [`rung0`]: `harness run --rung rungs/0.toml` with the real engine.
//! * [`campaign`]: `harness campaign` with the real engine: interleave, resume, stop.
//! * [`faults`]: engine and harness SIGKILLed at seeded random points, a full disk
//!   (`FAULTS_RUNS`, `FAULTS_SEED`, `HARNESS_FAULTS_NO_LOOP`).
//! * [`control`]: `harness control`'s GPU control over scripted burns and a
//!   fake utilization: readings inside the load only, instrument errors named.
//! * [`watchdog`]: the watchdog's positive control and the test engine's frames.
//! * [`cli`]: the store gate; recover, ls, verify and show on a real store.
//! * [`rank`]: planted effects ranked; the `rank` and `diff` binaries.
//! * [`report`]: `harness report` on the planted store, its page opened in headless
//!   Chromium (`HARNESS_TEST_CHROMIUM`, `HARNESS_NO_CHROMIUM`).
//! * [`surfaces`]: plot, export, pack/unpack, `--json`, and third-party readers
//!   (`HARNESS_TEST_PYTHON`).
//! * [`exec_engines`]: `--exec` wraps a venv interpreter, a pyenv-style shim and
//!   a shell script in place, pinning what ran.
//! * [`committed_evidence`]: every committed bundle verifies and
//!   `reports/levers.md` reproduces.
//! * [`layout`]: the module graph has no circles, subcommands live in `cmd/`, no
//!   code names a fragment key by string.
//! * [`hostile`]: the hostile tester's cases (tampered, crafted and oversized
//!   input), one test per case.
//! * [`s3`]: the store on the S3 protocol against a real server (s3s-fs on
//!   loopback): publish, read back, concurrent publishers, a killed upload
//!   recovered, tampering caught, rank identical to rank on disk
//!   (`HARNESS_NO_S3_SERVER`).
//! * [`slurm`]: campaigns across a fleet: `--scheduler slurm` against a real
//!   one-node Slurm and the S3 server: the array, its status, a killed task
//!   recovered and resubmitted, rank within the host (`HARNESS_NO_SLURM`).
//! * [`spec_campaign`]: the campaign spec (`specs/device-residency.md`) stays
//!   executable.

mod support;

mod bounded_input;
mod campaign;
mod cli;
mod committed_evidence;
mod control;
mod exec_engines;
mod faults;
mod fidelity;
mod hostile;
mod layout;
mod rank;
mod report;
mod run;
mod rung0;
mod s3;
mod slurm;
mod spec_campaign;
mod surfaces;
mod watchdog;
