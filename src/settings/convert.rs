//! What the settings turn into — the crate's own options — and the checks between settings
//! that no single value shows (a username without its password, TLS files for a plain URL).

use std::sync::Arc;
use std::time::Duration;

use super::keys::env_name;
use super::parse::format_name;
use super::{RetryKind, Settings};
use crate::codec::Codec;
use crate::connection::ConnectionOptions;
use crate::consume::{ConsumerOptions, RetryPolicy};
use crate::credentials::Credentials;
use crate::error::{Error, Result};
use crate::publish::PublisherOptions;

/// A setting named both ways, for the refusals that are about two of them.
fn both(path: &str) -> String {
    format!("{} (`{path}`)", env_name(path))
}

/// `url` with its vhost replaced by `vhost` (percent-encoded whole: `/` is `%2F`).
fn with_vhost(url: &str, vhost: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority = rest.split('/').next().unwrap_or(rest);
    let mut encoded = String::new();
    for b in vhost.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            encoded.push(char::from(b));
        } else {
            encoded.push_str(&format!("%{b:02X}"));
        }
    }
    format!("{scheme}://{authority}/{encoded}")
}

impl Settings {
    /// The checks between settings, made when they are loaded and again by
    /// [`connection_options`](Self::connection_options).
    pub(super) fn check(&self) -> Result<()> {
        let pair = |a: bool, b: bool, first: &str, second: &str| {
            if a && !b {
                return Err(Error::invalid(format!(
                    "{} is set but {} is not: give both or neither (an empty value counts as \
                     not set)",
                    both(first),
                    both(second)
                )));
            }
            Ok(())
        };
        pair(
            self.username.is_some(),
            self.password.is_some(),
            "username",
            "password",
        )?;
        pair(
            self.password.is_some(),
            self.username.is_some(),
            "password",
            "username",
        )?;
        pair(
            self.tls.client_certificate.is_some(),
            self.tls.client_key.is_some(),
            "tls.client_certificate",
            "tls.client_key",
        )?;
        pair(
            self.tls.client_key.is_some(),
            self.tls.client_certificate.is_some(),
            "tls.client_key",
            "tls.client_certificate",
        )?;
        if self.urls.is_empty() {
            return Err(Error::invalid(format!("{} holds no address", both("url"))));
        }
        let memory = self.urls.iter().any(|u| u.starts_with("memory://"));
        if memory && self.virtual_host.is_some() {
            return Err(Error::invalid(format!(
                "{} is set but {} names a memory:// broker, which has no virtual hosts",
                both("virtual_host"),
                both("url")
            )));
        }
        if self.backoff_min > self.backoff_max {
            return Err(Error::invalid(format!(
                "{} ({:?}) is longer than {} ({:?})",
                both("backoff_min"),
                self.backoff_min,
                both("backoff_max"),
                self.backoff_max
            )));
        }
        let encrypted = self.urls.iter().any(|u| u.starts_with("amqps://"));
        if !cfg!(feature = "tls") && (encrypted || self.tls.is_set()) {
            return Err(Error::invalid(format!(
                "{} asks for TLS: build acemq-amqp with the `tls` feature",
                if encrypted {
                    both("url")
                } else {
                    "ACEMQ_TLS__* (`[tls]`)".to_string()
                }
            )));
        }
        if self.tls.is_set() && self.urls.iter().any(|u| !u.starts_with("amqps://")) {
            return Err(Error::invalid(format!(
                "TLS settings (ACEMQ_TLS__*, `[tls]`) are given but {} is not amqps://: \
                 nothing here can make a plaintext connection safe; use amqps:// or take the \
                 TLS settings off",
                both("url")
            )));
        }
        let retry = &self.consumer.retry;
        if retry.kind == RetryKind::Fixed && retry.multiplier.is_some() {
            return Err(Error::invalid(format!(
                "{} is set but {} is `fixed`, which waits the same every time: take the \
                 multiplier off or make the kind `exponential`",
                both("consumer.retry.multiplier"),
                both("consumer.retry.kind")
            )));
        }
        Ok(())
    }

    /// The broker's addresses with [`virtual_host`](Self::virtual_host) applied.
    fn addresses(&self) -> Vec<String> {
        self.urls
            .iter()
            .map(|u| match &self.virtual_host {
                Some(vhost) if !u.starts_with("memory://") => with_vhost(u, vhost),
                _ => u.clone(),
            })
            .collect()
    }

