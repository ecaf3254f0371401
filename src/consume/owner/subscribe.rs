//! One subscription's beginning and end on the owner thread: waiting for a link, the channel
//! and its prefetch, `basic.consume`, what the broker returned of a hook's publishes, and the cancel that must
//! drain amiquip's receiver ([`cancel_and_drain`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::transport::{
    Channel, ConsumerMessage, ConsumerOptions as AmqpConsumerOptions, Delivery,
};
use crossbeam_channel::{Receiver, Sender};

use crate::connection::Link;
use crate::consume::report::CloseReport;
use crate::consume::threads::context::Context;
use crate::consume::threads::protocol::Job;
use crate::error::{Error, Result};
use crate::observe::PublishOutcome;

/// Hands what the broker returned so far on the delivery channel to the hook.
pub(in crate::consume) fn count_returned(
    ctx: &Context,
    returns: &crate::transport::Feed<crate::transport::Return>,
) {
    while let Ok(r) = returns.try_recv() {
        reply_returned(ctx, r);
    }
}

/// Something a hook published on the delivery channel (a responder's reply) that the broker could
/// not route.
pub(in crate::consume) fn reply_returned(ctx: &Context, r: crate::transport::Return) {
    ctx.observer
        .publish_answered(&crate::observe::PublishEvent {
            exchange: &r.exchange,
            routing_key: &r.routing_key,
            outcome: PublishOutcome::Unroutable,
            duration: None,
        });
    if let Some(hook) = &ctx.hook {
        hook.returned(r);
    }
}

/// Waits for a live link; `None` when stop was asked meanwhile. While recovering it waits on;
/// before the first subscription (`first`) any error is returned, after it only `Closed`.
pub(in crate::consume) fn wait_for_link(ctx: &Context, first: bool) -> Result<Option<Arc<Link>>> {
    loop {
        if ctx.stop_requested() {
            return Ok(None);
        }
        match ctx.connection.link(Duration::from_millis(250)) {
            Ok(link) => return Ok(Some(link)),
            Err(e @ Error::Closed { .. }) => return Err(e),
            Err(e) if first => return Err(e),
            Err(_) => {}
        }
    }
}

/// A new subscription: its generation makes workers skip and the owner drop what belongs to the
/// old channel. Jobs from the old channel still waiting for a worker are dropped now, so that
/// the hand-off has room for the redeliveries and never blocks this thread (the broker sends at
/// most `prefetch` unsettled on the new channel).
pub(in crate::consume) fn begin_generation(ctx: &Context, generation: u64, stale: &Receiver<Job>) {
    // The generation first: a worker whose delivery is not counted in flight for it
    // (`InFlight::take`) then sees that it is from before the reconnect.
    ctx.generation.store(generation, Ordering::SeqCst);
    ctx.in_flight.begin(generation);
    let dropped = stale.try_iter().count();
    if dropped > 0 {
        log::debug!(
            "acemq: dropped {dropped} jobs on {:?} from before the reconnect",
            ctx.queue
        );
    }
}

/// `basic.consume` on the queue with the consumer's options.
pub(in crate::consume) fn consume_on<'c>(
    ctx: &Context,
    channel: &'c Channel,
) -> Result<crate::transport::Consumer<'c>> {
    // A hook may change them for each subscription (a stream reader subscribing again after a
    // reconnect goes on where it was, not from the offset it first asked for).
    let arguments = match &ctx.hook {
        Some(hook) => {
            let mut arguments = ctx.arguments.clone();
            hook.on_subscribe(&mut arguments);
            crate::connection::to_table(&arguments)
        }
        None => crate::connection::to_table(&ctx.arguments),
    };
    let options = AmqpConsumerOptions {
        exclusive: ctx.exclusive,
        arguments,
        ..AmqpConsumerOptions::default()
    };
    channel
        .basic_consume(ctx.queue.clone(), options)
        .map_err(|e| consume_error(&ctx.queue, e))
}

pub(in crate::consume) fn fail(
    started: &mut Option<Sender<Result<()>>>,
    e: Error,
) -> Result<CloseReport> {
    match started.take() {
        Some(tx) => {
            let _ = tx.send(Err(e));
            Ok(CloseReport::default())
        }
        None => Err(e),
    }
}

pub(in crate::consume) fn subscribe_channel(ctx: &Context, link: &Link) -> Result<Channel> {
    let channel = link.open_channel()?;
    channel
        .qos(0, ctx.prefetch(), false)
        .map_err(|e| Error::amqp(format!("setting prefetch on {:?}", ctx.queue), e))?;
    Ok(channel)
}

pub(in crate::consume) fn consume_error(queue: &str, e: crate::transport::AmqpError) -> Error {
    Error::from_amqp_on("queue", queue, "consuming from", e)
}

/// Cancels `consumer` and reads its receiver until amiquip reports the cancel, handing any
/// delivery that was still on its way to `on_delivery`.
///
/// amiquip answers the cancel RPC first and only then sends `ClientCancelled` to the
/// consumer's receiver; if the receiver is gone by then, amiquip's I/O thread treats it as an
/// internal error and **drops the whole connection**. So an amiquip consumer must never be
/// dropped before this has run (amiquip's own `Drop` cancels without waiting).
pub(crate) fn cancel_and_drain(
    queue: &str,
    consumer: &crate::transport::Consumer<'_>,
    mut on_delivery: impl FnMut(Delivery),
) {
    if let Err(e) = consumer.cancel() {
        // The channel or connection is gone: nothing more will be sent to the receiver.
        log::debug!("acemq: cancelling the consumer of {queue:?}: {e}");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Ok(ConsumerMessage::Delivery(d)) = consumer.receiver().recv_deadline(deadline) {
        on_delivery(d);
    }
}
