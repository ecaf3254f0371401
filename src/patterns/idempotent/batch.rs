//! The batched transactional form: [`IdempotentTx::batch`].
//!
//! Two ways to gather a batch:
//!
//! * **by the consumer's worker** (the wrapper handed to the consumer as it is): the worker
//!   takes up to `max_messages` deliveries (its share of the prefetch at most), waiting at
//!   most `max_wait` after the first, and calls [`Handler::handle_batch`] once;
//! * **across workers** (the wrapper called through [`Handler::handle`], e.g. from another
//!   handler): each worker puts its message in the wrapper's queue and waits; the first to
//!   find no batch running leads — it waits for `max_messages` messages (or, once a partial
//!   batch has waited out `max_wait`, as many as the callers seen at once), at most `max_wait`,
//!   takes up to `max_messages` (its own first) and runs them; one batch at a time per wrapper.
//!
//! A batch runs on one transaction: its keys claimed in one statement under one token, each
//! claimed message's handler, the receipts in one statement, the failed messages' claims given
//! back in one, one commit — and only then any result handed back to the consumer.
//!
//! **Savepoints only when they are needed.** A savepoint per message costs a round trip to
//! PostgreSQL per message (about as much as the rest of a batch of 100 together, measured). So
//! a batch first runs without them; if a handler fails, that pass is rolled back whole (nothing
//! of it was applied) and the batch runs again at once with each message under its own
//! savepoint, which rolls back the failing message's work alone. After a batch with a failure
//! the next one starts with savepoints; after one without, the next starts without.

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::duplicates::{key_of, DuplicateCount};
use super::options::IdempotentTxBatchOptions;
use super::tx::{rollback, IdempotentTx, BEGIN_TRIES};
use crate::consume::{Handler, HandlerResult, Outcome};
use crate::envelope::Message;
use crate::patterns::idempotency::{Claim, ClaimToken, SqlIdempotencyStore};
use crate::sql::{SqlTransaction, Transactional};

/// A message's result, or the panic its handler raised (resumed on its own worker).
type Settled = std::result::Result<HandlerResult, Box<dyn Any + Send>>;

/// A message waiting in the queue for its batch.
struct Entry {
    id: u64,
    message: Message,
    key: String,
}

/// A message of a batch as the batch runs it.
struct Item<'a> {
    id: u64,
    message: &'a Message,
    key: &'a str,
}

#[derive(Default)]
struct State {
    next_id: u64,
    queue: VecDeque<Entry>,
    /// A batch is running (its leader is out of the lock).
    leading: bool,
    /// Results of the finished batches, by entry id, until their worker takes them.
    done: HashMap<u64, Settled>,
    /// Callers inside [`Handler::handle`] now (waiting for their batch, or leading one).
    inside: usize,
    /// How many callers come at once: the most seen inside together since the last partial
    /// batch that waited out `max_wait` (which sets it to those inside then), never over
    /// `max_messages`. A count, not a set of threads: a caller on a fresh thread per message
    /// (under a deadline, say) is one caller, not one more worker each time.
    workers: usize,
    /// A partial batch has waited out `max_wait`: from then on a batch waits for no more
    /// messages than `workers` (the consumer may have fewer than `max_messages`). Until then
    /// it waits for `max_messages`.
    learned: bool,
}

/// A handler made transactional, idempotent and batched by [`IdempotentTx::batch`].
///
/// Hand it to the consumer as it is: the consumer's worker then gathers each batch (up to
/// `max_messages`, and at most its share of the prefetch: give the consumer a prefetch of at
/// least `max_messages` per worker, e.g. `max_messages` 100 with prefetch 200). Wrapped in
/// another handler that calls [`Handler::handle`], it gathers the calls of the consumer's
/// concurrent workers instead, so a batch is then at most the consumer's concurrency.
pub struct IdempotentTxBatch<F, H> {
    inner: IdempotentTx<F, H>,
    max_messages: usize,
    max_wait: Duration,
    state: Mutex<State>,
    changed: Condvar,
    on_commit: Option<Box<dyn Fn(usize) + Send + Sync>>,
    /// The last batch had a failing message: the next one runs each message under its own
    /// savepoint from the start (see the module's docs).
    savepoints: AtomicBool,
}

