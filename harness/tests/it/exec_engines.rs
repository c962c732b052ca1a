//! `harness run --exec` wraps engines as people run them (issue 19): a virtual
//! environment's interpreter with a package only that environment has, a
//! pyenv-style shim that dispatches on its own name, a shell script; each runs
//! in place, completes, and the bundle pins the script by sha256 (and the
//! Python environment); a script edited while it runs is flagged.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::support::bins::{bundle_path, harness, text, TEST_ENGINE};
use crate::support::dirs::{fresh_dir, vacant_dir};

/// The engine scripts hand over to the test engine for markers and frames.
const HAND_OVER: &str = "--hello --frames good 64x48 9";

/// `python3` as PATH finds it here (a real interpreter or a shim).
fn python3() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("python3"))
        .find(|p| p.is_file())
        .expect("python3 on PATH (the test setup needs it)")
}

/// PATH with `dir` first.
fn path_with(dir: &Path) -> std::ffi::OsString {
    let mut dirs = vec![dir.to_path_buf()];
    dirs.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    std::env::join_paths(dirs).unwrap()
}

/// `harness run --exec -- ARGS` in `cwd` with PATH `path`: (exit, manifest, stderr).
fn exec_in(
    cwd: &Path,
    path: &std::ffi::OsStr,
    store: &Path,
    args: &[&str],
) -> (i32, Value, String) {
    let out = harness()
        .current_dir(cwd)
        .env("PATH", path)
        .env("TEST_ENGINE_BIN", TEST_ENGINE)
        .env_remove("HARNESS_LEASE_ID")
        .env_remove("VIRTUAL_ENV")
        .args(["run", "--store"])
        .arg(store)
        .arg("--exec")
        .arg("--")
        .args(args)
        .output()
        .unwrap();
    let se = text(&out.stderr);
    let m = std::fs::read(bundle_path(&out).join("manifest.json"))
        .map(|b| serde_json::from_slice(&b).unwrap())
        .unwrap_or_else(|e| panic!("no bundle ({e}): {se}"));
    (out.status.code().unwrap_or(-1), m, se)
}

fn sha256_hex(p: &Path) -> String {
    evidence::weights_digest::sha256_file(p).unwrap()
}

/// The pinned file of `role` whose name ends with `suffix`.
fn pinned<'a>(m: &'a Value, role: &str, suffix: &str) -> &'a Value {
    m["engine"]["pinned"]["files"]
        .as_array()
        .and_then(|a| {
            a.iter().find(|f| {
                f["role"] == role && f["named"].as_str().is_some_and(|n| n.ends_with(suffix))
            })
        })
        .unwrap_or_else(|| panic!("no pinned {role} {suffix}: {}", m["engine"]))
}

#[test]
fn a_venv_interpreter_runs_with_its_own_packages_and_the_script_is_pinned() {
    let d = fresh_dir("exec-venv");
    let venv = d.join("venv");
    let made = Command::new(python3())
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "python3 -m venv: {}",
        text(&made.stderr)
    );
    // A package only this environment has, installed as a distribution.
    let purelib = Command::new(venv.join("bin/python"))
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ])
        .output()
        .unwrap();
    let site = PathBuf::from(text(&purelib.stdout).trim());
    std::fs::create_dir_all(site.join("venvmark")).unwrap();
    std::fs::write(site.join("venvmark/__init__.py"), "MARK = 'venv'\n").unwrap();
    std::fs::create_dir_all(site.join("venvmark-1.0.dist-info")).unwrap();
    std::fs::write(
        site.join("venvmark-1.0.dist-info/METADATA"),
        "Metadata-Version: 2.1\nName: venvmark\nVersion: 1.0\n",
    )
    .unwrap();
    let script = d.join("engine.py");
    std::fs::write(
        &script,
        format!(
            "import os, venvmark\nassert venvmark.MARK == 'venv'\nte = os.environ['TEST_ENGINE_BIN']\nos.execv(te, [te] + {:?}.split())\n",
            HAND_OVER
        ),
    )
    .unwrap();
    let store = vacant_dir("exec-venv-store");
    let (code, m, se) = exec_in(
        &d,
        &path_with(&venv.join("bin")),
        &store,
        &["python3", "engine.py"],
    );
    assert_eq!(code, 0, "{se}");
    assert_eq!(m["exit"]["reason"], "completed", "{se}");
    assert_eq!(
        pinned(&m, "argument", "engine.py")["sha256"],
        sha256_hex(&script)
    );
    assert_eq!(m["engine"]["exec"], true);
    assert!(
        m["engine"]["store_path"].is_null(),
        "an --exec program is not copied"
    );
    let py = &m["engine"]["pinned"]["python"];
    let prefix = py["prefix"].as_str().unwrap_or_else(|| panic!("{py}"));
    assert_eq!(
        Path::new(prefix).canonicalize().unwrap(),
        venv.canonicalize().unwrap()
    );
    assert!(py["distributions"].as_u64().unwrap() >= 1, "{py}");
    assert_eq!(py["distributions_sha256"].as_str().map(str::len), Some(64));
    assert!(m.get("exec_check").is_none(), "{}", m["exec_check"]);
}

