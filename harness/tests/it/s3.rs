//! The store on the S3 protocol against a real server (s3s-fs on loopback,
//! [`crate::support::s3`]): runs publish there, readers read it back verified,
//! two publishers at once, an upload killed midway and finished by `recover`, a
//! tampered object caught, a campaign publishing every run, and `rank` over the
//! bucket identical to `rank` over the same bundles on disk (the committed
//! evidence, `--check reports/levers.md`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::bins::{repo, run, TEST_ENGINE};
use crate::support::dirs::fresh_store;
use crate::support::render::seal_render;
use crate::support::s3::{Server, SECRET};

/// `(code, stdout, stderr)`, asserting the secret appears in neither.
fn go(c: &mut Command) -> (i32, String, String) {
    let (code, so, se) = run(c);
    assert!(
        !so.contains(SECRET) && !se.contains(SECRET),
        "the secret key was printed:\n{so}\n{se}"
    );
    (code, so, se)
}

/// Sealed synthetic renders in a fresh local store; their ids.
fn local_bundles(name: &str, seeds: &[u64]) -> (PathBuf, Vec<String>) {
    let store = fresh_store(name);
    let ids = seeds
        .iter()
        .map(|s| seal_render(&store, *s, 3, false).id)
        .collect();
    (store.root().to_path_buf(), ids)
}

/// The bucket's objects with their bytes.
fn snapshot(srv: &Server, prefix: &str) -> BTreeMap<String, Vec<u8>> {
    srv.keys(prefix)
        .into_iter()
        .map(|k| {
            let b = std::fs::read(srv.object_file(&k)).unwrap();
            (k, b)
        })
        .collect()
}

/// The modification times of the bucket's objects under `prefix`, in key order.
fn mtimes(srv: &Server, prefix: &str) -> Vec<std::time::SystemTime> {
    srv.keys(prefix)
        .iter()
        .map(|k| {
            std::fs::metadata(srv.object_file(k))
                .unwrap()
                .modified()
                .unwrap()
        })
        .collect()
}

