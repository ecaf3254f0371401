//! The broker login from the environment or a file, read as the family reads it.
//!
//! A password in a connection URL reaches every log line and `ps` listing that URL appears in;
//! these keep it out of the URL. A source is **asked each time a connection is made** (the
//! first connect and every reconnect), so a password rotated by a sidecar or a remounted
//! Kubernetes secret takes effect without a restart (Python `security.py`,
//! `credentials_from_environment`, `credentials_from_file`):
//!
//! - [`from_environment`]: two variables, by default `ACEMQ_USERNAME` and `ACEMQ_PASSWORD`;
//!   either unset is an error naming that variable (an empty value is a value);
//! - [`from_file`]: a file holding `username:password` (split at the first `:`), or the
//!   password alone when a username is given; trailing spaces, tabs, CR and LF are trimmed
//!   (an editor's final newline); a missing, unreadable or empty file, or one with no `:` and no
//!   username given, is an error naming the file.
//!
//! Set one with [`ConnectionOptions::credentials`](crate::ConnectionOptions::credentials); it
//! replaces the user and password of every address. [`Credentials`] never shows its secret in
//! `Debug`, and no error carries it.
//!
//! ```no_run
//! use acemq_amqp::{credentials, ConnectionOptions};
//!
//! # fn main() -> acemq_amqp::Result<()> {
//! let options = ConnectionOptions::new()
//!     .address("amqp://broker.internal:5672/")
//!     .credentials(credentials::from_file("/run/secrets/rabbitmq", Some("billing")));
//! let connection = acemq_amqp::Connection::open_with(options)?;
//! # Ok(()) }
//! ```

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, Result};

/// A username and its secret. `Debug` shows the username only.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    username: String,
    secret: String,
}

impl Credentials {
    /// Credentials for `username` with `secret`.
    pub fn new(username: impl Into<String>, secret: impl Into<String>) -> Credentials {
        Credentials {
            username: username.into(),
            secret: secret.into(),
        }
    }

    /// The account name.
    pub fn username(&self) -> &str {
        &self.username
    }

    /// The password (or token).
    pub fn secret(&self) -> &str {
        &self.secret
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Credentials(username={:?}, secret=<secret>)",
            self.username
        )
    }
}

/// Where credentials come from, asked each time a connection is made.
pub trait CredentialsSource: Send + Sync + 'static {
    /// Reads the credentials now.
    ///
    /// # Errors
    ///
    /// [`Error::Credentials`] when they cannot be read.
    fn credentials(&self) -> Result<Credentials>;
}

impl<F> CredentialsSource for F
where
    F: Fn() -> Result<Credentials> + Send + Sync + 'static,
{
    fn credentials(&self) -> Result<Credentials> {
        self()
    }
}

impl CredentialsSource for Credentials {
    fn credentials(&self) -> Result<Credentials> {
        Ok(self.clone())
    }
}

/// A shared source, as the connection keeps it.
pub(crate) type SharedSource = Arc<dyn CredentialsSource>;

/// The username in `ACEMQ_USERNAME` and the password in `ACEMQ_PASSWORD`, read each time.
pub fn from_default_environment() -> impl CredentialsSource {
    from_environment("ACEMQ_USERNAME", "ACEMQ_PASSWORD")
}

/// The username in `username_variable` and the password in `password_variable`, read each
/// time. Either unset is [`Error::Credentials`] naming it.
pub fn from_environment(
    username_variable: &str,
    password_variable: &str,
) -> impl CredentialsSource {
    let (user_var, pass_var) = (username_variable.to_string(), password_variable.to_string());
    move || {
        let read = |var: &str, what: &str| {
            std::env::var(var).map_err(|e| Error::Credentials {
                reason: match e {
                    std::env::VarError::NotPresent => {
                        format!("{var} is not set, so there is no broker {what}")
                    }
                    std::env::VarError::NotUnicode(_) => {
                        format!("{var} is not valid Unicode, so there is no broker {what}")
                    }
                },
            })
        };
        Ok(Credentials::new(
            read(&user_var, "username")?,
            read(&pass_var, "password")?,
        ))
    }
}

/// A file holding `username:password`, or the password alone when `username` is given; read
/// each time, trailing whitespace trimmed.
pub fn from_file(path: impl AsRef<Path>, username: Option<&str>) -> impl CredentialsSource {
    let path: PathBuf = path.as_ref().to_path_buf();
    let username = username.filter(|u| !u.is_empty()).map(str::to_string);
    move || {
        let failed = |reason: String| Error::Credentials { reason };
        let contents = std::fs::read_to_string(&path).map_err(|e| {
            failed(format!(
                "cannot read the credentials file {:?}: {e}",
                path.display()
            ))
        })?;
        let contents = contents.trim_end_matches([' ', '\t', '\r', '\n']);
        if contents.is_empty() {
            return Err(failed(format!(
                "the credentials file {:?} is empty",
                path.display()
            )));
        }
        if let Some(user) = &username {
            return Ok(Credentials::new(user.clone(), contents));
        }
        match contents.split_once(':') {
            Some((user, secret)) => Ok(Credentials::new(user, secret)),
            None => Err(failed(format!(
                "the credentials file {:?} holds no username, and none was given; write it as \
                 username:password, or pass the username to credentials::from_file",
                path.display()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_files_as_the_family_does() {
        let dir = tempfile::tempdir().unwrap();
        let both = dir.path().join("both");
        std::fs::write(&both, "app:pa:ss word \r\n").unwrap();
        let c = from_file(&both, None).credentials().unwrap();
        assert_eq!((c.username(), c.secret()), ("app", "pa:ss word"));
        let c = from_file(&both, Some("other")).credentials().unwrap();
        assert_eq!((c.username(), c.secret()), ("other", "app:pa:ss word"));
        let secret_only = dir.path().join("secret");
        std::fs::write(&secret_only, "s3cret\n").unwrap();
        let e = from_file(&secret_only, None).credentials().unwrap_err();
        assert!(e.to_string().contains("holds no username"), "{e}");
        assert!(!e.to_string().contains("s3cret"), "{e}");
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n\n").unwrap();
        let e = from_file(&empty, Some("u")).credentials().unwrap_err();
        assert!(e.to_string().contains("is empty"), "{e}");
        let e = from_file(dir.path().join("missing"), Some("u"))
            .credentials()
            .unwrap_err();
        assert!(matches!(e, Error::Credentials { .. }), "{e}");
        // Read again each time: a rotated file takes effect.
        let source = from_file(&secret_only, Some("u"));
        std::fs::write(&secret_only, "rotated").unwrap();
        assert_eq!(source.credentials().unwrap().secret(), "rotated");
    }

    #[test]
    fn reads_the_environment_and_names_what_is_missing() {
        let (u, p) = ("ACEMQ_TEST_CRED_USER_7f3", "ACEMQ_TEST_CRED_PASS_7f3");
        let source = from_environment(u, p);
        let e = source.credentials().unwrap_err().to_string();
        assert!(e.contains(u), "{e}");
        std::env::set_var(u, "app");
        let e = source.credentials().unwrap_err().to_string();
        assert!(e.contains(p), "{e}");
        std::env::set_var(p, "hunter2");
        let c = source.credentials().unwrap();
        assert_eq!((c.username(), c.secret()), ("app", "hunter2"));
        assert_eq!(
            format!("{c:?}"),
            "Credentials(username=\"app\", secret=<secret>)"
        );
        std::env::remove_var(u);
        std::env::remove_var(p);
    }
}
