//! The bundle's Parquet tables: their Arrow schemas (with `unit`, `window` and
//! `source` in every field's metadata), the fixed writer settings, and a reader
//! that checks a table against its schema.
//!
//! Writer settings are fixed so the same rows always give the same bytes: zstd
//! level 3, one row group (up to 2^20 rows), dictionary encoding with plain or
//! delta fallback, page statistics, `created_by` naming this crate.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{WriterProperties, WriterVersion};
use parquet::schema::types::ColumnPath;

use crate::bundle_files::{FRAMES, MARKERS, PHASES, SAMPLES};
use crate::sample::{ColumnType, SAMPLE_COLUMNS};

/// Schema-level metadata key naming the table.
pub const TABLE_KEY: &str = "evidence.table";
/// Schema-level metadata key holding the bundle schema version.
pub const SCHEMA_KEY: &str = "evidence.schema";

fn field(
    name: &str,
    ty: DataType,
    nullable: bool,
    unit: &str,
    window: &str,
    source: &str,
) -> Field {
    let md: HashMap<String, String> = [
        ("unit".to_string(), unit.to_string()),
        ("window".to_string(), window.to_string()),
        ("source".to_string(), source.to_string()),
    ]
    .into_iter()
    .collect();
    Field::new(name, ty, nullable).with_metadata(md)
}

fn schema(table: &str, fields: Vec<Field>) -> SchemaRef {
    let md: HashMap<String, String> = [
        (TABLE_KEY.to_string(), table.to_string()),
        (
            SCHEMA_KEY.to_string(),
            crate::manifest::SCHEMA_VERSION.to_string(),
        ),
    ]
    .into_iter()
    .collect();
    Arc::new(Schema::new_with_metadata(fields, md))
}

/// The column names of each table: the one definition the seal (writer), the
/// schemas and every reader use.
pub mod columns {
    /// The columns of `samples.parquet`'s own columns (the sampler's follow them, named in
    /// [`crate::sample::column`]).
    pub mod samples {
        /// `t_ns`.
        pub const T_NS: &str = "t_ns";
        /// `phase`.
        pub const PHASE: &str = "phase";
    }

    /// The columns of `phases.parquet`.
    pub mod phases {
        /// `seq`.
        pub const SEQ: &str = "seq";
        /// `name`.
        pub const NAME: &str = "name";
        /// `depth`.
        pub const DEPTH: &str = "depth";
        /// `parent_seq`.
        pub const PARENT_SEQ: &str = "parent_seq";
        /// `open_ns`.
        pub const OPEN_NS: &str = "open_ns";
        /// `close_ns`.
        pub const CLOSE_NS: &str = "close_ns";
        /// `duration_s`.
        pub const DURATION_S: &str = "duration_s";
        /// `is_leaf`.
        pub const IS_LEAF: &str = "is_leaf";
        /// `attrs_json`.
        pub const ATTRS_JSON: &str = "attrs_json";
        /// `peak_rss_bytes`.
        pub const PEAK_RSS_BYTES: &str = "peak_rss_bytes";
        /// `peak_engine_gpu_mem_bytes`.
        pub const PEAK_ENGINE_GPU_MEM_BYTES: &str = "peak_engine_gpu_mem_bytes";
        /// `peak_device_bytes`.
        pub const PEAK_DEVICE_BYTES: &str = "peak_device_bytes";
        /// `device_ms`.
        pub const DEVICE_MS: &str = "device_ms";
        /// `gpu_busy_share`.
        pub const GPU_BUSY_SHARE: &str = "gpu_busy_share";
        /// `mean_gpu_util_pct`.
        pub const MEAN_GPU_UTIL_PCT: &str = "mean_gpu_util_pct";
        /// `mean_cpu_cores`.
        pub const MEAN_CPU_CORES: &str = "mean_cpu_cores";
        /// `samples`.
        pub const SAMPLES: &str = "samples";
    }

    /// The columns of `markers.parquet`.
    pub mod markers {
        /// `seq`.
        pub const SEQ: &str = "seq";
        /// `recv_ns`.
        pub const RECV_NS: &str = "recv_ns";
        /// `t_ns`.
        pub const T_NS: &str = "t_ns";
        /// `ev`.
        pub const EV: &str = "ev";
        /// `name`.
        pub const NAME: &str = "name";
        /// `attrs_json`.
        pub const ATTRS_JSON: &str = "attrs_json";
        /// `line`.
        pub const LINE: &str = "line";
        /// `error`.
        pub const ERROR: &str = "error";
    }

