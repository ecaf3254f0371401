//! AMQP URLs: one broker address, its password kept and never shown.

use std::fmt;

use crate::error::{Error, Result};

/// One broker address parsed from an `amqp://` or `amqps://` URL.
///
/// `Debug` and `Display` show `amqp://user@host:port/vhost`: the password never appears.
#[derive(Clone, PartialEq, Eq)]
pub struct Address {
    /// The scheme of a transport beside AMQP (`transport/schemes.rs`), whose broker `host`
    /// names, as `memory` in `memory://name`; `None` for AMQP.
    pub(crate) transport: Option<&'static str>,
    pub(crate) tls: bool,
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) user: String,
    pub(crate) password: String,
    pub(crate) vhost: String,
}

impl Address {
    /// Parses `amqp[s]://[user[:password]@]host[:port][/vhost]`. User and password default to
    /// `guest`, the port to 5672 (5671 for `amqps`), the vhost to `/`; `%2f` in the vhost is `/`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for any other shape (the message never repeats the password).
    pub fn parse(url: &str) -> Result<Address> {
        let bad = |why: &str| Error::invalid(format!("bad AMQP URL: {why}"));
        if let Some(scheme) = url
            .split_once("://")
            .and_then(|(scheme, _)| crate::transport::schemes::find(scheme))
        {
            return beside_amqp(scheme, &url[scheme.name.len() + 3..]);
        }
        let (tls, rest) = if let Some(r) = url.strip_prefix("amqp://") {
            (false, r)
        } else if let Some(r) = url.strip_prefix("amqps://") {
            (true, r)
        } else {
            let others: String = crate::transport::schemes::SCHEMES
                .iter()
                .map(|s| format!(", {}://", s.name))
                .collect();
            return Err(bad(&format!(
                "it must start with amqp://, amqps://{others}"
            )));
        };
        if rest.contains('?') {
            return Err(bad(
                "query parameters are not supported; use ConnectionOptions",
            ));
        }
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], Some(&rest[i + 1..])),
            None => (rest, None),
        };
        let (userinfo, hostport) = match authority.rfind('@') {
            Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
            None => (None, authority),
        };
        let (user, password) = match userinfo {
            Some(ui) => match ui.find(':') {
                Some(i) => (decode(&ui[..i])?, decode(&ui[i + 1..])?),
                None => (decode(ui)?, String::new()),
            },
            None => ("guest".to_string(), "guest".to_string()),
        };
        let default_port = if tls { 5671 } else { 5672 };
        let (host, port) = if let Some(h) = hostport.strip_prefix('[') {
            let end = h.find(']').ok_or_else(|| bad("unclosed [ in host"))?;
            let port = match &h[end + 1..] {
                "" => default_port,
                p => parse_port(p.strip_prefix(':').ok_or_else(|| bad("bad port"))?)?,
            };
            (h[..end].to_string(), port)
        } else {
            match hostport.rfind(':') {
                Some(i) => (hostport[..i].to_string(), parse_port(&hostport[i + 1..])?),
                None => (hostport.to_string(), default_port),
            }
        };
        if host.is_empty() {
            return Err(bad("the host is missing"));
        }
        let vhost = match path {
            None | Some("") => "/".to_string(),
            Some(p) => decode(p)?,
        };
        Ok(Address {
            transport: None,
            tls,
            host,
            port,
            user,
            password,
            vhost,
        })
    }

    /// `host:port`.
    pub fn host_port(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// `{scheme}://{host}` of a transport beside AMQP: `host` as that transport checks it, and
/// the transport in this build.
fn beside_amqp(scheme: &'static crate::transport::schemes::Scheme, host: &str) -> Result<Address> {
    let name = scheme.name;
    let Some(ops) = scheme.ops else {
        return Err(Error::invalid(format!(
            "{name}://{host} needs {}",
            scheme.needs
        )));
    };
    (ops.check)(host).map_err(|why| Error::invalid(format!("bad {name}:// URL: {why}")))?;
    Ok(Address {
        transport: Some(name),
        tls: false,
        host: host.to_string(),
        port: 0,
        user: String::new(),
        password: String::new(),
        vhost: "/".to_string(),
    })
}

fn parse_port(p: &str) -> Result<u16> {
    p.parse()
        .map_err(|_| Error::invalid(format!("bad AMQP URL: port {p:?} is not a number")))
}

fn decode(s: &str) -> Result<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| Error::invalid("bad AMQP URL: bad percent-escape"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| Error::invalid("bad AMQP URL: escape is not UTF-8"))
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(scheme) = self.transport {
            return write!(f, "{scheme}://{}", self.host);
        }
        let scheme = if self.tls { "amqps" } else { "amqp" };
        let vhost = if self.vhost == "/" {
            String::new()
        } else {
            self.vhost.replace('/', "%2f")
        };
        write!(f, "{scheme}://{}@{}/{vhost}", self.user, self.host_port())
    }
}

impl fmt::Debug for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Address({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let a = Address::parse("amqp://localhost").unwrap();
        assert_eq!((a.user.as_str(), a.password.as_str()), ("guest", "guest"));
        assert_eq!(a.port, 5672);
        assert_eq!(a.vhost, "/");
        assert_eq!(Address::parse("amqps://h/").unwrap().port, 5671);
    }

    #[test]
    fn refuses_bad_urls_without_echoing_passwords() {
        for bad in [
            "http://x",
            "amqp://",
            "amqp://u:pw@h:notaport/",
            "amqp://h/?heartbeat=5",
        ] {
            let e = Address::parse(bad).unwrap_err();
            assert!(!e.to_string().contains("pw@"), "{e}");
        }
    }

    #[test]
    fn a_scheme_of_the_table_beside_amqp_is_read_through_it_and_shown_as_given() {
        let a = Address::parse("memory://orders-test.1").unwrap();
        assert_eq!(a.transport, Some("memory"));
        assert_eq!(a.to_string(), "memory://orders-test.1");
        assert_eq!(Address::parse("amqp://h").unwrap().transport, None);
        let e = Address::parse("memory://has space")
            .unwrap_err()
            .to_string();
        assert!(e.contains("bad memory:// URL") && e.contains("' '"), "{e}");
        assert!(Address::parse("memory://").is_err());
    }

    #[test]
    fn an_unknown_scheme_is_refused_naming_every_scheme_there_is() {
        let e = Address::parse("nats://h").unwrap_err().to_string();
        assert!(
            e.contains("amqp://, amqps://, memory://"),
            "the error names the schemes of the table too: {e}"
        );
    }

    #[test]
    fn a_connection_of_two_transports_is_refused_naming_both() {
        let options = crate::ConnectionOptions::new()
            .address("memory://a")
            .address("amqp://h");
        let e = options.validate().unwrap_err().to_string();
        assert!(e.contains("memory:// and amqp://"), "{e}");
    }
}