#[test]
fn a_pyenv_style_shim_that_dispatches_on_its_name_runs_in_place() {
    let d = fresh_dir("exec-shim");
    let shims = d.join("shims");
    std::fs::create_dir_all(&shims).unwrap();
    let real_dir = python3().parent().unwrap().to_path_buf();
    let shim = shims.join("python3");
    // Like pyenv's shims: the name it was started by picks the program.
    std::fs::write(
        &shim,
        format!(
            "#!/bin/sh\nname=$(basename \"$0\")\nexec \"{}/$name\" \"$@\"\n",
            real_dir.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755)).unwrap();
    let script = d.join("engine.py");
    std::fs::write(
        &script,
        format!(
            "import os\nte = os.environ['TEST_ENGINE_BIN']\nos.execv(te, [te] + {:?}.split())\n",
            HAND_OVER
        ),
    )
    .unwrap();
    let store = vacant_dir("exec-shim-store");
    let (code, m, se) = exec_in(&d, &path_with(&shims), &store, &["python3", "engine.py"]);
    assert_eq!(code, 0, "{se}");
    assert_eq!(
        pinned(&m, "program", "python3")["sha256"],
        sha256_hex(&shim)
    );
    assert_eq!(pinned(&m, "interpreter", "/bin/sh")["role"], "interpreter");
    assert_eq!(
        pinned(&m, "argument", "engine.py")["sha256"],
        sha256_hex(&script)
    );
    assert!(
        m["engine"]["pinned"]["python"]["version"].is_string(),
        "{}",
        m["engine"]
    );
}

#[test]
fn a_shell_script_engine_runs_and_one_edited_while_running_is_flagged() {
    let d = fresh_dir("exec-shell");
    let script = d.join("engine.sh");
    std::fs::write(
        &script,
        format!("#!/bin/sh\nexec \"$TEST_ENGINE_BIN\" {HAND_OVER}\n"),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let store = vacant_dir("exec-shell-store");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let (code, m, se) = exec_in(&d, &path, &store, &["./engine.sh"]);
    assert_eq!(code, 0, "{se}");
    assert_eq!(
        pinned(&m, "program", "engine.sh")["sha256"],
        sha256_hex(&script)
    );
    assert!(m.get("exec_check").is_none());

    // The same engine, edited by itself while it runs.
    std::fs::write(
        &script,
        format!("#!/bin/sh\necho '# edited' >> \"$0\"\nexec \"$TEST_ENGINE_BIN\" {HAND_OVER}\n"),
    )
    .unwrap();
    let (code, m, se) = exec_in(&d, &path, &store, &["./engine.sh"]);
    let changed = m["exec_check"]["changed"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        changed.len() == 1 && changed[0].as_str().unwrap().contains("engine.sh"),
        "{}\n{se}",
        m["exec_check"]
    );
    assert!(se.contains("changed while the engine ran"), "{se}");
    let _ = code;
}

#[test]
fn out_dash_writes_the_file_to_standard_output_alone() {
    let repo = crate::support::bins::repo();
    let id = "dc068fb8d3470c98ae1b5cf84e3a3a35ecc4ccdf6c5103266711357b57932e3d";
    let dir = repo.join("reports/evidence/bundles").join(id);
    let d = fresh_dir("exec-out-dash");
    let run_out = |args: &[&str]| {
        let out = harness().current_dir(&repo).args(args).output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}",
            text(&out.stderr)
        );
        out.stdout
    };
    let dir_s = dir.display().to_string();
    // export: the trace, and nothing else, on stdout; equal to the file form.
    let json = run_out(&["export", "--perfetto", &dir_s, "--out", "-"]);
    let v: Value = serde_json::from_slice(&json).expect("stdout is the trace alone");
    assert!(v["traceEvents"].as_array().is_some_and(|a| !a.is_empty()));
    let file = d.join("t.json");
    run_out(&[
        "export",
        "--perfetto",
        &dir_s,
        "--out",
        file.to_str().unwrap(),
    ]);
    assert_eq!(std::fs::read(&file).unwrap(), json);
    // plot: SVG by default on stdout, PNG with --format png.
    let svg = run_out(&["plot", &dir_s, "--out", "-"]);
    assert!(String::from_utf8_lossy(&svg).contains("<svg"), "not SVG");
    let png = run_out(&["plot", &dir_s, "--out", "-", "--format", "png"]);
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));
    // pack: the same bytes as the file form.
    let packed = run_out(&["pack", &dir_s, "--out", "-"]);
    let file = d.join("b.tar.zst");
    run_out(&["pack", &dir_s, "--out", file.to_str().unwrap()]);
    assert_eq!(std::fs::read(&file).unwrap(), packed);
    // rank: the table alone, as without --out.
    let a = run_out(&["rank", "--store", "reports/evidence", "--out", "-"]);
    let b = run_out(&["rank", "--store", "reports/evidence"]);
    assert_eq!(a, b);
}

#[test]
fn campaign_finds_the_engine_next_to_the_harness_binary() {
    // From a directory with no target/ under it.
    let d = fresh_dir("exec-campaign-default");
    let repo = crate::support::bins::repo();
    let out = harness()
        .current_dir(&d)
        .args([
            "campaign",
            "--dry-run",
            "--levers",
            "staging",
            "--repeat",
            "1",
            "--rungs",
        ])
        .arg(repo.join("rungs/2.toml"))
        .arg("--spec")
        .arg(repo.join("specs/levers.toml"))
        .arg("--store")
        .arg(d.join("store"))
        .output()
        .unwrap();
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{all}");
    let next_to = Path::new(crate::support::bins::HARNESS)
        .parent()
        .unwrap()
        .join("engine");
    let sha = sha256_hex(&next_to);
    assert!(
        all.contains(&format!("(engine {}, order random", &sha[..12])),
        "{all}"
    );
}
