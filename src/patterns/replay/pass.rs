//! One replay pass under way: read with `basic.get`, filter, move or hold, return the held.

use std::sync::Arc;
use std::time::Instant;

use super::copy::{destination, replayed_copy};
use super::options::ReplayOptions;
use crate::connection::Connection;
use crate::consume::replace_counted;
use crate::envelope::Message;
use crate::error::{Error, Result};
use crate::observe::replay_report::{ReplayReport, Stopped};
use crate::observe::{Observer, ReplayEvent};

/// What a pass holds unacknowledged until its end: how many, and those the broker counted a
/// return of, with their messages (at most the window).
#[derive(Default)]
pub(super) struct Held {
    count: usize,
    counted: Vec<(crate::transport::Delivery, Message)>,
}

impl Held {
    fn hold(&mut self, delivery: crate::transport::Delivery, message: &Message) {
        self.count += 1;
        if message.returns_counted() > 0 {
            self.counted.push((delivery, message.clone()));
        }
    }
}

/// One pass under way.
pub(super) struct Pass<'p, 'a> {
    pub(super) connection: &'p Connection,
    pub(super) source: &'p str,
    pub(super) options: &'p mut ReplayOptions<'a>,
    pub(super) report: &'p mut ReplayReport,
    pub(super) observer: &'p Arc<dyn Observer>,
    pub(super) started: Instant,
    pub(super) read: u64,
}

impl Pass<'_, '_> {
    pub(super) fn run(&mut self) -> Result<Stopped> {
        let source = self.source.to_string();
        let (channel, _link) = self.connection.open_channel()?;
        // Fail with NotFound rather than a closed channel when the queue is not there.
        channel
            .queue_declare_passive(source.as_str())
            .map_err(|e| Error::from_amqp_on("queue", &source, "checking", e))?;
        let publisher = if self.options.dry_run {
            None
        } else {
            Some(self.connection.publisher()?)
        };
        let mut held = Held::default();
        let result = self.read_loop(&channel, publisher.as_ref(), &mut held);
        // Held messages the broker counted a return of go back as fresh copies (not counted
        // again: RabbitMQ 4.x drops a quorum queue's message past its delivery limit), the rest
        // with the one nack below.
        if result.is_ok() {
            if let Err(e) = replace_counted(self.connection, &channel, &source, held.counted) {
                log::warn!("acemq: replay of {source:?}: {e}");
            }
        }
        let held = held.count;
        // Return what is held (declined, dry-run reads, the message whose move failed) all at
        // once, in order: nack `multiple` with tag 0 covers every unacknowledged delivery.
        let returned = channel.nack_all(true);
        if let Err(e) = &returned {
            log::warn!(
                "acemq: could not return {held} held message(s) to {source:?} ({e}); the broker \
                 returns them as the channel closes"
            );
        }
        let _ = channel.close();
        if let Some(p) = publisher {
            let _ = p.close();
        }
        result
    }

    fn read_loop(
        &mut self,
        channel: &crate::transport::Channel,
        publisher: Option<&crate::Publisher>,
        held: &mut Held,
    ) -> Result<Stopped> {
        let source = self.source.to_string();
        loop {
            if self.options.limit.is_some_and(|l| self.report.matched >= l) {
                return Ok(Stopped::Limit);
            }
            if self
                .options
                .deadline
                .is_some_and(|d| self.started.elapsed() >= d)
            {
                return Ok(Stopped::Deadline);
            }
            if held.count >= self.options.window {
                return Ok(Stopped::Window);
            }
            let got = channel
                .basic_get(source.as_str(), false)
                .map_err(|e| Error::from_amqp_on("queue", &source, "reading from", e))?;
            let Some(got) = got else {
                return Ok(Stopped::Drained);
            };
            let mut delivery = got.delivery;
            let message = delivery.take_message();
            self.read += 1;
            let wanted = match self.options.filter.as_mut() {
                Some(filter) => filter(&message),
                None => true,
            };
            if !wanted {
                self.report.skipped += 1;
                held.hold(delivery, &message);
            } else {
                self.report.matched += 1;
                match publisher {
                    None => held.hold(delivery, &message),
                    Some(publisher) => {
                        // On failure the delivery stays unacknowledged: returned with the held.
                        self.move_one(publisher, message)?;
                        delivery.ack(channel).map_err(|e| {
                            Error::amqp(
                                format!(
                                    "acknowledging a replayed message on {source:?} (its copy \
                                     is out: it will be replayed again)"
                                ),
                                e,
                            )
                        })?;
                        self.report.moved += 1;
                    }
                }
            }
            let every = self.options.progress_every;
            if every > 0 && self.read.is_multiple_of(every) {
                self.report.elapsed = self.started.elapsed();
                self.observer.replay(&ReplayEvent {
                    report: self.report,
                    finished: false,
                });
            }
        }
    }

    /// Publishes the stamped copy, mandatory and confirmed.
    fn move_one(&self, publisher: &crate::Publisher, message: Message) -> Result<()> {
        let (exchange, routing_key) = destination(
            &message,
            self.source,
            self.options.exchange.as_deref(),
            self.options.routing_key.as_deref(),
        )?;
        let mut copy = replayed_copy(message, self.source, self.options.restart);
        if copy.validate().is_err() {
            // A header another client sent that cannot go back on the wire: drop it rather than
            // leave the message stuck on the queue for ever.
            copy.drop_invalid_headers();
        }
        publisher.publish(&exchange, &routing_key, copy)
    }
}
