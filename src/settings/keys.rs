//! Every setting's key, in one table: its TOML path (`consumer.retry.kind`), from which its
//! variable's name is made (`ACEMQ_CONSUMER__RETRY__KIND`), and how its text is read into
//! [`Settings`]. The table's order is the order values are applied in, so of two names for one
//! field the later wins (`consumer.prefetch` over Python's top-level `prefetch`).

use std::path::PathBuf;

use super::parse::{boolean, choice, decimal, duration, positive_duration, refuse, whole};
use super::{RetryKind, Secret, Settings};
use crate::error::Result;

/// One setting: where it sits and how its text is read. `set` gets the settings, the name to
/// refuse the value by, and the value (never empty: an empty value counts as not set).
pub(super) struct Key {
    pub(super) path: &'static str,
    pub(super) set: fn(&mut Settings, &str, &str) -> Result<()>,
}

/// `ACEMQ_` and the path in upper case, `__` between levels (pydantic-settings' nesting, as
/// the Python library reads it).
pub(super) fn env_name(path: &str) -> String {
    format!("ACEMQ_{}", path.to_ascii_uppercase().replace('.', "__"))
}

/// The key whose path is `path` (a TOML file's keys are read by it).
#[cfg(any(feature = "toml", test))]
pub(super) fn by_path(path: &str) -> Option<usize> {
    KEYS.iter().position(|k| k.path == path)
}

/// The key whose variable is `name`.
pub(super) fn by_env_name(name: &str) -> Option<usize> {
    KEYS.iter().position(|k| env_name(k.path) == name)
}

fn whole_usize(label: &str, text: &str, min: u64) -> Result<usize> {
    let max = u64::try_from(usize::MAX).unwrap_or(u64::MAX);
    let n = whole(label, text, min, max)?;
    Ok(usize::try_from(n).unwrap_or(usize::MAX))
}

fn prefetch(label: &str, text: &str) -> Result<u16> {
    let n = whole(label, text, 1, u64::from(u16::MAX))?;
    Ok(u16::try_from(n).unwrap_or(u16::MAX))
}

fn path(text: &str) -> Option<PathBuf> {
    Some(PathBuf::from(text))
}

