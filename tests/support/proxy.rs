//! The fault proxy is the public one, `acemq_amqp::testing::FaultProxy`; this wrapper keeps
//! the names older tests use (`start` that panics, `cut_all`, `stall_all`, `freeze_all`,
//! `accepted`) and dereferences to it for everything else.

use std::ops::Deref;

pub struct FaultProxy(acemq_amqp::testing::FaultProxy);

impl FaultProxy {
    /// Listens on a free loopback port and forwards to `upstream` (`host:port` or a URL).
    pub fn start(upstream: &str) -> FaultProxy {
        FaultProxy(acemq_amqp::testing::FaultProxy::start(upstream).expect("start the fault proxy"))
    }

    /// `cut`.
    pub fn cut_all(&self) {
        self.0.cut();
    }

    /// `stall`.
    pub fn stall_all(&self) {
        self.0.stall();
    }

    /// `freeze`.
    pub fn freeze_all(&self) {
        self.0.freeze();
    }

    /// `connections`.
    pub fn accepted(&self) -> usize {
        self.0.connections()
    }
}

impl Deref for FaultProxy {
    type Target = acemq_amqp::testing::FaultProxy;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}
