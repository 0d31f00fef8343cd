//! `stoker inspect`.

use crate::flags::parse_shuffle;
use clap::Args;
use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use serde::Serialize;
use serde_json::json;
use stoker_format::manifest::{PackedOrder, read_manifest_text};
use stoker_format::tokens::{TOKEN_MANIFEST_FILE, TokenManifest};
use stoker_format::{IndexPolicy, IndexStatus, MANIFEST_FILE, Manifest, Shard, ShardLocation, resolve_uri};
use stoker_store::{MAX_OBJECT_READ_BYTES, ObjectStores, ObjectUri, StoreError};
use tokio::runtime::Runtime;

use crate::cmd::object_files::{check_shard, download_shard};
use crate::flags::{ObjectStoreArgs, TokenFileArgs, is_token_path};
use stoker_plan::mixing::{LabelMixing, label_mixing};
use stoker_plan::{SampleRef, ShardTable, Shuffle};

#[derive(Debug, Args)]
pub(crate) struct InspectArgs {
    /// A shard (.tar), a manifest (.json), or a folder holding manifest.json; or the same in an
    /// object store (s3://bucket/key: a shard is downloaded into TMPDIR; a manifest's shards are
    /// checked by size without downloading them). Or a token dataset: a token file (.bin, .idx,
    /// a Megatron prefix), a tokens.json, or a folder holding one: documents, tokens, dtype,
    /// the vocabulary seen and document lengths.
    pub(crate) path: PathBuf,
    /// Print one JSON object (for scripts); for a shard it lists every member's offset and size.
    #[arg(long)]
    pub(crate) json: bool,
    /// Samples listed in the text output of a shard.
    #[arg(long, default_value_t = 5)]
    pub(crate) show: usize,
    /// Of a dataset: the shuffle whose label mixing is measured (none, full, window,
    /// window:K, block, block:S:N).
    #[arg(long, default_value = "window", value_parser = parse_shuffle)]
    pub(crate) shuffle: Shuffle,
    /// Of a dataset: samples per global batch (all ranks' batches of one step) in the label
    /// mixing measure.
    #[arg(long, default_value_t = NonZeroU32::new(256).unwrap_or(NonZeroU32::MIN))]
    pub(crate) global_batch: NonZeroU32,
    #[command(flatten)]
    pub(crate) object_store: ObjectStoreArgs,
    #[command(flatten)]
    pub(crate) tokens: TokenFileArgs,
    #[command(flatten)]
    pub(crate) packing: super::token_packing::PackingArgs,
}

pub(crate) fn run(args: InspectArgs) -> anyhow::Result<ExitCode> {
    let given = args.path.to_string_lossy().into_owned();
    if ObjectUri::is_object_uri(&given) {
        refuse_packing(&args)?;
        let (runtime, stores) = (super::remote::runtime()?, args.object_store.stores()?);
        let uri = ObjectUri::manifest(&given)?;
        // `s3://b/shard-000` names a shard when an object has exactly that key, a prefix
        // holding manifest.json when there is none (as a local path is a file or a folder);
        // a trailing '/' always names a prefix. Any other failure of the check is the answer.
        let taken_for_prefix = uri.to_string() != given && !given.ends_with('/');
        let is_object = || -> anyhow::Result<bool> {
            match runtime.block_on(stores.head(&ObjectUri::parse(&given)?)) {
                Ok(_) => Ok(true),
                // S3 answers 403 for a missing key to a caller without s3:ListBucket.
                Err(StoreError::NotFound { .. } | StoreError::Denied { .. }) => Ok(false),
                Err(error) => Err(error.into()),
            }
        };
        if uri.file_name().ends_with(".json") && !(taken_for_prefix && is_object()?) {
            return inspect_object_manifest(&uri, &runtime, &stores, &args);
        }
        let copy = download_shard(&runtime, &stores, &ObjectUri::parse(&given)?, true)?;
        return inspect_shard(&copy.shard, &given, args.json, args.show);
    }
    if args.tokens.given() || is_token_path(&args.path) {
        return super::inspect_tokens::inspect_file(&args.path, args.tokens.options(), &args.packing, args.json);
    }
    let is_manifest = args.path.is_dir() || args.path.extension().is_some_and(|extension| extension == "json");
    if is_manifest {
        let mut path = if args.path.is_dir() { args.path.join(MANIFEST_FILE) } else { args.path.clone() };
        let token_manifest = args.path.join(TOKEN_MANIFEST_FILE);
        if args.path.is_dir() && !path.exists() && token_manifest.is_file() {
            path = token_manifest;
        }
        if is_token_manifest(&path) {
            return super::inspect_tokens::inspect_manifest(&path, &args.packing, args.json);
        }
        refuse_packing(&args)?;
        inspect_manifest(&path, &args)
    } else {
        refuse_packing(&args)?;
        inspect_shard(&args.path, &args.path.display().to_string(), args.json, args.show)
    }
}

