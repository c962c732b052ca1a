//! Bundles are read only once they verify: [`local`] for a store on disk (an S3
//! store's bundles are fetched into the local store and verified there first,
//! `remote::fetch`). What verified is remembered in one cache type,
//! [`cache::StampCache`], whose one trust decision
//! ([`cache::StampCache::trusted`]) says when a remembered result stands for
//! reading again; evidence readers never consult it
//! ([`local::VerifyCache::in_process`]).

pub mod cache;
pub mod local;