#[test]
fn a_run_publishes_to_the_bucket_and_every_reader_reads_it_back_verified() {
    let Some(srv) = Server::start("publish") else {
        return;
    };
    let url = srv.url("team");
    // A run on "machine a" lands in the bucket.
    let (code, so, se) = go(srv
        .harness("a")
        .args([
            "run",
            "--store",
            &url,
            "--cadence-ms",
            "20",
            "--exec",
            "--",
            TEST_ENGINE,
        ])
        .args("--hello --render 2 2 --sleep-ms 200 --frames good 64x48 9".split(' ')));
    assert_eq!(code, 0, "{so}\n{se}");
    let id = so
        .lines()
        .find_map(|l| l.strip_prefix("bundle: "))
        .expect("bundle line")
        .to_string();
    assert!(
        so.contains(&format!("published: {url}/bundles/{id} (")),
        "{so}"
    );
    let keys = srv.keys(&format!("team/bundles/{id}/"));
    assert!(
        keys.iter().any(|k| k.ends_with("/manifest.json")),
        "{keys:?}"
    );
    let local_copy = srv.dir.join("a/store/bundles").join(&id);
    let files = std::fs::read_dir(&local_copy).unwrap().count();
    assert_eq!(keys.len(), files, "every file of the bundle is an object");
    // Each object is byte-identical to the file sealed on the machine.
    for k in &keys {
        let name = k.rsplit('/').next().unwrap();
        assert_eq!(
            std::fs::read(srv.object_file(k)).unwrap(),
            std::fs::read(local_copy.join(name)).unwrap(),
            "{k}"
        );
    }
    // Machine "b", which never saw the run, reads it through the bucket.
    let (code, so, se) = go(srv.harness("b").args(["ls", "--store", &url]));
    assert_eq!(code, 0, "{se}");
    assert!(so.contains(&id[..12]), "{so}");
    let (code, so, se) = go(srv
        .harness("b")
        .args(["verify", "--store", &url, &id[..10]]));
    assert_eq!(
        (code, so.trim()),
        (0, format!("ok {id} ({} files)", keys.len()).as_str()),
        "{se}"
    );
    let (code, so, se) = go(srv.harness("b").args(["show", "--store", &url, &id]));
    assert_eq!(code, 0, "{se}");
    assert!(so.contains("denoise"), "{so}");
    // show fetched a verified copy into b's local store.
    assert!(srv
        .dir
        .join("b/store/bundles")
        .join(&id)
        .join("manifest.json")
        .is_file());
    // A local copy that no longer verifies is replaced from the bucket.
    let copy = srv
        .dir
        .join("b/store/bundles")
        .join(&id)
        .join("phases.parquet");
    let good = std::fs::read(&copy).unwrap();
    let mut bad = good.clone();
    bad[7] ^= 1;
    std::fs::write(&copy, &bad).unwrap();
    let (code, _, se) = go(srv.harness("b").args(["show", "--store", &url, &id]));
    assert_eq!(code, 0, "{se}");
    assert_eq!(
        std::fs::read(&copy).unwrap(),
        good,
        "the corrupt copy was replaced"
    );
    let (code, _, se) = go(srv.harness("b").args(["diff", "--store", &url, &id, &id]));
    assert_eq!(code, 0, "{se}");
    // The report page of the bucket (its bundles fetched whole, verified).
    let rep = srv.dir.join("report");
    let (code, _, se) = go(srv
        .harness("b")
        .args(["report", "--store", &url, "--out"])
        .arg(&rep));
    assert_eq!(code, 0, "{se}");
    let page = std::fs::read_to_string(rep.join("index.html")).unwrap();
    assert!(
        page.contains(&id) && page.contains("s3://evidence/team"),
        "the page names the bundle and the bucket"
    );
    // plot, export and pack read the same verified copy.
    for args in [
        vec!["plot", "--store", &url, &id, "--out", "-"],
        vec!["export", "--perfetto", "--store", &url, &id, "--out", "-"],
        vec!["pack", "--store", &url, &id, "--out", "-"],
    ] {
        let (code, so, se) = go(srv.harness("b").args(&args));
        assert_eq!(code, 0, "{args:?}: {se}");
        assert!(!so.is_empty(), "{args:?} wrote nothing");
    }
    // An unknown id is a usage error naming the bucket.
    let (code, _, se) = go(srv.harness("b").args(["show", "--store", &url, "ffff"]));
    assert_eq!(code, 2, "{se}");
    assert!(
        se.contains("s3://evidence/team") && se.contains("no bundle matches"),
        "{se}"
    );
    // Nothing owed: the outbox is empty once the manifest is committed.
    let (code, so, _) = go(srv.harness("a").args(["recover", "--store", &url]));
    assert_eq!(code, 0);
    assert!(!so.contains("published"), "{so}");
}

