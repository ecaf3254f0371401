//! Dead-letter replay: move messages from a queue (usually a `{queue}.dlq`) back to where they
//! were going, once whatever killed them is fixed.
//!
//! ```no_run
//! use std::time::Duration;
//! use acemq_amqp::{dead_letter_queue, Connection};
//! use acemq_amqp::patterns::replay::{replay, ReplayOptions};
//!
//! # fn main() -> acemq_amqp::Result<()> {
//! let connection = Connection::open("amqp://guest:guest@127.0.0.1:5672/")?;
//! let options = ReplayOptions::default()
//!     .only(|envelope, _body| envelope.error.as_deref().unwrap_or("").contains("timeout"))
//!     .limit(500)
//!     .deadline(Duration::from_secs(60));
//! let report = replay(&connection, &dead_letter_queue("orders"), options).run()?;
//! println!("{report}"); // moved 137, skipped 363 (drained)
//! # Ok(()) }
//! ```
//!
//! # What is promised
//!
//! * **Nothing is lost.** Each message is republished **mandatory, with a publisher confirm**,
//!   and only then is the original acknowledged. A crash (or a `SIGKILL`) in between leaves the
//!   original on the source queue as well as the copy at its destination: a duplicate, never a
//!   loss. A copy that reaches no queue (the destination was deleted, nothing is bound) or is
//!   refused is a failure: its original stays on the source queue, the pass stops, and
//!   [`Replay::run`] returns [`Error::Replay`] carrying the report so far.
//! * **Stamps** (the family's names, unprefixed application headers so every library's handler
//!   sees them): `acemq-replayed-from` = the source queue, `acemq-replayed-at` = the instant as
//!   RFC 3339 in UTC with whole seconds (`2026-11-30T14:12:36Z`, as the Go library writes it;
//!   every library reads it), `acemq-replay-count` = the previous count (read forgivingly: any
//!   integer width or decimal text; missing → 0) plus one. The id, correlation, causation, type,
//!   first-seen time, body, content type and every other header stay as they were (a header
//!   another client wrote that cannot be sent back, such as a non-finite float, is dropped
//!   rather than leaving the message stuck).
//! * **Restart** (default on): attempt back to 1 and `x-acemq-error` cleared, so a message that
//!   died on its last attempt gets a full set of attempts again. [`restart(false)`](ReplayOptions::restart) keeps both.
//! * **Where a message goes.** Exchange: [`ReplayOptions::exchange`], else the exchange the message
//!   was first published to when that is known and not the default exchange, else the default
//!   exchange to the queue it was dead-lettered from. Routing key: [`ReplayOptions::routing_key`], else
//!   its own original routing key (to the original queue when it goes through the default
//!   exchange). What is known is read from `acemq-original-exchange`,
//!   `acemq-original-routing-key` and `acemq-original-queue` (which this crate's consumer writes
//!   on its retry, dead-letter and parked copies when they are not there yet), else from the
//!   broker's own dead-lettering headers (`x-first-death-exchange`, `x-first-death-queue`, the
//!   routing keys in `x-death`), else from the source queue's name (`orders.dlq` and
//!   `orders.parked` came from `orders`). A message whose destination cannot be worked out, or
//!   that would go back to the source queue itself, stops the pass with [`Error::Replay`]
//!   (nothing is lost; set [`ReplayOptions::exchange`] / [`ReplayOptions::routing_key`]).
//!
//! # How a pass reads: `basic.get` and a window
//!
//! A pass reads the source queue with `basic.get` on a channel of its own, one message at a
//! time (a read costs one round trip, a move one publisher confirm; moves are not pipelined). `basic.get` tells "empty" apart from "nothing yet", so a pass ends exactly
//! when there is nothing left to offer: [`Stopped::Drained`]. Messages the filter declines are
//! **held unacknowledged until the pass ends, then returned all at once** (one `basic.nack`,
//! `multiple`, requeue), so they stay on the source queue in their original order; returning
//! one at once would put it back at the head and the pass would read it for ever. A held
//! message costs the broker, not this process (nothing of it is kept here), but the number held
//! is bounded by [`ReplayOptions::window`] (default 10 000): a pass that has declined that many stops
//! with [`Stopped::Window`]. A crash returns held messages too: the broker requeues what an
//! ended channel held.
//!
//! A pass also stops after [`ReplayOptions::limit`] messages matched ([`Stopped::Limit`]) or once
//! [`ReplayOptions::deadline`] has passed ([`Stopped::Deadline`]); both are checked between messages
//! (a move in progress finishes, bounded by the publisher's timeout). Against a queue that is
//! still being written to, a pass without a limit or deadline may not end: prefer one.
//!
//! # For a tool
//!
//! [`ReplayOptions::dry_run`] reads and filters without moving anything (every message read is held
//! and returned at the end, so the window bounds a dry run's reads): [`ReplayReport::matched`]
//! says how many would move. Progress goes to the connection's [`Observer`](crate::observe::Observer) (or
//! [`ReplayOptions::observer`]) every [`ReplayOptions::progress_every`] messages read and once at the end,
//! for a progress bar. The report's `Display` is one line: `moved 137, skipped 363 (drained)`.

