//! `scripts/netns-cluster`: a Stoker cluster on several hosts of this one machine (network
//! namespaces, `stoker_testkit::netns`), with faults switched from a prompt. Needs root.
//!
//! ```text
//! netns-cluster --stoker target/release/stoker [--workers 2] [--trainers 2] [--mtu 1500] [--data MANIFEST]
//! ```

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::{ExitCode, Stdio};
use std::time::Duration;

use stoker_testkit::netns::{Impairment, Lab, unavailable};

const HELP: &str = "\
commands (HOST is a name from `hosts`, or `all`):
  hosts                         hosts, addresses and namespaces
  delay HOST MS [JITTER_MS]     add MS (+- JITTER_MS) to every packet to or from HOST
  loss HOST PERCENT             lose PERCENT of the packets to and from HOST
  rate HOST MBIT                limit HOST's link to MBIT megabits a second each way
  heal HOST                     no delay, loss or rate limit on HOST's link
  down HOST | up HOST           take HOST's link down (a partition) or up again
  kill HOST | start HOST        kill -9 the node on HOST, or start it again
  exec HOST COMMAND...          run COMMAND on HOST (e.g. `exec trainer-0 stoker consume ...`; `stoker` is this cluster's)
  quit                          stop everything and remove the hosts (also Ctrl-D)";

struct Options {
    stoker: PathBuf,
    workers: usize,
    trainers: usize,
    mtu: u32,
    data: Option<PathBuf>,
}

fn parse(mut args: impl Iterator<Item = String>) -> Result<Options, String> {
    let mut options = Options { stoker: PathBuf::from("target/release/stoker"), workers: 2, trainers: 2, mtu: 1500, data: None };
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--stoker" => options.stoker = PathBuf::from(value()?),
            "--workers" => options.workers = value()?.parse().map_err(|_| "--workers takes a number".to_owned())?,
            "--trainers" => options.trainers = value()?.parse().map_err(|_| "--trainers takes a number".to_owned())?,
            "--mtu" => options.mtu = value()?.parse().map_err(|_| "--mtu takes a number of bytes (1500, 9000)".to_owned())?,
            "--data" => options.data = Some(PathBuf::from(value()?)),
            "-h" | "--help" => {
                return Err(format!(
                    "usage: netns-cluster [--stoker PATH] [--workers N] [--trainers N] [--mtu BYTES] [--data MANIFEST]\n\n{HELP}"
                ));
            }
            other => return Err(format!("unknown argument {other:?} (--help lists them)")),
        }
    }
    if !(1..=50).contains(&options.workers) || options.trainers > 50 || !(1280..=65000).contains(&options.mtu) {
        return Err("1 to 50 workers, 0 to 50 trainers, an MTU of 1280 to 65000".to_owned());
    }
    Ok(options)
}

/// The running cluster: the lab, and which process runs the node of each host.
struct Cluster {
    lab: Lab,
    options: Options,
    coordinator: String,
    data_dir: PathBuf,
    nodes: BTreeMap<String, u32>,
    impaired: BTreeMap<String, Impairment>,
}

impl Cluster {
    fn start_node(&mut self, host: &str) -> Result<(), String> {
        let mut command = self.lab.command(host, &self.options.stoker)?;
        command.env("STOKER_METRICS_LISTEN", "0.0.0.0:9100").stdout(Stdio::null()).stderr(Stdio::null());
        if host == "coordinator" {
            command.args(["coordinator", "--listen", &self.coordinator]).arg("--data-dir").arg(&self.data_dir);
        } else {
            let listen = format!("{}:7100", self.lab.addr(host)?);
            command.args(["worker", "--coordinator", &self.coordinator, "--listen", &listen]);
        }
        let pid = self.lab.spawn(command)?;
        self.nodes.insert(host.to_owned(), pid);
        Ok(())
    }

    fn hosts_named(&self, name: &str) -> Result<Vec<String>, String> {
        if name == "all" {
            return Ok(self.lab.host_names().into_iter().map(str::to_owned).collect());
        }
        self.lab.addr(name)?;
        Ok(vec![name.to_owned()])
    }

    fn impair(&mut self, name: &str, change: impl Fn(&mut Impairment)) -> Result<(), String> {
        for host in self.hosts_named(name)? {
            let impairment = self.impaired.entry(host.clone()).or_default();
            change(impairment);
            self.lab.impair(&host, *impairment)?;
        }
        Ok(())
    }

