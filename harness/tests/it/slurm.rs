//! Campaigns across a fleet (issue 38) against a real Slurm (a two-node cluster
//! on loopback, [`crate::support::slurm`]) and a real S3 server
//! ([`crate::support::s3`]): `harness campaign --scheduler slurm` submits a
//! 2-round rung-0 campaign (the CPU arm, `rungs/0.toml`) as an sbatch array,
//! one task per round, every run published to the bucket under the task's lease
//! with the node it ran on; `--status` reports the array; `rank` over the bucket
//! pairs within the host; one task cancelled and one killed mid-run leave
//! incomplete bundles (the second through `recover`), and the resubmission runs
//! only the positions not sealed, duplicating none; the Slurm lease satisfies a
//! rung's `require.lease`.
//!
//! The two nodes are two slurmd on this one machine: two tasks side by side
//! would each be measured under the other's load (the contention gate flags
//! such runs and rank excludes them). The tests that measure submit with
//! `--max-parallel 1`, so that their rounds run one after another whatever the
//! node count, and check that no two runs overlapped; the tests take the
//! cluster one at a time. An unthrottled array spreads over both nodes, and its
//! runs record which (where the cluster came up with one node, that assertion
//! says NOT RUN).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::bins::{engine, run};
use crate::support::s3::{Server, SECRET};
use crate::support::slurm::Cluster;

/// How long one array is given (2 rung-0 runs per task, on a busy 2-core box).
const JOB_LIMIT: Duration = Duration::from_secs(600);

/// One task at a time: no run is measured under another's load, whatever the
/// node count.
const ONE_AT_A_TIME: [&str; 2] = ["--max-parallel", "1"];

/// `(code, stdout, stderr)`, asserting the secret appears in neither.
fn go(c: &mut Command) -> (i32, String, String) {
    let (code, so, se) = run(c);
    assert!(
        !so.contains(SECRET) && !se.contains(SECRET),
        "the secret key was printed:\n{so}\n{se}"
    );
    (code, so, se)
}

/// `harness campaign` of host-threads at rung 0 (`rungs/0.toml`), 2 rounds,
/// ABBA, into the bucket's `prefix`, scheduled by Slurm, with `extra` flags.
fn campaign(srv: &Server, cl: &Cluster, prefix: &str, extra: &[&str]) -> (i32, String, String) {
    campaign_of(srv, cl, "0", prefix, extra)
}

/// [`campaign`] of the rung files `rungs`.
fn campaign_of(
    srv: &Server,
    cl: &Cluster,
    rungs: &str,
    prefix: &str,
    extra: &[&str],
) -> (i32, String, String) {
    go(srv
        .harness("node")
        .args(["campaign", "--rungs", rungs, "--levers", "host-threads"])
        .args([
            "--repeat",
            "2",
            "--order",
            "abba",
            "--store",
            &srv.url(prefix),
        ])
        .arg("--engine")
        .arg(engine())
        // render_wall reads the weights: every run starts with them cached, so
        // that no pair is dropped for differing cache states.
        .args(["--weights-cache", "warm"])
        .args([
            "--scheduler",
            "slurm",
            "--partition",
            "harness",
            "--time",
            "20",
        ])
        .args(extra)
        .args(["--", "--cadence-ms", "50"])
        .env("SLURM_CONF", &cl.conf)
        .env_remove("HARNESS_LEASE_ID"))
}

/// The job id of a `slurm: submitted job J: ...` line.
/// Wait for array `job` (two tasks, one per round) and require both COMPLETED;
/// `what` says which array in the failure.
fn wait_both_completed(cl: &Cluster, job: u64, what: &str) {
    let mut got = cl.wait(job, JOB_LIMIT);
    got.sort();
    let want = vec![
        (format!("{job}_1"), "COMPLETED".to_string()),
        (format!("{job}_2"), "COMPLETED".to_string()),
    ];
    assert_eq!(got, want, "{what}");
}

fn job_of(so: &str) -> u64 {
    so.lines()
        .find_map(|l| l.strip_prefix("slurm: submitted job "))
        .and_then(|r| r.split(':').next())
        .and_then(|j| j.parse().ok())
        .unwrap_or_else(|| panic!("no submitted job in {so}"))
}

