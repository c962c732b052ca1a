//! A real S3-protocol server for the S3 store's tests: s3s-fs (crates.io,
//! installed by `scripts/s3-server.sh install`, which `just test` runs), started
//! on 127.0.0.1 at a free port over a data directory of the build tree, with a
//! bucket made as a directory (s3s-fs keeps one directory per bucket and one
//! file per object: the tests tamper with an object there, below the server).
//! Where it cannot be installed, `HARNESS_NO_S3_SERVER=1` makes each test say
//! NOT RUN on stderr instead of failing.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::bins::{harness, repo};
use super::dirs::fresh_dir;

/// The test credentials (only ever on this loopback server).
pub const KEY: &str = "harness-test-key";
/// The test secret: asserted never to appear in any output.
pub const SECRET: &str = "harness-test-secret-9f3c";
/// The bucket every test uses.
pub const BUCKET: &str = "evidence";

/// A running server, killed on drop.
pub struct Server {
    child: Child,
    /// The port on 127.0.0.1.
    pub port: u16,
    /// The server's data directory (`<data>/<bucket>/<key>` per object).
    pub data: PathBuf,
    /// The test's own directory (local stores, caches).
    pub dir: PathBuf,
}

/// The installed server binary, or `None` (with NOT RUN on stderr) when the
/// environment says it cannot be installed here; panics when it is simply missing.
fn binary(test: &str) -> Option<PathBuf> {
    let b = repo().join("target/tools/s3s-fs/bin/s3s-fs");
    if b.is_file() {
        return Some(b);
    }
    if std::env::var_os("HARNESS_NO_S3_SERVER").is_some() {
        eprintln!("NOT RUN {test}: no S3 server here (HARNESS_NO_S3_SERVER; scripts/s3-server.sh install failed)");
        return None;
    }
    panic!(
        "{} is missing: run scripts/s3-server.sh install (just test does), or set \
         HARNESS_NO_S3_SERVER=1 to report this test NOT RUN",
        b.display()
    );
}

impl Server {
    /// Start a server for test `name` with an empty bucket [`BUCKET`]; `None`
    /// when the server cannot be installed here (NOT RUN said).
    pub fn start(name: &str) -> Option<Server> {
        let bin = binary(name)?;
        let dir = fresh_dir(&format!("s3-{name}"));
        let data = dir.join("server");
        std::fs::create_dir_all(data.join(BUCKET)).unwrap();
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let mut child = Command::new(&bin)
                .args(["--host", "127.0.0.1", "--port", &port.to_string()])
                .args(["--access-key", KEY, "--secret-key", SECRET])
                .arg(&data)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start s3s-fs");
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(15) {
                if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return Some(Server {
                        child,
                        port,
                        data,
                        dir,
                    });
                }
                if child.try_wait().unwrap().is_some() {
                    break; // the port was taken meanwhile: another one
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("s3s-fs did not start listening on 127.0.0.1");
    }

    /// `s3://evidence/<prefix>`.
    pub fn url(&self, prefix: &str) -> String {
        format!("s3://{BUCKET}/{prefix}")
    }

    /// The file holding object `key` of the bucket (below the server).
    pub fn object_file(&self, key: &str) -> PathBuf {
        self.data.join(BUCKET).join(key)
    }

    /// `harness` pointed at this server: the credentials and endpoint in the
    /// environment (as a team sets them), the AWS files and the user's store
    /// kept out, the local store and the verify cache under `local`.
    pub fn harness(&self, local: &str) -> Command {
        let mut c = harness();
        let l = self.dir.join(local);
        c.env("AWS_ACCESS_KEY_ID", KEY)
            .env("AWS_SECRET_ACCESS_KEY", SECRET)
            .env(
                "AWS_ENDPOINT_URL",
                format!("http://127.0.0.1:{}", self.port),
            )
            .env("AWS_REGION", "us-east-1")
            .env("AWS_CONFIG_FILE", self.dir.join("no-aws-config"))
            .env(
                "AWS_SHARED_CREDENTIALS_FILE",
                self.dir.join("no-aws-credentials"),
            )
            .env_remove("AWS_PROFILE")
            .env_remove("AWS_SESSION_TOKEN")
            .env("HARNESS_LOCAL_STORE", l.join("store"))
            .env("HARNESS_VERIFY_CACHE", l.join("cache"))
            .current_dir(repo());
        c
    }

    /// Object keys under `prefix` (relative to the bucket), sorted.
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        let root = self.data.join(BUCKET);
        let mut out = Vec::new();
        walk(&root, &root, &mut out);
        out.retain(|k| k.starts_with(prefix));
        out.sort();
        out
    }
}

fn walk(root: &Path, d: &Path, out: &mut Vec<String>) {
    let Ok(rd) = std::fs::read_dir(d) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            walk(root, &p, out);
        } else if let Ok(rel) = p.strip_prefix(root) {
            let k = rel.to_string_lossy().into_owned();
            // s3s-fs keeps its own metadata and upload scratch beside objects.
            if !k.contains(".s3s") && !k.starts_with('.') {
                out.push(k);
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
