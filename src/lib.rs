//! # acemq-amqp
//!
//! Synchronous, blocking RabbitMQ (AMQP 0-9-1) messaging for threaded Rust services — no async
//! runtime. It fills amiquip's gaps (recovery, confirm bookkeeping, bounded buffers, header
//! validation) and ships the patterns of the AceMQ family, whose wire contract it shares with
//! the Python, Go, Java, .NET and Ruby libraries.
//!
//! This example needs `serde_json` in your `[dependencies]` too, for `serde_json::json!`:
//!
//! ```no_run
//! use acemq_amqp::{Connection, Message, QueueSpec};
//!
//! fn main() -> acemq_amqp::Result<()> {
//!     let connection = Connection::open("amqp://guest:guest@127.0.0.1:5672/")?;
//!     connection.declare_queue(&QueueSpec::new("orders"))?;
//!     let publisher = connection.publisher()?;
//!     // Returns once the broker confirmed it; an unroutable message is an error.
//!     publisher.publish_value("", "orders", &serde_json::json!({"order_id": "o-1"}))?;
//!     connection.close()
//! }
//! ```
//!
//! ## What is here
//!
//! * [`Connection`]: one AMQP connection at a time, with `TCP_NODELAY`, kept up by a supervisor
//!   thread that reconnects with capped exponential backoff and jitter across several addresses
//!   and re-declares the topology it was asked to declare ([`QueueSpec`], [`ExchangeSpec`],
//!   [`Binding`]). Passwords never appear in `Debug`, `Display`, logs or errors.
//! * [`Message`] and its [`Envelope`]: the reserved `x-acemq-` headers of the family's wire
//!   contract ([`headers`]), written with the family's names and AMQP types, read forgivingly,
//!   validated before sending.
//! * [`Codec`]: [`JsonCodec`] (default) and [`BytesCodec`], settable on the connection, a
//!   publisher or a consumer.
//! * [`Publisher`]: confirmed, mandatory publishing shared by many threads, with tickets for
//!   batches and a bounded window; [`Publisher::publish_all`] publishes a batch and reports
//!   each message ([`BatchReport`]). Publishing without confirms (at most once) is an option
//!   chosen on purpose ([`PublisherOptions::confirms`], with the delivery-guarantee table),
//!   still bounded and still refusing what cannot be sent.
//! * [`Consumer`]: worker threads running a [`Handler`] that returns an [`Outcome`] (accept,
//!   retry, reject, park, in progress); the family's [`RetryPolicy`] — waits under 30 s held in
//!   the consumer, longer ones on `{queue}.retry.{Ns|Nm|Nh}` rungs through `acemq.retry` —,
//!   `{queue}.dlq` and `{queue}.parked` on `acemq.dlx`; recovery with the connection; graceful
//!   shutdown ([`CloseReport`]); and a scoped [`Consumer::run`] whose handler may borrow local
//!   state.
//! * [`observe`]: the [`Observer`](observe::Observer) hook and the family's metric names; with the `metrics`
//!   feature, `observe::MetricsObserver` records them through the `metrics` crate facade for
//!   any exporter (Prometheus and the like).
//! * [`health`]: [`Connection::health`] — the broker link, running consumers and relays, the
//!   application's checks under deadlines; `up` / `degraded` / `down` and the family's JSON.
//!   With the `actuator` feature, `actuator::Actuator` serves it on `/acemq-health` (and
//!   `/readyz`, `/livez` for probes) beside `/acemq-info` and `/acemq-metrics`.
//! * [`patterns`]: the family's patterns, one module each: the SQL stores (idempotency, outbox,
//!   schema registry), the idempotent consumer (plain and transactional), the outbox relay,
//!   the consumer group, request/reply ([`patterns::request_reply::Requester`], [`patterns::request_reply::Responder`]), the
//!   broker-neutral acknowledged consumer, dead-letter replay ([`mod@patterns::replay`]), routing
//!   slips ([`patterns::routing_slip::RoutingSlip`], [`patterns::routing_slip::follow_slip`]), sagas ([`patterns::saga::Saga`]),
//!   the scheduler ([`patterns::scheduler::Scheduler`]: delayed delivery on a TTL ladder), RabbitMQ streams
//!   ([`patterns::streams::declare_stream`], [`patterns::streams::StreamReader`]), claim checks
//!   ([`patterns::claim_check::ClaimCheckCodec`]), ordered dispatch and partitions ([`patterns::ordering::ordered`],
//!   [`patterns::ordering::partition`]), the handler chain ([`patterns::chain`](fn@patterns::chain::chain)) and
//!   pipelines ([`patterns::pipeline::then`]). At-most-once delivery is a consumer option, chosen on
//!   purpose ([`ConsumerOptions::at_most_once`], with the delivery-guarantee table).
//! * For operators: [`patterns::peek::peek()`] (the head of a classic queue, left unchanged and in
//!   order), [`Connection::compare_queue`] / [`Connection::compare_exchange`] (the broker's
//!   queue or exchange against a spec, argument by argument, changing nothing) and
//!   [`failure_topology`] (what a consumer declares for its failures) — and the `acemq`
//!   command line built on them and the rest of this API (the `acemq-cli` crate of this
//!   workspace: `acemq replay|peek|outbox|schema|topology`, `acemq --help`).
//! * `testing` (feature `testing`, for your tests): a fault proxy that cuts, stalls or refuses
//!   connections, unique test names, clean-up after a panicking test, `wait_until`, and
//!   `received` to unit-test a handler without a broker; its guide is `docs/testing.md`.
//! * [`codecs`]: [`codecs::TextCodec`], [`codecs::CompositeCodec`] (read by content type, as the
//!   family does) and, each behind its feature, the family's YAML, TOML, XML, Avro, Protobuf and
//!   encrypted (AES-GCM) codecs.
//! * [`trace`]: W3C trace context carried from consumed to published messages
//!   ([`TraceContext`](trace::TraceContext)); OpenTelemetry spans behind the `opentelemetry` feature.
//! * [`intercept`]: publish and consume interceptors on a connection.
//! * [`wire`]: the AMQP data a message carries, as this crate's own types — its properties, the
//!   header table and every AMQP field value (`Message::properties` on a received message), and
//!   the [`AmqpError`](wire::AmqpError) a transport answers with (the source of
//!   [`Error::Amqp`]).
//! * [`credentials`]: the broker login from the environment or a file; flow control
//!   ([`Connection::is_blocked`], [`Error::Blocked`]); `test_ca` (feature `test-ca`): a
//!   development certificate authority for TLS tests.
//! * [`settings`]: [`Settings`](settings::Settings) from the `ACEMQ_*` variables with the
//!   family's names (`ACEMQ_URL`, `ACEMQ_CONSUMER__PREFETCH`, `ACEMQ_TLS__…`) and, with the
//!   `toml` feature, a file of the same keys, turned into the connection's, publishers',
//!   consumers' and the actuator's options; every bad value refused by name when loaded.
//! * [`topology`]: a service's exchanges, queues (with their failure topology), bindings and
//!   the scheduler's ladder as one [`Topology`](topology::Topology), planned (changing
//!   nothing), applied (creating what is missing, refusing on a conflict) or validated (failing
//!   on drift); from code, a TOML or JSON file, or `acemq topology plan|apply|validate`.
//! * [`patterns::retention`]: receipts (and retired outbox records) deleted past a retention,
//!   never one younger than the oldest message still waiting on the broker.
//! * [`service`]: the service host — [`Service`](service::Service) starts a service's
//!   consumers, responders, relays, scheduler and actuator on two connections (publishing,
//!   consuming), stops on SIGTERM or SIGINT, a handle or a failing part, drains them in order
//!   within a deadline (readiness down first) and reports what it did, with an exit code;
//!   [`RunningConsumer::pause`], `resume`, `scale_to`, `set_prefetch` and `drain` are the
//!   same flow control on one consumer.
//!
//! ## Features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `sqlite` | yes | the SQL stores on SQLite (`rusqlite`, bundled) with an `r2d2` pool |
//! | `postgres` | no | the same stores on PostgreSQL (`postgres`, `r2d2_postgres`) |
//! | `mysql` | no | the same stores on MySQL 8.0+ and MariaDB 10.6+ (the blocking `mysql` crate, pure Rust), pooled by `sql::MysqlManager` |
//! | `tls` | no | `amqps://` addresses (`native-tls`), as the family does TLS: a given authority trusted alone, mutual TLS, a server-name override, TLS 1.2 at least, development certificates refused unless allowed, failed handshakes named ([`TlsError`]) |
//! | `metrics` | no | `observe::MetricsObserver`: the family's metric names through the `metrics` facade |
//! | `opentelemetry` | no | OpenTelemetry spans as the family names them (the W3C headers are carried without it too) |
//! | `encryption` | no | `codecs::encrypted`: the family's AES-GCM codec and its keys |
//! | `yaml`, `toml`, `xml`, `avro`, `protobuf` | no | the family's optional codecs in [`codecs`]; `toml` also reads a settings file ([`settings`]) |
//! | `actuator` | no | `actuator`: the family's `/acemq-health`, `/readyz`, `/livez`, `/acemq-info` and `/acemq-metrics` on a small bounded blocking listener of its own (`std::net`; metrics through `metrics-exporter-prometheus`); turns on `metrics` |
//! | `test-ca` | no | `test_ca`: a development certificate authority for TLS tests (`rcgen`) |
//! | `testing` | no | `testing`: a fault proxy, test names, clean-up, `wait_until`, `received`, `MemoryBroker`; turns on `memory` |
//! | `memory` | no | `memory://name`: an in-process broker for tests without RabbitMQ (`testing::MemoryBroker` gives its faults) |
//! | `internals` | no | hidden hooks for this crate's benchmarks and fuzzing; no stability promise |
//!
//! The examples use `serde_json` (`serde_json::json!`), as the first one above does: add it to
//! your `[dependencies]` to write them as they are. The `acemq` command line is the `acemq-cli`
//! crate of this workspace; a library build never compiles it.
//!
//! ## Life cycle
//!
//! One rule for everything that runs threads (a consumer, a relay, a consumer group, a requester,
//! a responder, a scheduler, a stream reader):
//!
//! 1. **Configure.** An options value (`XxxOptions`: `Default`, named setters whose docs say
//!    "Defaults to …", every time a `Duration`) is given when the thing is made, which checks
//!    it and returns `Err` rather than panicking. Nothing runs yet, and the options cannot
//!    change afterwards: there is no setter to be ignored later.
//! 2. **Start.** `start(self)` consumes the configured value and returns a running handle:
//!    [`Consumer::start`] → [`RunningConsumer`], [`patterns::outbox::OutboxRelay::start`] →
//!    [`patterns::outbox::RunningRelay`], [`patterns::consumer_group::ConsumerGroup::start`] →
//!    [`patterns::consumer_group::RunningConsumerGroup`],
//!    [`patterns::request_reply::Requester::start`] →
//!    [`patterns::request_reply::RunningRequester`], and so on for the responder, the scheduler
//!    and the stream reader. Starting twice cannot be written.
//! 3. **Close.** The running handle's `close(self)` stops its threads, joins them and reports:
//!    [`RunningConsumer::close`] → [`CloseReport`], [`patterns::outbox::RunningRelay::close`] →
//!    [`patterns::outbox::RelayReport`], [`patterns::consumer_group::RunningConsumerGroup::close`] → the members'
//!    [`CloseReport`]s summed, or the error. Its `Drop` does the same best-effort: it
//!    **blocks** until the threads are joined (within the handle's own deadline, documented on
//!    it) and logs the errors instead of returning them.
//!
//! Stopping from another thread goes through a cloneable stop handle ([`StopHandle`]). The
//! cloneable handles that many threads share, [`Connection`] and [`Publisher`], close with
//! `close(&self)`: closing one clone closes it for all (`Connection::open(url)` and
//! `Connection::publisher()` are their defaults' shorthands for `open_with(options)` and
//! `publisher_with(options)`), the others then fail with
//! [`Error::Closed`], and closing twice is harmless. What runs on the caller's thread
//! ([`Consumer::run`], [`patterns::acknowledged::consume`]) ends when it returns and has
//! nothing to close. A configured value that was never started holds no thread of its own
//! (an [`patterns::outbox::OutboxRelay`] that was swept by hand holds a publisher, which its
//! `close(self)`, or its `Drop`, closes).
//!
//! ## Threads
//!
//! Every thread this crate starts is named `acemq-…` and ends when its owner is closed or
//! dropped.
//!
//! | type | Send | Sync | threads behind it |
//! |---|---|---|---|
//! | [`Connection`] | yes | yes | amiquip's I/O thread; `acemq-supervisor` (holds a `Weak`) |
//! | [`Publisher`] | yes | yes | `acemq-confirms`: matches confirms and returns to callers (without confirms, `acemq-flush`: releases what the broker has read, counts returns) |
//! | [`Ticket`] | yes | no need | — |
//! | [`Consumer`] | yes | yes | none until started; [`Consumer::run`] uses the caller's thread plus scoped workers |
//! | [`RunningConsumer`] | yes | yes | `acemq-consumer` (the owner: channel, amiquip consumer, acks; with [`ConsumerOptions::inline`] the handler too), `acemq-worker-N` (none inline) and `acemq-retry-timer` (retries waiting in the consumer) |
//! | [`StopHandle`] | yes | yes | — |
//! | [`patterns::outbox::OutboxRelay`] | yes | yes | none until started; its publisher's `acemq-confirms` once a sweep opened it |
//! | [`patterns::outbox::RunningRelay`] | yes | yes | `acemq-outbox-relay` (sweeps until closed) and its publisher's `acemq-confirms` |
//! | [`patterns::consumer_group::ConsumerGroup`] | yes | yes | none of its own; member `k` (from 1) runs `acemq-consumer-k`, `acemq-worker-k-N` and `acemq-retry-timer-k` |
//! | [`patterns::request_reply::RunningRequester`] | yes | yes | `acemq-requester` (owns the channel consuming the reply queue, reads late replies and returned requests); each call publishes its request and reads its reply on its own thread, which it blocks |
//! | [`patterns::request_reply::RunningResponder`] | yes | yes | a [`RunningConsumer`]'s threads (its owner publishes replies to transient reply queues, just before each request's ack), and a publisher's `acemq-confirms` for replies to named queues |
//! | [`patterns::scheduler::Scheduler`] | yes | yes | its control consumer's `acemq-consumer`, `acemq-worker-N`, `acemq-retry-timer`, and its publisher's `acemq-confirms` |
//! | [`patterns::streams::StreamReader`] | yes | yes | a [`RunningConsumer`]'s threads (named after its `consumer_name`, if any) |
//! | [`patterns::chain::TimeLimited`] | yes | yes | one `acemq-handler-deadline` per message it handles; one that overruns runs on as an orphan (counted, at most `max_orphans` at once) |
//! | [`patterns::acknowledged::Batcher`] | yes | yes | `acemq-ack-worker` while `consume` runs; the source and the acknowledgements stay on the caller's thread |
//! | [`patterns::replay::Replay`] | no (borrows its filter) | no | runs on the caller's thread; a publisher's `acemq-confirms` while `run` runs |
//! | [`patterns::routing_slip::FollowSlip`] | when its step is | when its step is | none: a handler, run on a consumer's workers |
//! | [`patterns::saga::Saga`] | yes | yes | none: runs on the caller's thread |
//! | [`service::RunningService`] | yes | no (its parts need only `Send`) | its parts' threads; `acemq-signals` (signal-hook's iterator, forwarding SIGTERM and SIGINT) while it listens for them; each part stops on a thread of its own while it drains |
//! | `actuator::RunningActuator` (feature `actuator`) | yes | yes | `acemq-actuator` (accepts), `acemq-actuator-stop` (wakes it on stop), one `acemq-actuator-client` per open connection (at most 256; each reads its request within 5 s, answers, closes) |
//! | [`Connection::health`] | — | — | one `acemq-health-check` per application check while a run of it is under way (not started again while one hangs) |
//! | `testing::FaultProxy` (feature `testing`) | yes | yes | `acemq-fault-proxy` (accepts) and two `acemq-fault-proxy-pump` per proxied connection; all joined when it is dropped |
//! | `testing::Cleanup` (feature `testing`) | yes | no (its actions need only `Send`) | none: deletes on the dropping thread |
//!
//! A message consumed passes: amiquip's I/O thread → amiquip's consumer buffer (at most
//! `prefetch` unsettled) → a worker, which takes it from that buffer itself (handler;
//! retry/dead-letter copy published and confirmed) → the settlement channel → the owner thread
//! (ack or requeue). The owner alone touches the amiquip channel and consumer, which may not
//! leave it; the workers hold only a clone of the consumer's receiver. For an ordered handler
//! the owner reads the buffer and hands each delivery on through a bounded job channel, because
//! it decides which may run.
//!
//! A publish runs on the caller's thread under the publisher's lock and only hands frames to
//! amiquip's I/O thread; the confirm thread answers it. amiquip's own buffers (deliveries,
//! returns, confirms) are unbounded; this crate bounds what it lets into them: the publisher by
//! its window, consumers by their prefetch.
//!
//! ## Choices where the design is silent
//!
//! * A publish that cannot be handed over while the connection is down waits for recovery (up
//!   to the publisher's timeout) and then goes out; one already handed over when the connection
//!   drops is failed with a retriable [`Error::ConnectionLost`], never re-sent behind the
//!   caller's back.
//! * A publish to an exchange that does not exist fails with [`Error::NotFound`]; other
//!   publishes in flight on that channel fail retriably and the publisher opens a new channel.
//! * [`Publisher::publish_all`] checks every message before sending any (one invalid message
//!   refuses the batch, [`Error::InvalidBatch`], nothing sent); it is not atomic, and a batch
//!   not wholly confirmed is [`Error::Batch`] with the per-message report. A hand-over that
//!   waits out its timeout stops the batch there (the rest reported
//!   [`BatchOutcome::NotSent`] untried, rather than each waiting as long); a dropped
//!   connection does not (the next message waits for the recovery).
//! * Application integers in headers are written as AMQP long-long (unless a copy re-sends a
//!   header unchanged: then with the type it arrived with); the reserved ones as the family
//!   writes them (32-bit, `x-acemq-first-seen` 64-bit). Every width is read.
//! * Where the AceMQ libraries disagree with each other this crate follows the majority;
//!   docs/wire-contract.md lists each point.
//! * A server-named queue is not re-declared after recovery (it would get a new name).
//! * Consumer tags are chosen by the broker: amiquip 0.4 sends none, so no tag prefix can be set.
//! * A handler's `Err` is a retry (`Error: …`), a [`FatalError`] a reject, a panic a retry
//!   (`panic: …`; logged, the worker survives), a codec error returned by the handler a park
//!   (`could not be decoded: …`) — unless the codec marked it: a [`FatalError`] inside it (a
//!   claim check whose payload is gone) is a reject, a crate [`Error`] inside it (the claim-check
//!   store failing) a retry. A retry after the last attempt goes to `{queue}.dlq` with
//!   `x-acemq-error` = "exhausted N attempts: …".
//! * An explicit delay (`retry_after`, `in_progress`) under the broker-wait threshold is held in
//!   the consumer; at or over it, it goes to the policy's smallest rung at least as long (else
//!   its longest); with a policy that has no rungs it is held in the consumer too. No queue is
//!   ever declared for one delay. `in_progress` keeps the attempt and is never jittered.
//! * A retry held in the consumer keeps its delivery unacknowledged (as the family's consumers
//!   do) on the `acemq-retry-timer` thread, never on a worker; closing the consumer puts held
//!   retries back on the queue unchanged (same attempt) rather than waiting them out.
//! * A received message without `x-acemq-id` or `message_id` (another client's) gets an id
//!   derived from what the broker redelivers unchanged (exchange, routing key, properties but
//!   the broker's own delivery-count and death headers, body), so every delivery of it reads
//!   with the same id and an idempotent consumer recognises a redelivery. Consequence: two
//!   such messages identical in all of these are one message. Headers that cannot be sent back
//!   are dropped from its retry and dead-letter copies, so it always reaches `{queue}.dlq`
//!   rather than being requeued for ever.
//! * A copy that cannot be published (its queue deleted, the broker refusing it) puts the
//!   original back after a pause of 1 s doubling per failure of that message on this consumer
//!   (at most 30 s, drawn between half and all of it), never at once; each failure is logged at error and reported to the
//!   observer as outcome `copy_failed`.
//! * Ordered dispatch is done by the consumer's owner thread, not by a wrapper that blocks a
//!   worker: a delivery whose key is busy waits there, unacknowledged, within the prefetch (see
//!   [`patterns::ordering`]).
//! * Closing waits up to the shutdown timeout for running handlers; one still running then is
//!   left to finish on its thread and its message goes back to the queue with the channel.
//! * amiquip logs its handshake, SASL response (the password) included, at debug level. While a
//!   handshake is under way this crate holds the `log` crate's maximum level at `Info` and then
//!   restores it: other threads' debug lines during those milliseconds are lost, the password
//!   never reaches a log.
//! * The connection name goes to the broker as the client property `information` (amiquip has
//!   no `connection_name`).
//! * amiquip drops a received non-UTF-8 `longstr` header and every header after it; nothing on
//!   the receiving side can undo that, so this crate never sends one (binary goes as a byte
//!   array) and refuses text that is not UTF-8 ([`HeaderValue::try_text`]).
//! * A scheduled message keeps the id it was scheduled with on every hop and on delivery (in a
//!   fresh `ScheduledMessage` envelope), so a duplicate after a crash is recognisable; its
//!   application headers travel with it. A message is delivered within half the smallest rung
//!   of its due time (the Go library: up to a whole rung early).
//! * A stream handler's retry (or `Err`, or panic) is parked with [`Error::StreamRetry`]'s
//!   text, as the Go library parks it; a stream reader re-subscribing after a reconnect starts
//!   at the lowest offset it has not finished, not at its first offset again.
#![deny(missing_docs)]
// On docs.rs (nightly, `--cfg docsrs`) every feature-gated item carries a badge naming its feature.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

