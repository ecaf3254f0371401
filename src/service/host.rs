//! [`Service`]: the parts of a service, configured, started together on the host's
//! connections ([`Connections`]).

use super::options::{Connections, Factory, ServiceOptions};
use super::part::ServicePart;
use super::running::RunningService;
use super::ServiceReport;
use crate::consume::{ConsumerOptions, Handler};
use crate::error::{BoxError, Result};
use crate::patterns::outbox::{OutboxRelay, OutboxRelayOptions, OutboxStore};
use crate::patterns::request_reply::{Responder, ResponderOptions};
use crate::patterns::scheduler::{Scheduler, SchedulerOptions};
use crate::Message;

/// A service: its consumers, responders, relays, scheduler and parts of its own, started
/// together by [`start`](Self::start) or [`run`](Self::run) (which also waits for the stop and
/// drains). See the [module docs](super).
pub struct Service {
    pub(super) options: ServiceOptions,
    pub(super) parts: Vec<(String, Factory)>,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<&str> = self.parts.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("Service")
            .field("options", &self.options)
            .field("parts", &parts)
            .finish()
    }
}

impl Service {
    /// A service with these options and no parts yet.
    pub fn new(options: ServiceOptions) -> Service {
        Service {
            options,
            parts: Vec::new(),
        }
    }

    /// A consumer of `queue` on the consuming connection, named `consumer:{queue}`.
    pub fn consumer<H>(self, queue: &str, options: ConsumerOptions, handler: H) -> Service
    where
        H: Handler + Send + Sync + 'static,
    {
        let q = queue.to_string();
        self.part(format!("consumer:{queue}"), move |c: &Connections| {
            let running = c.consuming.consumer(&q, options)?.start(handler)?;
            Ok(Box::new(running) as Box<dyn ServicePart>)
        })
    }

    /// A responder to the requests on `queue` on the consuming connection, named
    /// `responder:{queue}` ([`Responder::start`] says what `handler` returns).
    pub fn responder<F, R, E>(self, queue: &str, options: ResponderOptions, handler: F) -> Service
    where
        F: Fn(&Message) -> std::result::Result<R, E> + Send + Sync + 'static,
        R: Into<Message>,
        E: Into<BoxError>,
    {
        let q = queue.to_string();
        self.part(format!("responder:{queue}"), move |c: &Connections| {
            let running = Responder::new(&c.consuming, &q, options)?.start(handler)?;
            Ok(Box::new(running) as Box<dyn ServicePart>)
        })
    }

    /// An outbox relay of `store` on the publishing connection, named `relay`; while the
    /// service drains it stops after the consumers, with a last sweep.
    pub fn relay(self, store: impl OutboxStore + 'static, options: OutboxRelayOptions) -> Service {
        self.part("relay", move |c: &Connections| {
            let running = OutboxRelay::new(&c.publishing, store, options)?.start()?;
            Ok(Box::new(running) as Box<dyn ServicePart>)
        })
    }

    /// The guarded retention sweeper, named `retention`: every `interval`, the receipts of
    /// `receipts` (and with the options' `retired_outbox`, `outbox`'s retired records) past the
    /// retention are deleted — never one younger than the oldest message still waiting on the
    /// broker ([`patterns::retention`](crate::patterns::retention)).
    #[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
    pub fn retention(
        self,
        receipts: crate::patterns::idempotency::SqlIdempotencyStore,
        outbox: Option<crate::patterns::outbox::SqlOutboxStore>,
        options: crate::patterns::retention::RetentionOptions,
        interval: std::time::Duration,
    ) -> Service {
        self.part("retention", move |c: &Connections| {
            let sweeper = crate::patterns::retention::Sweeper::new(
                &c.consuming,
                receipts,
                outbox,
                options,
                interval,
            )?;
            Ok(Box::new(sweeper.start()?) as Box<dyn ServicePart>)
        })
    }

    /// The scheduler on the consuming connection, named `scheduler`.
    pub fn scheduler(self, options: SchedulerOptions) -> Service {
        self.part("scheduler", move |c: &Connections| {
            let running = Scheduler::new(&c.consuming, options)?.start()?;
            Ok(Box::new(running) as Box<dyn ServicePart>)
        })
    }

    /// A part of the application's own, started by `start` on the service's connections. A
    /// name used already gets `#2`, `#3`, … after it.
    pub fn part<F>(mut self, name: impl Into<String>, start: F) -> Service
    where
        F: FnOnce(&Connections) -> Result<Box<dyn ServicePart>> + Send + 'static,
    {
        let base = name.into();
        let taken = |n: &str| self.parts.iter().any(|(p, _)| p == n);
        let mut name = base.clone();
        let mut i = 1;
        while taken(&name) {
            i += 1;
            name = format!("{base}#{i}");
        }
        self.parts.push((name, Box::new(start)));
        self
    }

    /// Opens the connections, starts every part in the order added, then the actuator, and
    /// returns the running service (it stops on a signal only while someone
    /// [`wait`](RunningService::wait)s).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for bad options; the first connection or part that could
    /// not start (the parts started before it are stopped and the connections closed).
    pub fn start(self) -> Result<RunningService> {
        self.options.validate()?;
        RunningService::start(self.options, self.parts)
    }

    /// Starts the service, blocks until it is asked to stop — SIGTERM or SIGINT, a
    /// [`StopHandle`](crate::StopHandle) from [`RunningService::stop_handle`] (not reachable
    /// here: use [`start`](Self::start) and [`RunningService::wait`] for that), or a part
    /// failing for good — then drains, and returns what the run did: a `main` ends with
    /// `std::process::exit(report.exit_code())`.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start); once started, failures are in the report.
    pub fn run(self) -> Result<ServiceReport> {
        Ok(self.start()?.wait())
    }
}
