//! [`ReplayOptions`]: what a replay pass reads, moves and where it sends it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::envelope::{Envelope, Message};
use crate::observe::Observer;

pub(super) type Filter<'a> = Box<dyn FnMut(&Message) -> bool + 'a>;

/// How a [`Replay`](super::Replay) pass runs: given to [`replay`](super::replay). Checked when
/// the pass [runs](super::Replay::run).
///
/// The filter may borrow (hence the lifetime): `ReplayOptions::default().only(|e, _| …)`.
#[must_use]
pub struct ReplayOptions<'a> {
    pub(super) limit: Option<u64>,
    pub(super) deadline: Option<Duration>,
    pub(super) filter: Option<Filter<'a>>,
    pub(super) routing_key: Option<String>,
    pub(super) exchange: Option<String>,
    pub(super) restart: bool,
    pub(super) window: usize,
    pub(super) progress_every: u64,
    pub(super) dry_run: bool,
    pub(super) observer: Option<Arc<dyn Observer>>,
}

impl Default for ReplayOptions<'_> {
    fn default() -> Self {
        ReplayOptions {
            limit: None,
            deadline: None,
            filter: None,
            routing_key: None,
            exchange: None,
            restart: true,
            window: 10_000,
            progress_every: 100,
            dry_run: false,
            observer: None,
        }
    }
}

impl ReplayOptions<'_> {
    /// Every check of these options, in one place (run by `Replay::run` before anything is
    /// read).
    pub(super) fn validate(&self) -> crate::Result<()> {
        if let Some(e) = &self.exchange {
            crate::envelope::check_name("exchange", e, true)?;
        }
        if let Some(k) = &self.routing_key {
            crate::envelope::check_name("routing key", k, true)?;
        }
        if self.window == 0 {
            return Err(crate::Error::invalid(
                "a replay window (ReplayOptions::window) must be at least 1, got 0",
            ));
        }
        Ok(())
    }
}

impl fmt::Debug for ReplayOptions<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplayOptions")
            .field("limit", &self.limit)
            .field("deadline", &self.deadline)
            .field("filtered", &self.filter.is_some())
            .field("routing_key", &self.routing_key)
            .field("exchange", &self.exchange)
            .field("restart", &self.restart)
            .field("window", &self.window)
            .field("dry_run", &self.dry_run)
            .finish()
    }
}

impl<'a> ReplayOptions<'a> {
    /// The defaults (as [`Default`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// Stops after this many messages matched (moved, or in a dry run would move). Defaults to
    /// no limit.
    pub fn limit(mut self, n: u64) -> Self {
        self.limit = Some(n);
        self
    }

    /// Stops once this long has passed since [`run`](super::Replay::run) began (checked between
    /// messages). Defaults to none.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Moves only the messages for which `filter(envelope, body)` is true; the others stay on the
    /// source queue in their order. Defaults to every message.
    pub fn only(mut self, mut filter: impl FnMut(&Envelope, &[u8]) -> bool + 'a) -> Self {
        self.filter = Some(Box::new(move |m: &Message| filter(&m.envelope, &m.body)));
        self
    }

    /// As [`only`](Self::only), with the whole received message (application headers, routing
    /// key, …) to decide on. Defaults to every message.
    pub fn only_message(mut self, filter: impl FnMut(&Message) -> bool + 'a) -> Self {
        self.filter = Some(Box::new(filter));
        self
    }

    /// Publishes every message with this routing key. Defaults to each message's own original
    /// routing key (see the [module docs](super)).
    pub fn routing_key(mut self, routing_key: impl Into<String>) -> Self {
        self.routing_key = Some(routing_key.into());
        self
    }

    /// Publishes every message to this exchange (`""` for the default exchange). Defaults to the
    /// exchange each was first published to, else the default exchange to its original queue.
    pub fn exchange(mut self, exchange: impl Into<String>) -> Self {
        self.exchange = Some(exchange.into());
        self
    }

    /// True: attempt back to 1 and the error cleared; false: both kept. Defaults to true.
    pub fn restart(mut self, restart: bool) -> Self {
        self.restart = restart;
        self
    }

    /// The most messages held unacknowledged in one pass (declined ones, or every one read in a
    /// dry run); reaching it stops the pass with [`Stopped::Window`](super::Stopped::Window).
    /// At least 1. Defaults to 10 000.
    pub fn window(mut self, window: usize) -> Self {
        self.window = window;
        self
    }

    /// Reports progress to the observer every `n` messages read (and once at the end). 0 reports
    /// only the end. Defaults to 100.
    pub fn progress_every(mut self, n: u64) -> Self {
        self.progress_every = n;
        self
    }

    /// True: read and filter, move nothing; every message read goes back at the end. Defaults to
    /// false.
    pub fn dry_run(mut self, dry_run: bool) -> Self {
        self.dry_run = dry_run;
        self
    }

    /// Where progress goes. Defaults to the connection's observer.
    pub fn observer(mut self, observer: impl Observer) -> Self {
        self.observer = Some(crate::observe::Guarded::wrap(observer));
        self
    }
}
