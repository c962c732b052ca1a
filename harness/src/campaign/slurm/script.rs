//! The sbatch array script of a campaign: one array task per round still to run,
//! each running `harness campaign ... --scheduler slurm --slurm-task`, which runs
//! that round's positions (both arms, in the campaign's order) on the node it
//! lands on and publishes each run to the bucket.
//!
//! The script is a pure function of its [`ArrayJob`]: the `#SBATCH` lines (the
//! job's name `harness-<campaign id>`, which `--status` finds it by; the array of
//! rounds, with `%N` where at most N tasks may run at once (`--max-parallel`);
//! one node, one task, the node exclusive, since a measurement must own its
//! machine; and `--partition`, `--gres`, `--time` as given), then the task's
//! output sent to `slurm-<job>_<round>.out` in the campaign's directory *on the
//! node that runs it* (made there first: Slurm's own `--output` would need the
//! directory to exist on every node before the task starts, and a node's local
//! store is its own disk), `cd` to the submitting directory and `exec` of the
//! task's command line, every word single-quoted. No credential is ever
//! written into it: the task inherits the submitting shell's environment
//! (sbatch's `--export=ALL`, its default), `AWS_*` and `HARNESS_*` included.

use std::fmt::Write;
use std::path::Path;

use crate::campaign::slurm::error::SlurmError;

/// The script's file name in the campaign's directory (the latest submission's).
pub const SCRIPT_FILE: &str = "slurm.sbatch";

/// The `#SBATCH` options passed through from the command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlurmOptions {
    /// `--partition`.
    pub partition: Option<String>,
    /// `--gres` (e.g. `gpu:h100:1`).
    pub gres: Option<String>,
    /// `--time` (Slurm's formats: `MM`, `HH:MM:SS`, `D-HH`, ...).
    pub time: Option<String>,
}

/// One submission: a campaign's rounds as an array.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArrayJob<'a> {
    /// The campaign id.
    pub campaign: &'a str,
    /// The rounds to run (1-based), ascending: the array indices.
    pub rounds: &'a [u32],
    /// The options passed through.
    pub options: &'a SlurmOptions,
    /// The campaign's directory (each task's output goes there, on its node).
    pub dir: &'a Path,
    /// The directory the task starts in (the submitting one: relative rung and
    /// spec paths resolve there).
    pub workdir: &'a Path,
    /// The task's command line, program first.
    pub command: &'a [String],
    /// At most this many of its tasks running at once (sbatch's array
    /// throttle, `--array=...%N`); `None`: as many as Slurm gives nodes for.
    pub max_parallel: Option<u32>,
}

/// The job name of campaign `id`'s arrays: `harness-<id>`.
pub fn job_name(campaign: &str) -> String {
    format!("harness-{campaign}")
}

/// Rounds as an sbatch array spec, runs of consecutive rounds as ranges:
/// `[1, 2, 3, 5]` -> `1-3,5`.
pub fn array_spec(rounds: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < rounds.len() {
        let start = rounds[i];
        let mut end = start;
        while i + 1 < rounds.len() && rounds[i + 1] == end + 1 {
            end += 1;
            i += 1;
        }
        out.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    out.join(",")
}

/// `s` as one word of a POSIX shell: single-quoted, each `'` as `'\''`.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The `--array` value of `rounds`, throttled to `max_parallel` tasks at once
/// (`1-3,5%2`); a throttle of 0 is refused (no task would ever start).
pub fn array_value(rounds: &[u32], max_parallel: Option<u32>) -> Result<String, SlurmError> {
    let spec = array_spec(rounds);
    match max_parallel {
        None => Ok(spec),
        Some(0) => Err(SlurmError::Option {
            option: "max-parallel",
            value: "0".into(),
            why: "expected at least 1 array task at a time",
        }),
        Some(n) => Ok(format!("{spec}%{n}")),
    }
}

/// A value for an `#SBATCH` line: printable ASCII without spaces (sbatch reads
/// the line up to the first space; a newline would start another line).
fn option_value(option: &'static str, value: &str) -> Result<String, SlurmError> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(SlurmError::Option {
            option,
            value: value.to_string(),
            why: "expected printable ASCII without spaces",
        });
    }
    Ok(value.to_string())
}