impl<F, H> IdempotentTx<F, H> {
    /// Handles messages in batches (set up by `options`): up to `max_messages` deliveries are claimed, handled and
    /// confirmed in **one** database transaction, committed once, and only then acknowledged.
    /// A partial batch waits at most `max_wait` for more messages.
    ///
    /// What stays as in the single-message form:
    ///
    /// * **a failing message's work rolled back alone**: a message whose handler fails (an
    ///   `Err`, a panic, any outcome but accept, an SQL error in it) has its work undone and its
    ///   claim given back, and it alone takes the retry / dead-letter path; the others commit.
    ///   How: the batch runs without savepoints (each costs PostgreSQL a round trip); at the
    ///   first failure that pass is rolled back whole and the batch runs again with each
    ///   message under its own savepoint, rolled back to for the failing one. So the handlers
    ///   of the messages before the failure **run twice**, the first run's work rolled back:
    ///   their effects are applied once, provided they are in the transaction (as
    ///   [`idempotent_tx`](crate::patterns::idempotent::idempotent_tx) requires: a crash before the commit
    ///   runs them again too). After a batch with a failure the next starts with savepoints,
    ///   and after one without, without. A duplicate is accepted without
    ///   running, a key claimed elsewhere comes back later (in progress), as in the single form;
    ///   a failure of the batch's own statements (claims, receipts, savepoints, commit) is a
    ///   retry for every message of the batch, with nothing applied;
    /// * **acknowledged only after the commit**: no outcome of a batch reaches the consumer
    ///   before the batch's commit returned, so no acknowledgement (not even a `multiple` one)
    ///   covers an uncommitted effect. A crash before the commit redelivers the whole batch
    ///   with no effect applied; a crash after it redelivers messages whose receipts are
    ///   committed, and each is acknowledged as a duplicate without running again;
    /// * a commit that fails turns every message of the batch that was to be accepted into a
    ///   retry (nothing of the batch was applied);
    /// * claims are fenced by their tokens, on the database's clock, as before.
    ///
    /// The handler sees, in one transaction, the work of the batch's earlier messages. Two
    /// messages with one key in a batch: the second finds the first's receipt (a duplicate).
    ///
    /// `max_messages` of 1 is the single-message form. How batches are gathered, and the
    /// prefetch they need, is in [`IdempotentTxBatch`].
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for `max_messages` of 0 or
    /// over 10,000, or a `max_wait` of zero.
    pub fn batch(
        self,
        options: IdempotentTxBatchOptions,
    ) -> crate::Result<IdempotentTxBatch<F, H>> {
        options.validate()?;
        let IdempotentTxBatchOptions {
            max_messages,
            max_wait,
            on_commit,
        } = options;
        Ok(IdempotentTxBatch {
            inner: self,
            max_messages,
            max_wait,
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            on_commit,
            savepoints: AtomicBool::new(false),
        })
    }
}

impl<F, H> IdempotentTxBatch<F, H> {
    /// The count of duplicates this wrapper absorbed (a shared handle).
    pub fn duplicates(&self) -> DuplicateCount {
        self.inner.duplicates()
    }

    /// The largest batch.
    pub fn max_messages(&self) -> usize {
        self.max_messages
    }

    /// The longest a partial batch waits for more messages.
    pub fn max_wait(&self) -> Duration {
        self.max_wait
    }
}

/// How often a worker waiting for its batch looks again (its batch's leader wakes it sooner).
const RECHECK: Duration = Duration::from_millis(100);

