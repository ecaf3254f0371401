//! One test body on both transports: RabbitMQ and the in-process `memory://` broker.
//!
//! ```ignore
//! on_both! {
//!     /// What it shows.
//!     fn a_rejected_message_is_dead_lettered(on) {
//!         let connection = on.connect();
//!         // …
//!     }
//! }
//! ```
//!
//! makes a module `a_rejected_message_is_dead_lettered` with two tests, `amqp` and `memory`,
//! running the same body with `on` a [`On`] for each. A body that passes on one and fails on
//! the other is a defect of the memory broker (or of a test leaning on a real broker's
//! specifics, which does not belong here). `tests/support/both.rs` counts for the README: every
//! `on_both!` is two tests.

use std::time::Duration;

use acemq_amqp::testing::MemoryBroker;
use acemq_amqp::{Connection, ConnectionOptions};

/// The transport a body runs on.
pub struct On {
    url: String,
    memory: Option<MemoryBroker>,
}

impl On {
    /// The tests' RabbitMQ ([`super::amqp_url`]).
    pub fn amqp() -> On {
        On {
            url: super::amqp_url(),
            memory: None,
        }
    }

    /// A memory broker of the test's own (`test` names it; the process id keeps runs apart).
    pub fn memory(test: &str) -> On {
        let broker = MemoryBroker::named(&format!("{test}-{}", std::process::id()));
        On {
            url: broker.url(),
            memory: Some(broker),
        }
    }

    /// The URL to connect to.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// True on `memory://`.
    pub fn is_memory(&self) -> bool {
        self.memory.is_some()
    }

    /// The memory broker, for its faults; `None` on RabbitMQ.
    pub fn memory_broker(&self) -> Option<&MemoryBroker> {
        self.memory.as_ref()
    }

    /// A connection, or a failed test saying why (RabbitMQ not reachable).
    pub fn connect(&self) -> Connection {
        self.connect_with(ConnectionOptions::new())
    }

    /// A connection with `options` (their address replaced by this transport's).
    pub fn connect_with(&self, options: ConnectionOptions) -> Connection {
        match Connection::open_with(options.address(self.url.clone())) {
            Ok(c) => c,
            Err(e) => panic!(
                "cannot connect to {} ({e}); RabbitMQ tests need a real broker: run \
                 `scripts/test`, which starts it",
                self.url
            ),
        }
    }

    /// The tests' clean-up on this transport.
    pub fn cleanup(&self) -> acemq_amqp::testing::Cleanup {
        acemq_amqp::testing::Cleanup::new(self.url.clone())
    }

    /// A connection, the clean-up, and a queue of the test's own named after `prefix`, declared
    /// with the library's defaults. Hold the clean-up while the queue is used.
    pub fn declared_queue(
        &self,
        prefix: &str,
    ) -> (Connection, acemq_amqp::testing::Cleanup, String) {
        self.declared_queue_with(prefix, |spec| spec)
    }

    /// [`On::declared_queue`] with the spec shaped by `spec` (`QueueSpec::classic`,
    /// [`super::full_at_one`], …).
    pub fn declared_queue_with(
        &self,
        prefix: &str,
        spec: impl FnOnce(acemq_amqp::QueueSpec) -> acemq_amqp::QueueSpec,
    ) -> (Connection, acemq_amqp::testing::Cleanup, String) {
        self.declared(prefix, false, spec)
    }

    /// [`On::declared_queue`] for a queue a consumer runs on: its `.dlq` / `.parked` cleaned
    /// up too.
    pub fn declared_consumed_queue(
        &self,
        prefix: &str,
    ) -> (Connection, acemq_amqp::testing::Cleanup, String) {
        self.declared_consumed_queue_with(prefix, |spec| spec)
    }

    /// [`On::declared_consumed_queue`] with the spec shaped by `spec`.
    pub fn declared_consumed_queue_with(
        &self,
        prefix: &str,
        spec: impl FnOnce(acemq_amqp::QueueSpec) -> acemq_amqp::QueueSpec,
    ) -> (Connection, acemq_amqp::testing::Cleanup, String) {
        self.declared(prefix, true, spec)
    }

    fn declared(
        &self,
        prefix: &str,
        consumed: bool,
        spec: impl FnOnce(acemq_amqp::QueueSpec) -> acemq_amqp::QueueSpec,
    ) -> (Connection, acemq_amqp::testing::Cleanup, String) {
        let conn = self.connect();
        let mut clean = self.cleanup();
        let name = super::unique(prefix);
        let q = if consumed {
            clean.consumed_queue(&name, &[])
        } else {
            clean.queue(&name)
        };
        conn.declare_queue(&spec(acemq_amqp::QueueSpec::new(&q)))
            .unwrap();
        (conn, clean, q)
    }

    /// Lets `by` of the broker's time pass where a TTL is waited for: the memory broker's clock
    /// moves on at once; on RabbitMQ real time must pass, so this returns at once and the
    /// caller's deadline (which must cover `by`) does the waiting.
    pub fn let_time_pass(&self, by: Duration) {
        if let Some(m) = &self.memory {
            m.advance_clock(by);
        }
    }
}

/// One body, two tests (`amqp` and `memory`) in a module named after it.
#[macro_export]
macro_rules! on_both {
    ($( $(#[$meta:meta])* fn $name:ident($on:ident) $body:block )*) => {$(
        $(#[$meta])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            fn body($on: &$crate::support::both::On) $body

            #[test]
            fn amqp() {
                body(&$crate::support::both::On::amqp());
            }

            #[test]
            fn memory() {
                body(&$crate::support::both::On::memory(concat!(
                    module_path!(),
                    "-",
                    stringify!($name)
                ).replace("::", "-").as_str()));
            }
        }
    )*};
}
