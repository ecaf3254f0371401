//! The family's patterns, one module each.

pub mod acknowledged;
pub mod chain;
pub mod claim_check;
pub mod consumer_group;
pub mod idempotency;
pub mod idempotent;
pub mod ordering;
pub mod outbox;
pub mod peek;
pub mod pipeline;
pub mod relay;
pub mod replay;
pub mod request_reply;
pub mod routing_slip;
pub mod saga;
pub mod scheduler;
pub mod schema_registry;
pub mod streams;

#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use crate::sql::{create_schema, schema_ddl};
pub use chain::{
    chain, with_idempotency, with_logging, with_ordering, with_timeout, BoxHandler, Chain,
    Deadline, Layer, Logged, OrphanCount, TimeLimited,
};
pub use claim_check::{
    claim_key_of, is_claim_check, ClaimCheckCodec, ClaimCheckStore, FilesystemClaimCheckStore,
    DEFAULT_CLAIM_CHECK_THRESHOLD,
};
pub use consumer_group::ConsumerGroup;
pub use idempotency::{Claim, ClaimToken, IdempotencyStore, InMemoryIdempotencyStore};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use idempotency::{SqlIdempotencyStore, SqlIdempotencyStoreBuilder};
pub use idempotent::{idempotent, DuplicateCount, Idempotent};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use idempotent::{idempotent_tx, IdempotentTx, IdempotentTxBatch};
pub use ordering::{
    by_correlation, by_header, ordered, partition, partitioned_routing_key, Ordered,
};
pub use outbox::{InMemoryOutboxStore, NewOutboxRecord, OutboxRecord, OutboxStats, OutboxStore};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use outbox::{SqlOutboxStore, SqlOutboxStoreBuilder};
pub use peek::{peek, peek_unordered, PEEK_MAX};
pub use pipeline::{then, Next, Then, NOTHING};
pub use relay::{
    record, record_message, OutboxRelay, OutboxRelayOptions, RelayReport, RunningRelay,
};
pub use replay::{replay, Replay, ReplayReport, Stopped};
pub use request_reply::{serve, serve_with, Requester, RequesterOptions, Responder};
pub use routing_slip::{
    follow_slip, route_of, route_queue, slip_from, start, FollowSlip, RoutingSlip, SlipForm,
    SlipStart, SlipStep,
};
pub use saga::{Saga, SagaReport, StepFailure};
pub use scheduler::{
    hop_plan, hop_plan_on, schedule_rungs, schedule_topology, ScheduleTopology, Scheduler,
    SchedulerOptions, SCHEDULED_MESSAGE_TYPE, SCHEDULE_CONTROL_QUEUE, SCHEDULE_EXCHANGE,
};
pub use schema_registry::{fingerprint, InMemorySchemaRegistry, Schema, SchemaRegistry};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use schema_registry::{SqlSchemaRegistry, SqlSchemaRegistryBuilder};
pub use streams::{
    declare_stream, from_first, read_stream, read_stream_with, stream, stream_offset_of, Offset,
    StreamOptions, StreamReader, StreamRetention,
};
