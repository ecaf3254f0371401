//! How a pattern takes part in a delivery's life ([`DeliveryHook`]): the engine's one door for
//! what a pattern built on a consumer needs of it, so that no pattern's code lives in the engine.
//!
//! A pattern that runs its handler on a [`Consumer`](crate::Consumer) and must do more than
//! handle — keep a position, answer on the request's own channel, name its threads — gives the
//! consumer a hook ([`ConsumerOptions::hook`](super::ConsumerOptions::hook), crate-private: one
//! per consumer), and the engine calls it at fixed points of each delivery's way:
//!
//! | point | thread | what the hook may do |
//! |---|---|---|
//! | [`label`](DeliveryHook::label) | when the consumer is made | name its threads and log lines |
//! | [`on_subscribe`](DeliveryHook::on_subscribe) | owner, before each `basic.consume` (the first and every one after a reconnect) | change the consumer arguments (where a stream reader starts) |
//! | [`before_handler`](DeliveryHook::before_handler) | worker, before the handler (at least once only) | note the delivery as started |
//! | [`after_handler`](DeliveryHook::after_handler) | worker, once per handler run, whatever became of it | hand back a [`BeforeAck`]: published on the delivery's channel just before its ack |
//! | [`done`](DeliveryHook::done) | worker, once the verdict's copy (if any) is confirmed | note the delivery as finished |
//! | [`returned`](DeliveryHook::returned) | owner, with [`listens_for_returns`](DeliveryHook::listens_for_returns) | hear what the broker returned of what a [`BeforeAck`] published |
//!
//! Every method has a default that does nothing, so a hook implements only its points.
//!
//! **Why a `BeforeAck` and not a publisher.** Something published on the delivery's own channel
//! *before* its acknowledgement has been routed by the time the broker takes the ack (RabbitMQ
//! handles one channel's frames in order), and if the connection drops in between neither took
//! effect and the delivery comes again: for a message to a transient queue that is all a
//! confirm would say, at about half the thread wake-ups (the request/reply pattern's
//! `reply.rs` has the measurements). The engine keeps invariant 1 this way: the owner runs the
//! `BeforeAck` and only then acknowledges, and a `BeforeAck` that fails fails the ack with it.
//! Anything else a pattern publishes goes through a [`Publisher`](crate::Publisher), confirmed,
//! before its handler returns.

use std::collections::BTreeMap;

use crate::envelope::{HeaderValue, Message};
use crate::observe::Observer;

/// A pattern's part in the life of each delivery of one consumer (see the [module docs](self)).
/// Called from the consumer's threads: keep each call short and never block on the consumer.
pub(crate) trait DeliveryHook: Send + Sync + std::fmt::Debug {
    /// A suffix for this consumer's thread names (`acemq-consumer-{label}`) and a tag in its log
    /// lines (a consumer group's member number, a stream reader's name).
    fn label(&self) -> Option<String> {
        None
    }

    /// Before each `basic.consume`: the consumer arguments (the options' own, as given) to
    /// change, e.g. a stream reader subscribing again where it was.
    fn on_subscribe(&self, _arguments: &mut BTreeMap<String, HeaderValue>) {}

    /// On the worker, just before the handler runs on `message` (not at most once, whose
    /// delivery is acknowledged before).
    fn before_handler(&self, _message: &Message) {}

    /// On the thread that ran the handler, right after it, once per run whatever became of it:
    /// `accepted` when the delivery is to be acknowledged, false when it is retried,
    /// dead-lettered, lost or given back. What it returns runs on the owner thread, on the
    /// delivery's channel, just before its acknowledgement (only when `accepted`; otherwise it
    /// is dropped at once).
    fn after_handler(&self, _accepted: bool) -> Option<Box<dyn BeforeAck>> {
        None
    }

    /// On the worker, once the verdict is carried out (its copy, if any, confirmed) and before
    /// the delivery is settled: `message` is done with.
    fn done(&self, _message: &Message) {}

    /// Whether the owner listens for the broker's returns on the delivery channel (what a
    /// [`BeforeAck`] published mandatory and could not be routed): each goes to
    /// [`returned`](Self::returned).
    fn listens_for_returns(&self) -> bool {
        false
    }

    /// A message published on the delivery channel came back unroutable (already reported to
    /// the observer).
    fn returned(&self, _returned: crate::transport::Return) {}
}

/// Work a [`DeliveryHook`] hands the owner thread to do on a delivery's channel just before the
/// delivery is acknowledged. Dropped without running when the delivery is not acknowledged
/// after all (its channel went away first): its `Drop` may say so.
pub(crate) trait BeforeAck: Send {
    /// Runs it on `channel`. An error fails the delivery's channel: the delivery is not
    /// acknowledged, and the broker delivers it again.
    fn run(self: Box<Self>, channel: OnChannel<'_>) -> Result<(), crate::transport::AmqpError>;
}

/// The delivery's channel as a [`BeforeAck`] gets it: publish, unconfirmed, reported to the
/// observer.
pub(crate) struct OnChannel<'a> {
    pub(super) channel: &'a crate::transport::Channel,
    pub(super) observer: &'a dyn Observer,
}

impl OnChannel<'_> {
    /// Publishes `publish` to `exchange` on the delivery's channel, unconfirmed (reported to
    /// the observer as such).
    pub(crate) fn publish(
        &self,
        exchange: &str,
        publish: crate::transport::Publish<'_>,
    ) -> Result<(), crate::transport::AmqpError> {
        crate::publish::send_unconfirmed(self.channel, exchange, publish, self.observer)
    }
}
