//! `stoker cluster add-node|remove-node`: Raft membership changes, through the leader.

use std::process::ExitCode;

use anyhow::Context;
use stoker_proto::ControlRequest;
use stoker_proto::expect_response;

use super::remote::call;
use crate::args::{AddNodeArgs, RemoveNodeArgs};

fn print_voters(voters: &[(u64, String)]) {
    let listed: Vec<String> = voters.iter().map(|(id, addr)| format!("{id}={addr}")).collect();
    println!("voters now: {}", listed.join(","));
    println!("give every coordinator --peers {} at its next restart", listed.join(","));
}

pub(crate) fn add_node(args: AddNodeArgs) -> anyhow::Result<ExitCode> {
    let (id, addr) =
        args.node.split_once('=').with_context(|| format!("{:?}: give the node as ID=HOST:PORT, e.g. 4=c4:7400", args.node))?;
    let id: u64 =
        id.trim().parse().ok().filter(|id| *id > 0).with_context(|| format!("{:?}: the id must be a positive number", args.node))?;
    let request = ControlRequest::AddNode { id, addr: addr.trim().to_owned() };
    let voters = expect_response!(call(&args.coordinator, request)?, MembershipChanged { voters })?;
    eprintln!("added node {id}");
    print_voters(&voters);
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn remove_node(args: RemoveNodeArgs) -> anyhow::Result<ExitCode> {
    let request = ControlRequest::RemoveNode { id: args.id };
    let voters = expect_response!(call(&args.coordinator, request)?, MembershipChanged { voters })?;
    eprintln!("removed node {}", args.id);
    print_voters(&voters);
    Ok(ExitCode::SUCCESS)
}