#[test]
fn sync_is_idempotent_both_ways_and_verifies_as_it_goes() {
    let Some(srv) = Server::start("sync") else {
        return;
    };
    let url = srv.url("p");
    let (dir, ids) = local_bundles("s3-sync-src", &[1, 2, 3]);
    let (code, so, se) = go(srv.harness("a").args(["sync"]).arg(&dir).arg(&url));
    assert_eq!(code, 0, "{so}\n{se}");
    assert!(so.contains("3 copied, 0 already there, 0 refused"), "{so}");
    let before = snapshot(&srv, "p/");
    let stamps = mtimes(&srv, "p/");
    let (code, so, _) = go(srv.harness("a").args(["sync"]).arg(&dir).arg(&url));
    assert_eq!(code, 0);
    assert!(so.contains("0 copied, 3 already there, 0 refused"), "{so}");
    let again = mtimes(&srv, "p/");
    assert_eq!(stamps, again, "a second sync wrote nothing");
    assert_eq!(before, snapshot(&srv, "p/"));
    // Back to a new directory store: every bundle arrives verified, then stays.
    let back = srv.dir.join("back");
    let (code, so, se) = go(srv.harness("a").args(["sync", &url]).arg(&back));
    assert_eq!(code, 0, "{so}\n{se}");
    assert!(so.contains("3 copied"), "{so}");
    for id in &ids {
        let (c, _, se) = go(srv
            .harness("a")
            .args(["verify", "--store"])
            .arg(&back)
            .arg(id));
        assert_eq!(c, 0, "{se}");
    }
    let (_, so, _) = go(srv.harness("a").args(["sync", &url]).arg(&back));
    assert!(so.contains("0 copied, 3 already there"), "{so}");
    // A bundle that does not verify at the source is refused, the rest still go.
    let (dir2, ids2) = local_bundles("s3-sync-bad", &[4, 5]);
    let bad = dir2.join("bundles").join(&ids2[0]).join("phases.parquet");
    let mut b = std::fs::read(&bad).unwrap();
    b[10] ^= 1;
    std::fs::write(&bad, b).unwrap();
    let (code, so, _) = go(srv.harness("a").args(["sync"]).arg(&dir2).arg(&url));
    assert_eq!(code, 1, "{so}");
    assert!(so.contains("1 copied, 0 already there, 1 refused"), "{so}");
    assert!(
        so.contains("phases.parquet"),
        "the refusal names the file: {so}"
    );
    assert!(
        srv.keys(&format!("p/bundles/{}", ids2[0])).is_empty(),
        "nothing of it uploaded"
    );
}

#[test]
fn two_machines_publishing_at_once_never_corrupt_or_overwrite_a_bundle() {
    let Some(srv) = Server::start("concurrent") else {
        return;
    };
    let url = srv.url("team");
    // Different bundles from two machines, and the same bundles from both.
    let (a, ids_a) = local_bundles("s3-conc-a", &[11, 12, 13, 14]);
    let (b, ids_b) = local_bundles("s3-conc-b", &[21, 22, 23, 24]);
    let (shared, ids_s) = local_bundles("s3-conc-shared", &[31, 32, 33, 34]);
    let shared2 = srv.dir.join("shared-copy");
    let (c, _, se) = go(srv.harness("x").args(["sync"]).arg(&shared).arg(&shared2));
    assert_eq!(c, 0, "{se}");
    for round in 0..2 {
        let spawn = |from: &Path, who: &str| {
            srv.harness(who)
                .args(["sync"])
                .arg(from)
                .arg(&url)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        };
        let (src1, src2): (&Path, &Path) = if round == 0 {
            (&a, &b)
        } else {
            (&shared, &shared2)
        };
        let p1 = spawn(src1, "m1");
        let p2 = spawn(src2, "m2");
        for p in [p1, p2] {
            let out = p.wait_with_output().unwrap();
            let so = String::from_utf8_lossy(&out.stdout);
            assert_eq!(out.status.code(), Some(0), "round {round}: {so}");
            assert!(so.contains("0 refused"), "{so}");
        }
    }
    // Every bundle is there once, whole, and verifies object by object.
    let listed = go(srv.harness("r").args(["ls", "--json", "--store", &url])).1;
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 12, "{listed}");
    for id in ids_a.iter().chain(&ids_b).chain(&ids_s) {
        let (c, so, se) = go(srv.harness("r").args(["verify", "--store", &url, id]));
        assert_eq!(c, 0, "{id}: {so}{se}");
    }
    // An object of other content already at a bundle's key (not committed) is
    // never overwritten: the publisher stops, naming the key, and commits nothing.
    let (d, ids_d) = local_bundles("s3-conc-squat", &[41]);
    let squat = format!("team/bundles/{}/phases.parquet", ids_d[0]);
    std::fs::create_dir_all(srv.object_file(&squat).parent().unwrap()).unwrap();
    std::fs::write(srv.object_file(&squat), b"not the bundle's table").unwrap();
    // Once as it is, once with the publisher's listing taken before the
    // squatter wrote (`HARNESS_TEST_PUBLISH_UNLISTED`: publish as if the listing
    // were empty), so that the conditional create alone must refuse.
    for unlisted in [false, true] {
        let mut c = srv.harness("m1");
        if unlisted {
            c.env("HARNESS_TEST_PUBLISH_UNLISTED", "1");
        }
        let (code, so, _) = go(c.args(["sync"]).arg(&d).arg(&url));
        assert_eq!(code, 1, "{so}");
        assert!(
            so.contains(&squat) && so.contains("not overwritten"),
            "unlisted {unlisted}: {so}"
        );
        assert_eq!(
            std::fs::read(srv.object_file(&squat)).unwrap(),
            b"not the bundle's table"
        );
        assert!(!srv
            .object_file(&format!("team/bundles/{}/manifest.json", ids_d[0]))
            .exists());
    }
}

