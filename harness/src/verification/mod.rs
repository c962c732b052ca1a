//! Bundles are read only once they verify: [`local`] for a store on disk,
//! [`remote`] for an S3 store's bundles that `rank` reads in place. Both remember
//! what verified in one cache type, [`cache::StampCache`], whose one trust
//! decision ([`cache::StampCache::trusted`]) says when a remembered result
//! stands for reading again.

pub mod cache;
pub mod local;
pub mod remote;
