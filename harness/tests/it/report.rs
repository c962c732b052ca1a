//! End-to-end: `harness report` on the planted store of [`crate::rank`] (effects,
//! a fit, contended and incomplete runs), then the page opened in headless
//! Chromium: no console message, nothing requested outside the report, a
//! screenshot that is not blank, and one plotted interval per ranked row.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use harness::formats::forest::rows;

use crate::rank::{ranking, spec_toml, world};
use crate::support::bins::{harness, run};
use crate::support::browser::{chromium, console_lines, headless};
use crate::support::dirs::{fresh_dir, vacant_dir};

/// Every file under `dir` (relative path -> bytes).
fn files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    fn walk(root: &Path, d: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
        for e in std::fs::read_dir(d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = e.expect("a directory entry").path();
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                let rel = p.strip_prefix(root).expect("under the root").to_path_buf();
                out.insert(rel, std::fs::read(&p).expect("read a report file"));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// Every value of attribute `name` (`href`, `src`) in `html`.
fn attr_values<'a>(html: &'a str, name: &str) -> Vec<&'a str> {
    let key = format!(" {name}=\"");
    html.match_indices(&key)
        .filter_map(|(at, _)| html[at + key.len()..].split('"').next())
        .collect()
}

fn spec_file() -> PathBuf {
    let spec = fresh_dir("report-spec").join("spec.toml");
    std::fs::write(&spec, spec_toml()).expect("write the spec");
    spec
}

fn report(store: &Path, spec: &Path, out: &Path) -> (i32, String, String) {
    run(harness()
        .arg("report")
        .arg("--store")
        .arg(store)
        .arg("--spec")
        .arg(spec)
        .arg("--out")
        .arg(out))
}

#[test]
fn the_report_is_self_contained_deterministic_and_renders_in_a_browser() {
    let w = world();
    let spec = spec_file();
    let out = vacant_dir("report-e2e");
    let (code, so, se) = report(&w.store_root, &spec, &out);
    assert_eq!(code, 0, "{so}{se}");
    let first = files(&out);
    // Same store, same bytes: written again over itself (ours, by the marker).
    let (code, _, se) = report(&w.store_root, &spec, &out);
    assert_eq!(code, 0, "{se}");
    assert!(first == files(&out), "a second report differs");

    let page = String::from_utf8(first[Path::new("index.html")].clone()).expect("UTF-8 page");
    // Nothing outside the report: no scheme, no protocol-relative URL, no
    // subresource at all (no src, no stylesheet, no url()), and every link lands
    // on a file the report wrote.
    for banned in [
        "http:", "https:", "file:", "\"//", "<script", "<link", "url(", " src=",
    ] {
        assert!(!page.contains(banned), "{banned} in index.html");
    }
    let hrefs = attr_values(&page, "href");
    assert!(!hrefs.is_empty());
    for h in &hrefs {
        if let Some(anchor) = h.strip_prefix('#') {
            assert!(
                page.contains(&format!(" id=\"{anchor}\"")),
                "dangling #{anchor}"
            );
        } else {
            assert!(
                out.join(h).is_file(),
                "link {h} names no file in the report"
            );
        }
    }

    // Every pair links both timelines and a diff; every bundle is listed.
    let r = ranking(&w.dirs);
    let pairs: Vec<_> = rows(&r).iter().flat_map(|x| x.at.rounds.clone()).collect();
    assert!(pairs.len() >= 10, "{} pairs", pairs.len());
    assert_eq!(page.matches("class=\"diff\"").count(), pairs.len());
    for p in &pairs {
        for id in [&p.baseline_id, &p.treatment_id] {
            assert!(
                hrefs.contains(&format!("timelines/{id}.svg").as_str()),
                "no timeline link for {id}"
            );
        }
        let diff = format!("diffs/{}_vs_{}.html", p.baseline_id, p.treatment_id);
        let text = std::fs::read_to_string(out.join(&diff)).expect("the diff page");
        assert!(
            text.contains(&format!("- A: `{}`", p.baseline_id)),
            "{diff}"
        );
    }
    for e in &r.excluded {
        assert!(
            page.contains(&harness::formats::forest::xml_escape(&e.reason)),
            "{}",
            e.reason
        );
    }
    // The contended run is listed with its timeline.
    assert!(page.contains(&format!("timelines/{}.svg", w.contended_id)));
    // The planted fit names the constant phase.
    assert!(page.contains("<td>artifacts.frames</td>") && page.contains("<b>no</b>"));
    let timelines = first.keys().filter(|k| k.starts_with("timelines")).count();
    assert_eq!(timelines, w.dirs.len());

    let Some(browser) =
        chromium("report::the_report_is_self_contained_deterministic_and_renders_in_a_browser")
    else {
        return;
    };
    let url = format!(
        "file://{}",
        out.join("index.html")
            .canonicalize()
            .expect("the page path")
            .display()
    );
    let scratch = fresh_dir("report-browser");
    let limit = Duration::from_secs(90);
    let dom = headless(
        &browser,
        &scratch.join("profile"),
        &url,
        &["--dump-dom".to_string()],
        limit,
    );
    assert_eq!(dom.code, 0, "{}", dom.stderr);
    assert!(
        console_lines(&dom.stderr).is_empty(),
        "console messages: {:?}",
        console_lines(&dom.stderr)
    );
    let want_rows = rows(&r).len();
    let want_intervals = rows(&r).iter().filter(|x| x.saving().is_some()).count();
    assert!(want_intervals >= 6, "{want_intervals}");
    assert_eq!(
        dom.stdout.matches("class=\"row\"").count(),
        want_rows,
        "rows in the DOM"
    );
    assert_eq!(
        dom.stdout.matches("class=\"ci\"").count(),
        want_intervals,
        "plotted intervals in the DOM"
    );
    assert!(
        !dom.stdout.contains(" src="),
        "the DOM requests a subresource"
    );

    let png = scratch.join("page.png");
    let shot = headless(
        &browser,
        &scratch.join("profile"),
        &url,
        &[
            format!("--screenshot={}", png.display()),
            "--window-size=1400,1600".to_string(),
            "--hide-scrollbars".to_string(),
        ],
        limit,
    );
    assert_eq!(shot.code, 0, "{}", shot.stderr);
    assert!(console_lines(&shot.stderr).is_empty(), "{}", shot.stderr);
    let (w_px, h_px, distinct, inked) = picture_stats(&png);
    assert_eq!((w_px, h_px), (1400, 1600));
    // A blank or failed render is one or two colours; the page has text, tables
    // and four verdict colours, antialiased into many more.
    assert!(distinct >= 64, "{distinct} distinct colours: blank?");
    assert!(inked > 0.02, "{:.4} of the pixels are not white", inked);
}