/// The script text of `job`.
pub fn script(job: &ArrayJob) -> Result<String, SlurmError> {
    let mut o = String::new();
    let dir = job.dir.display().to_string();
    let _ = writeln!(o, "#!/bin/bash");
    let _ = writeln!(
        o,
        "# harness campaign {}: one array task per round (both arms, the campaign's order),",
        job.campaign
    );
    let _ = writeln!(
        o,
        "# each run published to the bucket; written by `harness campaign --scheduler slurm`."
    );
    let _ = writeln!(o, "#SBATCH --job-name={}", job_name(job.campaign));
    let _ = writeln!(
        o,
        "#SBATCH --array={}",
        array_value(job.rounds, job.max_parallel)?
    );
    let _ = writeln!(o, "#SBATCH --nodes=1");
    let _ = writeln!(o, "#SBATCH --ntasks=1");
    let _ = writeln!(o, "#SBATCH --exclusive");
    let _ = writeln!(o, "#SBATCH --output=/dev/null");
    for (name, v) in [
        ("partition", &job.options.partition),
        ("gres", &job.options.gres),
        ("time", &job.options.time),
    ] {
        if let Some(v) = v {
            let _ = writeln!(o, "#SBATCH --{name}={}", option_value(name, v)?);
        }
    }
    let _ = writeln!(o, "set -euo pipefail");
    let _ = writeln!(o, "mkdir -p {}", shell_quote(&dir));
    let _ = writeln!(
        o,
        "exec >>{}\"/slurm-${{SLURM_ARRAY_JOB_ID}}_${{SLURM_ARRAY_TASK_ID}}.out\" 2>&1",
        shell_quote(&dir)
    );
    let _ = writeln!(o, "cd {}", shell_quote(&job.workdir.display().to_string()));
    let words: Vec<String> = job.command.iter().map(|w| shell_quote(w)).collect();
    let _ = writeln!(o, "exec {}", words.join(" "));
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_become_ranges_and_words_survive_the_shell() {
        assert_eq!(array_spec(&[1, 2, 3, 5, 7, 8]), "1-3,5,7-8");
        assert_eq!(array_spec(&[2]), "2");
        assert_eq!(array_spec(&[]), "");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        // The quoted word reads back as itself through a real shell.
        let word = "x'y \"$HOME\" `z` \\";
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("printf %s {}", shell_quote(word)))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), word);
    }

    #[test]
    fn the_script_names_the_job_the_array_and_passes_the_options_through() {
        let opts = SlurmOptions {
            partition: Some("h100".into()),
            gres: Some("gpu:1".into()),
            time: Some("02:00:00".into()),
        };
        let cmd = vec![
            "/h/harness".to_string(),
            "campaign".into(),
            "--rungs".into(),
            "0".into(),
        ];
        let job = ArrayJob {
            campaign: "0123abcd0123abcd",
            rounds: &[1, 2, 4],
            options: &opts,
            dir: Path::new("/s/campaigns/0123abcd0123abcd"),
            workdir: Path::new("/repo"),
            command: &cmd,
            max_parallel: None,
        };
        let s = script(&job).unwrap();
        for line in [
            "#SBATCH --job-name=harness-0123abcd0123abcd",
            "#SBATCH --array=1-2,4",
            "#SBATCH --exclusive",
            "#SBATCH --output=/dev/null",
            "mkdir -p '/s/campaigns/0123abcd0123abcd'",
            "exec >>'/s/campaigns/0123abcd0123abcd'\"/slurm-${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}.out\" 2>&1",
            "#SBATCH --partition=h100",
            "#SBATCH --gres=gpu:1",
            "#SBATCH --time=02:00:00",
            "cd '/repo'",
            "exec '/h/harness' 'campaign' '--rungs' '0'",
        ] {
            assert!(s.lines().any(|l| l == line), "no {line:?} in\n{s}");
        }
        assert!(s.starts_with("#!/bin/bash\n"));
        // Without options, no such lines; a value that would break the line is refused.
        let bare = script(&ArrayJob {
            options: &SlurmOptions::default(),
            ..job.clone()
        })
        .unwrap();
        assert!(!bare.contains("--partition") && !bare.contains("--gres"));
        // Without --max-parallel the array is not throttled; with it, `%N`.
        assert!(!s.contains('%'), "{s}");
        let one = script(&ArrayJob {
            max_parallel: Some(1),
            ..job.clone()
        })
        .unwrap();
        assert!(one.lines().any(|l| l == "#SBATCH --array=1-2,4%1"), "{one}");
        assert_eq!(
            one.lines()
                .filter(|l| l.starts_with("#SBATCH --array"))
                .count(),
            1
        );
        let three = script(&ArrayJob {
            max_parallel: Some(3),
            rounds: &[7],
            ..job.clone()
        })
        .unwrap();
        assert!(three.lines().any(|l| l == "#SBATCH --array=7%3"), "{three}");
        let e = script(&ArrayJob {
            max_parallel: Some(0),
            ..job.clone()
        })
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("--max-parallel \"0\"") && e.contains("at least 1"),
            "{e}"
        );
        let bad = SlurmOptions {
            partition: Some("a\n#SBATCH --uid=0".into()),
            ..Default::default()
        };
        let e = script(&ArrayJob {
            options: &bad,
            ..job
        })
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("--partition ") && e.contains("printable ASCII"),
            "{e}"
        );
    }
}
