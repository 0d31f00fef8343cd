//! [`MotoServer`]: a real S3-compatible server (moto's, from PyPI: `moto[server]`) that a test
//! starts on a loopback address of its own and stops when it drops. Tests that need it are
//! `#[ignore]`d in a plain `cargo test` and run under `make test`, which installs moto into the
//! venv whose Python `STOKER_PYTHON` names.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::TestkitError;
use crate::netns::Lab;
use crate::wait::wait_until;

/// Credentials every test sets for the client (moto accepts any unless started with
/// authentication on); they must never appear in Stoker's output.
pub const TEST_ACCESS_KEY_ID: &str = "AKIASTOKERTESTKEY01";
/// The secret that goes with [`TEST_ACCESS_KEY_ID`].
pub const TEST_SECRET_ACCESS_KEY: &str = "stoker-test-secret-do-not-print-7Hq";

/// A moto S3 server, killed on drop.
#[derive(Debug)]
pub struct MotoServer {
    child: Child,
    addr: SocketAddr,
}

/// Set the AWS variables the object-store client reads to the test credentials (and a
/// region), once per process: without them the client would ask the instance-metadata
/// address for credentials, which tests must never reach.
pub fn use_test_credentials() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: set once, before any object-store client of this process is built (each
        // test that uses one calls this first); nothing reads these variables concurrently.
        unsafe {
            std::env::set_var("AWS_ACCESS_KEY_ID", TEST_ACCESS_KEY_ID);
            std::env::set_var("AWS_SECRET_ACCESS_KEY", TEST_SECRET_ACCESS_KEY);
            std::env::set_var("AWS_REGION", "us-east-1");
            std::env::remove_var("AWS_SESSION_TOKEN");
            std::env::remove_var("AWS_PROFILE");
        }
    });
}

/// The Python to run moto with: `STOKER_PYTHON` (set by `make test`).
pub fn python() -> Result<std::path::PathBuf, TestkitError> {
    std::env::var_os("STOKER_PYTHON")
        .map(std::path::PathBuf::from)
        .ok_or_else(|| "STOKER_PYTHON is not set: run these tests with make test (its venv has moto[server])".to_owned())
}

impl MotoServer {
    /// Start moto on `127.0.0.<host>`, with authentication on if `authenticate`
    /// (every request's credentials are then checked, and the test ones refused), and wait until
    /// it answers.
    pub fn start(host: u8, authenticate: bool) -> Result<Self, TestkitError> {
        let ip = Ipv4Addr::new(127, 0, 0, host);
        // A free port on that address; moto binds it right after (a test's own address, so
        // nothing else races for it).
        let port = TcpListener::bind((ip, 0)).and_then(|listener| listener.local_addr()).map_err(|error| error.to_string())?.port();
        let mut command = Command::new(python()?);
        if authenticate {
            command.env("INITIAL_NO_AUTH_ACTION_COUNT", "0");
        }
        Self::serve(command, SocketAddr::from((ip, port)))
    }

    /// Start moto on host `host` of `lab` (its address, port 5000: the host's namespace is the
    /// lab's own), authentication off, and wait until it answers: the calling thread must be on
    /// a host of the lab (see [`Lab::enter`]). The lab kills it when dropped, if this does not.
    pub fn start_in(lab: &Lab, host: &str) -> Result<Self, TestkitError> {
        let addr = SocketAddr::from((lab.addr(host)?, 5000));
        Self::serve(lab.command(host, python()?)?, addr)
    }

    /// Run `command` (a Python) as moto's server on `addr`, and wait until it answers.
    fn serve(mut command: Command, addr: SocketAddr) -> Result<Self, TestkitError> {
        use_test_credentials();
        command
            .args(["-m", "moto.server", "-H", &addr.ip().to_string(), "-p", &addr.port().to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = command.spawn().map_err(|error| format!("cannot start moto with {:?}: {error}", python()))?;
        let mut server = Self { child, addr };
        let waited =
            wait_until(Duration::from_secs(30), "moto answers", || TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok());
        if let Err(error) = waited {
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(format!("moto exited ({status}) before it answered: is moto[server] installed for STOKER_PYTHON?"));
            }
            return Err(error);
        }
        Ok(server)
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The endpoint, for `--s3-endpoint`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The client settings that reach it, retrying quickly.
    pub fn store_config(&self) -> stoker_store::StoreConfig {
        let mut config = stoker_store::StoreConfig::with_endpoint(Some(self.endpoint())).unwrap_or_default();
        config.first_backoff = Duration::from_millis(20);
        config
    }

    /// Create `bucket` (moto takes an unsigned request when authentication is off).
    pub fn create_bucket(&self, bucket: &str) -> Result<(), TestkitError> {
        let mut stream = TcpStream::connect(self.addr).map_err(|error| error.to_string())?;
        let request = format!("PUT /{bucket} HTTP/1.1\r\nHost: {}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", self.addr);
        stream.write_all(request.as_bytes()).map_err(|error| error.to_string())?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).map_err(|error| error.to_string())?;
        if answer.starts_with("HTTP/1.1 200") || answer.starts_with("HTTP/1.0 200") {
            Ok(())
        } else {
            Err(format!("moto did not create bucket {bucket}: {}", answer.lines().next().unwrap_or("")))
        }
    }

    /// Upload every file of `folder` under `s3://bucket/prefix/`.
    pub fn upload_folder(&self, folder: &std::path::Path, prefix: &str) -> Result<(), TestkitError> {
        let stores = stoker_store::ObjectStores::new(self.store_config(), stoker_store::ObjectRoots::anywhere());
        let prefix = stoker_store::ObjectUri::parse_prefix(prefix).map_err(|error| error.to_string())?;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|error| error.to_string())?;
        for entry in std::fs::read_dir(folder).map_err(|error| error.to_string())? {
            let path = entry.map_err(|error| error.to_string())?.path();
            let name = path.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
            if !path.is_file() {
                continue;
            }
            let uri = prefix.join(&name).map_err(|error| error.to_string())?;
            runtime.block_on(stores.upload(&path, &uri)).map_err(|error| error.to_string())?;
        }
        Ok(())
    }
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
