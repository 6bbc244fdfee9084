//! The bearer token of `run --auth-token-file`: read from a file (so it
//! never shows in `ps` or the shell history), checked by the HTTP server
//! ([`crate::http`]) and sent by the client commands ([`crate::client`]).
//!
//! A token is one line of visible ASCII (RFC 6750 `b64token` characters
//! and a few more, no spaces), surrounding whitespace ignored; anything
//! else is refused when the file is read, so a bad file fails at start-up
//! rather than on the first request.

use std::fmt;
use std::path::{Path, PathBuf};

/// Shortest accepted token: a guessable token is no protection.
pub const MIN_TOKEN_LEN: usize = 16;

/// Why a token file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The file could not be read.
    #[error("cannot read the auth token file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file holds no token, or one that is too short.
    #[error(
        "the auth token file {path} holds {len} characters; a token needs at least {MIN_TOKEN_LEN} \
         (e.g. `openssl rand -hex 32 > {path}`)"
    )]
    TooShort {
        /// The file.
        path: PathBuf,
        /// Characters found (after trimming).
        len: usize,
    },
    /// The token has characters an `Authorization` header cannot carry.
    #[error(
        "the auth token in {path} must be one line of visible ASCII without spaces \
         (byte {offset} is not)"
    )]
    BadCharacter {
        /// The file.
        path: PathBuf,
        /// Offset of the first bad byte in the trimmed token.
        offset: usize,
    },
}

/// A bearer token. Its `Debug` form does not show it.
#[derive(Clone, PartialEq, Eq)]
pub struct BearerToken(String);

impl fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BearerToken(<redacted>)")
    }
}

impl BearerToken {
    /// Reads the token in `path`.
    pub fn read(path: &Path) -> Result<Self, TokenError> {
        let text = std::fs::read_to_string(path).map_err(|source| TokenError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// A warning when `path` can be read by users other than its owner
    /// (group or other permission bits set): the token is a secret.
    pub fn permission_warning(path: &Path) -> Option<String> {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
        (mode & 0o077 != 0).then(|| {
            format!(
                "the auth token file {} is readable beyond its owner (mode {mode:03o}); chmod 600 it",
                path.display()
            )
        })
    }

    /// The token in `text`, read from `path` (named in errors).
    pub fn parse(text: &str, path: &Path) -> Result<Self, TokenError> {
        let token = text.trim();
        if let Some(offset) = token.bytes().position(|b| !b.is_ascii_graphic()) {
            return Err(TokenError::BadCharacter {
                path: path.to_path_buf(),
                offset,
            });
        }
        if token.len() < MIN_TOKEN_LEN {
            return Err(TokenError::TooShort {
                path: path.to_path_buf(),
                len: token.len(),
            });
        }
        Ok(Self(token.to_string()))
    }

    /// The `Authorization` header value carrying it.
    pub fn header_value(&self) -> String {
        format!("Bearer {}", self.0)
    }

    /// Whether the `Authorization` header value `header` carries this
    /// token. The scheme is case-insensitive (RFC 7235); the token is
    /// compared in time independent of where it differs.
    pub fn accepts(&self, header: &str) -> bool {
        let Some((scheme, token)) = header.split_once(' ') else {
            return false;
        };
        scheme.eq_ignore_ascii_case("bearer") && constant_time_eq(token.trim().as_bytes(), self.0.as_bytes())
    }
}

/// Byte equality whose time depends only on the lengths. Written out
/// because it is four lines; a crate for it would add a dependency for no
/// more assurance.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATH: &str = "/etc/subetha/token";

    #[test]
    fn a_token_file_is_one_trimmed_line() {
        let token = BearerToken::parse("  0123456789abcdef0123\n", Path::new(PATH)).unwrap();
        assert_eq!(token.header_value(), "Bearer 0123456789abcdef0123");
        assert!(token.accepts("Bearer 0123456789abcdef0123"));
        assert!(token.accepts("bearer 0123456789abcdef0123"));
        assert!(!token.accepts("Bearer 0123456789abcdef0124"));
        assert!(!token.accepts("Bearer 0123456789abcdef012"));
        assert!(!token.accepts("Basic 0123456789abcdef0123"));
        assert!(!token.accepts("0123456789abcdef0123"));
        assert!(!format!("{token:?}").contains("0123"));
    }

    #[test]
    fn a_token_file_others_can_read_is_warned_about() {
        use std::os::unix::fs::PermissionsExt;
        let path = std::env::temp_dir().join(format!("subetha-token-mode-{}", std::process::id()));
        std::fs::write(&path, "0123456789abcdef0123\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(BearerToken::permission_warning(&path), None);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let warning = BearerToken::permission_warning(&path).expect("a warning");
        assert!(
            warning.contains("mode 640") && warning.contains("chmod 600"),
            "{warning}"
        );
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn bad_token_files_are_refused_with_the_reason() {
        let short = BearerToken::parse("abc\n", Path::new(PATH)).unwrap_err();
        assert!(matches!(short, TokenError::TooShort { len: 3, .. }), "{short}");
        assert!(short.to_string().contains(PATH), "{short}");
        let empty = BearerToken::parse("\n", Path::new(PATH)).unwrap_err();
        assert!(matches!(empty, TokenError::TooShort { len: 0, .. }), "{empty}");
        let spaced = BearerToken::parse("0123456789 abcdef0123", Path::new(PATH)).unwrap_err();
        assert!(
            matches!(spaced, TokenError::BadCharacter { offset: 10, .. }),
            "{spaced}"
        );
        let two_lines =
            BearerToken::parse("0123456789abcdef\n0123456789abcdef", Path::new(PATH)).unwrap_err();
        assert!(
            matches!(two_lines, TokenError::BadCharacter { .. }),
            "{two_lines}"
        );
        let missing = BearerToken::read(Path::new("/nonexistent/subetha-token")).unwrap_err();
        assert!(matches!(missing, TokenError::Read { .. }));
        assert!(std::error::Error::source(&missing).is_some());
    }
}