    /// The columns of `frames.parquet`.
    pub mod frames {
        /// `index`.
        pub const INDEX: &str = "index";
        /// `sha256`.
        pub const SHA256: &str = "sha256";
        /// `mean_luma`.
        pub const MEAN_LUMA: &str = "mean_luma";
        /// `std_luma`.
        pub const STD_LUMA: &str = "std_luma";
        /// `min_luma`.
        pub const MIN_LUMA: &str = "min_luma";
        /// `max_luma`.
        pub const MAX_LUMA: &str = "max_luma";
        /// `motion_vs_prev`.
        pub const MOTION_VS_PREV: &str = "motion_vs_prev";
        /// `near_black`.
        pub const NEAR_BLACK: &str = "near_black";
        /// `near_uniform`.
        pub const NEAR_UNIFORM: &str = "near_uniform";
        /// `duplicate_of`.
        pub const DUPLICATE_OF: &str = "duplicate_of";
    }
}

use columns::{frames, markers, phases, samples};

const NS: &str = "nanoseconds (CLOCK_MONOTONIC)";

/// `samples.parquet`: `t_ns`, `phase`, then every sampler column.
pub fn samples_schema() -> SchemaRef {
    samples_schema_of(SAMPLE_COLUMNS.len())
}

/// `samples.parquet` with the first `n` of [`SAMPLE_COLUMNS`]: today's layout for
/// `n` = all, an earlier one for each of [`crate::sample::PREFIX_LAYOUTS`].
fn samples_schema_of(n: usize) -> SchemaRef {
    let mut f = vec![
        field(
            samples::T_NS,
            DataType::Int64,
            false,
            NS,
            "instant",
            "the sampler tick",
        ),
        field(
            samples::PHASE,
            DataType::Utf8,
            true,
            "phase name",
            "instant",
            "innermost phase open at t_ns, from the markers (null outside every phase)",
        ),
    ];
    for c in &SAMPLE_COLUMNS[..n.min(SAMPLE_COLUMNS.len())] {
        let ty = match c.ty {
            ColumnType::I64 => DataType::Int64,
            ColumnType::F64 => DataType::Float64,
        };
        f.push(field(c.name, ty, true, c.unit, c.window, c.source));
    }
    schema("samples", f)
}

/// `phases.parquet` (`specs/bundle.md`, "phases.parquet").
pub fn phases_schema() -> SchemaRef {
    let m = "markers";
    let s = "samples inside the phase's window";
    schema(
        "phases",
        vec![
            field(
                phases::SEQ,
                DataType::Int64,
                false,
                "index",
                "-",
                "position in open order, from 0",
            ),
            field(phases::NAME, DataType::Utf8, false, "phase name", "-", m),
            field(
                phases::DEPTH,
                DataType::Int64,
                false,
                "levels",
                "-",
                "nesting depth, 0 at top",
            ),
            field(
                phases::PARENT_SEQ,
                DataType::Int64,
                true,
                "index",
                "-",
                "seq of the enclosing phase",
            ),
            field(
                phases::OPEN_NS,
                DataType::Int64,
                false,
                NS,
                "instant",
                "open marker t_ns",
            ),
            field(
                phases::CLOSE_NS,
                DataType::Int64,
                true,
                NS,
                "instant",
                "close marker t_ns; null if open at the end",
            ),
            field(
                phases::DURATION_S,
                DataType::Float64,
                false,
                "seconds",
                "the phase",
                "close (or end of recording) - open",
            ),
            field(
                phases::IS_LEAF,
                DataType::Boolean,
                false,
                "flag",
                "-",
                "no sub-phases",
            ),
            field(
                phases::ATTRS_JSON,
                DataType::Utf8,
                false,
                "JSON",
                "-",
                "{\"open\":{..},\"close\":{..}} marker attributes, canonical",
            ),
            field(
                phases::PEAK_RSS_BYTES,
                DataType::Int64,
                true,
                "bytes",
                "the phase",
                "max samples.rss_bytes; null without samples",
            ),
            field(
                phases::PEAK_ENGINE_GPU_MEM_BYTES,
                DataType::Int64,
                true,
                "bytes",
                "the phase",
                "max samples.engine_gpu_mem_bytes",
            ),
            field(
                phases::PEAK_DEVICE_BYTES,
                DataType::Int64,
                true,
                "bytes",
                "the phase",
                "close attribute peak_device_bytes",
            ),
            field(
                phases::DEVICE_MS,
                DataType::Float64,
                true,
                "milliseconds",
                "the phase",
                "close attribute device_ms",
            ),
            field(
                phases::GPU_BUSY_SHARE,
                DataType::Float64,
                true,
                "fraction 0-1",
                "the phase",
                "share of samples with gpu_util_pct > 0",
            ),
            field(
                phases::MEAN_GPU_UTIL_PCT,
                DataType::Float64,
                true,
                "percent",
                "the phase",
                "mean samples.gpu_util_pct",
            ),
            field(
                phases::MEAN_CPU_CORES,
                DataType::Float64,
                true,
                "cores",
                "the phase",
                "mean samples.cpu_cores",
            ),
            field(
                phases::SAMPLES,
                DataType::Int64,
                false,
                "count",
                "the phase",
                s,
            ),
        ],
    )
}