/// Every setting read. The names are the family's (the Python package's variables, nested as
/// its models are); the ones only this crate has are marked "ours" in docs/settings.md.
pub(super) const KEYS: &[Key] = &[
    Key {
        path: "url",
        set: |s, label, v| {
            s.urls = super::parse::split_urls(label, v)?;
            Ok(())
        },
    },
    Key {
        path: "username",
        set: |s, _, v| {
            s.username = Some(v.to_string());
            Ok(())
        },
    },
    Key {
        path: "password",
        set: |s, _, v| {
            s.password = Some(Secret::new(v));
            Ok(())
        },
    },
    Key {
        path: "virtual_host",
        set: |s, _, v| {
            s.virtual_host = Some(v.to_string());
            Ok(())
        },
    },
    Key {
        path: "client_name",
        set: |s, _, v| {
            s.client_name = Some(v.to_string());
            Ok(())
        },
    },
    Key {
        path: "connection_timeout",
        set: |s, label, v| {
            s.connection_timeout = positive_duration(label, v)?;
            Ok(())
        },
    },
    Key {
        path: "heartbeat",
        set: |s, label, v| {
            if v.trim().eq_ignore_ascii_case("server") {
                return Err(refuse(
                    label,
                    "`server` (the broker's suggestion) is not offered: this crate asks for its \
                     own interval; give whole seconds, 0 to turn heartbeats off",
                ));
            }
            let d = duration(label, v)?;
            if d.subsec_nanos() != 0 || d.as_secs() > u64::from(u16::MAX) {
                return Err(refuse(
                    label,
                    format!(
                        "`{}` is not a whole number of seconds from 0 (off) to 65535",
                        v.trim()
                    ),
                ));
            }
            s.heartbeat = d;
            Ok(())
        },
    },
    Key {
        path: "confirm_timeout",
        set: |s, label, v| {
            s.confirm_timeout = positive_duration(label, v)?;
            Ok(())
        },
    },
    Key {
        path: "max_outstanding_publishes",
        set: |s, label, v| {
            s.max_outstanding_publishes = whole_usize(label, v, 1)?;
            Ok(())
        },
    },
    Key {
        path: "publisher_confirms",
        set: |s, label, v| {
            s.publisher_confirms = boolean(label, v)?;
            Ok(())
        },
    },
    Key {
        path: "format",
        set: |s, label, v| {
            s.format = super::parse::format_name(label, v)?;
            Ok(())
        },
    },
    Key {
        path: "channel_max",
        set: |s, label, v| {
            let n = whole(label, v, 0, u64::from(u16::MAX))?;
            s.channel_max = u16::try_from(n).unwrap_or(u16::MAX);
            Ok(())
        },
    },
    Key {
        path: "frame_max",
        set: |s, label, v| {
            let n = whole(label, v, 4096, u64::from(u32::MAX))?;
            s.frame_max = u32::try_from(n).unwrap_or(u32::MAX);
            Ok(())
        },
    },
    Key {
        path: "backoff_min",
        set: |s, label, v| {
            s.backoff_min = positive_duration(label, v)?;
            Ok(())
        },
    },
    Key {
        path: "backoff_max",
        set: |s, label, v| {
            s.backoff_max = positive_duration(label, v)?;
            Ok(())
        },
    },
    Key {
        path: "operation_timeout",
        set: |s, label, v| {
            s.operation_timeout = positive_duration(label, v)?;
            Ok(())
        },
    },
    Key {
        path: "max_unconfirmed_bytes",
        set: |s, label, v| {
            s.max_unconfirmed_bytes = whole_usize(label, v, 1)?;
            Ok(())
        },
    },
    // Python's top-level `prefetch`: before `consumer.prefetch`, which wins when both are given.
    Key {
        path: "prefetch",
        set: |s, label, v| {
            s.consumer.prefetch = prefetch(label, v)?;
            Ok(())
        },
    },
    Key {
        path: "consumer.prefetch",
        set: |s, label, v| {
            s.consumer.prefetch = prefetch(label, v)?;
            Ok(())
        },
    },
    Key {
        path: "consumer.concurrency",
        set: |s, label, v| {
            s.consumer.concurrency = whole_usize(label, v, 1)?;
            Ok(())
        },
    },
    Key {
        path: "consumer.shutdown_timeout",
        set: |s, label, v| {
            s.consumer.shutdown_timeout = duration(label, v)?;
            Ok(())
        },
    },
    Key {
        path: "consumer.declare",
        set: |s, label, v| {
            s.consumer.declare = boolean(label, v)?;
            Ok(())
        },
    },
    Key {
        path: "consumer.retry.enabled",
        set: |s, label, v| {
            s.consumer.retry.enabled = boolean(label, v)?;
            Ok(())
        },
    },
    Key {
        path: "consumer.retry.kind",
        set: |s, label, v| {
            s.consumer.retry.kind = match choice(label, v, &["exponential", "fixed"])?.as_str() {
                "fixed" => RetryKind::Fixed,
                _ => RetryKind::Exponential,
            };
            Ok(())
        },
    },
    Key {
        path: "consumer.retry.max_attempts",
        set: |s, label, v| {
            let n = whole(label, v, 1, u64::from(u32::MAX))?;
            s.consumer.retry.max_attempts = u32::try_from(n).unwrap_or(u32::MAX);
            Ok(())
        },
    },
    Key {
        path: "consumer.retry.initial_delay",
        set: |s, label, v| {
            s.consumer.retry.initial_delay = duration(label, v)?;
            Ok(())
        },
    },
    Key {
        path: "consumer.retry.max_delay",
        set: |s, label, v| {
            s.consumer.retry.max_delay = duration(label, v)?;
            Ok(())
        },
    },
    Key {
        path: "consumer.retry.multiplier",
        set: |s, label, v| {
            s.consumer.retry.multiplier = Some(decimal(label, v, 1.0, f64::INFINITY)?);
            Ok(())
        },
    },
    Key {
        path: "consumer.retry.jitter",
        set: |s, label, v| {
            s.consumer.retry.jitter = Some(decimal(label, v, 0.0, 1.0)?);
            Ok(())
        },
    },
    Key {
        path: "consumer.retry.give_up_after",
        set: |s, label, v| {
            s.consumer.retry.give_up_after = Some(duration(label, v)?).filter(|d| !d.is_zero());
            Ok(())
        },
    },
    // Python's name, before the one Ruby, .NET and this crate use, which wins when both are given.
    Key {
        path: "consumer.retry.wait_in_broker_from",
        set: |s, label, v| {
            s.consumer.retry.broker_wait_threshold = duration(label, v)?;
            Ok(())
        },
    },
    Key {
        path: "consumer.retry.broker_wait_threshold",
        set: |s, label, v| {
            s.consumer.retry.broker_wait_threshold = duration(label, v)?;
            Ok(())
        },
    },
    Key {
        path: "consumer.retry.quorum_rungs",
        set: |s, label, v| {
            s.consumer.retry.quorum_rungs = boolean(label, v)?;
            Ok(())
        },
    },
    Key {
        path: "tls.certificate_authority",
        set: |s, _, v| {
            s.tls.certificate_authority = path(v);
            Ok(())
        },
    },
    Key {
        path: "tls.client_certificate",
        set: |s, _, v| {
            s.tls.client_certificate = path(v);
            Ok(())
        },
    },
    Key {
        path: "tls.client_key",
        set: |s, _, v| {
            s.tls.client_key = path(v);
            Ok(())
        },
    },
    Key {
        path: "tls.client_key_password",
        // A secret: refused without its value.
        set: |_, label, _| {
            Err(refuse(
                label,
                "this crate reads unencrypted PKCS#8 keys only (-----BEGIN PRIVATE KEY-----), so \
                 a key password cannot be used; decrypt the key (`openssl pkcs8 -topk8 -nocrypt \
                 -in key.pem -out key.pkcs8.pem`), keep it readable by this service alone, and \
                 take the setting off",
            ))
        },
    },
    Key {
        path: "tls.server_name",
        set: |s, label, v| {
            let name = v.trim();
            if name.chars().any(|c| c.is_whitespace() || c == '/') {
                return Err(refuse(
                    label,
                    format!("`{name}` is not a host name or an IP address"),
                ));
            }
            s.tls.server_name = Some(name.to_string());
            Ok(())
        },
    },
    Key {
        path: "tls.verification",
        set: |_, label, v| {
            if choice(label, v, &["certificate", "nothing-at-all"])? == "certificate" {
                return Ok(());
            }
            Err(refuse(
                label,
                "`nothing-at-all` is not offered: this crate always checks the broker's \
                 certificate and name; for a development broker, trust its authority \
                 (ACEMQ_TLS__CERTIFICATE_AUTHORITY) and, for the family's development \
                 certificates, ACEMQ_TLS__ALLOW_DEVELOPMENT_CERTIFICATES=true",
            ))
        },
    },
    Key {
        path: "tls.allow_development_certificates",
        set: |s, label, v| {
            s.tls.allow_development_certificates = boolean(label, v)?;
            Ok(())
        },
    },
    Key {
        path: "tls.trust_system_roots",
        set: |s, label, v| {
            s.tls.trust_system_roots = boolean(label, v)?;
            Ok(())
        },
    },
    Key {
        path: "actuator.address",
        set: |s, label, v| {
            let a = v.trim();
            let port = a
                .rsplit_once(':')
                .map(|(host, port)| (host, port.parse::<u16>()));
            if !matches!(port, Some((host, Ok(_))) if !host.is_empty()) {
                return Err(refuse(
                    label,
                    format!("`{a}` is not host:port (`127.0.0.1:9464`, `[::1]:9464`, `0.0.0.0:0`)"),
                ));
            }
            s.actuator.address = a.to_string();
            Ok(())
        },
    },
    Key {
        path: "actuator.prefix",
        set: |s, label, v| {
            let p = v.trim();
            if !p.starts_with('/')
                || p.ends_with('/')
                || p.chars().any(|c| c == '?' || c == '#' || c.is_whitespace())
            {
                return Err(refuse(
                    label,
                    format!(
                        "`{p}` is not a path prefix: it starts with '/', does not end with one, \
                         and holds no '?', '#' or whitespace (`/ops`)"
                    ),
                ));
            }
            s.actuator.prefix = p.to_string();
            Ok(())
        },
    },
];