#[test]
fn an_upload_killed_midway_is_no_bundle_until_recover_finishes_it() {
    let Some(srv) = Server::start("killed") else {
        return;
    };
    let url = srv.url("team");
    let (dir, ids) = local_bundles("s3-killed-src", &[7]);
    let id = &ids[0];
    let pack = srv.dir.join("one.pack");
    let (c, _, se) = go(srv
        .harness("x")
        .args(["pack", "--store"])
        .arg(&dir)
        .args([id, "--out"])
        .arg(&pack));
    assert_eq!(c, 0, "{se}");
    // The machine dies (SIGKILL) after its third object.
    let (code, _, _) = go(srv
        .harness("a")
        .env("HARNESS_TEST_KILL_PUBLISH_AFTER", "3")
        .args(["unpack", "--store", &url])
        .arg(&pack));
    assert_eq!(code, -1, "killed by a signal");
    let keys = srv.keys(&format!("team/bundles/{id}/"));
    assert_eq!(keys.len(), 3, "{keys:?}");
    assert!(
        !keys.iter().any(|k| k.ends_with("manifest.json")),
        "{keys:?}"
    );
    // Readers see no bundle; asking for it says why and what finishes it.
    let (_, so, _) = go(srv.harness("b").args(["ls", "--store", &url]));
    assert!(!so.contains(&id[..12]), "{so}");
    let (code, _, se) = go(srv.harness("b").args(["show", "--store", &url, id]));
    assert_eq!(code, 2, "{se}");
    assert!(
        se.contains("did not finish") && se.contains("harness recover"),
        "{se}"
    );
    // Recover on the machine that made it finishes the upload, once.
    let (code, so, se) = go(srv.harness("a").args(["recover", "--store", &url]));
    assert_eq!(code, 0, "{so}{se}");
    assert!(
        so.contains(&format!("published {id}")) && so.contains("3 already there"),
        "{so}"
    );
    let (code, so, _) = go(srv.harness("b").args(["verify", "--store", &url, id]));
    assert_eq!(code, 0, "{so}");
    let (_, so, _) = go(srv.harness("a").args(["recover", "--store", &url]));
    assert!(!so.contains("published"), "owed once only: {so}");
    // A run that died before sealing (its staging journal left in the local
    // store that stages for the bucket): recover seals it and publishes it.
    let local = evidence::store::Store::resolve(Some(&srv.dir.join("a/store"))).unwrap();
    let j = crate::support::journal::SynthJournal::in_store(&local);
    j.fragment("run", serde_json::json!({"hostname": "a"}));
    drop(j);
    let (code, so, se) = go(srv.harness("a").args(["recover", "--store", &url]));
    assert_eq!(code, 0, "{so}{se}");
    let sealed = so
        .lines()
        .find_map(|l| {
            l.strip_prefix("sealed ")
                .and_then(|r| r.split(" -> ").nth(1))
        })
        .and_then(|r| r.split(' ').next())
        .unwrap_or_else(|| panic!("no sealed line: {so}"))
        .to_string();
    assert!(so.contains(&format!("published {sealed}")), "{so}");
    let (code, so, _) = go(srv.harness("b").args(["verify", "--store", &url, &sealed]));
    assert_eq!(code, 0, "{so}");
}

