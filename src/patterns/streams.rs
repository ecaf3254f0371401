//! RabbitMQ streams: append-only logs read from a chosen position, over AMQP 0-9-1.
//!
//! A stream keeps its messages after they are read; every reader picks where it starts
//! ([`Offset`]) and reads independently of the others. What this module promises:
//!
//! * [`declare_stream`] (or [`QueueSpec::stream`] / [`stream`] as topology) declares a durable
//!   `x-queue-type: stream` queue with the given [`StreamRetention`]. **A stream is unbounded by
//!   default: it keeps every message until the disk is full.** Set `max_age` or `max_bytes` on
//!   anything that runs for long.
//! * [`StreamReader::start`] subscribes with the `x-stream-offset` argument, a prefetch (`basic.qos`,
//!   default 10; RabbitMQ refuses a stream consumer without one, so 0 is refused here with
//!   [`Error::InvalidArgument`] by [`StreamReader::new`]) and manual acknowledgements, on
//!   threads of its own, one worker by default (messages are handled in stream order).
//! * **Acknowledging advances the position; it removes nothing.** [`Outcome::Park`] and
//!   [`Outcome::Reject`] (and a [`FatalError`](crate::FatalError)) publish a copy to
//!   `{stream}.parked` / `{stream}.dlq` (declared by the reader, bound to `acemq.dlx`),
//!   confirmed, and then acknowledge the original, which stays in the stream.
//! * **A retry is refused**: [`Outcome::Retry`], [`Outcome::InProgress`], an `Err` from the
//!   handler and a panic would all mean republishing onto the stream — a second copy in the log
//!   for every reader, now and on every replay. None of them does: the message is parked on
//!   `{stream}.parked` with the text of [`Error::StreamRetry`], which names the alternatives
//!   (park, reject, or record the offset, accept, and come back to it), and the reader moves on.
//! * **Offsets.** Every delivery carries the broker's `x-stream-offset` header
//!   ([`stream_offset_of`]). After a reconnect the reader subscribes again from the lowest
//!   offset it has not finished (so nothing is missed; a message may be handled twice), not
//!   from the offset it was started with; before anything was read it uses that offset again.
//! * **No server-side offset tracking.** RabbitMQ 3.10 tracks a named consumer's offset only
//!   for the stream protocol (port 5552), not for AMQP 0-9-1, and amiquip cannot even name a
//!   consumer (the broker chooses every tag). [`StreamOptions::consumer_name`] therefore only
//!   names the reader's threads and log lines. To resume where a reader stopped, track the
//!   offset yourself: in the handler, after the effect is committed, store
//!   [`stream_offset_of`]`(message)` (in the same transaction as the effect, ideally); start the
//!   next reader with [`Offset::At`]`(stored + 1)`. [`RunningStreamReader::position`] gives the same
//!   number for the reader as a whole.
//! * **Depth.** [`Connection::queue_info`] on a stream reports a `message_count` of 0 whatever
//!   it holds: RabbitMQ does not count a stream's messages as ready ones. Use `rabbitmqctl
//!   list_queues name messages` (or the management API) to see a stream's size.

use std::sync::Arc;
use std::time::Duration;

use time::OffsetDateTime;

use crate::connection::{Connection, QueueInfo, QueueSpec, StreamRetention};
use crate::consume::{
    CloseReport, ConsumerOptions, Handler, HandlerResult, Outcome, RunningConsumer,
};
use crate::envelope::{HeaderValue, Message};
use crate::error::{panic_message, Error, Result};
use crate::stop::StopHandle;

mod cursor;

use cursor::{ReaderHook, StreamCursor};

fn clamp(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A stream as topology: the same as [`QueueSpec::stream`].
pub fn stream(name: impl Into<String>, retention: StreamRetention) -> QueueSpec {
    QueueSpec::stream(name, retention)
}

/// Declares a stream (durable, `x-queue-type: stream`) with this retention, and remembers it
/// for re-declaration after recovery. The message count it reports is always 0 (see the
/// [module docs](self)).
///
/// # Errors
///
/// [`Error::TopologyConflict`] when a queue of that name exists with other settings (the
/// connection keeps working).
pub fn declare_stream(
    connection: &Connection,
    name: &str,
    retention: StreamRetention,
) -> Result<QueueInfo> {
    connection.declare_queue(&QueueSpec::stream(name, retention))
}

/// Where a stream reader starts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Offset {
    /// The oldest message the stream still holds (retention may have discarded older ones).
    First,
    /// The last chunk the stream holds: roughly "the recent past", not one exact message.
    Last,
    /// What is published from now on. The default.
    #[default]
    Next,
    /// An exact offset (a stored `x-stream-offset` + 1 resumes after it).
    At(u64),
    /// The first chunk holding messages published at or after this moment (second precision;
    /// RabbitMQ may start a little earlier, at the chunk's beginning).
    Since(OffsetDateTime),
}

