//! A minimal blocking HTTP/1.1 GET, for the commands that talk to a running
//! agent (`status`, `storms`, `top`, `report`): over TCP or the agent's
//! unix socket, with its bearer token when it asks for one. (A full client
//! library would be a heavy dependency for one request to our own server.)

use std::fmt;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::auth::BearerToken;

/// Largest response accepted.
const MAX_RESPONSE: u64 = 64 << 20;

/// Where an agent serves HTTP: `HOST:PORT`, or `unix:PATH` for a unix
/// socket. The same syntax for `run --listen` and the clients' `--addr`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AgentAddr {
    /// A TCP address.
    Tcp(SocketAddr),
    /// A unix socket path.
    Unix(PathBuf),
}

/// The prefix that makes an address a unix socket path.
pub const UNIX_PREFIX: &str = "unix:";

/// Why text is not an [`AgentAddr`].
#[derive(Debug, thiserror::Error)]
pub enum AddrError {
    /// `unix:` without a path.
    #[error("unix: needs a socket path (e.g. unix:/run/subetha/http.sock)")]
    NoPath,
    /// Neither `unix:PATH` nor a socket address.
    #[error("{text:?} is not an address: write HOST:PORT (e.g. 127.0.0.1:9464) or unix:PATH")]
    Invalid {
        /// What was given.
        text: String,
        /// Why it is not a socket address.
        #[source]
        source: std::net::AddrParseError,
    },
}

impl FromStr for AgentAddr {
    type Err = AddrError;

    fn from_str(text: &str) -> Result<Self, AddrError> {
        if let Some(path) = text.strip_prefix(UNIX_PREFIX) {
            if path.is_empty() {
                return Err(AddrError::NoPath);
            }
            return Ok(Self::Unix(PathBuf::from(path)));
        }
        text.parse().map(Self::Tcp).map_err(|source| AddrError::Invalid {
            text: text.to_string(),
            source,
        })
    }
}

impl fmt::Display for AgentAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tcp(addr) => addr.fmt(f),
            Self::Unix(path) => write!(f, "{UNIX_PREFIX}{}", path.display()),
        }
    }
}

impl From<SocketAddr> for AgentAddr {
    fn from(addr: SocketAddr) -> Self {
        Self::Tcp(addr)
    }
}

impl Serialize for AgentAddr {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for AgentAddr {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// How the client commands reach a running agent.
#[derive(Clone, Debug, clap::Args)]
pub struct AgentArgs {
    /// Address of the running agent: HOST:PORT, or unix:PATH for an agent
    /// run with `--listen unix:PATH`.
    #[arg(long, default_value = "127.0.0.1:9464")]
    pub addr: AgentAddr,
    /// File holding the bearer token of an agent run with
    /// `--auth-token-file`.
    #[arg(long, value_name = "PATH")]
    pub auth_token_file: Option<PathBuf>,
}

impl AgentArgs {
    /// A client for the agent these flags name (reads the token file).
    pub fn client(&self) -> Result<AgentClient> {
        let token = match &self.auth_token_file {
            None => None,
            Some(path) => Some(BearerToken::read(path)?),
        };
        Ok(AgentClient {
            addr: self.addr.clone(),
            token,
        })
    }
}

/// A running agent's address and the token it wants, if any.
#[derive(Clone, Debug)]
pub struct AgentClient {
    addr: AgentAddr,
    token: Option<BearerToken>,
}

impl AgentClient {
    /// A client for `addr`, sending `token` when given.
    pub fn new(addr: impl Into<AgentAddr>, token: Option<BearerToken>) -> Self {
        Self {
            addr: addr.into(),
            token,
        }
    }

    /// The agent's address.
    pub fn addr(&self) -> &AgentAddr {
        &self.addr
    }