/// Every committed bundle's manifest under the bucket's `prefix`, with the
/// bundle id (from its key) added as `_id`.
fn manifests(srv: &Server, prefix: &str) -> Vec<Value> {
    srv.keys(&format!("{prefix}/bundles/"))
        .into_iter()
        .filter_map(|k| {
            let id = k
                .strip_suffix("/manifest.json")?
                .rsplit('/')
                .next()?
                .to_string();
            let mut m: Value =
                serde_json::from_slice(&std::fs::read(srv.object_file(&k)).unwrap()).unwrap();
            m["_id"] = Value::String(id);
            Some(m)
        })
        .collect()
}

/// Complete bundles per schedule position.
fn complete_by_position(ms: &[Value]) -> BTreeMap<u64, usize> {
    let mut out = BTreeMap::new();
    for m in ms.iter().filter(|m| m["complete"] == true) {
        *out.entry(m["schedule"]["position"].as_u64().unwrap())
            .or_default() += 1;
    }
    out
}

/// `harness rank --store s3://... --json`, and the host-threads result at rung 0
/// (`None` when no run of it was usable: every one flagged as contended).
fn rank(srv: &Server, prefix: &str) -> (Value, Option<Value>) {
    let (code, so, se) =
        go(srv
            .harness("reviewer")
            .args(["rank", "--json", "--store", &srv.url(prefix)]));
    assert!(code <= 1, "{so}\n{se}");
    let r: Value = serde_json::from_str(&so).unwrap_or_else(|e| panic!("{e}: {so}\n{se}"));
    let lever = r["levers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["id"] == "host-threads")
        .cloned()
        .unwrap();
    let at0 = std::iter::once(&lever["reference"])
        .chain(lever["other_rungs"].as_array().unwrap())
        .find(|x| x["rung"] == "0")
        .cloned();
    (r, at0)
}

/// The runs of `ms` ran one after another: sorted by start, each starts after
/// the one before ended (the run fragment's monotonic clock, one boot), and at
/// least `min` of them say when.
fn assert_one_after_another(ms: &[Value], min: usize) {
    let mut spans: Vec<(u64, u64, String)> = ms
        .iter()
        .filter_map(|m| {
            Some((
                m["run"]["start_ns"].as_u64()?,
                m["run"]["end_ns"].as_u64()?,
                format!("{} ({})", m["_id"], m["lease"]),
            ))
        })
        .collect();
    assert!(
        spans.len() >= min,
        "{} of {} runs timed",
        spans.len(),
        ms.len()
    );
    let boots: std::collections::BTreeSet<&str> = ms
        .iter()
        .filter_map(|m| m["run"]["boot_id"].as_str())
        .collect();
    assert_eq!(boots.len(), 1, "one machine, one boot: {boots:?}");
    spans.sort();
    for w in spans.windows(2) {
        assert!(
            w[1].0 >= w[0].1,
            "run {} started {:.1} s before run {} ended: two tasks ran side by side",
            w[1].2,
            (w[0].1 - w[1].0) as f64 / 1e9,
            w[0].2
        );
    }
}

/// Each manifest of `ms` records the node its task ran on, as squeue gives it
/// for the task its lease names (`tasks`: `(JOB_TASK, state, node)`); the node of
/// each round.
fn nodes_recorded(ms: &[Value], tasks: &[(String, String, String)]) -> BTreeMap<u64, String> {
    let mut out = BTreeMap::new();
    for m in ms {
        let lease = m["lease"]["id"].as_str().unwrap();
        let task = lease.strip_prefix("slurm:").unwrap();
        let slurm_node = tasks
            .iter()
            .find(|(t, _, _)| t == task)
            .map(|(_, _, n)| n.as_str())
            .unwrap_or_else(|| panic!("no task {task} in {tasks:?}"));
        assert!(!slurm_node.is_empty(), "{tasks:?}");
        assert_eq!(
            m["lease"]["node"].as_str(),
            Some(slurm_node),
            "the lease records the node squeue names: {}",
            m["lease"]
        );
        let round = m["schedule"]["round"].as_u64().unwrap();
        out.insert(round, slurm_node.to_string());
    }
    out
}

/// Pairs at rung 0 are formed within one host and no host blocks appear; a run
/// flagged as contended (this box is shared with the rest of the suite) costs
/// at most its round's pair.
fn assert_paired_within_the_host(r: &Value, at0: Option<&Value>, rounds: usize) {
    let contended = r["excluded"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["reason"].as_str().unwrap_or("").starts_with("contended"))
        .count();
    let Some(at0) = at0 else {
        assert!(
            contended >= rounds,
            "no pair and {contended} contended: {r}"
        );
        return;
    };
    let pairs = at0["rounds"].as_array().unwrap();
    assert!(
        pairs.len() >= rounds.saturating_sub(contended) && pairs.len() <= rounds,
        "{} pairs, {contended} contended: {at0}",
        pairs.len()
    );
    let hosts: std::collections::BTreeSet<&str> = pairs
        .iter()
        .map(|p| p["cell"]["host"].as_str().unwrap())
        .collect();
    assert!(hosts.len() <= 1, "{hosts:?}");
    assert_eq!(at0["hosts"], Value::Null, "one host: no blocks");
}

#[test]
fn an_array_runs_a_round_per_task_into_the_bucket_and_rank_pairs_within_the_host() {
    let Some(srv) = Server::start("slurm-array") else {
        return;
    };
    let Some(cl) = Cluster::start("slurm-array") else {
        return;
    };
    let (code, so, se) = campaign(&srv, &cl, "fleet", &ONE_AT_A_TIME);
    assert_eq!(code, 0, "{so}\n{se}");
    assert!(
        so.contains(
            ": array 1-2 (one task per round: 2 round(s), 4 position(s) not sealed; \
             at most 1 task(s) at once)"
        ),
        "{so}"
    );
    let job = job_of(&so);
    let id = so
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("campaign "))
        .and_then(|l| l.split(' ').next())
        .unwrap()
        .to_string();
    // The script: in the campaign's directory, the options passed through, no
    // credential in it.
    let dir = srv.dir.join("node/store/campaigns").join(&id);
    let script = std::fs::read_to_string(dir.join("slurm.sbatch")).unwrap();
    for line in [
        format!("#SBATCH --job-name=harness-{id}"),
        "#SBATCH --array=1-2%1".to_string(),
        "#SBATCH --partition=harness".to_string(),
        "#SBATCH --time=20".to_string(),
        "#SBATCH --exclusive".to_string(),
    ] {
        assert!(script.lines().any(|l| l == line), "no {line} in\n{script}");
    }
    assert!(script.contains("'--slurm-task' '--expect-campaign' '") && !script.contains(SECRET));

    wait_both_completed(&cl, job, &format!("task output in {}", dir.display()));
    let on = cl.tasks_on(job);

    // Each task's output, in the campaign's directory on its node (this
    // machine: both nodes are on it).
    for round in [1, 2] {
        let out = std::fs::read_to_string(dir.join(format!("slurm-{job}_{round}.out")))
            .unwrap_or_else(|e| panic!("task {job}_{round}'s output: {e}"));
        let node = &on
            .iter()
            .find(|(t, _, _)| *t == format!("{job}_{round}"))
            .unwrap()
            .2;
        assert!(
            out.contains(&format!(
                "campaign: slurm task slurm:{job}_{round} on {} (node {node}): round {round} of campaign {id}: 2 position(s), 0 already sealed",
                harness::run::facts::hostname().unwrap_or_default()
            )),
            "{out}"
        );
    }
    // Four bundles in the bucket, one per position, each under its task's lease.
    let ms = manifests(&srv, "fleet");
    assert_eq!(ms.len(), 4, "{ms:?}");
    assert_eq!(
        complete_by_position(&ms),
        BTreeMap::from([(0, 1), (1, 1), (2, 1), (3, 1)])
    );
    for m in &ms {
        let round = m["schedule"]["round"].as_u64().unwrap();
        assert_eq!(m["schedule"]["campaign"], id.as_str());
        assert_eq!(m["lease"]["id"], format!("slurm:{job}_{round}"), "{m}");
        let lease = m["gates"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["name"] == "lease")
            .unwrap();
        assert_eq!(lease["verdict"], "pass", "{lease}");
    }
    // Each run records its task's node; the throttle kept the two tasks (on
    // one node or two) from running side by side.
    let nodes = nodes_recorded(&ms, &on);
    assert_one_after_another(&ms, 4);

    let (r, at0) = rank(&srv, "fleet");
    assert_paired_within_the_host(&r, at0.as_ref(), 2);

    // --status: each round's task and its sealed positions; complete.
    let (code, so, se) = campaign(&srv, &cl, "fleet", &["--status"]);
    assert_eq!(code, 0, "{so}\n{se}");
    assert!(
        so.contains(&format!(
            "campaign {id}: 4 of 4 position(s) sealed complete over 2 round(s)"
        )),
        "{so}"
    );
    for round in [1, 2] {
        let line = so
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{round}  ")))
            .unwrap_or_else(|| panic!("no round {round}: {so}"));
        assert!(
            line.contains(&format!("{job}_{round}"))
                && line.contains("COMPLETED")
                && line.contains(&format!(" {} ", nodes[&round]))
                && line.contains("2/2"),
            "{line}"
        );
    }
    assert!(so.contains("complete: every position is sealed"), "{so}");
    assert!(
        so.contains("sacct: "),
        "the test cluster keeps no accounting: {so}"
    );

    // Submitted again: nothing is left, nothing is submitted.
    let (code, so, _) = campaign(&srv, &cl, "fleet", &ONE_AT_A_TIME);
    assert_eq!(code, 0, "{so}");
    assert!(
        so.contains("slurm: nothing to submit: every position of campaign"),
        "{so}"
    );
}