impl Offset {
    /// The `x-stream-offset` argument.
    fn argument(&self) -> HeaderValue {
        match self {
            Offset::First => HeaderValue::Text("first".into()),
            Offset::Last => HeaderValue::Text("last".into()),
            Offset::Next => HeaderValue::Text("next".into()),
            Offset::At(n) => HeaderValue::Int(clamp(*n)),
            Offset::Since(t) => {
                HeaderValue::Timestamp(u64::try_from(t.unix_timestamp()).unwrap_or(0))
            }
        }
    }
}

/// [`Offset::First`]: read the whole stream.
pub fn from_first() -> Offset {
    Offset::First
}

/// The offset RabbitMQ stamped on a stream delivery (`x-stream-offset`), in any integer width;
/// `None` on a message that did not come from a stream.
pub fn stream_offset_of(message: &Message) -> Option<u64> {
    cursor::offset_of(message)
}

/// How a [`StreamReader`] reads: given to [`StreamReader::new`], checked there.
#[derive(Clone, Debug)]
#[must_use]
pub struct StreamOptions {
    offset: Offset,
    consumer: ConsumerOptions,
    consumer_name: Option<String>,
}

impl Default for StreamOptions {
    fn default() -> Self {
        StreamOptions {
            offset: Offset::Next,
            consumer: ConsumerOptions::new()
                .prefetch(10)
                .concurrency(1)
                .shutdown_timeout(Duration::from_secs(30)),
            consumer_name: None,
        }
    }
}

impl StreamOptions {
    /// Default options.
    pub fn new() -> Self {
        Self::default()
    }

    /// Where to start. Defaults to [`Offset::Next`].
    pub fn offset(mut self, offset: Offset) -> Self {
        self.offset = offset;
        self
    }

    /// The reader's consumer settings: the prefetch (`basic.qos`, required by RabbitMQ for a
    /// stream, so 0 is refused), worker threads (1 handles messages in stream order), how long
    /// closing waits for running handlers, …; the reader sets no retry (a stream cannot take a
    /// retry: see [`Error::StreamRetry`]) and the `x-stream-offset` argument on them. Defaults
    /// to prefetch 10, concurrency 1 and a 30 s shutdown timeout.
    pub fn consumer(mut self, consumer: ConsumerOptions) -> Self {
        self.consumer = consumer;
        self
    }

    /// Names the reader's threads and log lines. It does **not** make the broker track the
    /// reader's offset: over AMQP 0-9-1 RabbitMQ does not (see the [module docs](self) for how
    /// to track it yourself). Defaults to none.
    pub fn consumer_name(mut self, name: impl Into<String>) -> Self {
        self.consumer_name = Some(name.into());
        self
    }
}

/// A stream reader configured and checked, not started: see [`StreamReader::start`].
#[derive(Debug)]
pub struct StreamReader {
    connection: Connection,
    stream: String,
    options: StreamOptions,
}

impl StreamReader {
    /// A reader of `stream` as `options` say; nothing is sent yet.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] / [`Error::InvalidName`] for bad consumer options (a prefetch
    /// or concurrency of 0, …) or stream name.
    pub fn new(connection: &Connection, stream: &str, options: StreamOptions) -> Result<Self> {
        options.consumer.validate(stream)?;
        Ok(StreamReader {
            connection: connection.clone(),
            stream: stream.to_string(),
            options,
        })
    }

