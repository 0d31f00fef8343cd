//! Arguments several subcommands share: where the coordinator is, this node's certificate,
//! and how a shuffle is written.

use std::path::PathBuf;

use clap::Args;
use stoker_plan::Shuffle;

/// Where the coordinator is, for the commands that call it, and this client's certificate.
#[derive(Debug, Args)]
pub(crate) struct CoordinatorAddr {
    /// The coordinator's address HOST:PORT, or the addresses of a replicated coordinator's nodes
    /// as HOST:PORT,HOST:PORT,... (calls follow the leader among them).
    #[arg(long, env = "STOKER_COORDINATOR", default_value = "127.0.0.1:7400")]
    pub(crate) coordinator: String,
    #[command(flatten)]
    pub(crate) tls: TlsArgs,
}

/// Where this node's certificate comes from (mutual TLS, DESIGN §10).
#[derive(Debug, Args)]
pub(crate) struct TlsArgs {
    /// This node's TLS directory: ca.pem (the cluster CA, or two during a rotation), node.pem
    /// and node.key (its certificate, whose role must fit the command, and a coordinator's
    /// node id its --node-id), and optionally
    /// `revoked` (SHA-256 fingerprints refused). `stoker certs issue` writes one. [default:
    /// the local CA in ~/.local/share/stoker/local-ca, made on first use: one machine only]
    #[arg(long, env = "STOKER_TLS_DIR", value_name = "DIR")]
    pub(crate) tls_dir: Option<PathBuf>,
    /// Check no certificates: traffic is encrypted, but anyone who reaches a Stoker port may
    /// do anything (take batches, fail jobs). For demos on a trusted network; every node says
    /// so in its log. Nodes with --insecure and nodes with certificates cannot talk.
    #[arg(long)]
    pub(crate) insecure: bool,
}

impl TlsArgs {
    /// Where TLS comes from, as the flags say.
    pub(crate) fn source(&self) -> Result<stoker_net::TlsSource, stoker_net::TlsError> {
        stoker_net::TlsSource::from_flags(self.tls_dir.clone(), self.insecure)
    }
}

pub(crate) fn parse_shuffle(text: &str) -> Result<Shuffle, String> {
    text.parse().map_err(|error: stoker_plan::error::PlanError| error.to_string())
}

/// How this process reaches object stores (datasets at `s3://` URIs). Credentials are not
/// flags: they come from the standard AWS environment variables (`AWS_ACCESS_KEY_ID`,
/// `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`), the static keys of the profile `AWS_PROFILE`
/// in `~/.aws/credentials`, a web-identity token (`AWS_WEB_IDENTITY_TOKEN_FILE`, `AWS_ROLE_ARN`)
/// or the instance/pod role.
#[derive(Debug, Args)]
pub(crate) struct ObjectStoreArgs {
    /// An S3-compatible endpoint (MinIO, Ceph RGW, R2, a local test server):
    /// http://HOST:PORT or https://HOST [default: AWS, or AWS_ENDPOINT_URL where set].
    #[arg(long, env = "STOKER_S3_ENDPOINT", value_name = "URL")]
    pub(crate) s3_endpoint: Option<String>,
    /// The store's region [default: AWS_REGION or AWS_DEFAULT_REGION, else us-east-1].
    #[arg(long, env = "STOKER_S3_REGION", value_name = "REGION")]
    pub(crate) s3_region: Option<String>,
    /// At most this many requests a second to object stores from this process (S3 answers
    /// 503 SlowDown above about 5,500 GETs a second per prefix) [default: no limit].
    #[arg(long, env = "STOKER_S3_MAX_REQUESTS_PER_SECOND", value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) s3_max_requests_per_second: Option<u64>,
    /// At most this many bytes a second read from object stores by this process (e.g. 200MiB),
    /// to leave a node's network to the trainers' batches [default: no limit].
    #[arg(long, env = "STOKER_S3_MAX_BANDWIDTH", value_name = "BYTES", value_parser = crate::cmd::pack::parse_byte_size)]
    pub(crate) s3_max_bandwidth: Option<u64>,
}

impl ObjectStoreArgs {
    /// The client settings these flags give.
    pub(crate) fn config(&self) -> Result<stoker_store::StoreConfig, stoker_store::StoreError> {
        let mut config = stoker_store::StoreConfig::with_endpoint(self.s3_endpoint.clone())?;
        config.region_opt = self.s3_region.clone();
        config.max_requests_per_second = self.s3_max_requests_per_second;
        config.max_bytes_per_second = self.s3_max_bandwidth.filter(|bytes| *bytes > 0);
        Ok(config)
    }

    /// Clients with these settings, reading anywhere the credentials allow.
    pub(crate) fn stores(&self) -> Result<stoker_store::ObjectStores, stoker_store::StoreError> {
        Ok(stoker_store::ObjectStores::new(self.config()?, stoker_store::ObjectRoots::anywhere()))
    }
}

/// What a token file does not say itself (`stoker index` and `stoker inspect` of token files).
#[derive(Debug, Args)]
pub(crate) struct TokenFileArgs {
    /// Token files: their layout, when not told from the file. megatron: PREFIX.bin + PREFIX.idx
    /// (found when the .idx is beside the .bin); llmc: llm.c / modded-nanogpt shards (found by
    /// their magic, 20240520 or 20240801); raw: a headerless array of --dtype tokens (nanoGPT's
    /// train.bin, taken when --dtype is given and nothing else fits).
    #[arg(long, value_name = "megatron|llmc|raw", help_heading = "Token datasets")]
    pub(crate) format: Option<stoker_format::tokens::TokenFormat>,
    /// Token files: the token type of a headerless file (uint16 for nanoGPT; also uint8, int8,
    /// int16, int32, uint32, int64). Megatron and llm.c files say theirs.
    #[arg(long, value_name = "TYPE", help_heading = "Token datasets")]
    pub(crate) dtype: Option<stoker_format::tokens::TokenDtype>,
    /// Token files: the token that ends each document of llm.c and raw files (GPT-2's
    /// <|endoftext|> is 50256); a document runs up to and including it. Without it each file is
    /// one document. Megatron datasets carry their documents (sequences) in the .idx.
    #[arg(long, value_name = "TOKEN", help_heading = "Token datasets")]
    pub(crate) eos: Option<i64>,
}

impl TokenFileArgs {
    /// The options of opening a token file.
    pub(crate) fn options(&self) -> stoker_format::tokens::TokenOptions {
        stoker_format::tokens::TokenOptions { format: self.format, dtype: self.dtype, eos: self.eos }
    }

    /// Whether any token option was given (then the paths are token files).
    pub(crate) fn given(&self) -> bool {
        self.format.is_some() || self.dtype.is_some() || self.eos.is_some()
    }
}

/// Whether `path` names a token file: a `.bin` or `.idx`, or the prefix of a Megatron dataset.
pub(crate) fn is_token_path(path: &std::path::Path) -> bool {
    path.extension().is_some_and(|extension| extension == "bin" || extension == "idx")
        || stoker_format::tokens::megatron_paths(path).is_some()
}
