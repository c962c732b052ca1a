//! One bundle's Parquet tables, read with Arrow and checked against their schemas
//! (`evidence::parquet_tables`): as record batches, as JSON rows (`show --json`),
//! and as the phase table text people read (`show`, and `run` after its seal).

use std::path::Path;

use arrow_array::{Array, BooleanArray, Float64Array, Int64Array, RecordBatch, StringArray};
use evidence::bundle_files::{MANIFEST, PHASES};
use evidence::error::VerifyError;
use evidence::manifest::Manifest;
use evidence::parquet_tables;
use serde_json::Value;

use crate::bundle::error::TableError;
use crate::bundle::files;

/// Every record batch of table `file` (`phases.parquet`, ...) of the bundle at
/// `dir`, checked against the table's schema.
pub fn read(dir: &Path, file: &str) -> Result<Vec<RecordBatch>, TableError> {
    let bytes = files::read(dir, file)?;
    let schemas = parquet_tables::schemas_for(file);
    if schemas.is_empty() {
        return Err(TableError::NotATable {
            file: file.to_string(),
        });
    }
    // samples.parquet of a bundle sealed before the GPM columns: an earlier
    // layout (its appended columns are missing to the readers).
    let t =
        parquet_tables::read_table_as(&bytes, &schemas).map_err(|why| TableError::Malformed {
            path: dir.join(file),
            why,
        })?;
    Ok(t.batches)
}

/// Every row of table `file` of the bundle at `dir` as a JSON object keyed by
/// column name; nulls stay null, and `*_json` columns are parsed into JSON.
pub fn rows(dir: &Path, file: &str) -> Result<Vec<Value>, TableError> {
    let mut out = Vec::new();
    for b in read(dir, file)? {
        let schema = b.schema();
        for i in 0..b.num_rows() {
            let mut row = serde_json::Map::new();
            for (f, c) in schema.fields().iter().zip(b.columns()) {
                let v = if c.is_null(i) {
                    Value::Null
                } else if let Some(a) = c.as_any().downcast_ref::<Int64Array>() {
                    Value::from(a.value(i))
                } else if let Some(a) = c.as_any().downcast_ref::<Float64Array>() {
                    serde_json::Number::from_f64(a.value(i)).map_or(Value::Null, Value::Number)
                } else if let Some(a) = c.as_any().downcast_ref::<BooleanArray>() {
                    Value::Bool(a.value(i))
                } else if let Some(a) = c.as_any().downcast_ref::<StringArray>() {
                    let text = a.value(i);
                    if f.name().ends_with("_json") {
                        serde_json::from_str(text).unwrap_or_else(|_| Value::from(text))
                    } else {
                        Value::from(text)
                    }
                } else {
                    return Err(TableError::ColumnType {
                        file: file.to_string(),
                        column: f.name().clone(),
                        data_type: f.data_type().to_string(),
                    });
                };
                row.insert(f.name().clone(), v);
            }
            out.push(Value::Object(row));
        }
    }
    Ok(out)
}

/// The phase table of the bundle at `dir` (`evidence::phase_table::render_with`
/// over its manifest, `phases.parquet` and the GPM windows of `samples.parquet`),
/// with the errors
/// `evidence::phase_table::phase_table_text` gives.
pub fn phase_table_text(dir: &Path) -> Result<String, VerifyError> {
    let read = |name: &str| {
        files::read(dir, name).map_err(|e| VerifyError::Unreadable {
            file: name.to_string(),
            why: e.source.to_string(),
        })
    };
    let mtext = read(MANIFEST)?;
    let manifest = std::str::from_utf8(&mtext)
        .map_err(|e| e.to_string())
        .and_then(Manifest::from_json)
        .map_err(|why| VerifyError::Manifest { why })?;
    let pbytes = read(PHASES)?;
    let t =
        parquet_tables::read_table(&pbytes, &parquet_tables::phases_schema()).map_err(|why| {
            VerifyError::Content {
                file: PHASES.into(),
                why,
            }
        })?;
    let sbytes = read(evidence::bundle_files::SAMPLES)?;
    let st = parquet_tables::read_table_as(
        &sbytes,
        &parquet_tables::schemas_for(evidence::bundle_files::SAMPLES),
    )
    .map_err(|why| VerifyError::Content {
        file: evidence::bundle_files::SAMPLES.into(),
        why,
    })?;
    let gpm = evidence::phase_table::gpm_figures(&st.batches);
    evidence::phase_table::render_with(&manifest, &t.batches, &gpm).map_err(|why| {
        VerifyError::Content {
            file: PHASES.into(),
            why,
        }
    })
}
