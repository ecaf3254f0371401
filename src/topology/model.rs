//! [`Topology`]: the exchanges, queues (with their failure topology) and bindings a service
//! needs, and the scheduler's ladder, as one value.

use crate::connection::{Binding, ExchangeSpec, QueueSpec};
use crate::consume::{failure_topology, RetryPolicy};
use crate::patterns::scheduler::SchedulerOptions;

/// What a service declares, as one value: build it, then [`plan`](Topology::plan) it (what
/// would be created or differs, changing nothing), [`apply`](Topology::apply) it (create what
/// is missing, refuse on a conflict) or [`validate`](Topology::validate) it (fail on any
/// drift) — see the [module docs](super).
///
/// Each item is listed once, in the order added (a queue or exchange added twice, as
/// `acemq.dlx` is by every consumed queue, is kept once).
#[derive(Clone, Debug, Default)]
pub struct Topology {
    pub(super) exchanges: Vec<ExchangeSpec>,
    pub(super) queues: Vec<QueueSpec>,
    pub(super) bindings: Vec<Binding>,
}

impl Topology {
    /// An empty topology.
    pub fn new() -> Topology {
        Topology::default()
    }

    /// An exchange.
    pub fn exchange(mut self, spec: ExchangeSpec) -> Topology {
        if !self.exchanges.iter().any(|e| e.name() == spec.name()) {
            self.exchanges.push(spec);
        }
        self
    }

    /// A queue, alone (no failure topology: see [`consumed_queue`](Self::consumed_queue)).
    pub fn queue(mut self, spec: QueueSpec) -> Topology {
        if !self.queues.iter().any(|q| q.name() == spec.name()) {
            self.queues.push(spec);
        }
        self
    }

    /// A queue a consumer with `policy` reads, with everything that consumer declares beside
    /// it: `acemq.dlx` with `{queue}.dlq` and `{queue}.parked`, and for a policy that waits on
    /// the broker `acemq.retry` and a rung per wait ([`failure_topology`]).
    pub fn consumed_queue(self, spec: QueueSpec, policy: &RetryPolicy) -> Topology {
        let failures = failure_topology(spec.name(), &policy.broker_rungs());
        let mut t = self.queue(spec);
        for x in failures.exchanges {
            t = t.exchange(x);
        }
        for q in failures.queues {
            t = t.queue(q);
        }
        for b in failures.bindings {
            t = t.binding(b);
        }
        t
    }

    /// A binding.
    pub fn binding(mut self, binding: Binding) -> Topology {
        if !self.bindings.contains(&binding) {
            self.bindings.push(binding);
        }
        self
    }

    /// The scheduler's ladder: its exchange, a queue per rung and its control queue, each bound
    /// under its own name ([`SchedulerOptions::topology`]).
    pub fn scheduler(self, options: &SchedulerOptions) -> Topology {
        let ladder = options.topology();
        let mut t = self.exchange(ladder.exchange);
        for q in ladder.queues {
            t = t.queue(q);
        }
        for b in ladder.bindings {
            t = t.binding(b);
        }
        t
    }

    /// The exchanges, in order.
    pub fn exchanges(&self) -> &[ExchangeSpec] {
        &self.exchanges
    }

    /// The queues, in order.
    pub fn queues(&self) -> &[QueueSpec] {
        &self.queues
    }

    /// The bindings, in order.
    pub fn bindings(&self) -> &[Binding] {
        &self.bindings
    }
}