/// `--seq-len` packs token datasets; given with anything else it is a mistake worth saying.
fn refuse_packing(args: &InspectArgs) -> anyhow::Result<()> {
    if args.packing.seq_len.is_some() {
        anyhow::bail!(
            "--seq-len packs the documents of a token dataset into rows; {} is an image dataset or shard (token datasets are .bin/.idx \
             files, a tokens.json, or a folder holding one)",
            args.path.display()
        );
    }
    Ok(())
}

/// Whether the manifest at `path` is a token dataset's (an unreadable one is left to the image
/// manifest's reader to report).
fn is_token_manifest(path: &Path) -> bool {
    read_manifest_text(path).is_ok_and(|text| TokenManifest::is_token_manifest(&text))
}

#[derive(Default, Serialize)]
struct ExtensionStats {
    count: u64,
    bytes: u64,
    min: u64,
    max: u64,
}

fn index_description(status: &IndexStatus) -> String {
    match status {
        IndexStatus::Loaded => "loaded".into(),
        IndexStatus::Built { reason, .. } => format!("built in memory ({reason})"),
    }
}

fn extension_stats(shard: &Shard) -> BTreeMap<String, ExtensionStats> {
    let mut stats: BTreeMap<String, ExtensionStats> = BTreeMap::new();
    for sample in 0..shard.len() {
        for member in shard.index().sample_members(sample) {
            let entry = stats.entry(member.extension.to_string()).or_insert(ExtensionStats { min: u64::MAX, ..ExtensionStats::default() });
            entry.count += 1;
            entry.bytes += member.size;
            entry.min = entry.min.min(member.size);
            entry.max = entry.max.max(member.size);
        }
    }
    stats
}

/// The label mixing of `shuffle` over the dataset, when its samples have labels.
fn mixing_of(manifest: &Manifest, shards: &[Shard], shuffle: Shuffle, global_batch: NonZeroU32) -> anyhow::Result<Option<LabelMixing>> {
    let table = Arc::new(ShardTable::new(manifest.shards.iter().map(|shard| shard.samples))?);
    let label = |sample: SampleRef| {
        let bytes = shards.get(sample.shard.0 as usize)?.sample(sample.index as usize)?.member("cls")?;
        std::str::from_utf8(bytes).ok()?.trim().parse::<i64>().ok()
    };
    let mixing_opt = label_mixing(table, shuffle, 0, global_batch, MIXING_BATCHES, label);
    Ok(mixing_opt.filter(|mixing| mixing.random_distinct > 1.0))
}

/// What to do when `shuffle` mixes labels far worse than random batches.
fn mixing_advice(mixing: &LabelMixing, shuffle: Shuffle, packed: Option<PackedOrder>) -> Option<String> {
    if mixing.ratio() >= MIXING_WARN_RATIO {
        return None;
    }
    let repack = match packed {
        Some(PackedOrder::Folder) => "pack it again without --no-shuffle",
        _ => "write the shards in a shuffled order (stoker pack shuffles by default)",
    };
    let instead = match shuffle {
        Shuffle::Block { samples, blocks } => format!(
            "train with a larger block window (shuffle=\"block:{samples}:{}\": the window must hold many more blocks than a global batch \
             has samples; check it with stoker inspect --shuffle) or \"full\" (no read locality)",
            blocks.get().saturating_mul(2)
        ),
        _ => "train with shuffle=\"block\" (mixes any order; its working set is runs of 8 consecutive samples) or \"full\" (no read \
              locality)"
            .to_owned(),
    };
    Some(format!(
        "samples are clustered by label: a global batch with shuffle {shuffle} holds {:.0}% of the distinct labels of a random batch, \
         which hurts SGD and BatchNorm. Either {repack}, or {instead}",
        mixing.ratio() * 100.0
    ))
}