#[test]
fn a_campaign_publishes_every_run_and_resumes_from_the_local_store() {
    let Some(srv) = Server::start("campaign") else {
        return;
    };
    let url = srv.url("team");
    let campaign = || {
        go(srv
            .harness("a")
            .args(["campaign", "--rungs", "0", "--levers", "host-threads"])
            .args([
                "--repeat", "1", "--order", "abba", "--store", &url, "--engine",
            ])
            .arg(crate::support::bins::engine())
            .env_remove("HARNESS_LEASE_ID"))
    };
    let (code, so, se) = campaign();
    assert_eq!(code, 0, "{so}\n{se}");
    assert!(so.contains("2 sealed complete"), "{so}");
    let published: Vec<&str> = so
        .lines()
        .filter(|l| l.starts_with("published: "))
        .collect();
    assert_eq!(published.len(), 2, "{so}");
    let (_, listed, _) = go(srv.harness("b").args(["ls", "--json", "--store", &url]));
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 2, "{listed}");
    // Rerun: both positions are done (read from the local store), nothing runs.
    let (code, so, _) = campaign();
    assert_eq!(code, 0, "{so}");
    assert!(so.contains("2 already done"), "{so}");
}

#[test]
fn a_tampered_object_is_caught_by_verify_show_and_rank() {
    let Some(srv) = Server::start("tamper") else {
        return;
    };
    let url = srv.url("team");
    let (dir, ids) = local_bundles("s3-tamper-src", &[1, 2]);
    let (c, _, se) = go(srv.harness("a").args(["sync"]).arg(&dir).arg(&url));
    assert_eq!(c, 0, "{se}");
    // rank once (the tables verify and are remembered), then tamper below the server.
    let (c, _, se) = go(srv.harness("r").args(["rank", "--json", "--store", &url]));
    assert_eq!(c, 0, "{se}");
    let key = format!("team/bundles/{}/phases.parquet", ids[0]);
    let f = srv.object_file(&key);
    let mut b = std::fs::read(&f).unwrap();
    let i = b.len() / 2;
    b[i] ^= 0x20;
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(&f, &b).unwrap();
    let (code, so, _) = go(srv.harness("v").args(["verify", "--store", &url, &ids[0]]));
    assert_eq!(code, 1, "{so}");
    assert!(so.contains("phases.parquet"), "{so}");
    let (code, _, se) = go(srv.harness("v").args(["show", "--store", &url, &ids[0]]));
    assert_eq!(code, 1, "{se}");
    assert!(
        se.contains("phases.parquet") && se.contains("does not verify"),
        "{se}"
    );
    // The machine that ranked before reads its verified local copy (what its
    // `report` reads too); a machine without one fetches the tampered object,
    // hashes it, and excludes the bundle.
    let (code, so, se) = go(srv.harness("r").args(["rank", "--json", "--store", &url]));
    assert_eq!(code, 0, "{se}");
    let r: serde_json::Value = serde_json::from_str(&so).unwrap();
    assert!(
        !r["excluded"].to_string().contains("does not verify"),
        "{}",
        r["excluded"]
    );
    let (code, so, se) = go(srv.harness("r2").args(["rank", "--json", "--store", &url]));
    assert_eq!(code, 0, "{se}");
    let r: serde_json::Value = serde_json::from_str(&so).unwrap();
    let ex = r["excluded"].to_string();
    assert!(
        ex.contains(&ids[0])
            && ex.contains("does not verify")
            && ex.contains("phases.parquet: sha256"),
        "excluded by its hash, not by a decoder that happened to choke: {ex}"
    );
    // The other bundle still reads.
    let (code, _, _) = go(srv.harness("v").args(["verify", "--store", &url, &ids[1]]));
    assert_eq!(code, 0);
}