impl<F, C, H> Handler for IdempotentTxBatch<F, H>
where
    F: Fn() -> crate::Result<C>,
    C: Transactional,
    H: Fn(&Message, &mut C::Transaction<'_>) -> HandlerResult,
{
    fn batch_limits(&self) -> Option<(usize, Duration)> {
        (self.max_messages > 1).then_some((self.max_messages, self.max_wait))
    }

    /// The consumer's worker gathered the batch: run it as it is.
    fn handle_batch(&self, messages: &[&Message]) -> Vec<std::thread::Result<HandlerResult>> {
        let mut results: Vec<Option<Settled>> = Vec::with_capacity(messages.len());
        let mut keys = Vec::with_capacity(messages.len());
        for m in messages {
            match key_of(&self.inner.key, m) {
                Ok(key) => {
                    keys.push(Some(key));
                    results.push(None);
                }
                Err(e) => {
                    keys.push(None);
                    results.push(Some(Ok(Err(e))));
                }
            }
        }
        let items: Vec<Item<'_>> = messages
            .iter()
            .zip(&keys)
            .enumerate()
            .filter_map(|(i, (m, key))| {
                key.as_deref().map(|key| Item {
                    id: i as u64,
                    message: m,
                    key,
                })
            })
            .collect();
        if !items.is_empty() {
            for (i, settled) in self.run_batch(&items) {
                results[i as usize] = Some(settled);
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Ok(Err("no result for the message".into()))))
            .collect()
    }

    fn handle(&self, m: &Message) -> HandlerResult {
        if self.max_messages == 1 {
            return self.inner.handle(m);
        }
        let key = key_of(&self.inner.key, m)?;
        // Declared before `state`, so dropped after it: its drop takes the lock.
        let _inside = Inside::enter(self);
        let mut state = self.state.lock();
        let id = state.next_id;
        state.next_id += 1;
        state.queue.push_back(Entry {
            id,
            message: m.clone(),
            key,
        });
        self.changed.notify_all();
        loop {
            if let Some(settled) = state.done.remove(&id) {
                drop(state);
                return match settled {
                    Ok(r) => r,
                    Err(panic) => resume_unwind(panic),
                };
            }
            if !state.leading {
                // Lead: wait for a full batch or for max_wait, then run it.
                state.leading = true;
                let deadline = Instant::now() + self.max_wait;
                loop {
                    let full = if state.learned {
                        self.max_messages.min(state.workers).max(1)
                    } else {
                        self.max_messages
                    };
                    if state.queue.len() >= full {
                        break;
                    }
                    if self.changed.wait_until(&mut state, deadline).timed_out() {
                        state.learned = true;
                        state.workers = state.inside.clamp(1, self.max_messages);
                        break;
                    }
                }
                let mut batch = Vec::with_capacity(self.max_messages);
                if let Some(pos) = state.queue.iter().position(|e| e.id == id) {
                    batch.extend(state.queue.remove(pos));
                }
                while batch.len() < self.max_messages {
                    match state.queue.pop_front() {
                        Some(e) => batch.push(e),
                        None => break,
                    }
                }
                drop(state);
                // Until the batch is answered, a panic out of it (the connections factory, the
                // driver) answers the other callers with an error and gives the lead up.
                let mut lead = Lead {
                    batch: self,
                    leader: id,
                    waiting: batch.iter().map(|e| e.id).collect(),
                };
                let items: Vec<Item<'_>> = batch
                    .iter()
                    .map(|e| Item {
                        id: e.id,
                        message: &e.message,
                        key: &e.key,
                    })
                    .collect();
                let results = self.run_batch(&items);
                lead.waiting.clear();
                drop(lead);
                state = self.state.lock();
                state.done.extend(results);
                self.changed.notify_all();
                continue;
            }
            self.changed.wait_for(&mut state, RECHECK);
        }
    }
}

/// A caller inside [`Handler::handle`] of a batch gathered across workers, counted in while it
/// is there (also when it leaves by a panic).
struct Inside<'a, F, H>(&'a IdempotentTxBatch<F, H>);

impl<'a, F, H> Inside<'a, F, H> {
    fn enter(batch: &'a IdempotentTxBatch<F, H>) -> Self {
        let mut state = batch.state.lock();
        state.inside += 1;
        state.workers = state.workers.max(state.inside).min(batch.max_messages);
        Inside(batch)
    }
}

impl<F, H> Drop for Inside<'_, F, H> {
    fn drop(&mut self) {
        self.0.state.lock().inside -= 1;
    }
}

/// The lead of a batch gathered across workers: dropped, it gives the lead up and wakes the
/// waiting callers; dropped with callers still `waiting` for their answers (the batch panicked
/// outside every handler's `catch_unwind`: in the connections factory, the driver's `BEGIN` or
/// `COMMIT`), it answers each of them (the leader's own caller excepted: the panic goes on up
/// its stack) with an error, so that nobody waits for an answer that will never come.
struct Lead<'a, F, H> {
    batch: &'a IdempotentTxBatch<F, H>,
    leader: u64,
    waiting: Vec<u64>,
}