/// Without `--max-parallel` a campaign's array is not throttled and relies on
/// Slurm to spread exclusive tasks over idle nodes: on the two-node cluster two
/// exclusive tasks start together, one on each node. Checked with a trivial
/// array (each task sleeps), not with renders: two renders side by side on this
/// machine would measure each other and load every other test running beside
/// (the campaign tests submit with `--max-parallel 1` and check the node each
/// run records and `--status` shows). Where the cluster came up with one node,
/// NOT RUN (said on stderr).
#[test]
fn an_unthrottled_exclusive_array_spreads_over_the_nodes() {
    let Some(cl) = Cluster::start("slurm-spread") else {
        return;
    };
    let nodes = cl.nodes();
    assert!(!nodes.is_empty(), "sinfo names no node");
    if nodes.len() < 2 {
        eprintln!(
            "\n*** NOT RUN slurm-spread: the array spreading over two nodes: the cluster has \
             one node ({nodes:?}; scripts/slurm-cluster.sh fell back to one, or \
             HARNESS_SLURM_NODES=1) ***\n"
        );
        return;
    }
    let out = cl
        .command("sbatch")
        .args([
            "--parsable",
            "--array=1-2",
            "--exclusive",
            "--partition=harness",
            "--time=2",
            "--output=/dev/null",
            "--wrap",
            "sleep 3",
        ])
        .output()
        .expect("sbatch");
    let so = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{so}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let job: u64 = so
        .trim()
        .split(';')
        .next()
        .and_then(|j| j.parse().ok())
        .unwrap_or_else(|| panic!("sbatch --parsable printed {so:?}"));
    wait_both_completed(&cl, job, "the unthrottled array");
    let on: BTreeMap<String, String> = cl
        .tasks_on(job)
        .into_iter()
        .map(|(task, _, node)| (task, node))
        .collect();
    for n in on.values() {
        assert!(nodes.contains(n), "{n} is not a node of {nodes:?}");
    }
    let used: std::collections::BTreeSet<&String> = on.values().collect();
    assert_eq!(
        used.len(),
        2,
        "two idle nodes, two exclusive tasks: one on each ({on:?})"
    );
}

