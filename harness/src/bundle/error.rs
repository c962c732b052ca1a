//! The typed errors of reading a bundle's files. Each names the file at fault;
//! which exit code an error earns is decided by the command that met it. A
//! bundle's facts that cannot be read are an [`evidence::error::BundleError`].

use std::path::PathBuf;

/// A file of a bundle could not be read.
#[derive(Debug, thiserror::Error)]
#[error("reading {}", file.display())]
pub struct FileError {
    /// The file.
    pub file: PathBuf,
    /// The I/O error.
    #[source]
    pub source: std::io::Error,
}

/// `manifest.json` could not be read or parsed.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// The file could not be read.
    #[error(transparent)]
    Read(#[from] FileError),
    /// The file is not JSON.
    #[error("{}: not JSON: {message}", file.display())]
    NotJson {
        /// The manifest file.
        file: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// The file is JSON but not a manifest of this schema.
    #[error("{}: {why}", file.display())]
    Malformed {
        /// The manifest file.
        file: PathBuf,
        /// What is wrong, from the manifest parser.
        why: String,
    },
}

/// A Parquet table of a bundle could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    /// The file could not be read.
    #[error(transparent)]
    Read(#[from] FileError),
    /// The name is not one of a bundle's tables.
    #[error("{file}: not a bundle table")]
    NotATable {
        /// The file name asked for.
        file: String,
    },
    /// The file does not decode, or does not match its schema.
    #[error("{}: {why}", path.display())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What the reader said.
        why: String,
    },
    /// A column of a type the JSON rows cannot carry.
    #[error("{file}: column {column} has type {data_type}")]
    ColumnType {
        /// The table's file name.
        file: String,
        /// The column.
        column: String,
        /// Its Arrow type, in words.
        data_type: String,
    },
}
