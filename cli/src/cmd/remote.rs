//! Calling a coordinator from the command line.

use std::net::{SocketAddr, ToSocketAddrs};

use anyhow::Context;
use stoker_net::{CoordinatorAddrs, QuicCoordinator, Role};
use stoker_proto::api::CoordinatorApi;
use stoker_proto::{ControlRequest, ControlResponse};

use crate::args::CoordinatorAddr;

/// `host:port` → the first address it resolves to.
pub(crate) fn resolve(text: &str) -> anyhow::Result<SocketAddr> {
    text.to_socket_addrs()
        .with_context(|| format!("cannot resolve {text:?} (expected HOST:PORT)"))?
        .next()
        .with_context(|| format!("{text:?} resolves to no address"))
}

/// `--coordinator`: `HOST:PORT`, or the nodes of a replicated coordinator as
/// `HOST:PORT,HOST:PORT,...`, each resolved to its first address.
pub(crate) fn resolve_coordinators(text: &str) -> anyhow::Result<CoordinatorAddrs> {
    Ok(CoordinatorAddrs::parse(text)?)
}

/// A runtime for one command's network work.
pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().context("cannot start the async runtime")
}

/// Send one request to the coordinator `to` names (one `HOST:PORT` or a comma-separated list:
/// the call follows the leader), with the certificate its TLS flags name.
pub(crate) fn call(to: &CoordinatorAddr, request: ControlRequest) -> anyhow::Result<ControlResponse> {
    let addrs = resolve_coordinators(&to.coordinator)?;
    let runtime = runtime()?;
    let _guard = runtime.enter();
    let tls = to.tls.source()?.load_for(Role::required_for(&request))?;
    let coordinator = QuicCoordinator::with_addrs(addrs.clone(), &tls)?;
    let answer = runtime.block_on(coordinator.call(request));
    coordinator.close();
    answer.with_context(|| format!("coordinator at {addrs}"))
}
