//! One module per subcommand; each is a thin call into the libraries.

pub(crate) mod augment;
#[cfg(feature = "demo")]
pub(crate) mod bench_cluster;
#[cfg(feature = "demo")]
pub(crate) mod bench_delivery;
pub(crate) mod bench_pipeline;
pub(crate) mod certs;
pub(crate) mod cluster;
pub(crate) mod consume;
pub(crate) mod dataset;
#[cfg(feature = "demo")]
pub(crate) mod demo;
pub(crate) mod index;
pub(crate) mod index_tokens;
pub(crate) mod inspect;
pub(crate) mod inspect_tokens;
pub(crate) mod job;
pub(crate) mod object_files;
pub(crate) mod pack;
pub(crate) mod ranks;
pub(crate) mod remote;
pub(crate) mod serve;
pub(crate) mod status;
pub(crate) mod token_report;
pub(crate) mod transform;
