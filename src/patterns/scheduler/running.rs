//! [`Scheduler`] (configured) and [`RunningScheduler`] (its control consumer running): the
//! life cycle and the calls that schedule.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use time::OffsetDateTime;

use super::control::{strip_scheduler_headers, Inner, Scheduled};
use super::options::SchedulerOptions;
use crate::connection::Connection;
use crate::consume::{CloseReport, RunningConsumer};
use crate::envelope::{check_name, headers, HeaderValue, Message};
use crate::error::Result;
use crate::stop::StopHandle;

/// Delivers messages later, by hops down a TTL ladder (see the [module docs](super)):
/// configured and checked here, [started](Self::start) as a [`RunningScheduler`].
///
/// ```no_run
/// use acemq_amqp::patterns::scheduler::{Scheduler, SchedulerOptions};
/// use acemq_amqp::{Connection, Message};
/// use std::time::Duration;
/// # fn main() -> acemq_amqp::Result<()> {
/// let connection = Connection::open("amqp://guest:guest@127.0.0.1:5672/")?;
/// let scheduler = Scheduler::new(&connection, SchedulerOptions::default())?.start()?;
/// let invoice = Message::encode(connection.codec().as_ref(), &serde_json::json!({"n": 7}))?;
/// scheduler.after(Duration::from_secs(4 * 3600), "billing", "invoice.due", invoice)?;
/// scheduler.close()?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Scheduler {
    connection: Connection,
    options: SchedulerOptions,
}

impl Scheduler {
    /// A scheduler on `connection` as `options` say; nothing is declared or started yet.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) /
    /// [`Error::InvalidName`](crate::Error::InvalidName)(crate::Error::InvalidName) for bad options.
    pub fn new(connection: &Connection, options: SchedulerOptions) -> Result<Scheduler> {
        options.validate()?;
        Ok(Scheduler {
            connection: connection.clone(),
            options,
        })
    }

    /// Declares the topology of its options and starts the control consumer (on threads of its
    /// own).
    ///
    /// # Errors
    ///
    /// [`Error::TopologyConflict`](crate::Error::TopologyConflict) when a queue of the
    /// scheduler's exists with other arguments (the connection stays usable); the connection's
    /// errors.
    pub fn start(self) -> Result<RunningScheduler> {
        let Scheduler {
            connection,
            options,
        } = self;
        options.topology().apply(&connection)?;
        let publisher = connection.publisher()?;
        let control = options.control_queue();
        let consumer_options = options.consumer.clone().declare(false);
        let inner = Arc::new(Inner {
            options,
            publisher,
            connection: connection.clone(),
            scheduled: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
            hops: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
        });
        let handler_inner = inner.clone();
        let consumer = connection
            .consumer(&control, consumer_options)?
            .start(move |m: &Message| handler_inner.on_control(m))?;
        Ok(RunningScheduler {
            inner,
            consumer: Some(consumer),
        })
    }
}

/// A started [`Scheduler`]: schedule messages on it, then [`close`](Self::close) it.
#[derive(Debug)]
pub struct RunningScheduler {
    inner: Arc<Inner>,
    consumer: Option<RunningConsumer>,
}

impl RunningScheduler {
    /// Delivers `message` to `exchange` with `routing_key` after `delay` (now when it is under
    /// the smallest rung). Its body and content type are kept; its envelope is not (the
    /// delivery gets a fresh one of type `ScheduledMessage` with the same id).
    ///
    /// # Errors
    ///
    /// As [`at`](Self::at).
    pub fn after(
        &self,
        delay: Duration,
        exchange: &str,
        routing_key: &str,
        message: Message,
    ) -> Result<()> {
        let delay_ms = i64::try_from(delay.as_millis()).unwrap_or(i64::MAX);
        self.schedule(
            self.inner.connection.now_ms().saturating_add(delay_ms),
            exchange,
            routing_key,
            message,
        )
    }

