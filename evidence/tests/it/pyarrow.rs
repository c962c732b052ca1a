//! A reader nobody here wrote: pyarrow reads every Parquet file of a sealed
//! bundle and must see the same row counts, values and column units.
//!
//! Needs `HARNESS_TEST_PYTHON` pointing at a Python with pyarrow (`just test`
//! sets it up: `./scripts/pyenv.sh` creates target/pyenv). Without it the test
//! FAILS, saying how to set it up; it never skips silently.

use std::collections::BTreeMap;
use std::process::Command;

use arrow_array::{Array, BooleanArray, Float64Array, Int64Array, StringArray};
use arrow_schema::DataType;
use evidence::bundle_files;
use evidence::journal::Record;
use evidence::parquet_tables;
use evidence::sample::{ColumnType, SAMPLE_COLUMNS};
use evidence::seal::seal;
use evidence::store::Store;
use evidence::test_kit::run::{fake_png, synth_records, test_dir, write_journal, Rng, RunShape};
use serde_json::Value;

const SCRIPT: &str = r#"
import json, os, sys
import pyarrow.parquet as pq
out = {}
d = sys.argv[1]
for name in sorted(os.listdir(d)):
    if not name.endswith(".parquet"):
        continue
    t = pq.read_table(os.path.join(d, name))
    out[name] = {
        "rows": t.num_rows,
        "columns": {f.name: t.column(f.name).to_pylist() for f in t.schema},
        "order": [f.name for f in t.schema],
        "units": {f.name: (f.metadata or {}).get(b"unit", b"").decode() for f in t.schema},
        "windows": {f.name: (f.metadata or {}).get(b"window", b"").decode() for f in t.schema},
    }
print(json.dumps(out))
"#;

/// Our own reading of a table as JSON columns, for comparison.
fn columns_json(bytes: &[u8], schema: &arrow_schema::Schema) -> BTreeMap<String, Vec<Value>> {
    let t = parquet_tables::read_table(bytes, schema).unwrap();
    let mut out: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for b in &t.batches {
        for (f, col) in schema.fields().iter().zip(b.columns()) {
            let v = out.entry(f.name().clone()).or_default();
            for i in 0..col.len() {
                v.push(if col.is_null(i) {
                    Value::Null
                } else {
                    match f.data_type() {
                        DataType::Int64 => {
                            Value::from(col.as_any().downcast_ref::<Int64Array>().unwrap().value(i))
                        }
                        DataType::Float64 => Value::from(
                            col.as_any()
                                .downcast_ref::<Float64Array>()
                                .unwrap()
                                .value(i),
                        ),
                        DataType::Utf8 => Value::from(
                            col.as_any().downcast_ref::<StringArray>().unwrap().value(i),
                        ),
                        DataType::Boolean => Value::from(
                            col.as_any()
                                .downcast_ref::<BooleanArray>()
                                .unwrap()
                                .value(i),
                        ),
                        other => panic!("unexpected type {other}"),
                    }
                });
            }
        }
    }
    out
}

#[test]
fn pyarrow_reads_every_table_with_the_same_rows_values_and_units() {
    let python = std::env::var("HARNESS_TEST_PYTHON").unwrap_or_else(|_| {
        panic!(
            "HARNESS_TEST_PYTHON is not set. This test needs a Python with pyarrow: run `just test`, \
             or `./scripts/pyenv.sh` and then \
             `HARNESS_TEST_PYTHON=$PWD/target/pyenv/bin/python cargo test -p evidence --test it pyarrow::`"
        )
    });
    let d = test_dir("pyarrow");
    let store = Store::resolve(Some(&d.join("store"))).unwrap();
    let records = synth_records(RunShape::small(91));
    let st = store.open_staging().unwrap();
    write_journal(&st.journal_path(), &records);
    std::fs::write(st.frames_dir().join("first.png"), fake_png(&mut Rng(1))).unwrap();
    let sealed = seal(st.dir(), &store).unwrap();

    let out = Command::new(&python)
        .arg("-c")
        .arg(SCRIPT)
        .arg(&sealed.path)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {python}: {e}"));
    assert!(
        out.status.success(),
        "pyarrow failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let py: Value = serde_json::from_slice(&out.stdout).expect("pyarrow output is JSON");

    let names = [
        bundle_files::SAMPLES,
        bundle_files::PHASES,
        bundle_files::MARKERS,
        bundle_files::FRAMES,
    ];
    assert_eq!(py.as_object().unwrap().len(), names.len());
    for name in names {
        let schema = parquet_tables::schema_for(name).unwrap();
        let bytes = std::fs::read(sealed.path.join(name)).unwrap();
        let ours = columns_json(&bytes, &schema);
        let theirs = &py[name];
        let rows = theirs["rows"].as_u64().unwrap();
        assert_eq!(
            Some(rows),
            ours.values().next().map(|c| c.len() as u64),
            "{name}"
        );
        let order: Vec<&str> = theirs["order"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let want: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(order, want, "{name}");
        for f in schema.fields() {
            let col = theirs["columns"][f.name()].as_array().unwrap();
            assert_eq!(col, &ours[f.name()], "{name}.{}", f.name());
            assert_eq!(
                theirs["units"][f.name()],
                Value::from(f.metadata()["unit"].as_str()),
                "{name}.{}",
                f.name()
            );
        }
    }

    // And against the journal itself, not only against our reader.
    let samples: Vec<_> = records
        .iter()
        .filter_map(|r| match r {
            Record::Sample(s) => Some(s),
            _ => None,
        })
        .collect();
    let pc = &py[bundle_files::SAMPLES]["columns"];
    assert_eq!(
        py[bundle_files::SAMPLES]["rows"],
        Value::from(samples.len())
    );
    for (i, s) in samples.iter().enumerate() {
        assert_eq!(pc["t_ns"][i], Value::from(s.t_ns));
        for (c, spec) in SAMPLE_COLUMNS.iter().enumerate() {
            let want = match (s.values[c], spec.ty) {
                (None, _) => Value::Null,
                (Some(v), ColumnType::I64) => Value::from(v as i64),
                (Some(v), ColumnType::F64) => Value::from(v),
            };
            assert_eq!(pc[spec.name][i], want, "row {i} {}", spec.name);
        }
    }
    for spec in SAMPLE_COLUMNS {
        assert_eq!(
            py[bundle_files::SAMPLES]["units"][spec.name],
            Value::from(spec.unit)
        );
        assert_eq!(
            py[bundle_files::SAMPLES]["windows"][spec.name],
            Value::from(spec.window)
        );
    }
    let lines: Vec<Value> = records
        .iter()
        .filter_map(|r| match r {
            Record::Marker { line, .. } => Some(Value::from(line.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(
        py[bundle_files::MARKERS]["columns"]["line"]
            .as_array()
            .unwrap(),
        &lines
    );
    let shas: Vec<Value> = records
        .iter()
        .filter_map(|r| match r {
            Record::Frame(f) => Some(Value::from(f.sha256.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(
        py[bundle_files::FRAMES]["columns"]["sha256"]
            .as_array()
            .unwrap(),
        &shas
    );
}