/// Width, height, distinct RGB colours and the share of pixels that are not
/// near-white, of a PNG decoded with the png crate.
fn picture_stats(path: &Path) -> (u32, u32, usize, f64) {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut decoder = png::Decoder::new(std::io::BufReader::new(file));
    decoder.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let mut reader = decoder.read_info().expect("a PNG header");
    let mut buf = vec![0; reader.output_buffer_size().expect("a sane PNG size")];
    let info = reader.next_frame(&mut buf).expect("a PNG frame");
    let channels = info.color_type.samples();
    assert!(channels >= 3, "{:?}", info.color_type);
    let px = &buf[..info.buffer_size()];
    let mut colours = std::collections::BTreeSet::new();
    let mut inked = 0usize;
    for p in px.chunks_exact(channels) {
        colours.insert((p[0], p[1], p[2]));
        if p[0] < 235 || p[1] < 235 || p[2] < 235 {
            inked += 1;
        }
    }
    let n = px.len() / channels;
    (
        info.width,
        info.height,
        colours.len(),
        inked as f64 / n.max(1) as f64,
    )
}

#[test]
fn a_foreign_out_directory_and_a_missing_or_empty_store_are_refused() {
    let w = world();
    let spec = spec_file();
    let foreign = fresh_dir("report-foreign");
    std::fs::write(foreign.join("notes.txt"), "mine").expect("write");
    let (code, _, se) = report(&w.store_root, &spec, &foreign);
    assert_eq!(code, 2, "{se}");
    assert!(
        se.contains(&foreign.display().to_string()) && se.contains("not made by `harness report`"),
        "{se}"
    );
    assert_eq!(
        std::fs::read_to_string(foreign.join("notes.txt")).ok(),
        Some("mine".into())
    );
    assert_eq!(std::fs::read_dir(&foreign).expect("list").count(), 1);

    let out = vacant_dir("report-none");
    let missing = vacant_dir("report-missing-store");
    let (code, _, se) = report(&missing, &spec, &out);
    assert_eq!(code, 2, "{se}");
    assert!(se.contains("no such directory"), "{se}");
    let empty = fresh_dir("report-empty-store");
    let (code, _, se) = report(&empty, &spec, &out);
    assert_eq!(code, 2, "{se}");
    assert!(se.contains("holds no bundles"), "{se}");
    assert!(!out.exists(), "a refused report wrote {}", out.display());
}
