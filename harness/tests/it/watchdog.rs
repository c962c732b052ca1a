//! The watchdog's positive control, with the real probe child (this package's
//! `harness __alloc-probe`), and the test engine's frames through the pixel check.

use std::path::Path;

use harness::completion::{check_frames_dir, Expect, Verdict};
use harness::control::watchdog::{control, ControlKind};

use crate::support::bins::{HARNESS, TEST_ENGINE as ENGINE};
use crate::support::dirs::vacant_dir;

#[test]
fn the_floor_control_kills_the_probe_within_two_ticks() {
    let c = control(Path::new(HARNESS), ControlKind::Floor, 20, 0);
    assert_eq!(c.verdict, "pass", "{}", c.detail);
    assert!(c.detail.contains("SIGKILL"), "{}", c.detail);
}

#[test]
fn the_budget_control_kills_the_probe_within_two_ticks() {
    let c = control(Path::new(HARNESS), ControlKind::UnifiedBudget, 50, 0);
    assert_eq!(c.verdict, "pass", "{}", c.detail);
    assert!(c.detail.contains("unified_bytes"), "{}", c.detail);
}

#[test]
fn a_control_with_no_probe_fails_and_says_why() {
    let c = control(Path::new("/nonexistent/harness"), ControlKind::Floor, 20, 0);
    assert_eq!(c.verdict, "fail");
    assert!(c.detail.contains("/nonexistent/harness"), "{}", c.detail);
    // A probe that never allocates (here: `true`, which ignores its arguments and
    // exits) leaves the watchdog silent: the control fails.
    let c = control(Path::new("/bin/true"), ControlKind::Floor, 20, 0);
    assert_eq!(c.verdict, "fail", "{}", c.detail);
    assert!(c.detail.contains("never fired"), "{}", c.detail);
}

#[test]
fn the_floor_must_leave_room_for_the_probe() {
    let c = control(Path::new(HARNESS), ControlKind::Floor, 20, u64::MAX / 4);
    assert_eq!(c.verdict, "fail");
    assert!(c.detail.contains("leaves no room"), "{}", c.detail);
}

#[test]
fn the_test_engines_frames_pass_or_fail_as_their_kind_says() {
    for (kind, want) in [
        ("good", Verdict::Pass),
        ("black", Verdict::Fail),
        ("static", Verdict::Fail),
    ] {
        let d = vacant_dir(&format!("watchdog-frames-{kind}"));
        let st = std::process::Command::new(ENGINE)
            .args(["--frames", kind, "64x32", "9"])
            .env("HARNESS_FRAMES_DIR", &d)
            .env_remove("HARNESS_MARKER_FD")
            .status()
            .unwrap();
        assert!(st.success());
        let c = check_frames_dir(
            &d,
            Expect {
                frames: Some(9),
                size: Some((64, 32)),
            },
        );
        assert_eq!(c.verdict, want, "{kind}: {:?}", c.reasons);
        assert_eq!(c.frames.len(), 9);
        for png in ["first.png", "middle.png", "last.png"] {
            let bytes = std::fs::read(d.join(png)).unwrap();
            assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{png}");
        }
    }
}