    /// The connection's options: the addresses (their vhost replaced by `virtual_host`), the
    /// login, the name (also the service stamped in `x-acemq-origin`), the timeouts, heartbeat,
    /// reconnect backoff, limits, the codec `format` names, and TLS. The rest of
    /// [`ConnectionOptions`] (observer, interceptors) is the caller's to add.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for settings that do not go together (checked when loaded,
    /// checked again here for fields changed since), and every check
    /// [`Connection::open_with`](crate::Connection::open_with) makes before it dials: the
    /// URLs, and the TLS files read and checked (an unreadable one is [`Error::Io`] naming it).
    pub fn connection_options(&self) -> Result<ConnectionOptions> {
        self.check()?;
        let mut o = ConnectionOptions::new()
            .connect_timeout(self.connection_timeout)
            .heartbeat(self.heartbeat)
            .channel_max(self.channel_max)
            .frame_max(self.frame_max)
            .backoff_min(self.backoff_min)
            .backoff_max(self.backoff_max)
            .operation_timeout(self.operation_timeout)
            .max_unconfirmed_bytes(self.max_unconfirmed_bytes);
        for url in self.addresses() {
            o = o.address(url);
        }
        if let (Some(user), Some(password)) = (&self.username, &self.password) {
            o = o.credentials(Credentials::new(user, password.expose()));
        }
        if let Some(name) = &self.client_name {
            o = o.name(name).service(name);
        }
        o = o.codec(self.codec()?);
        #[cfg(feature = "tls")]
        {
            let tls = &self.tls;
            if let Some(ca) = &tls.certificate_authority {
                o = o.tls_root_certificate_file(ca.clone());
            }
            if let (Some(cert), Some(key)) = (&tls.client_certificate, &tls.client_key) {
                o = o.tls_client_certificate_files(cert.clone(), key.clone());
            }
            if let Some(name) = &tls.server_name {
                o = o.tls_server_name(name);
            }
            if tls.trust_system_roots {
                o = o.tls_trust_system_roots(true);
            }
            if tls.allow_development_certificates {
                o = o.allow_development_certificates(true);
            }
        }
        o.validate()?;
        Ok(o)
    }

    /// The codec `format` names (`ACEMQ_FORMAT`), made by
    /// [`codecs::by_name`](crate::codecs::by_name): what
    /// [`connection_options`](Self::connection_options) sets as the connection's default codec,
    /// for publishers and consumers that set none.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming the setting, for a name this build has no codec for
    /// (checked when loaded, checked again here for a field changed since).
    pub fn codec(&self) -> Result<Arc<dyn Codec>> {
        let name = format_name(&both("format"), &self.format)?;
        crate::codecs::by_name(&name)
    }

    /// A publisher's options: the window (`max_outstanding_publishes`), the timeout
    /// (`confirm_timeout`) and whether it waits for confirms (`publisher_confirms`; `false`:
    /// at most once, [`PublisherOptions::confirms`]).
    pub fn publisher_options(&self) -> PublisherOptions {
        PublisherOptions::new()
            .window(self.max_outstanding_publishes)
            .timeout(self.confirm_timeout)
            .confirms(self.publisher_confirms)
    }

    /// The retry policy `consumer.retry` describes, or `None` when it is not enabled (a
    /// consumer then uses [`RetryPolicy::none`]: the first failure is dead-lettered).
    pub fn retry_policy(&self) -> Option<RetryPolicy> {
        let r = &self.consumer.retry;
        if !r.enabled {
            return None;
        }
        let mut policy = match r.kind {
            RetryKind::Exponential => {
                let p = RetryPolicy::none()
                    .max_attempts(r.max_attempts)
                    .initial_delay(r.initial_delay)
                    .multiplier(r.multiplier.unwrap_or(2.0))
                    .jitter(r.jitter.unwrap_or(0.2));
                if r.max_delay.is_zero() {
                    p
                } else {
                    p.max_delay(r.max_delay)
                }
            }
            RetryKind::Fixed => {
                RetryPolicy::fixed(r.max_attempts, r.initial_delay).jitter(r.jitter.unwrap_or(0.0))
            }
        };
        if let Some(age) = r.give_up_after {
            policy = policy.max_message_age(age);
        }
        Some(
            policy
                .broker_wait_threshold(r.broker_wait_threshold)
                .quorum_rungs(r.quorum_rungs),
        )
    }

    /// A consumer's options: prefetch, concurrency, shutdown timeout, whether it declares its
    /// failure topology, and the [`retry_policy`](Self::retry_policy).
    pub fn consumer_options(&self) -> ConsumerOptions {
        let c = &self.consumer;
        ConsumerOptions::new()
            .prefetch(c.prefetch)
            .concurrency(c.concurrency)
            .shutdown_timeout(c.shutdown_timeout)
            .declare(c.declare)
            .retry(self.retry_policy().unwrap_or_default())
    }

    /// How long a service drains on shutdown — stops taking messages, lets running handlers
    /// finish — before it closes anyway: `ACEMQ_CONSUMER__SHUTDOWN_TIMEOUT`, 20 s by default
    /// as in the Python, Go, .NET and Ruby libraries. Keep it shorter than the time the
    /// platform gives a stopping process (Kubernetes' `terminationGracePeriodSeconds`, 30 s).
    pub fn drain_timeout(&self) -> Duration {
        self.consumer.shutdown_timeout
    }

    /// The actuator's options: `actuator.address` to bind and `actuator.prefix` (feature
    /// `actuator`). Its service name is the connection's (`client_name`).
    #[cfg(feature = "actuator")]
    #[cfg_attr(docsrs, doc(cfg(feature = "actuator")))]
    pub fn actuator_options(&self) -> crate::actuator::ActuatorOptions {
        let o = crate::actuator::ActuatorOptions::new().bind(&self.actuator.address);
        if self.actuator.prefix.is_empty() {
            o
        } else {
            o.prefix(&self.actuator.prefix)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connection::Address;

    #[test]
    fn a_vhost_replaces_the_path_encoded_whole() {
        assert_eq!(
            with_vhost("amqp://u:p@h:5672/old", "/"),
            "amqp://u:p@h:5672/%2F"
        );
        assert_eq!(
            with_vhost("amqps://h", "tenant/a b"),
            "amqps://h/tenant%2Fa%20b"
        );
        let a = Address::parse(&with_vhost("amqp://h/", "tenant/a")).unwrap();
        assert_eq!(a.vhost, "tenant/a");
    }
}