    /// `GET path`; the body of a 200 response.
    pub fn get(&self, path: &str) -> Result<String> {
        let authorization = self
            .token
            .as_ref()
            .map(|token| format!("Authorization: {}\r\n", token.header_value()))
            .unwrap_or_default();
        let request = |host: &dyn fmt::Display| {
            format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{authorization}Connection: close\r\n\r\n")
        };
        let response = match &self.addr {
            AgentAddr::Tcp(addr) => {
                let stream = TcpStream::connect_timeout(addr, Duration::from_secs(2))?;
                stream.set_read_timeout(Some(Duration::from_secs(10)))?;
                exchange(stream, &request(addr))?
            }
            AgentAddr::Unix(path) => {
                let stream = UnixStream::connect(path)
                    .with_context(|| format!("cannot connect to {}", path.display()))?;
                stream.set_read_timeout(Some(Duration::from_secs(10)))?;
                exchange(stream, &request(&"localhost"))?
            }
        };
        parse_response(response)
    }
}

/// `GET path` from TCP `addr` without a token; the body of a 200 response.
pub fn get(addr: SocketAddr, path: &str) -> Result<String> {
    AgentClient::new(addr, None).get(path)
}

fn exchange(mut stream: impl Read + Write, request: &str) -> Result<Vec<u8>> {
    stream.write_all(request.as_bytes())?;
    let mut response = Vec::new();
    stream.take(MAX_RESPONSE).read_to_end(&mut response)?;
    Ok(response)
}

fn parse_response(response: Vec<u8>) -> Result<String> {
    let text = String::from_utf8(response).context("response is not UTF-8")?;
    let (head, body) = text.split_once("\r\n\r\n").context("malformed HTTP response")?;
    let status = head.lines().next().unwrap_or_default();
    let chunked = head.to_ascii_lowercase().contains("transfer-encoding: chunked");
    let body = || {
        if chunked {
            dechunk(body)
        } else {
            Ok(body.to_string())
        }
    };
    match status.split_whitespace().nth(1) {
        Some("200") => body(),
        Some("401") => bail!("agent answered {status}: it wants its bearer token (--auth-token-file PATH)"),
        _ => bail!("agent answered {status}"),
    }
}

fn dechunk(mut body: &str) -> Result<String> {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n").context("malformed chunk")?;
        let size = usize::from_str_radix(size.trim(), 16).context("bad chunk size")?;
        if size == 0 {
            return Ok(out);
        }
        let chunk = rest.get(..size).context("truncated chunk")?;
        out.push_str(chunk);
        body = rest.get(size + 2..).context("truncated chunk")?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dechunks() {
        assert_eq!(dechunk("3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n").unwrap(), "abcde");
        assert!(dechunk("zz\r\n").is_err());
    }

    #[test]
    fn addresses_are_host_port_or_a_unix_path() {
        let tcp: AgentAddr = "127.0.0.1:9464".parse().unwrap();
        assert_eq!(tcp, AgentAddr::Tcp("127.0.0.1:9464".parse().unwrap()));
        assert_eq!(tcp.to_string(), "127.0.0.1:9464");
        let unix: AgentAddr = "unix:/run/subetha/http.sock".parse().unwrap();
        assert_eq!(unix, AgentAddr::Unix("/run/subetha/http.sock".into()));
        assert_eq!(unix.to_string(), "unix:/run/subetha/http.sock");
        assert!(matches!("unix:".parse::<AgentAddr>(), Err(AddrError::NoPath)));
        let bad = "nowhere".parse::<AgentAddr>().unwrap_err().to_string();
        assert!(bad.contains("HOST:PORT") && bad.contains("unix:PATH"), "{bad}");
    }

    #[test]
    fn a_401_says_how_to_pass_the_token() {
        let error =
            parse_response(b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 9\r\n\r\nno token\n".to_vec())
                .unwrap_err()
                .to_string();
        assert!(
            error.contains("401") && error.contains("--auth-token-file"),
            "{error}"
        );
        let ok = parse_response(b"HTTP/1.1 200 OK\r\n\r\nbody".to_vec()).unwrap();
        assert_eq!(ok, "body");
    }
}
