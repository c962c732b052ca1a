//! Bundles are read only once they verify: [`local`] for a store on disk,
//! [`remote`] for an S3 store's bundles that `rank` reads in place.

pub mod local;
pub mod remote;