impl<F, H> Drop for Lead<'_, F, H> {
    fn drop(&mut self) {
        let mut state = self.batch.state.lock();
        state.leading = false;
        for id in self.waiting.drain(..).filter(|id| *id != self.leader) {
            state.done.insert(
                id,
                Ok(Err(
                    "acemq: the batch this message was in panicked outside its handlers \
                        (the connections factory or the database driver); it is retried, and \
                        a message whose work did commit is then found a duplicate"
                        .into(),
                )),
            );
        }
        self.batch.changed.notify_all();
    }
}

/// A failure that ends the batch's transaction, as each message's error.
fn batch_error(what: &str, e: &dyn std::fmt::Display) -> HandlerResult {
    Err(format!("{what}: {e}").into())
}

impl<F, H> IdempotentTxBatch<F, H> {
    /// Claims, handlers, receipts and one commit; every entry's result.
    fn run_batch<C>(&self, batch: &[Item<'_>]) -> Vec<(u64, Settled)>
    where
        F: Fn() -> crate::Result<C>,
        C: Transactional,
        H: Fn(&Message, &mut C::Transaction<'_>) -> HandlerResult,
    {
        let all_fail = |what: &str, e: &dyn std::fmt::Display| {
            batch
                .iter()
                .map(|entry| (entry.id, Ok(batch_error(what, e))))
                .collect()
        };
        let mut savepoints = self.savepoints.load(Ordering::Relaxed);
        // As in the single form: a connection that fails at BEGIN is replaced (up to three).
        let mut tries = 0;
        loop {
            tries += 1;
            let mut conn = match (self.inner.connect)() {
                Ok(c) => c,
                Err(e) => return all_fail("no database connection for the batch", &e),
            };
            let begun = conn.begin();
            match begun {
                Ok(tx) => match self.run_on(batch, tx, savepoints) {
                    Some(results) => return results,
                    // A pass without savepoints met a failure and was rolled back: again,
                    // each message under its own savepoint.
                    None => {
                        savepoints = true;
                        tries = 0;
                    }
                },
                Err(e) if tries < BEGIN_TRIES => {
                    log::warn!("acemq: BEGIN failed, trying another connection: {e}");
                }
                Err(e) => return all_fail("beginning the batch's transaction", &e),
            }
        }
    }

    /// The batch on its transaction `tx`: its keys claimed in one statement (under one
    /// token), each claimed message's handler (under a savepoint of its own with
    /// `savepoints`), the receipts of the accepted written in one statement and the others'
    /// claims given back in one, then one commit. Without `savepoints`, `None` (and `tx` rolled
    /// back) at the first handler that fails: the batch is to run again with them.
    fn run_on<T>(
        &self,
        batch: &[Item<'_>],
        mut tx: T,
        savepoints: bool,
    ) -> Option<Vec<(u64, Settled)>>
    where
        T: SqlTransaction,
        H: Fn(&Message, &mut T) -> HandlerResult,
    {
        let store: &SqlIdempotencyStore = &self.inner.store;
        let token = ClaimToken::new();
        // A key twice in one batch is claimed once; its later messages follow the first.
        let mut first_of: HashMap<&str, usize> = HashMap::new();
        let mut distinct: Vec<&str> = Vec::new();
        for (i, item) in batch.iter().enumerate() {
            first_of.entry(item.key).or_insert_with(|| {
                distinct.push(item.key);
                i
            });
        }
        let claims = match store.claim_many_in(&mut tx, &distinct, &token) {
            Ok(c) => c,
            Err(e) => {
                rollback(tx);
                return Some(
                    batch
                        .iter()
                        .map(|item| (item.id, Ok(batch_error("claiming the batch's keys", &e))))
                        .collect(),
                );
            }
        };
        let claim_of: HashMap<&str, Claim> = distinct.iter().copied().zip(claims).collect();
        let mut results: Vec<Option<Settled>> = Vec::with_capacity(batch.len());
        let mut accepted: Vec<&str> = Vec::new();
        let mut failed: Vec<&str> = Vec::new();
        // What each first message of a key became: accepted (or a duplicate), or not.
        let mut done_keys: HashMap<&str, bool> = HashMap::new();
        let mut broken: Option<String> = None;
        // A savepoint stays open after a rollback to it (reused by the next message); after a
        // kept message a new one is needed above its work.
        let mut savepoint_open = false;
        for (i, item) in batch.iter().enumerate() {
            if let Some(why) = &broken {
                results.push(Some(Ok(batch_error("the batch's transaction failed", why))));
                continue;
            }
            if first_of[item.key] != i {
                results.push(None); // decided below, after its key's first message
                continue;
            }
            let settled = match &claim_of[item.key] {
                Claim::Duplicate => {
                    done_keys.insert(item.key, true);
                    Ok(Ok(Outcome::Accept))
                }
                Claim::InProgress => {
                    done_keys.insert(item.key, false);
                    Ok(Ok(Outcome::in_progress(self.inner.in_progress_delay)))
                }
                Claim::Claimed(_) => {
                    if savepoints && !savepoint_open {
                        if let Err(e) = tx.execute("SAVEPOINT acemq_message", &[]) {
                            broken = Some(e.to_string());
                            results.push(Some(Ok(batch_error("opening a savepoint", &e))));
                            continue;
                        }
                        savepoint_open = true;
                    }
                    let result = catch_unwind(AssertUnwindSafe(|| {
                        (self.inner.handler)(item.message, &mut tx)
                    }));
                    if matches!(result, Ok(Ok(Outcome::Accept))) {
                        accepted.push(item.key);
                        done_keys.insert(item.key, true);
                        savepoint_open = false;
                    } else if !savepoints {
                        // Its work cannot be undone alone: none of this pass counts.
                        rollback(tx);
                        self.savepoints.store(true, Ordering::Relaxed);
                        return None;
                    } else {
                        // Its work vanishes; its claim is given back below.
                        failed.push(item.key);
                        done_keys.insert(item.key, false);
                        if let Err(e) = tx.execute("ROLLBACK TO SAVEPOINT acemq_message", &[]) {
                            broken = Some(e.to_string());
                        }
                    }
                    result
                }
            };
            results.push(Some(settled));
        }
        if broken.is_none() {
            let ended = store
                .confirm_many_in(&mut tx, &accepted, &token)
                .and_then(|()| store.release_many_in(&mut tx, &failed, &token));
            if let Err(e) = ended {
                broken = Some(e.to_string());
            }
        }
        let committed = match broken {
            Some(why) => {
                rollback(tx);
                Err(why)
            }
            None => tx.commit().map_err(|e| e.to_string()),
        };
        let mut duplicates = Vec::new();
        let results: Vec<(u64, Settled)> = batch
            .iter()
            .zip(results)
            .enumerate()
            .map(|(i, (item, settled))| {
                let settled = match settled {
                    Some(settled) => {
                        if first_of[item.key] == i && matches!(claim_of[item.key], Claim::Duplicate)
                        {
                            duplicates.push(i);
                        }
                        settled
                    }
                    // A later message of a key: a duplicate of an accepted first one, else
                    // back later without spending an attempt.
                    None if done_keys.get(item.key) == Some(&true) => {
                        duplicates.push(i);
                        Ok(Ok(Outcome::Accept))
                    }
                    None => Ok(Ok(Outcome::in_progress(self.inner.in_progress_delay))),
                };
                let settled = match (&committed, settled) {
                    // Nothing of the batch was applied: what was to be accepted is retried.
                    (Err(why), Ok(Ok(Outcome::Accept))) => {
                        Ok(batch_error("the batch's commit failed", why))
                    }
                    (_, settled) => settled,
                };
                (item.id, settled)
            })
            .collect();
        if committed.is_ok() {
            if savepoints && failed.is_empty() {
                // No failure in this batch: the next one runs without savepoints.
                self.savepoints.store(false, Ordering::Relaxed);
            }
            if let Some(f) = &self.on_commit {
                // The batch is committed: a panicking hook must not lose its answers.
                if let Err(panic) = catch_unwind(AssertUnwindSafe(|| f(batch.len()))) {
                    log::error!(
                        "acemq: the batch's on_commit hook panicked ({}); the batch is committed",
                        crate::error::panic_message(&*panic)
                    );
                }
            }
            for i in duplicates {
                let _ = self
                    .inner
                    .duplicates
                    .absorbed(batch[i].key, batch[i].message);
            }
        }
        Some(results)
    }
}

impl<F, H> std::fmt::Debug for IdempotentTxBatch<F, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotentTxBatch")
            .field("max_messages", &self.max_messages)
            .field("max_wait", &self.max_wait)
            .field("workers", &self.state.lock().workers)
            .finish_non_exhaustive()
    }
}
