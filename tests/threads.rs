//! Compile-time checks of the documented Send/Sync promises (see the crate docs, "Threads").

fn send_sync<T: Send + Sync>() {}
fn send<T: Send>() {}

#[test]
fn handles_are_send_and_sync() {
    send_sync::<acemq_amqp::Connection>();
    send_sync::<acemq_amqp::Publisher>();
    send::<acemq_amqp::Ticket>();
    send_sync::<acemq_amqp::Message>();
    send_sync::<acemq_amqp::Error>();
    send_sync::<std::sync::Arc<dyn acemq_amqp::Codec>>();
    send_sync::<acemq_amqp::Consumer>();
    send_sync::<acemq_amqp::RunningConsumer>();
    send_sync::<acemq_amqp::StopHandle>();
    send_sync::<acemq_amqp::patterns::acknowledged::Batcher>();
}

#[cfg(feature = "sqlite")]
#[test]
fn stores_and_the_relay_are_send_and_sync() {
    send_sync::<acemq_amqp::patterns::outbox::OutboxRelay>();
    send_sync::<acemq_amqp::patterns::outbox::RunningRelay>();
    send_sync::<acemq_amqp::patterns::outbox::OutboxRelayOptions>();
    send_sync::<acemq_amqp::patterns::outbox::SqlOutboxStore>();
    send_sync::<acemq_amqp::patterns::idempotency::SqlIdempotencyStore>();
    send_sync::<acemq_amqp::patterns::schema_registry::SqlSchemaRegistry>();
}

#[test]
fn replay_reports_slips_and_sagas_are_send_and_sync() {
    type Step =
        fn(&acemq_amqp::Message) -> Result<Option<acemq_amqp::Message>, acemq_amqp::BoxError>;
    send_sync::<acemq_amqp::patterns::replay::ReplayReport>();
    send_sync::<acemq_amqp::patterns::routing_slip::RoutingSlip>();
    send_sync::<acemq_amqp::patterns::routing_slip::FollowSlip<Step>>();
    send_sync::<acemq_amqp::patterns::saga::Saga<String>>();
    send_sync::<acemq_amqp::patterns::saga::SagaReport>();
}

#[test]
fn scheduler_streams_and_claim_checks_are_send_and_sync() {
    send_sync::<acemq_amqp::patterns::scheduler::Scheduler>();
    send_sync::<acemq_amqp::patterns::scheduler::RunningScheduler>();
    send_sync::<acemq_amqp::patterns::streams::StreamReader>();
    send_sync::<acemq_amqp::patterns::streams::RunningStreamReader>();
    send_sync::<acemq_amqp::patterns::claim_check::ClaimCheckCodec>();
    send_sync::<acemq_amqp::patterns::claim_check::FilesystemClaimCheckStore>();
}

#[test]
fn the_testing_tools_are_send_and_sync() {
    send_sync::<acemq_amqp::testing::FaultProxy>();
    send_sync::<acemq_amqp::testing::TestNames>();
    send_sync::<acemq_amqp::testing::Delivered>();
    send_sync::<acemq_amqp::testing::TimedOut>();
    send::<acemq_amqp::testing::Cleanup>();
}