    fn command(&mut self, words: &[&str]) -> Result<bool, String> {
        let number = |index: usize| -> Result<f64, String> {
            words.get(index).ok_or("a number is missing")?.parse::<f64>().map_err(|_| format!("{:?} is not a number", words[index]))
        };
        let host = || words.get(1).copied().ok_or_else(|| "which host? (`hosts` lists them)".to_owned());
        match words.first().copied().unwrap_or("") {
            "" => {}
            "help" => eprintln!("{HELP}"),
            "quit" | "exit" => return Ok(false),
            "hosts" => {
                for name in self.lab.host_names() {
                    eprintln!("{name:<14} {:<12} {}", self.lab.addr(name)?.to_string(), self.lab.namespace(name)?);
                }
            }
            "delay" => {
                let (delay, jitter) = (number(2)?, if words.len() > 3 { number(3)? } else { 0.0 });
                self.impair(host()?, |impairment| {
                    impairment.delay = Duration::from_secs_f64(delay / 1e3);
                    impairment.jitter = Duration::from_secs_f64(jitter / 1e3);
                })?;
            }
            "loss" => {
                let percent = number(2)?;
                self.impair(host()?, |impairment| impairment.loss_percent = percent)?;
            }
            "rate" => {
                let mbit = number(2)?;
                self.impair(host()?, |impairment| impairment.rate_bits_per_sec = (mbit * 1e6) as u64)?;
            }
            "heal" => self.impair(host()?, |impairment| *impairment = Impairment::default())?,
            "down" | "up" => {
                for name in self.hosts_named(host()?)? {
                    self.lab.set_link(&name, words[0] == "up")?;
                }
            }
            "kill" => {
                let pid = self.nodes.remove(host()?).ok_or("no node runs there")?;
                self.lab.kill(pid)?;
            }
            "start" => {
                let name = host()?;
                if name.starts_with("trainer") || self.nodes.contains_key(name) {
                    return Err(format!("{name} runs no node to start (trainers: use exec), or its node runs"));
                }
                self.start_node(name)?;
            }
            "exec" => {
                let program = words.get(2).ok_or("exec HOST COMMAND...")?;
                let program = if *program == "stoker" { self.options.stoker.clone() } else { PathBuf::from(program) };
                let status = self.lab.command(host()?, program)?.args(&words[3..]).status().map_err(|error| error.to_string())?;
                eprintln!("({status})");
            }
            other => return Err(format!("unknown command {other:?}; `help` lists them")),
        }
        Ok(true)
    }
}

fn main() -> ExitCode {
    let options = match parse(std::env::args().skip(1)) {
        Ok(options) => options,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    if let Some(reason) = unavailable() {
        eprintln!("netns-cluster: {reason}");
        return ExitCode::FAILURE;
    }
    match run(options) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("netns-cluster: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run(options: Options) -> Result<(), String> {
    if !options.stoker.is_file() {
        return Err(format!("{} is not the stoker binary (build it: cargo build --release -p stoker-cli)", options.stoker.display()));
    }
    let options = Options { stoker: options.stoker.canonicalize().map_err(|error| error.to_string())?, ..options };
    let mut names = vec!["coordinator".to_owned()];
    names.extend((0..options.workers).map(|i| format!("worker-{i}")));
    names.extend((0..options.trainers).map(|i| format!("trainer-{i}")));
    let lab = Lab::new(&names.iter().map(String::as_str).collect::<Vec<_>>(), options.mtu)?;
    let dir = stoker_testkit::unique_temp_dir("stoker-netns-cluster")?;
    let manifest = match &options.data {
        Some(manifest) => manifest.clone(),
        None => {
            eprintln!("making a sample dataset in {} ...", dir.display());
            stoker_testkit::sample_dataset(&dir, 10, 100, 1 << 20)?
        }
    };
    let coordinator = format!("{}:7000", lab.addr("coordinator")?);
    let mut cluster =
        Cluster { lab, coordinator, data_dir: dir.join("coordinator"), options, nodes: BTreeMap::new(), impaired: BTreeMap::new() };
    cluster.start_node("coordinator")?;
    std::thread::sleep(Duration::from_secs(2));
    let added = cluster
        .lab
        .command("coordinator", &cluster.options.stoker)?
        .args(["dataset", "add", "train"])
        .arg(&manifest)
        .args(["--coordinator", &cluster.coordinator])
        .status()
        .map_err(|error| error.to_string())?;
    if !added.success() {
        return Err("dataset add failed (see above)".to_owned());
    }
    for i in 0..cluster.options.workers {
        cluster.start_node(&format!("worker-{i}"))?;
    }
    let trainer_ns = if cluster.options.trainers > 0 { cluster.lab.namespace("trainer-0")?.to_owned() } else { String::new() };
    eprintln!(
        "\ncoordinator at {} with {} workers; metrics on port 9100 of each host.\nA trainer, from another shell:\n  \
         ip netns exec {trainer_ns} {} consume --coordinator {} --dataset train --batch-size 64 --epochs 2\n\n{HELP}\n",
        cluster.coordinator,
        cluster.options.workers,
        cluster.options.stoker.display(),
        cluster.coordinator
    );
    let stdin = std::io::stdin();
    loop {
        eprint!("netns-cluster> ");
        let _ = std::io::stderr().flush();
        let mut line = String::new();
        if stdin.lock().read_line(&mut line).map_err(|error| error.to_string())? == 0 {
            break;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        match cluster.command(&words) {
            Ok(true) => {}
            Ok(false) => break,
            Err(message) => eprintln!("{message}"),
        }
    }
    eprintln!("stopping; removing the hosts");
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