#[cfg(feature = "actuator")]
#[cfg_attr(docsrs, doc(cfg(feature = "actuator")))]
pub mod actuator;
mod codec;
pub mod codecs;
mod connection;
mod consume;
pub mod credentials;
mod envelope;
mod error;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod fuzzing;
pub mod health;
pub mod intercept;
mod names;
pub mod observe;
mod outcome;
pub mod patterns;
mod publish;
pub mod service;
pub mod settings;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub mod sql;
mod stop;
#[cfg(feature = "test-ca")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-ca")))]
pub mod test_ca;
#[cfg(feature = "testing")]
pub mod testing;
mod ticket;
pub mod topology;
pub mod trace;
pub mod wire;
// The seam under the engine: the AMQP transport (amiquip) and the in-process one (`memory`).
mod transport;

pub use codec::{BytesCodec, Codec, CodecSource, JsonCodec};
pub use connection::{
    Address, Binding, Connection, ConnectionOptions, ExchangeKind, ExchangeSpec, QueueInfo,
    QueueKind, QueueSpec, StreamRetention, TopologyDifference,
};
#[cfg(feature = "tls")]
#[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
pub use connection::{TlsError, TlsFailure};
pub use consume::{
    failure_topology, CloseReport, Consumer, ConsumerOptions, FailureTopology, Handler,
    HandlerResult, OrderBy, Outcome, RetryPolicy, RunningConsumer, DEFAULT_BROKER_WAIT_THRESHOLD,
};
pub use envelope::{
    headers, new_id, now_ms, Envelope, HeaderValue, Message, Received, MAX_SHORT_STRING,
};
pub use error::{BoxError, Error, FatalError, Result};
pub use names::{
    dead_letter_queue, parked_queue, retry_queue, rung_name, DEAD_LETTER_EXCHANGE, RETRY_EXCHANGE,
};
pub use publish::{BatchItem, BatchOutcome, BatchReport, Publisher, PublisherOptions, Ticket};
pub use stop::StopHandle;
pub use transport::Capabilities;