#[test]
fn rank_over_the_bucket_reproduces_the_committed_table_from_the_committed_bundles() {
    let Some(srv) = Server::start("rank") else {
        return;
    };
    let url = srv.url("evidence");
    let ev = repo().join("reports/evidence");
    let (c, so, se) = go(srv.harness("a").args(["sync"]).arg(&ev).arg(&url));
    assert_eq!(c, 0, "{so}{se}");
    // The check reads the bucket's bundles fetched into the local store.
    let (c, so, se) =
        go(srv
            .harness("r")
            .args(["rank", "--store", &url, "--check", "reports/levers.md"]));
    assert_eq!(c, 0, "{so}\n{se}");
    assert!(so.contains("reproduce from"), "{so}");
    assert!(se.contains("verified in the local store"), "{se}");
    // Byte for byte: the JSON ranking and the table written from the bucket
    // equal those from the directory, but for the store the Regenerate line names.
    let out = srv.dir.join("out");
    let (s3_md, dir_md) = (out.join("s3/levers.md"), out.join("dir/levers.md"));
    let (c, _, se) = go(srv
        .harness("r")
        .args(["rank", "--store", &url, "--out"])
        .arg(&s3_md));
    assert_eq!(c, 0, "{se}");
    let (c, _, se) = go(srv
        .harness("d")
        .args(["rank", "--store"])
        .arg(&ev)
        .arg("--out")
        .arg(&dir_md));
    assert_eq!(c, 0, "{se}");
    let s3 = std::fs::read_to_string(&s3_md).unwrap();
    let dir = std::fs::read_to_string(&dir_md).unwrap();
    let regen = |t: &str| {
        t.lines()
            .filter(|l| !l.starts_with("Regenerate:"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(regen(&s3), regen(&dir));
    assert_eq!(s3.lines().count(), dir.lines().count());
    assert!(s3.contains(&format!("--store {url} --out")), "{s3}");
    assert_eq!(
        std::fs::read(out.join("s3/levers-forest.svg")).unwrap(),
        std::fs::read(out.join("dir/levers-forest.svg")).unwrap()
    );
    let (_, j1, _) = go(srv.harness("r").args(["rank", "--json", "--store", &url]));
    let (_, j2, _) = go(srv
        .harness("d")
        .args(["rank", "--json", "--store"])
        .arg(&ev));
    let strip = |t: &str| {
        let mut v: serde_json::Value = serde_json::from_str(t).unwrap();
        v.as_object_mut().unwrap().remove("command");
        v
    };
    assert_eq!(strip(&j1), strip(&j2));
    // A second rank reads the local copies, each verified again in full.
    let (_, _, se) = go(srv.harness("r").args(["rank", "--json", "--store", &url]));
    let committed = std::fs::read_dir(ev.join("bundles")).unwrap().count();
    assert!(
        se.contains(&format!(
            "{committed} committed bundle(s), {committed} verified in the local store"
        )),
        "{se}"
    );
}

#[test]
fn bad_credentials_and_locations_are_clear_errors_that_print_no_secret() {
    let Some(srv) = Server::start("creds") else {
        return;
    };
    let url = srv.url("team");
    let (code, _, se) = go(srv
        .harness("a")
        .env("AWS_SECRET_ACCESS_KEY", format!("{SECRET}-wrong"))
        .args(["ls", "--store", &url]));
    assert_ne!(code, 0);
    assert!(se.contains("s3://evidence/team"), "{se}");
    let (code, _, se) =
        go(srv
            .harness("a")
            .args(["ls", "--store", "s3://AKIA:hunter2@evidence/x"]));
    assert_eq!(code, 2);
    assert!(
        !se.contains("hunter2") && se.contains("credentials"),
        "{se}"
    );
    // A command that reads only a directory says so instead of making `s3:/...`.
    let (code, _, se) = go(srv.harness("a").args(["control", "--store", &url]));
    assert_eq!(code, 2, "{se}");
    assert!(se.contains("object-store URL"), "{se}");
    assert!(!repo().join("s3:").exists());
    // A run whose bucket cannot be reached is refused before anything is written.
    let (code, _, se) = go(srv
        .harness("a")
        .env("AWS_SECRET_ACCESS_KEY", "wrong")
        .args([
            "run",
            "--store",
            &url,
            "--exec",
            "--",
            TEST_ENGINE,
            "--hello",
        ]));
    assert_eq!(code, 3, "{se}");
    assert!(se.contains("store-remote"), "{se}");
    assert!(
        !srv.dir.join("a/store/bundles").exists()
            || std::fs::read_dir(srv.dir.join("a/store/bundles"))
                .unwrap()
                .count()
                == 0
    );
}

#[test]
fn a_profile_in_the_aws_files_and_harness_store_reach_the_bucket() {
    let Some(srv) = Server::start("profile") else {
        return;
    };
    let (dir, ids) = local_bundles("s3-profile-src", &[3]);
    let (c, _, se) = go(srv
        .harness("a")
        .args(["sync"])
        .arg(&dir)
        .arg(srv.url("team")));
    assert_eq!(c, 0, "{se}");
    // No key, secret or endpoint in the environment: profile `ci` of the
    // shared files has them, as `aws configure --profile ci` writes them.
    let creds = srv.dir.join("credentials");
    let config = srv.dir.join("config");
    std::fs::write(
        &creds,
        format!(
            "[default]\naws_access_key_id = wrong\naws_secret_access_key = wrong\n\n\
             [ci]\naws_access_key_id = {}\naws_secret_access_key = {SECRET}\n",
            crate::support::s3::KEY
        ),
    )
    .unwrap();
    std::fs::write(
        &config,
        format!(
            "[default]\nendpoint_url = http://127.0.0.1:{0}\n\n\
             [profile ci]\nregion = us-east-1\nendpoint_url = http://127.0.0.1:{0}\n",
            srv.port
        ),
    )
    .unwrap();
    let with_files = |profile: Option<&str>| {
        let mut c = srv.harness("b");
        c.env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_SECRET_ACCESS_KEY")
            .env_remove("AWS_ENDPOINT_URL")
            .env_remove("AWS_REGION")
            .env("AWS_SHARED_CREDENTIALS_FILE", &creds)
            .env("AWS_CONFIG_FILE", &config)
            .env("HARNESS_STORE", srv.url("team"))
            .args(["verify", &ids[0]]);
        if let Some(p) = profile {
            c.env("AWS_PROFILE", p);
        }
        go(&mut c)
    };
    let (code, so, se) = with_files(Some("ci"));
    assert_eq!(code, 0, "{so}{se}");
    assert!(so.starts_with(&format!("ok {}", ids[0])), "{so}");
    // The default profile's keys are wrong: refused by the server.
    let (code, _, _) = with_files(None);
    assert_ne!(code, 0);
}

/// Issue 35, finding 1 on a bucket: a bundle of which only `manifest.json` is
/// left (or whose table was torn) is not "present": sync hashes every object,
/// rewrites the wrong ones (the manifest last), counts and names it.
#[test]
fn sync_replaces_a_bucket_copy_that_is_only_a_manifest_or_torn() {
    let Some(srv) = Server::start("sync-repair") else {
        return;
    };
    let url = srv.url("b");
    let (dir, ids) = local_bundles("s3-repair-src", &[1, 2]);
    let (c, so, se) = go(srv.harness("a").args(["sync"]).arg(&dir).arg(&url));
    assert_eq!(c, 0, "{so}{se}");
    for k in srv.keys(&format!("b/bundles/{}/", ids[0])) {
        if !k.ends_with("manifest.json") {
            std::fs::remove_file(srv.object_file(&k)).unwrap();
        }
    }
    let torn = srv.object_file(&format!("b/bundles/{}/phases.parquet", ids[1]));
    let mut b = std::fs::read(&torn).unwrap();
    let i = b.len() / 2;
    b[i] ^= 0x01;
    std::fs::write(&torn, b).unwrap();
    let (c, so, se) = go(srv.harness("a").args(["sync"]).arg(&dir).arg(&url));
    assert_eq!(c, 0, "{so}{se}");
    assert!(
        so.contains("0 already there, 0 refused, 2 replaced"),
        "{so}"
    );
    for id in &ids {
        assert!(
            so.lines()
                .any(|l| l.starts_with("replaced") && l.contains(&id[..12])),
            "{so}"
        );
        let (c, so, _) = go(srv.harness("v").args(["verify", "--store", &url, id]));
        assert_eq!(c, 0, "{so}");
    }
}
