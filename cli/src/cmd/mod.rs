//! One module per subcommand; each is a thin call into the libraries.

pub(crate) mod bench_pipeline;
pub(crate) mod demo;
pub(crate) mod index;
pub(crate) mod inspect;
pub(crate) mod pack;