use std::fmt;
use std::time::{Duration, Instant};

use crate::connection::Connection;
use crate::envelope::check_name;
use crate::error::{Error, Result};
use crate::observe::ReplayEvent;

mod copy;
mod options;
mod pass;

pub use crate::observe::replay_report::{ReplayReport, Stopped};
pub(crate) use copy::rfc3339_now;
pub use options::ReplayOptions;

/// A replay pass ready to run: see [`replay`] and the [module docs](self).
#[must_use = "a replay does nothing until run() is called"]
pub struct Replay<'a> {
    connection: &'a Connection,
    source: String,
    options: ReplayOptions<'a>,
}

impl fmt::Debug for Replay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Replay")
            .field("source", &self.source)
            .field("options", &self.options)
            .finish()
    }
}

/// A replay of `source_queue` (usually [`dead_letter_queue`](crate::dead_letter_queue)`(queue)`)
/// on `connection` as `options` say; [`Replay::run`] it.
pub fn replay<'a>(
    connection: &'a Connection,
    source_queue: &str,
    options: ReplayOptions<'a>,
) -> Replay<'a> {
    Replay {
        connection,
        source: source_queue.to_string(),
        options,
    }
}

impl Replay<'_> {
    /// Runs one pass (on the calling thread) and reports what it did.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] / [`Error::InvalidArgument`] for a bad queue, exchange, routing
    /// key or window, before anything is read. Once the pass has begun, every failure —
    /// the source queue missing ([`Error::NotFound`] inside), a copy unroutable, nacked or
    /// unconfirmed, a destination that cannot be worked out, the connection lost — is
    /// [`Error::Replay`] with the report so far (its `stopped` is [`Stopped::Failed`]) and the
    /// cause; the message being moved and every held one are back on the source queue.
    pub fn run(mut self) -> Result<ReplayReport> {
        check_name("queue", &self.source, false)?;
        self.options.validate()?;
        let observer = self
            .options
            .observer
            .take()
            .unwrap_or_else(|| self.connection.observer().clone());
        let started = Instant::now();
        let mut report = ReplayReport {
            queue: self.source.clone(),
            moved: 0,
            skipped: 0,
            matched: 0,
            dry_run: self.options.dry_run,
            stopped: Stopped::Drained,
            elapsed: Duration::ZERO,
        };
        let mut pass = pass::Pass {
            connection: self.connection,
            source: &self.source,
            options: &mut self.options,
            report: &mut report,
            observer: &observer,
            started,
            read: 0,
        };
        let result = pass.run();
        report.elapsed = started.elapsed();
        match result {
            Ok(stopped) => {
                report.stopped = stopped;
                observer.replay(&ReplayEvent {
                    report: &report,
                    finished: true,
                });
                log::info!("acemq: replay of {:?}: {report}", report.queue);
                Ok(report)
            }
            Err(source) => {
                report.stopped = Stopped::Failed;
                observer.replay(&ReplayEvent {
                    report: &report,
                    finished: true,
                });
                log::error!(
                    "acemq: replay of {:?} stopped after {report}: {source}",
                    report.queue
                );
                Err(Error::Replay {
                    report: Box::new(report),
                    source: Box::new(source),
                })
            }
        }
    }
}
