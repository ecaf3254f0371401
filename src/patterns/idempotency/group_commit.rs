//! Group commit: callers queue their operation; one group runs at a time, led by a caller:
//! the first to find no group running leads (takes everything queued, runs it as one
//! transaction, hands out the answers) and the others wait for their answer, each in its
//! own mailbox (a slot and a condition variable), so a finished group wakes only the
//! callers it answered and, when more are queued, the one it hands the lead to — never
//! every waiting thread. One group at a time on PostgreSQL too: measured here (two cores
//! shared with the broker), four concurrent groups each committed a third as many
//! operations in about the same time, and two no more than one.
//!
//! The coordinator knows nothing of SQL: a [`Runner`] (the SQL store) runs a group and, when
//! the group failed, each of its operations alone.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use super::store::{Claim, ClaimToken};
use crate::error::{Error, Result};

/// One queued operation.
pub(crate) enum Op {
    Claim(String),
    Confirm(String, ClaimToken),
    Release(String, ClaimToken),
}

/// What runs the groups (the SQL store).
pub(crate) trait Runner {
    /// One group's operations on one transaction: each one's answer, or the error that failed
    /// the transaction. The group's claims are made under `token`.
    fn run_group(&self, ops: &[Op], token: &ClaimToken) -> Result<Vec<Done>>;

    /// One operation alone (a failed group's fallback); a claim under `own` when given.
    fn run_alone(&self, op: &Op, own: Option<&ClaimToken>) -> Result<Done>;
}

pub(crate) struct Done {
    pub(crate) claim: Claim,
}

/// What a waiting caller is told.
enum Wake {
    /// Its operation's answer.
    Done(Result<Done>),
    /// The lead was handed to it: run the next group.
    Lead,
    /// Its operation was taken into a group that will not answer (the thread running
    /// it panicked).
    Gone,
}

/// Where one waiting caller is woken: a slot and a condition variable, no channel. A
/// caller waits here about a commit's length (a database round trip); the waiting
/// parks the thread at once instead of spinning and yielding first as a channel's
/// receive does, which with dozens of workers waiting took the CPU the database and
/// the broker needed (measured: `sched_yield` and the channel's receive were the
/// workers' largest cost in the plain idempotent consumer at concurrency 32).
#[derive(Default)]
struct Mailbox {
    slot: Mutex<VecDeque<Wake>>,
    ready: Condvar,
}

impl Mailbox {
    fn put(&self, wake: Wake) {
        self.slot.lock().push_back(wake);
        self.ready.notify_one();
    }

    fn take(&self) -> Wake {
        let mut slot = self.slot.lock();
        loop {
            if let Some(wake) = slot.pop_front() {
                return wake;
            }
            self.ready.wait(&mut slot);
        }
    }
}

/// The right to answer one queued operation: answered once, or, when dropped
/// unanswered (a group that panicked), its caller is told [`Wake::Gone`].
struct Answer(Option<Arc<Mailbox>>);

impl Answer {
    /// The caller's mailbox, while it is not answered (to hand it the lead).
    fn mailbox(&self) -> Option<&Arc<Mailbox>> {
        self.0.as_ref()
    }

    fn send(mut self, done: Result<Done>) {
        if let Some(to) = self.0.take() {
            to.put(Wake::Done(done));
        }
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        if let Some(to) = self.0.take() {
            to.put(Wake::Gone);
        }
    }
}

#[derive(Default)]
struct State {
    /// Each operation with the right to answer it (which holds its caller's mailbox).
    queue: Vec<(Op, Answer)>,
    /// A group is running, or the lead was handed to a caller not yet awake.
    running: bool,
}

#[derive(Default)]
pub(crate) struct Group {
    state: Mutex<State>,
}

/// The lead: when dropped (also when a group panics) it is handed to the first caller
/// still queued, or, with nobody queued, given up.
struct Lead<'g>(&'g Group);

impl Drop for Lead<'_> {
    fn drop(&mut self) {
        let mut state = self.0.state.lock();
        // A queued answer is always unanswered, so it has its mailbox.
        match state.queue.first().and_then(|(_, a)| a.mailbox().cloned()) {
            Some(next) => {
                drop(state);
                // Its caller waits in its mailbox (it is still queued).
                next.put(Wake::Lead);
            }
            None => state.running = false,
        }
    }
}

impl Group {
    /// How many operations wait for a group (for tests).
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.state.lock().queue.len()
    }

    pub(crate) fn run(&self, store: &dyn Runner, op: Op) -> Result<Done> {
        let mailbox = Arc::new(Mailbox::default());
        {
            let mut state = self.state.lock();
            state.queue.push((op, Answer(Some(mailbox.clone()))));
            if !state.running {
                state.running = true;
                drop(state);
                self.lead(store);
            }
        }
        loop {
            match mailbox.take() {
                Wake::Done(done) => return done,
                Wake::Lead => self.lead(store),
                Wake::Gone => {
                    return Err(Error::sql(
                        "a group commit of the idempotency store",
                        "the thread running the group panicked; its transaction did \
                         not commit",
                    ))
                }
            }
        }
    }

    /// Runs what is queued as one group (the caller holds the lead).
    fn lead(&self, store: &dyn Runner) {
        let lead = Lead(self);
        let queued = std::mem::take(&mut self.state.lock().queue);
        if queued.is_empty() {
            return;
        }
        let (ops, answer_to): (Vec<Op>, Vec<Answer>) = queued.into_iter().unzip();
        let token = ClaimToken::new();
        let answers: Vec<Result<Done>> = match store.run_group(&ops, &token) {
            Ok(done) => done.into_iter().map(Ok).collect(),
            Err(e) if ops.len() > 1 => {
                log::debug!(
                    "acemq: a group commit of {} operations failed ({e}); running them \
                     one by one",
                    ops.len()
                );
                // Each key's first claim under the group's token (the group may have
                // claimed it already); a key asked for again is in progress, as in
                // the group.
                let mut claimed = std::collections::HashSet::new();
                ops.iter()
                    .map(|op| {
                        let own = match op {
                            Op::Claim(key) if claimed.insert(key.as_str()) => Some(&token),
                            _ => None,
                        };
                        store.run_alone(op, own)
                    })
                    .collect()
            }
            Err(e) => vec![Err(e)],
        };
        // The next group starts (what queued meanwhile) before these answers go out.
        drop(lead);
        for (to, answer) in answer_to.into_iter().zip(answers) {
            to.send(answer);
        }
    }
}