    /// Delivers `message` at `moment` (an instant with its offset: a naive time cannot be
    /// given); a moment in the past delivers now.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`](crate::Error::InvalidName) for an empty routing key or names over 255 bytes;
    /// [`Error::InvalidHeader`](crate::Error::InvalidHeader) for a header that cannot be sent; a publish error when the
    /// first hop (or an immediate delivery) could not be confirmed — then nothing was
    /// scheduled. A due message that no queue receives is not an error: it is kept.
    pub fn at(
        &self,
        moment: OffsetDateTime,
        exchange: &str,
        routing_key: &str,
        message: Message,
    ) -> Result<()> {
        let due_ms = i64::try_from(moment.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX);
        self.schedule(due_ms, exchange, routing_key, message)
    }

    fn schedule(
        &self,
        due_ms: i64,
        exchange: &str,
        routing_key: &str,
        message: Message,
    ) -> Result<()> {
        check_name("exchange", exchange, true)?;
        check_name("routing key", routing_key, false)?;
        message.validate()?;
        let mut headers = message.headers;
        strip_scheduler_headers(&mut headers);
        headers.insert(headers::SCHEDULE_EXCHANGE.into(), exchange.into());
        headers.insert(headers::SCHEDULE_ROUTING_KEY.into(), routing_key.into());
        headers.insert(headers::SCHEDULE_DUE_AT.into(), HeaderValue::Int(due_ms));
        if let Some(ct) = &message.content_type {
            headers.insert(headers::SCHEDULE_CONTENT_TYPE.into(), ct.clone().into());
        }
        let scheduled = Scheduled {
            id: message.envelope.id,
            body: message.body,
            exchange: exchange.to_string(),
            routing_key: routing_key.to_string(),
            due_ms,
            headers,
            received: None,
        };
        self.inner.route(scheduled)?;
        self.inner.scheduled.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Messages handed to this scheduler ([`after`](Self::after), [`at`](Self::at)).
    pub fn scheduled(&self) -> u64 {
        self.inner.scheduled.load(Ordering::Relaxed)
    }

    /// Messages this scheduler delivered to their destination.
    pub fn delivered(&self) -> u64 {
        self.inner.delivered.load(Ordering::Relaxed)
    }

    /// Moves of a message onto a rung by this scheduler (a due message kept on the 10 s rung
    /// because no queue received it counts too).
    pub fn hops(&self) -> u64 {
        self.inner.hops.load(Ordering::Relaxed)
    }

    /// Control messages without the scheduler's headers, dropped.
    pub fn rejected(&self) -> u64 {
        self.inner.rejected.load(Ordering::Relaxed)
    }

    /// The control queue this scheduler consumes.
    pub fn control_queue(&self) -> String {
        self.inner.options.control_queue()
    }

    /// A handle that stops the control consumer from any thread ([`close`](Self::close) still
    /// joins and reports).
    pub fn stop_handle(&self) -> StopHandle {
        match &self.consumer {
            Some(c) => c.stop_handle(),
            None => StopHandle::default(),
        }
    }

    /// True once its control consumer has ended (stopped, or failed).
    pub fn is_finished(&self) -> bool {
        self.consumer
            .as_ref()
            .is_none_or(RunningConsumer::is_finished)
    }

    /// Closes as [`close`](Self::close) does, waiting up to `timeout` (not the control
    /// consumer's shutdown timeout) for a hop under way ([`RunningConsumer::drain`]).
    ///
    /// # Errors
    ///
    /// As [`close`](Self::close).
    pub fn drain(mut self, timeout: std::time::Duration) -> Result<CloseReport> {
        let report = match self.consumer.take() {
            Some(c) => c.drain(timeout),
            None => Ok(CloseReport::default()),
        };
        let _ = self.inner.publisher.close();
        report
    }

    /// Stops the control consumer (a hop under way finishes and is acknowledged) and closes
    /// the publisher.
    ///
    /// # Errors
    ///
    /// The error that ended the control consumer, if it ended on its own.
    pub fn close(mut self) -> Result<CloseReport> {
        let report = match self.consumer.take() {
            Some(c) => c.close(),
            None => Ok(CloseReport::default()),
        };
        let _ = self.inner.publisher.close();
        report
    }
}

impl Drop for RunningScheduler {
    /// Closes as [`close`](RunningScheduler::close) does (blocking up to the shutdown timeout).
    fn drop(&mut self) {
        if let Some(c) = self.consumer.take() {
            if let Err(e) = c.close() {
                log::warn!("acemq: the scheduler's control consumer ended with: {e}");
            }
            let _ = self.inner.publisher.close();
        }
    }
}
