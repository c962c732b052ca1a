//! What can go wrong with an S3-protocol store, each naming the store, the
//! object key and what was expected. Credentials never appear in a message.

/// An error of the S3 store.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The `--store` URL is not a usable `s3://bucket/prefix`.
    #[error("--store {url}: {why}")]
    Location {
        /// The URL as given (credentials redacted).
        url: String,
        /// What was expected.
        why: String,
    },
    /// The client could not be configured (region, endpoint, credentials).
    #[error("{store}: cannot configure the S3 client: {why}")]
    Config {
        /// The store URL.
        store: String,
        /// What is missing or wrong.
        why: String,
    },
    /// A request failed (network, authorization, the server).
    #[error("{store}: {op} {key}: {cause}")]
    Request {
        /// The store URL.
        store: String,
        /// The operation (`GET`, `PUT`, `LIST`, ...).
        op: &'static str,
        /// The object key or prefix.
        key: String,
        /// The client's error and its causes, each said once.
        cause: String,
    },
    /// An object is not what the bundle's manifest says it is.
    #[error("{store}: {key}: {why}")]
    Mismatch {
        /// The store URL.
        store: String,
        /// The object key.
        key: String,
        /// What differs (sizes, sha256).
        why: String,
    },
    /// No bundle, or more than one, matches an id or prefix.
    #[error("{store}: {why}")]
    Lookup {
        /// The store URL.
        store: String,
        /// Unknown or ambiguous, with the query.
        why: String,
    },
    /// A local file of the publishing or fetching side.
    #[error("{file}: {source}")]
    Local {
        /// The file.
        file: std::path::PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}
