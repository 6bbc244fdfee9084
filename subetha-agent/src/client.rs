//! A minimal blocking HTTP/1.1 GET, for `subetha-agent status` talking to a
//! running agent on loopback. (A full client library would be a heavy
//! dependency for one request to our own server.)

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{Context, Result, bail};

/// Largest response accepted.
const MAX_RESPONSE: u64 = 64 << 20;

/// `GET path` from `addr`; the body of a 200 response.
pub fn get(addr: SocketAddr, path: &str) -> Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = Vec::new();
    stream.take(MAX_RESPONSE).read_to_end(&mut response)?;
    let text = String::from_utf8(response).context("response is not UTF-8")?;
    let (head, body) = text.split_once("\r\n\r\n").context("malformed HTTP response")?;
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("200") {
        bail!("agent answered {status}");
    }
    if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        return dechunk(body);
    }
    Ok(body.to_string())
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
}
