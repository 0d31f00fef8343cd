//! `stoker certs`: the cluster CA and the certificates of nodes and clients (DESIGN §10).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use stoker_net::{CA_CERT, CertSummary, ClusterCa, NODE_CERT, Role, Validity, summarize_pem};

use crate::args::{CertsInitArgs, CertsIssueArgs, CertsRevokeArgs, CertsShowArgs};

fn days(count: u64) -> Duration {
    Duration::from_secs(count * 86_400)
}

pub(crate) fn init(args: CertsInitArgs) -> anyhow::Result<ExitCode> {
    let ca = ClusterCa::generate(&args.name, Validity::from_now(days(args.days)))?;
    ca.write(&args.dir)?;
    let dir = args.dir.display();
    println!("made the cluster CA {:?} in {dir} (valid {} days)", args.name, args.days);
    println!("keep {dir}/ca.key off the nodes; issue each node and client a certificate:");
    println!("  stoker certs issue --dir {dir} --role coordinator --name c1 --out tls/c1");
    println!("then start it with --tls-dir tls/c1 (or STOKER_TLS_DIR=tls/c1)");
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn issue(args: CertsIssueArgs) -> anyhow::Result<ExitCode> {
    let role = Role::parse(&args.role).with_context(|| format!("--role {:?}: one of coordinator, worker, trainer, admin", args.role))?;
    let ca = ClusterCa::load(&args.dir)
        .with_context(|| format!("no usable CA in {} (make one with `stoker certs init`)", args.dir.display()))?;
    let trusted = match &args.trust {
        Some(path) => std::fs::read_to_string(path).with_context(|| format!("cannot read --trust {}", path.display()))?,
        None => ca.cert_pem().to_owned(),
    };
    let issued = ca.issue(role, &args.name, &args.hosts, Validity::from_now(days(args.days)))?;
    issued.write_node_dir(&args.out, &trusted)?;
    println!("issued a certificate with role {role} for {:?} into {} (valid {} days)", args.name, args.out.display(), args.days);
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
            println!("  issuer    {}", cert.issuer);
            println!("  valid     {} to {}", cert.not_before, cert.not_after);
            println!("  now       {}", if cert.valid_now { "valid" } else { "EXPIRED or not valid yet" });
            println!("  key       sha256 {} (of the public key)", cert.key.hex());
        }
    }
    Ok(ExitCode::SUCCESS)
}