    /// Reads the stream on threads of its own and returns once subscribed.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] when there is no such stream; declaring `{stream}.dlq` and
    /// `{stream}.parked` can fail with [`Error::TopologyConflict`].
    pub fn start<H>(self, handler: H) -> Result<RunningStreamReader>
    where
        H: Handler + Send + Sync + 'static,
    {
        let StreamReader {
            connection,
            stream,
            options,
        } = self;
        let cursor = Arc::new(StreamCursor::default());
        let hook = Arc::new(ReaderHook {
            cursor: cursor.clone(),
            name: options.consumer_name.clone(),
        });
        let consumer_options = options
            .consumer
            .retry(crate::RetryPolicy::none())
            .argument("x-stream-offset", options.offset.argument())
            .hook(hook);
        let running = connection
            .consumer(&stream, consumer_options)?
            .start(StreamHandler {
                inner: handler,
                stream: stream.clone(),
            })?;
        Ok(RunningStreamReader {
            running,
            cursor,
            stream,
        })
    }
}

/// A stream reader running on its own threads, made by [`StreamReader::start`]. Dropping it
/// closes it (blocking up to the shutdown timeout).
#[derive(Debug)]
pub struct RunningStreamReader {
    running: RunningConsumer,
    cursor: Arc<StreamCursor>,
    stream: String,
}

impl RunningStreamReader {
    /// The stream read.
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// The offset a reader started now would begin at to miss nothing this one has not
    /// finished: the lowest offset still being handled, else one past the last finished;
    /// `None` before anything was read. Store it to resume with [`Offset::At`].
    pub fn position(&self) -> Option<u64> {
        self.cursor.resume_at()
    }

    /// A handle that stops the reader from any thread.
    pub fn stop_handle(&self) -> StopHandle {
        self.running.stop_handle()
    }

    /// Stops the reader as [`RunningConsumer::close`] does.
    ///
    /// # Errors
    ///
    /// The error that ended the reader, if it ended on its own.
    pub fn close(self) -> Result<CloseReport> {
        self.running.close()
    }
}

/// Runs a stream handler and turns whatever would republish onto the stream into a park with
/// [`Error::StreamRetry`]'s text.
struct StreamHandler<H> {
    inner: H,
    stream: String,
}

impl<H: Handler> StreamHandler<H> {
    fn refuse(&self, message: &Message, reason: String) -> HandlerResult {
        let refusal = Error::StreamRetry {
            stream: self.stream.clone(),
            offset: stream_offset_of(message),
            message_id: message.id().to_string(),
            reason,
        };
        log::warn!("acemq: {refusal}");
        Ok(Outcome::park(refusal.to_string()))
    }
}

impl<H: Handler> Handler for StreamHandler<H> {
    fn handle(&self, message: &Message) -> HandlerResult {
        let result =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.inner.handle(message)));
        match result {
            Ok(Ok(Outcome::Retry { reason, .. })) => self.refuse(message, reason),
            Ok(Ok(Outcome::InProgress { delay })) => {
                self.refuse(message, format!("in progress, to come back in {delay:?}"))
            }
            Ok(Ok(outcome)) => Ok(outcome),
            Ok(Err(e)) => {
                // A reject (a `FatalError`) or a park (a body that cannot be decoded) passes;
                // what the consumer would retry is refused.
                if is_retry(&e) {
                    self.refuse(message, format!("Error: {e}"))
                } else {
                    Err(e)
                }
            }
            Err(panic) => {
                log::error!(
                    "acemq: a handler on stream {:?} panicked on message {}",
                    self.stream,
                    message.id()
                );
                self.refuse(message, format!("panic: {}", panic_message(&*panic)))
            }
        }
    }
}

/// True when the consumer would retry a handler's `Err(e)` (rather than reject or park it).
fn is_retry(e: &crate::error::BoxError) -> bool {
    use crate::error::FatalError;
    if e.downcast_ref::<FatalError>().is_some() {
        return false;
    }
    match e.downcast_ref::<Error>() {
        Some(Error::Codec { source, .. }) => {
            source.downcast_ref::<FatalError>().is_none()
                && source.downcast_ref::<Error>().is_some()
        }
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_are_the_brokers_arguments() {
        assert_eq!(Offset::First.argument(), HeaderValue::Text("first".into()));
        assert_eq!(Offset::At(42).argument(), HeaderValue::Int(42));
        let t = OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap();
        assert_eq!(
            Offset::Since(t).argument(),
            HeaderValue::Timestamp(1_700_000_000)
        );
        assert_eq!(Offset::default(), Offset::Next);
    }
}