/// The family's variables this crate does not read, each with why (warned about by name when
/// set, not refused). A name ending in `__` stands for every variable under it.
const NOT_READ: &[(&str, &str)] = &[
    (
        "ACEMQ_HEALTH__PATH",
        "the actuator serves the family's fixed /acemq-health; put it under a prefix with \
         ACEMQ_ACTUATOR__PREFIX",
    ),
    (
        "ACEMQ_HEALTH__TIMEOUT",
        "the connection's report does not wait on the broker; an application check carries its \
         own deadline (health::HealthCheckOptions::deadline)",
    ),
    (
        "ACEMQ_HEALTH__UNHEALTHY_STATUS_CODE",
        "the actuator answers 503 when down, as the family's endpoints do",
    ),
    (
        "ACEMQ_CONSUMER__AUTO_START",
        "the application starts its consumers (Consumer::start); nothing here starts them",
    ),
    (
        "ACEMQ_TOPOLOGY__",
        "queues, exchanges and bindings are declared in code (QueueSpec, ExchangeSpec, Binding)",
    ),
    (
        "ACEMQ_BLOCKED_TIMEOUT",
        "a publish the broker holds back waits up to ACEMQ_CONFIRM_TIMEOUT; there is no \
         separate limit",
    ),
    (
        "ACEMQ_ENABLED",
        "a library has nothing to turn off: the application decides whether to connect",
    ),
];