/// Inspect the shard at `path`, reported as `name` (its URI, when it is a downloaded copy).
fn inspect_shard(path: &Path, name: &str, as_json: bool, show: usize) -> anyhow::Result<ExitCode> {
    let shard = Shard::open(path, IndexPolicy::LoadOrBuildInMemory)?;
    let stats = extension_stats(&shard);
    if as_json {
        let samples: Vec<_> = (0..shard.len())
            .map(|sample| {
                let members: Vec<_> = shard
                    .index()
                    .sample_members(sample)
                    .map(|member| json!({"extension": member.extension, "offset": member.offset, "size": member.size}))
                    .collect();
                json!({"key": shard.index().key(sample), "members": members})
            })
            .collect();
        let report = json!({
            "kind": "shard",
            "path": name,
            "bytes": shard.bytes().len(),
            "samples": shard.len(),
            "members": shard.index().members(),
            "index": index_description(shard.index_status()),
            "extensions": stats,
            "entries": samples,
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("shard    {name}");
    println!("bytes    {} ({:.1} MiB)", shard.bytes().len(), shard.bytes().len() as f64 / 1048576.0);
    println!("samples  {}", shard.len());
    println!("members  {}", shard.index().members());
    println!("index    {}", index_description(shard.index_status()));
    println!("\n{:<12} {:>8} {:>14} {:>10} {:>10} {:>10}", "extension", "count", "bytes", "min", "mean", "max");
    for (extension, stat) in &stats {
        println!(
            "{extension:<12} {:>8} {:>14} {:>10} {:>10} {:>10}",
            stat.count,
            stat.bytes,
            stat.min,
            stat.bytes / stat.count.max(1),
            stat.max
        );
    }
    if !shard.is_empty() && show > 0 {
        println!("\nfirst samples:");
        for sample in (0..shard.len()).take(show).filter_map(|index| shard.sample(index)) {
            let members: Vec<String> = sample.members().map(|(extension, bytes)| format!("{extension} ({} B)", bytes.len())).collect();
            println!("  {}  {}", sample.key(), members.join(", "));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Global batches looked at on each side of the label mixing measure.
const MIXING_BATCHES: u64 = 200;
/// Below this share of a random batch's distinct labels, `inspect` warns.
const MIXING_WARN_RATIO: f64 = 0.9;

fn inspect_manifest(path: &Path, args: &InspectArgs) -> anyhow::Result<ExitCode> {
    let manifest = Manifest::load(path)?;
    let manifest_dir = path.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
    let mut problems = Vec::new();
    let mut shard_reports = Vec::new();
    let mut opened = Vec::new();
    for entry in &manifest.shards {
        let (status, found) = match resolve_uri(&entry.uri, &manifest_dir)? {
            ShardLocation::File(shard_path) => match Shard::open(&shard_path, IndexPolicy::LoadOrBuildInMemory) {
                Ok(shard) if shard.len() as u64 == entry.samples => {
                    let found = (index_description(shard.index_status()), Some(shard.len()));
                    opened.push(shard);
                    found
                }
                Ok(shard) => {
                    problems.push(format!("{}: manifest says {} samples, the shard has {}", entry.uri, entry.samples, shard.len()));
                    ("sample count differs".to_string(), Some(shard.len()))
                }
                Err(error) => {
                    problems.push(error.to_string());
                    ("unreadable".to_string(), None)
                }
            },
            ShardLocation::S3 { .. } => {
                problems.push(format!(
                    "{}: a manifest on local disk may not list s3:// shards (stoker dataset add refuses it): \
                     keep the manifest in the store beside them (stoker index --manifest s3://...)",
                    entry.uri
                ));
                ("refused: s3:// in a local manifest".to_string(), None)
            }
        };
        shard_reports
            .push(json!({"uri": entry.uri, "samples": entry.samples, "bytes": entry.bytes, "found_samples": found, "status": status}));
    }
    let mixing_opt = if opened.len() == manifest.shards.len() && problems.is_empty() {
        mixing_of(&manifest, &opened, args.shuffle, args.global_batch)?
    } else {
        None
    };
    let findings = Findings { shard_reports, problems, mixing_opt, remote: false };
    report_manifest(&path.display().to_string(), &manifest, findings, args)
}

/// A manifest in an object store: its shards checked by size (HEAD), not downloaded; no label
/// mixing (it would read every shard).
fn inspect_object_manifest(uri: &ObjectUri, runtime: &Runtime, clients: &ObjectStores, args: &InspectArgs) -> anyhow::Result<ExitCode> {
    let bytes = runtime.block_on(clients.read(uri, MAX_OBJECT_READ_BYTES))?;
    let text = std::str::from_utf8(&bytes).with_context(|| format!("{uri}: the manifest is not UTF-8 text"))?;
    let manifest = Manifest::parse(text, Path::new(&uri.to_string()))?;
    let (mut problems, mut shard_reports) = (Vec::new(), Vec::new());
    for entry in &manifest.shards {
        let checked = check_shard(runtime, clients, &uri.resolve_shard(&entry.uri)?, entry);
        problems.extend(checked.problem_opt);
        shard_reports.push(
            json!({"uri": entry.uri, "samples": entry.samples, "bytes": entry.bytes, "found_samples": null, "status": checked.status}),
        );
    }
    let findings = Findings { shard_reports, problems, mixing_opt: None, remote: true };
    report_manifest(&uri.to_string(), &manifest, findings, args)
}

/// What inspecting a manifest's shards found.
struct Findings {
    shard_reports: Vec<serde_json::Value>,
    problems: Vec<String>,
    mixing_opt: Option<LabelMixing>,
    /// The shards are in an object store: checked by size only, no label mixing.
    remote: bool,
}

/// Print what was found of the manifest named `name`: text, or JSON with `--json`.
fn report_manifest(name: &str, manifest: &Manifest, findings: Findings, args: &InspectArgs) -> anyhow::Result<ExitCode> {
    let Findings { shard_reports, problems, mixing_opt, remote } = findings;
    let (as_json, shuffle) = (args.json, args.shuffle);
    let advice_opt = mixing_opt.as_ref().and_then(|mixing| mixing_advice(mixing, shuffle, manifest.packed));
    if as_json {
        let mixing = mixing_opt.map(|mixing| {
            json!({
                "shuffle": shuffle.to_string(),
                "global_batch": mixing.batch_samples,
                "batches": mixing.batches,
                "plan_distinct_labels": mixing.plan_distinct,
                "random_distinct_labels": mixing.random_distinct,
                "ratio": mixing.ratio(),
                "warning": advice_opt,
            })
        });
        let report = json!({
            "kind": "manifest",
            "path": name,
            "shards": manifest.shards.len(),
            "samples": manifest.samples(),
            "bytes": manifest.bytes(),
            "classes": manifest.classes,
            "packed": manifest.packed,
            "label_mixing": mixing,
            "shard_details": shard_reports,
            "problems": problems,
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("manifest {name}");
        println!("shards   {}", manifest.shards.len());
        println!("samples  {}", manifest.samples());
        println!("bytes    {} ({:.1} MiB)", manifest.bytes(), manifest.bytes() as f64 / 1048576.0);
        println!("classes  {}", manifest.classes.len());
        match manifest.packed {
            Some(PackedOrder::Shuffled { seed }) => println!("order    shuffled across shards by stoker pack (seed {seed})"),
            Some(PackedOrder::Folder) => println!("order    folder order (stoker pack --no-shuffle)"),
            None => println!("order    as written (not packed by stoker pack)"),
        }
        if let Some(mixing) = &mixing_opt {
            println!(
                "mixing   {:.1} distinct labels per global batch of {} with shuffle {shuffle}, {:.1} in a random batch ({:.0}%)",
                mixing.plan_distinct,
                mixing.batch_samples,
                mixing.random_distinct,
                mixing.ratio() * 100.0
            );
        }
        if remote {
            println!("mixing   not measured: the shards in the store were checked by size, not read (inspect a local copy)");
        }
        if let Some(advice) = &advice_opt {
            println!("warning: {advice}");
        }
        for problem in &problems {
            println!("problem: {problem}");
        }
        if problems.is_empty() {
            println!("every shard is present and matches the manifest (local: sample count; object store: size)");
        }
    }
    Ok(if problems.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