/// `markers.parquet`: every marker line in arrival order.
pub fn markers_schema() -> SchemaRef {
    schema(
        "markers",
        vec![
            field(
                markers::SEQ,
                DataType::Int64,
                false,
                "index",
                "-",
                "arrival order, from 0",
            ),
            field(
                markers::RECV_NS,
                DataType::Int64,
                false,
                NS,
                "instant",
                "when the harness received the line",
            ),
            field(
                markers::T_NS,
                DataType::Int64,
                true,
                NS,
                "instant",
                "the event's t_ns; null if unparsed",
            ),
            field(
                markers::EV,
                DataType::Utf8,
                true,
                "event kind",
                "-",
                "hello|open|close|tick|info; null if unparsed",
            ),
            field(
                markers::NAME,
                DataType::Utf8,
                true,
                "phase or tick name",
                "-",
                "null for hello/info/unparsed",
            ),
            field(
                markers::ATTRS_JSON,
                DataType::Utf8,
                true,
                "JSON",
                "-",
                "the event's attributes, canonical; null if unparsed",
            ),
            field(
                markers::LINE,
                DataType::Utf8,
                false,
                "text",
                "-",
                "the line as received",
            ),
            field(
                markers::ERROR,
                DataType::Utf8,
                true,
                "text",
                "-",
                "why the line did not parse; null if it did",
            ),
        ],
    )
}

/// `frames.parquet`: per-frame facts, by index.
pub fn frames_schema() -> SchemaRef {
    let h = "harness frame analysis";
    schema(
        "frames",
        vec![
            field(
                frames::INDEX,
                DataType::Int64,
                false,
                "frame index",
                "-",
                "0-based",
            ),
            field(
                frames::SHA256,
                DataType::Utf8,
                false,
                "hex",
                "-",
                "sha256 of the RGB8 pixels",
            ),
            field(
                frames::MEAN_LUMA,
                DataType::Float64,
                false,
                "luma 0-255",
                "the frame",
                h,
            ),
            field(
                frames::STD_LUMA,
                DataType::Float64,
                false,
                "luma 0-255",
                "the frame",
                h,
            ),
            field(
                frames::MIN_LUMA,
                DataType::Float64,
                false,
                "luma 0-255",
                "the frame",
                h,
            ),
            field(
                frames::MAX_LUMA,
                DataType::Float64,
                false,
                "luma 0-255",
                "the frame",
                h,
            ),
            field(
                frames::MOTION_VS_PREV,
                DataType::Float64,
                true,
                "luma 0-255",
                "this and the previous frame",
                "mean absolute luma difference; null on frame 0",
            ),
            field(
                frames::NEAR_BLACK,
                DataType::Boolean,
                false,
                "flag",
                "the frame",
                h,
            ),
            field(
                frames::NEAR_UNIFORM,
                DataType::Boolean,
                false,
                "flag",
                "the frame",
                h,
            ),
            field(
                frames::DUPLICATE_OF,
                DataType::Int64,
                true,
                "frame index",
                "-",
                "an earlier frame with identical pixels",
            ),
        ],
    )
}