/// `ACEMQ_` variables this crate's settings do not read but that are not typos either: the
/// `acemq` command's database (`ACEMQ_DB`), the file of settings, and this crate's tests'.
pub(super) fn is_someone_elses(name: &str) -> bool {
    name == "ACEMQ_DB" || name == "ACEMQ_CONFIG_FILE" || name.starts_with("ACEMQ_TEST_")
}

/// What is known of an unknown `name` (a variable's, or a TOML key's as its variable's).
pub(super) enum Unknown {
    /// One of the family's, not read here, and why.
    NotRead(&'static str),
    /// Probably a typo of this setting (a key of [`KEYS`]).
    Near(usize),
    /// Nothing.
    Nothing,
}

/// Why the family's `name` is not read, or the setting it was probably meant to be: the same
/// name but for its underscores (`ACEMQ_CONSUMER_PREFETCH`), or one within three edits.
pub(super) fn unknown(name: &str) -> Unknown {
    if let Some((_, why)) = NOT_READ.iter().find(|(n, _)| {
        if let Some(whole) = n.strip_suffix("__") {
            name.starts_with(n) || name == whole
        } else {
            name == *n
        }
    }) {
        return Unknown::NotRead(why);
    }
    let squeeze = |s: &str| s.replace('_', "");
    let cost = |known: &str| {
        if squeeze(known) == squeeze(name) {
            0
        } else {
            distance(known, name)
        }
    };
    KEYS.iter()
        .enumerate()
        .map(|(i, k)| (cost(&env_name(k.path)), i))
        .min()
        .filter(|(cost, _)| *cost <= 3)
        .map_or(Unknown::Nothing, |(_, i)| Unknown::Near(i))
}

/// Edit distance (insertions, deletions, substitutions).
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut previous = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let current = row[j + 1];
            row[j + 1] = if ca == *cb {
                previous
            } else {
                1 + previous.min(row[j]).min(current)
            };
            previous = current;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typo_is_pointed_at_the_setting_it_meant() {
        let near = |name: &str| match unknown(name) {
            Unknown::Near(i) => env_name(KEYS[i].path),
            Unknown::NotRead(why) => format!("not read: {why}"),
            Unknown::Nothing => String::new(),
        };
        assert_eq!(near("ACEMQ_CONSUMER_PREFETCH"), "ACEMQ_CONSUMER__PREFETCH");
        assert_eq!(near("ACEMQ_CONFIRM_TIMOUT"), "ACEMQ_CONFIRM_TIMEOUT");
        assert!(near("ACEMQ_TOPOLOGY__QUEUES").contains("declared in code"));
        assert_eq!(near("ACEMQ_SOMETHING_ELSE_ENTIRELY"), "");
    }

    #[test]
    fn every_path_is_unique_and_in_the_documented_table() {
        let doc = include_str!("../../docs/settings.md");
        for (i, k) in KEYS.iter().enumerate() {
            assert_eq!(by_path(k.path), Some(i), "{} twice", k.path);
            let name = env_name(k.path);
            assert!(
                doc.contains(&format!("`{name}`")),
                "{name} is not in docs/settings.md"
            );
        }
    }
}