/// The staging directories of the local store at `store`.
fn staging(store: &std::path::Path) -> Vec<PathBuf> {
    std::fs::read_dir(store.join("staging"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default()
}

/// The pids of every process whose command line holds one of `marks`.
fn pids_with(marks: &[String]) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if pid != std::process::id() as i32 && marks.iter().any(|m| cmd.contains(m.as_str())) {
            out.push(pid);
        }
    }
    out
}

/// Whether a staging journal of `store` holds `needle`.
fn journal_holds(store: &std::path::Path, needle: &str) -> bool {
    staging(store).iter().any(|d| {
        std::fs::read(d.join("journal"))
            .is_ok_and(|j| j.windows(needle.len()).any(|w| w == needle.as_bytes()))
    })
}

/// Wait until a task of `job` other than `not` is RUNNING with a run staged in
/// `store` (journal open, not sealed); its id `JOB_ROUND`.
fn running_mid_run(cl: &Cluster, job: u64, not: Option<&str>, store: &std::path::Path) -> String {
    let t0 = Instant::now();
    loop {
        let tasks = cl.tasks(job);
        let others_done = not.is_none_or(|n| {
            tasks
                .iter()
                .any(|(t, s)| t == n && crate::support::slurm::TERMINAL.contains(&s.as_str()))
        });
        let running = tasks
            .iter()
            .find(|(t, s)| s == "RUNNING" && Some(t.as_str()) != not)
            .map(|(t, _)| t.clone());
        if let (Some(t), true, false) = (running, others_done, staging(store).is_empty()) {
            return t;
        }
        assert!(t0.elapsed() < JOB_LIMIT, "no task ran: {tasks:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Both ways a task dies, one per round of one array: round A's task cancelled
/// with `scancel` mid-run (Slurm's SIGTERM: the run stops its engine and seals
/// itself `interrupted`, an incomplete bundle it publishes), round B's task
/// killed with SIGKILL, every process at once, as a node losing power (the run
/// leaves its staging directory; `harness recover` on the node seals it
/// `harness-killed` and publishes it). The resubmission asks for the rounds not
/// complete and ends with every position sealed complete exactly once. The rung
/// is rung 0 requiring a lease: refused without Slurm, every run passes the
/// lease gate with its task's `slurm:<job>_<round>`.
#[test]
fn a_killed_task_is_recovered_and_the_resubmission_completes_without_duplicates() {
    let Some(srv) = Server::start("slurm-kill") else {
        return;
    };
    let Some(cl) = Cluster::start("slurm-kill") else {
        return;
    };
    let prefix = "fleet-kill";
    // Rung 0 as a fleet's rungs are: it requires a lease ([require] lease =
    // true), which no run here has but the Slurm task's. Without Slurm the
    // first run is refused by the lease gate.
    let rung = srv.dir.join("0.toml");
    let text = std::fs::read_to_string(crate::support::bins::repo().join("rungs/0.toml")).unwrap();
    assert!(text.contains("lease = false"));
    std::fs::write(&rung, text.replace("lease = false", "lease = true")).unwrap();
    let rung = rung.display().to_string();
    let (code, so, se) = go(srv
        .harness("local-node")
        .args([
            "campaign",
            "--rungs",
            &rung,
            "--levers",
            "host-threads",
            "--repeat",
            "1",
        ])
        .args(["--store", &srv.url("no-lease"), "--engine"])
        .arg(engine())
        .env_remove("HARNESS_LEASE_ID"));
    assert_eq!(code, 3, "{so}\n{se}");
    assert!(so.contains("refused by gate 'lease'"), "{so}");
    // Its own campaign (that rung, seed 2), so that the other test's array,
    // named by its campaign id, never shows in this one's status; one task at a
    // time.
    let campaign = |srv: &Server, cl: &Cluster, prefix: &str, extra: &[&str]| {
        let mut with_seed = vec!["--seed", "2", ONE_AT_A_TIME[0], ONE_AT_A_TIME[1]];
        with_seed.extend_from_slice(extra);
        campaign_of(srv, cl, &rung, prefix, &with_seed)
    };
    let (code, so, se) = campaign(&srv, &cl, prefix, &[]);
    assert_eq!(code, 0, "{so}\n{se}");
    let job = job_of(&so);
    let store = srv.dir.join("node/store");

    let cancelled = running_mid_run(&cl, job, None, &store);
    let out = cl.command("scancel").arg(&cancelled).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Killed once its run has journaled its lease (the journal reaches the disk
    // every 200 ms; a run killed before that leaves no lease to recover).
    let dead = loop {
        let t = running_mid_run(&cl, job, Some(&cancelled), &store);
        let needle = format!("slurm:{t}");
        let t0 = Instant::now();
        while !staging(&store).is_empty() && t0.elapsed() < Duration::from_secs(10) {
            if journal_holds(&store, &needle) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if journal_holds(&store, &needle) {
            break t;
        }
    };
    // This test's processes only: the task's campaign and its run name the
    // bucket prefix, the engine runs from the node's store (the S3 server's data
    // lives beside it, under server/, and is not matched).
    let marks = [srv.url(prefix), srv.dir.join("node").display().to_string()];
    let pids = pids_with(&marks);
    assert!(!pids.is_empty(), "no process of task {dead}");
    for pid in &pids {
        // SAFETY: kill(2) with SIGKILL on pids this test's Slurm task started.
        unsafe { libc::kill(*pid, libc::SIGKILL) };
    }
    let tasks = cl.wait(job, JOB_LIMIT);
    for t in [&cancelled, &dead] {
        let s = tasks.iter().find(|(i, _)| i == t).map(|(_, s)| s.as_str());
        assert!(matches!(s, Some("CANCELLED" | "FAILED")), "{t}: {tasks:?}");
    }
    let ms = manifests(&srv, prefix);
    assert!(
        complete_by_position(&ms).values().all(|n| *n == 1),
        "{ms:?}"
    );
    let interrupted: Vec<&Value> = ms.iter().filter(|m| m["complete"] == false).collect();
    assert_eq!(
        interrupted.len(),
        1,
        "the cancelled run sealed itself: {ms:?}"
    );
    assert_eq!(interrupted[0]["exit"]["reason"], "interrupted");
    assert_eq!(interrupted[0]["lease"]["id"], format!("slurm:{cancelled}"));

    // The dead run's staging directory, sealed by recover and published.
    assert_eq!(
        staging(&store).len(),
        1,
        "the killed run's staging directory"
    );
    let (code, so, se) = go(srv
        .harness("node")
        .args(["recover", "--store", &srv.url(prefix)]));
    assert_eq!(code, 0, "{so}\n{se}");
    assert!(
        so.contains("(harness-killed") && so.contains("published "),
        "{so}"
    );
    let ms = manifests(&srv, prefix);
    let recovered: Vec<&Value> = ms
        .iter()
        .filter(|m| m["complete"] == false && m["exit"]["reason"] != "interrupted")
        .collect();
    assert_eq!(recovered.len(), 1, "{ms:?}");
    assert_eq!(recovered[0]["exit"]["reason"], "harness-killed");
    assert_eq!(recovered[0]["lease"]["id"], format!("slurm:{dead}"));
    let sealed_before = complete_by_position(&ms).len();
    assert!(sealed_before < 4);

    // --status: not complete, naming both rounds.
    let (code, so, _) = campaign(&srv, &cl, prefix, &["--status"]);
    assert_eq!(code, 1, "{so}");
    assert!(so.contains("not complete: round(s) 1, 2 have"), "{so}");

    // Resubmitted: both rounds (each has a position not sealed), only the
    // positions not sealed run, and after it every position is sealed once.
    let (code, so, se) = campaign(&srv, &cl, prefix, &[]);
    assert_eq!(code, 0, "{so}\n{se}");
    assert!(
        so.contains(&format!(
            ": array 1-2 (one task per round: 2 round(s), {} position(s) not sealed; \
             at most 1 task(s) at once)",
            4 - sealed_before
        )),
        "{so}"
    );
    let again = job_of(&so);
    wait_both_completed(&cl, again, "the resubmitted array");
    let ms = manifests(&srv, prefix);
    assert_eq!(
        complete_by_position(&ms),
        BTreeMap::from([(0, 1), (1, 1), (2, 1), (3, 1)]),
        "every position sealed once"
    );
    assert_eq!(ms.len(), 6, "4 complete and the 2 dead runs' bundles");
    // No two of the six ran side by side (the killed run's end may be unknown).
    assert_one_after_another(&ms, 5);
    // Every complete run passed the rung's lease requirement with its task's lease.
    for m in ms.iter().filter(|m| m["complete"] == true) {
        let lease = m["gates"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["name"] == "lease")
            .unwrap();
        assert_eq!(lease["verdict"], "pass", "{lease}");
        assert!(
            m["lease"]["id"]
                .as_str()
                .is_some_and(|l| l.starts_with(&format!("slurm:{again}_"))
                    || l.starts_with(&format!("slurm:{job}_"))),
            "{}",
            m["lease"]
        );
    }

    let (code, so, _) = campaign(&srv, &cl, prefix, &["--status"]);
    assert_eq!(code, 0, "{so}");
    for t in [&cancelled, &dead] {
        let round = t.split('_').nth(1).unwrap();
        let line = so
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{round}  ")))
            .unwrap_or_else(|| panic!("{so}"));
        assert!(
            line.contains(&format!("{again}_{round}"))
                && line.contains("COMPLETED")
                && line.contains(t.as_str()),
            "{line}"
        );
    }
    let (r, at0) = rank(&srv, prefix);
    assert_paired_within_the_host(&r, at0.as_ref(), 2);
    // Both dead runs are named among the excluded (incomplete, or unreadable
    // where they died before the engine fragment was journaled), never used.
    let dead: Vec<String> = manifests(&srv, prefix)
        .iter()
        .filter(|m| m["complete"] == false)
        .map(|m| m["_id"].as_str().map(str::to_string).unwrap_or_default())
        .collect();
    let excluded: Vec<&str> = r["excluded"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            let why = e["reason"].as_str().unwrap_or("");
            why.starts_with("incomplete: ") || why.starts_with("unreadable: ")
        })
        .filter_map(|e| e["id"].as_str())
        .collect();
    assert_eq!(dead.len(), 2);
    for id in &dead {
        assert!(excluded.contains(&id.as_str()), "{id}: {}", r["excluded"]);
    }
}

/// No cluster needed: where sbatch is not on PATH, the submission says what it
/// expected; a directory store is refused for a fleet; Slurm's flags need
/// `--scheduler slurm`; `--max-parallel` is at least 1.
#[test]
fn without_sbatch_or_a_bucket_the_campaign_says_what_it_expected() {
    let Some(srv) = Server::start("slurm-errors") else {
        return;
    };
    let empty = srv.dir.join("empty-path");
    std::fs::create_dir_all(&empty).unwrap();
    let base = |c: &mut Command| {
        c.args([
            "campaign",
            "--rungs",
            "0",
            "--levers",
            "host-threads",
            "--repeat",
            "1",
        ])
        .arg("--engine")
        .arg(engine())
        .env_remove("HARNESS_LEASE_ID");
    };
    let mut c = srv.harness("n");
    base(&mut c);
    c.args(["--store", &srv.url("nosbatch"), "--scheduler", "slurm"])
        .env("PATH", &empty);
    let (code, so, se) = go(&mut c);
    assert_eq!(code, 2, "{so}\n{se}");
    assert!(
        se.contains("--scheduler slurm needs Slurm's `sbatch` on PATH"),
        "{se}"
    );
    let mut c = srv.harness("n");
    base(&mut c);
    c.args(["--store"])
        .arg(srv.dir.join("dir-store"))
        .args(["--scheduler", "slurm"]);
    let (code, _, se) = go(&mut c);
    assert_eq!(code, 2);
    assert!(se.contains("must be an s3://bucket/prefix"), "{se}");
    let mut c = srv.harness("n");
    base(&mut c);
    c.args(["--store", &srv.url("x"), "--partition", "gpu"]);
    let (code, _, se) = go(&mut c);
    assert_eq!(code, 2);
    assert!(
        se.contains("--partition: only with --scheduler slurm"),
        "{se}"
    );
    let mut c = srv.harness("n");
    base(&mut c);
    c.args([
        "--store",
        &srv.url("x"),
        "--scheduler",
        "slurm",
        "--",
        "--lease-id",
        "L1",
    ]);
    let (code, _, se) = go(&mut c);
    assert_eq!(code, 2);
    assert!(se.contains("remove --lease-id from the run flags"), "{se}");
    // --max-parallel: Slurm's, and at least 1.
    let mut c = srv.harness("n");
    base(&mut c);
    c.args(["--store", &srv.url("x"), "--max-parallel", "2"]);
    let (code, _, se) = go(&mut c);
    assert_eq!(code, 2);
    assert!(
        se.contains("--max-parallel: only with --scheduler slurm"),
        "{se}"
    );
    let mut c = srv.harness("n");
    base(&mut c);
    c.args(["--store", &srv.url("x"), "--scheduler", "slurm"])
        .args(["--max-parallel", "0"]);
    let (code, _, se) = go(&mut c);
    assert_eq!(code, 2);
    assert!(
        se.contains("--max-parallel 0: expected at least 1 array task running at a time"),
        "{se}"
    );
}
