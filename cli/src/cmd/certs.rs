//! `stoker certs`: the cluster CA and the certificates of nodes and clients (DESIGN §10).

use clap::Args;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use stoker_net::{CA_CERT, CertSummary, ClusterCa, NODE_CERT, Role, Validity, summarize_pem};

#[derive(Debug, Args)]
pub(crate) struct CertsInitArgs {
    /// Where the CA goes (created; refused if a CA is there already).
    #[arg(long, value_name = "DIR")]
    pub(crate) dir: PathBuf,
    /// The CA's name (its common name).
    #[arg(long, default_value = "Stoker cluster CA")]
    pub(crate) name: String,
    /// Days the CA is valid.
    #[arg(long, default_value_t = 3650, value_parser = clap::value_parser!(u64).range(1..=36_500))]
    pub(crate) days: u64,
}

#[derive(Debug, Args)]
pub(crate) struct CertsIssueArgs {
    /// The CA directory (`stoker certs init --dir`).
    #[arg(long, value_name = "DIR")]
    pub(crate) dir: PathBuf,
    /// What the holder may do: coordinator (serve, Raft), worker (pull chunks, push batches),
    /// trainer (attach, open epochs, take batches), admin (add and remove datasets, jobs and
    /// coordinators).
    #[arg(long, value_parser = ["coordinator", "worker", "trainer", "admin"])]
    pub(crate) role: String,
    /// The holder's name (shown in logs and by `certs show`), e.g. the host name.
    #[arg(long)]
    pub(crate) name: String,
    /// The coordinator's Raft node id (its `stoker coordinator --node-id`): required with
    /// `--role coordinator`, refused with the other roles. Peers accept this certificate's Raft
    /// messages only as that node's, and the coordinator refuses to start under another id.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) node_id: Option<u64>,
    /// The TLS directory to write (ca.pem, node.pem, node.key; existing ones are replaced).
    #[arg(long, value_name = "DIR")]
    pub(crate) out: PathBuf,
    /// DNS names or IP addresses of the holder, added to the certificate (informational:
    /// peers check the CA, the role, and for workers the exact certificate, not names).
    #[arg(long = "host", value_name = "NAME")]
    pub(crate) hosts: Vec<String>,
    /// Days the certificate is valid.
    #[arg(long, default_value_t = 365, value_parser = clap::value_parser!(u64).range(1..=3650))]
    pub(crate) days: u64,
    /// The CAs the holder trusts, written as its ca.pem [default: the CA of --dir]. During a
    /// CA rotation give a file with both CAs (`cat old/ca.pem new/ca.pem`).
    #[arg(long, value_name = "FILE")]
    pub(crate) trust: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub(crate) struct CertsRevokeArgs {
    /// The certificate to deny (a PEM file, or a TLS directory's node.pem).
    pub(crate) cert: PathBuf,
    /// The deny list to append to (created if missing); nodes read it as `revoked` in their
    /// TLS directory.
    #[arg(long, value_name = "FILE")]
    pub(crate) deny_list: PathBuf,
}

#[derive(Debug, Args)]
pub(crate) struct CertsShowArgs {
    /// A PEM certificate file, or a TLS directory (its node.pem and ca.pem are shown).
    pub(crate) path: PathBuf,
}

fn days(count: u64) -> Duration {
    Duration::from_secs(count * 86_400)
}

pub(crate) fn init(args: CertsInitArgs) -> anyhow::Result<ExitCode> {
    let ca = ClusterCa::generate(&args.name, Validity::from_now(days(args.days)))?;
    ca.write(&args.dir)?;
    let dir = args.dir.display();
    println!("made the cluster CA {:?} in {dir} (valid {} days)", args.name, args.days);
    println!("keep {dir}/ca.key off the nodes; issue each node and client a certificate:");
    println!("  stoker certs issue --dir {dir} --role coordinator --node-id 1 --name c1 --out tls/c1");
    println!("then start it with --node-id 1 --tls-dir tls/c1 (or STOKER_TLS_DIR=tls/c1)");
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn issue(args: CertsIssueArgs) -> anyhow::Result<ExitCode> {
    let role = Role::parse(&args.role).with_context(|| format!("--role {:?}: one of coordinator, worker, trainer, admin", args.role))?;
    match (role, args.node_id) {
        (Role::Coordinator, None) => anyhow::bail!(
            "--role coordinator needs --node-id N: the Raft node id this coordinator starts with (`stoker coordinator --node-id N`); \
             each coordinator gets its own certificate"
        ),
        (Role::Coordinator, Some(_)) | (_, None) => {}
        (other, Some(_)) => {
            anyhow::bail!("--node-id is for coordinator certificates only (a Raft node id); leave it out for --role {other}")
        }
    }
    let ca = ClusterCa::load(&args.dir)
        .with_context(|| format!("no usable CA in {} (make one with `stoker certs init`)", args.dir.display()))?;
    let trusted = match &args.trust {
        Some(path) => std::fs::read_to_string(path).with_context(|| format!("cannot read --trust {}", path.display()))?,
        None => ca.cert_pem().to_owned(),
    };
    let issued = ca.issue(role, &args.name, args.node_id, &args.hosts, Validity::from_now(days(args.days)))?;
    issued.write_node_dir(&args.out, &trusted)?;
    let node = args.node_id.map(|id| format!(" (Raft node {id})")).unwrap_or_default();
    println!("issued a certificate with role {role}{node} for {:?} into {} (valid {} days)", args.name, args.out.display(), args.days);
    println!("public key sha256 {}", issued.key.hex());
    println!("use it with --tls-dir {}", args.out.display());
    Ok(ExitCode::SUCCESS)
}

/// The certificate at `path`: a PEM file, or a TLS directory's node.pem.
fn cert_file(path: &Path) -> PathBuf {
    if path.is_dir() { path.join(NODE_CERT) } else { path.to_owned() }
}

fn summaries(path: &Path) -> anyhow::Result<Vec<CertSummary>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    summarize_pem(&text).with_context(|| format!("{}", path.display()))
}

pub(crate) fn revoke(args: CertsRevokeArgs) -> anyhow::Result<ExitCode> {
    let path = cert_file(&args.cert);
    let cert = summaries(&path)?.swap_remove(0);
    let who = match &cert.role {
        Some(role) => format!("{role} {:?}", cert.name),
        None => format!("{} (not a Stoker node certificate)", cert.subject),
    };
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args.deny_list)
        .with_context(|| format!("cannot open {}", args.deny_list.display()))?;
    writeln!(file, "{} # {who}, from {}", cert.key.hex(), path.display())
        .with_context(|| format!("cannot write {}", args.deny_list.display()))?;
    println!("denied {who} (public key sha256 {}) in {}", cert.key.hex(), args.deny_list.display());
    println!("copy it to every node's TLS directory as `revoked`; nodes refuse the certificate at its next handshake");
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn show(args: CertsShowArgs) -> anyhow::Result<ExitCode> {
    let files = if args.path.is_dir() { vec![args.path.join(NODE_CERT), args.path.join(CA_CERT)] } else { vec![args.path.clone()] };
    for file in files {
        for cert in summaries(&file)? {
            println!("{}: {}", file.display(), cert.subject);
            println!("  role      {}", cert.role.as_deref().unwrap_or("none (a CA)"));
            if let Some(id) = cert.node_id {
                println!("  node id   {id} (Raft)");
            }
            println!("  issuer    {}", cert.issuer);
            println!("  valid     {} to {}", cert.not_before, cert.not_after);
            println!("  now       {}", if cert.valid_now { "valid" } else { "EXPIRED or not valid yet" });
            println!("  key       sha256 {} (of the public key)", cert.key.hex());
        }
    }
    Ok(ExitCode::SUCCESS)
}