/// Every schema a bundle table may be sealed with, today's first: for
/// `samples.parquet` also the earlier layouts whose columns are a prefix of
/// today's (bundles sealed before columns were appended; readers see the
/// appended columns as missing). Empty for a file that is not a table.
pub fn schemas_for(file: &str) -> Vec<SchemaRef> {
    let mut v: Vec<SchemaRef> = schema_for(file).into_iter().collect();
    if file == SAMPLES {
        v.extend(
            crate::sample::PREFIX_LAYOUTS
                .iter()
                .map(|&n| samples_schema_of(n)),
        );
    }
    v
}

/// [`read_table`] against the first of `schemas` the file's columns match (the
/// error, when none does, is against the first: today's layout).
pub fn read_table_as(bytes: &[u8], schemas: &[SchemaRef]) -> Result<TableRead, String> {
    let mut first_err = None;
    for s in schemas {
        match read_table(bytes, s) {
            Ok(t) => return Ok(t),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    Err(first_err.unwrap_or_else(|| "no schema to read the table with".into()))
}

/// The schema of a bundle table by file name.
pub fn schema_for(file: &str) -> Option<SchemaRef> {
    match file {
        SAMPLES => Some(samples_schema()),
        PHASES => Some(phases_schema()),
        MARKERS => Some(markers_schema()),
        FRAMES => Some(frames_schema()),
        _ => None,
    }
}

fn props(schema: &Schema) -> WriterProperties {
    let table = schema
        .metadata()
        .get(TABLE_KEY)
        .cloned()
        .unwrap_or_default();
    let mut b = WriterProperties::builder()
        .set_writer_version(WriterVersion::PARQUET_1_0)
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .set_created_by(format!(
            "evidence {} (parquet-rs)",
            env!("CARGO_PKG_VERSION")
        ))
        .set_max_row_group_row_count(Some(1 << 20))
        .set_dictionary_enabled(true)
        .set_key_value_metadata(Some(vec![KeyValue::new(TABLE_KEY.to_string(), table)]));
    // Timestamps tick regularly: delta encoding stores them in a few bits each.
    for f in schema.fields() {
        if f.data_type() == &DataType::Int64 && f.name().ends_with("_ns") {
            let col = ColumnPath::from(f.name().as_str());
            b = b
                .set_column_dictionary_enabled(col.clone(), false)
                .set_column_encoding(col, Encoding::DELTA_BINARY_PACKED);
        }
    }
    b.build()
}

/// Encode `columns` (in `schema` order) as Parquet bytes with the fixed settings.
pub fn write_table(schema: SchemaRef, columns: Vec<ArrayRef>) -> Result<Vec<u8>, String> {
    let batch = RecordBatch::try_new(schema.clone(), columns).map_err(|e| e.to_string())?;
    let p = props(&schema);
    let mut w = ArrowWriter::try_new(Vec::new(), schema, Some(p)).map_err(|e| e.to_string())?;
    w.write(&batch).map_err(|e| e.to_string())?;
    w.into_inner().map_err(|e| e.to_string())
}

/// What reading a table back found.
#[derive(Debug, Clone)]
pub struct TableRead {
    /// The Arrow schema stored in the file.
    pub schema: SchemaRef,
    /// The decoded batches.
    pub batches: Vec<RecordBatch>,
    /// Rows, summed over the decoded batches.
    pub rows: u64,
}

/// Decode a whole table and check it has exactly `expected`'s fields (names,
/// types, nullability, unit/window/source metadata). Errors are in words.
pub fn read_table(bytes: &[u8], expected: &Schema) -> Result<TableRead, String> {
    let b = ParquetRecordBatchReaderBuilder::try_new(bytes::Bytes::copy_from_slice(bytes))
        .map_err(|e| format!("not a readable Parquet file: {e}"))?;
    let declared = b.metadata().file_metadata().num_rows();
    let schema = b.schema().clone();
    if schema.fields() != expected.fields() {
        let got: Vec<String> = schema
            .fields()
            .iter()
            .map(|f| format!("{}:{}", f.name(), f.data_type()))
            .collect();
        let want: Vec<String> = expected
            .fields()
            .iter()
            .map(|f| format!("{}:{}", f.name(), f.data_type()))
            .collect();
        return Err(if got == want {
            "column nullability or unit/window/source metadata differ from the schema".into()
        } else {
            format!(
                "columns [{}], expected [{}]",
                got.join(", "),
                want.join(", ")
            )
        });
    }
    let reader = b
        .with_batch_size(1 << 16)
        .build()
        .map_err(|e| format!("cannot decode: {e}"))?;
    let mut batches = Vec::new();
    let mut rows = 0u64;
    for batch in reader {
        let batch = batch.map_err(|e| format!("cannot decode: {e}"))?;
        rows += batch.num_rows() as u64;
        batches.push(batch);
    }
    if declared < 0 || rows != declared as u64 {
        return Err(format!("decoded {rows} rows, footer declares {declared}"));
    }
    Ok(TableRead {
        schema,
        batches,
        rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{BooleanArray, Float64Array, Int64Array, StringArray};

    #[test]
    fn every_field_documents_unit_window_and_source() {
        for s in [
            samples_schema(),
            phases_schema(),
            markers_schema(),
            frames_schema(),
        ] {
            for f in s.fields() {
                for k in ["unit", "window", "source"] {
                    assert!(
                        f.metadata().get(k).is_some_and(|v| !v.is_empty()),
                        "{} lacks {k}",
                        f.name()
                    );
                }
            }
        }
        assert_eq!(samples_schema().fields().len(), SAMPLE_COLUMNS.len() + 2);
    }

    #[test]
    fn write_is_deterministic_and_reads_back() {
        let s = frames_schema();
        let cols: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(vec![0, 1])),
            Arc::new(StringArray::from(vec!["aa", "bb"])),
            Arc::new(Float64Array::from(vec![1.5, 2.5])),
            Arc::new(Float64Array::from(vec![0.5, 0.25])),
            Arc::new(Float64Array::from(vec![0.0, 1.0])),
            Arc::new(Float64Array::from(vec![200.0, 255.0])),
            Arc::new(Float64Array::from(vec![None, Some(3.0)])),
            Arc::new(BooleanArray::from(vec![false, true])),
            Arc::new(BooleanArray::from(vec![true, false])),
            Arc::new(Int64Array::from(vec![None, Some(0)])),
        ];
        let a = write_table(s.clone(), cols.clone()).unwrap();
        let b = write_table(s.clone(), cols).unwrap();
        assert_eq!(a, b);
        let r = read_table(&a, &s).unwrap();
        assert_eq!(r.rows, 2);
        let e = read_table(&a, &phases_schema()).unwrap_err();
        assert!(e.contains("columns ["), "{e}");
        assert!(read_table(&a[..a.len() - 3], &s).is_err());
    }

    /// An empty samples table of the first `n` sampler columns.
    fn samples_table(n: usize) -> Vec<u8> {
        let schema = samples_schema_of(n);
        let cols: Vec<ArrayRef> = schema
            .fields()
            .iter()
            .map(|f| -> ArrayRef {
                match f.data_type() {
                    DataType::Utf8 => Arc::new(StringArray::from(Vec::<Option<&str>>::new())),
                    DataType::Float64 => Arc::new(Float64Array::from(Vec::<f64>::new())),
                    _ => Arc::new(Int64Array::from(Vec::<i64>::new())),
                }
            })
            .collect();
        write_table(schema, cols).unwrap()
    }

    /// samples.parquet of today's layout and of the layout before the GPM
    /// columns both read through `schemas_for`; a table one column short of
    /// that (no known layout) does not, and the error is against today's.
    /// Red if `schemas_for` drops the prefix layouts.
    #[test]
    fn samples_of_an_earlier_prefix_layout_read_and_others_do_not() {
        let all = schemas_for(SAMPLES);
        assert_eq!(all.len(), 1 + crate::sample::PREFIX_LAYOUTS.len());
        let old = crate::sample::PREFIX_LAYOUTS[0];
        for n in [SAMPLE_COLUMNS.len(), old] {
            let t = read_table_as(&samples_table(n), &all).unwrap();
            assert_eq!(t.schema.fields().len(), n + 2);
        }
        let e = read_table_as(&samples_table(old - 1), &all).unwrap_err();
        assert!(e.contains("gpm_window_start_ns"), "{e}");
        assert_eq!(schemas_for(FRAMES).len(), 1);
        assert!(schemas_for("manifest.json").is_empty());
    }
}
