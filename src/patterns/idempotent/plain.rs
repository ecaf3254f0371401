//! The plain idempotent consumer: [`idempotent`], claims and confirms through any store.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::duplicates::{key_of, DuplicateCount, Duplicates, KeyFn};
use super::options::IdempotentOptions;
use crate::consume::{Handler, HandlerResult, Outcome};
use crate::envelope::Message;
use crate::patterns::chain::orphans::{self, End};
use crate::patterns::idempotency::{Claim, ClaimToken, IdempotencyStore};

/// Wraps `handler` so that each key's effect is applied once. See the [module docs](crate::patterns::idempotent).
///
/// ```no_run
/// use acemq_amqp::patterns::idempotent::{idempotent, IdempotentOptions};
/// use acemq_amqp::patterns::idempotency::InMemoryIdempotencyStore;
/// use acemq_amqp::{Connection, Message, Outcome};
/// # fn main() -> acemq_amqp::Result<()> {
/// let connection = Connection::open("amqp://127.0.0.1")?;
/// let handler = idempotent(
///     InMemoryIdempotencyStore::default(),
///     |m: &Message| {
///         println!("charging for {}", m.id());
///         Ok(Outcome::Accept)
///     },
///     IdempotentOptions::default()
///         .key(|m: &Message| Ok(m.payload::<serde_json::Value>()?["order_id"].to_string())),
/// );
/// let consumer = connection.consume("payments", handler)?;
/// # consumer.close()?; Ok(()) }
/// ```
pub fn idempotent<S, H>(store: S, handler: H, options: IdempotentOptions) -> Idempotent<S, H>
where
    S: IdempotencyStore,
    H: Handler,
{
    Idempotent {
        store,
        handler,
        key: options.key,
        in_progress_delay: options.in_progress_delay,
        duplicates: options.duplicates,
        held: Mutex::new(Vec::new()),
    }
}

/// A handler made idempotent by [`idempotent`].
pub struct Idempotent<S, H> {
    store: S,
    handler: H,
    key: Option<KeyFn>,
    in_progress_delay: Duration,
    duplicates: Duplicates,
    /// Claims held for handlers that overran a deadline inside this wrapper and run on as
    /// orphans: given back (or confirmed) once they end, not before (see [`Held`]).
    held: Mutex<Vec<Held>>,
}

/// A claim held for orphaned handlers (a deadline inside the wrapper gave up on them, so the
/// message's outcome is a retry, while they still work on it): given back only once they have
/// all ended — confirmed instead if one of them accepted — so that the retry cannot run beside
/// them. Meanwhile a message with the key is in progress (until the claim's lease runs out).
struct Held {
    key: String,
    token: ClaimToken,
    /// Each orphan, and the place of this message in what it was given (`None`: not known,
    /// taken as not accepted).
    orphans: Vec<(Arc<End>, Option<usize>)>,
}

impl Held {
    /// `Some(accepted)` once every orphan has ended: whether one of them accepted the message.
    fn ended(&self) -> Option<bool> {
        let mut accepted = false;
        for (end, place) in &self.orphans {
            let each = end.ended()?;
            accepted |= place.and_then(|i| each.get(i).copied()).unwrap_or(false);
        }
        Some(accepted)
    }
}

/// The most claims one wrapper holds for orphans; past it a claim is left to run out its lease
/// (a store without claims: given back at once, as without a deadline).
const MAX_HELD: usize = 1024;

fn accepted(result: &std::thread::Result<HandlerResult>) -> bool {
    matches!(result, Ok(Ok(Outcome::Accept)))
}

impl<S, H> Idempotent<S, H> {
    /// The count of duplicates this wrapper absorbed (a shared handle: it goes on counting
    /// after the wrapper moved into a consumer).
    pub fn duplicates(&self) -> DuplicateCount {
        self.duplicates.count.clone()
    }
}

impl<S: IdempotencyStore, H> Idempotent<S, H> {
    /// The claim of `key`. A store with claims answers in progress by itself while a claim
    /// held for orphans lasts (until its lease runs out, as for any handler); for one without,
    /// whose `first_time` would take the key for done, the key is in progress while held.
    fn claim(&self, key: &str) -> crate::Result<Claim> {
        if self.store.supports_claims() {
            return self.store.claim(key);
        }
        if self.held.lock().iter().any(|h| h.key == key) {
            return Ok(Claim::InProgress);
        }
        Ok(if self.store.first_time(key)? {
            Claim::Claimed(ClaimToken::new())
        } else {
            Claim::Duplicate
        })
    }

    /// The claim after its handler: confirmed when it accepted; else held while `orphans`
    /// run, or given back now.
    fn settle(
        &self,
        key: String,
        token: ClaimToken,
        accepted: bool,
        orphans: Vec<(Arc<End>, Option<usize>)>,
    ) {
        if accepted {
            self.confirm(&key, &token);
            return;
        }
        if !orphans.is_empty() {
            let mut held = self.held.lock();
            if held.len() < MAX_HELD {
                held.push(Held {
                    key,
                    token,
                    orphans,
                });
                return;
            }
            drop(held);
            if self.store.supports_claims() {
                log::warn!(
                    "acemq: {MAX_HELD} claims are held for handlers still running past their \
                     deadline; the claim on {key:?} is left to run out its lease"
                );
                return;
            }
            log::warn!(
                "acemq: {MAX_HELD} keys are held for handlers still running past their \
                 deadline; {key:?} is given back while its handler may still run"
            );
        }
        self.give_back(&key, &token);
    }

    /// Confirms or gives back the claims held for orphans that have ended.
    fn sweep(&self) {
        let ended: Vec<(Held, bool)> = {
            let mut held = self.held.lock();
            if held.is_empty() {
                return;
            }
            let mut ended = Vec::new();
            let mut i = 0;
            while i < held.len() {
                match held[i].ended() {
                    Some(accepted) => ended.push((held.swap_remove(i), accepted)),
                    None => i += 1,
                }
            }
            ended
        };
        for (held, accepted) in ended {
            if accepted {
                self.confirm(&held.key, &held.token);
            } else {
                self.give_back(&held.key, &held.token);
            }
        }
    }

    fn confirm(&self, key: &str, token: &ClaimToken) {
        if let Err(e) = self.store.confirm(key, token) {
            // The effect is done; the claim expires by itself.
            log::warn!("acemq: confirming {key:?} failed (the claim will expire): {e}");
        }
    }

    /// Gives the claim back before the retry is issued, so that the retry runs. For a store
    /// without claims this forgets the key (`first_time` recorded it as done).
    fn give_back(&self, key: &str, token: &ClaimToken) {
        let given_back = if self.store.supports_claims() {
            self.store.release(key, token)
        } else {
            self.store.forget(key)
        };
        if let Err(e) = given_back {
            log::warn!("acemq: giving back the claim on {key:?} failed: {e}");
        }
    }
}

impl<S, H> Handler for Idempotent<S, H>
where
    S: IdempotencyStore,
    H: Handler,
{
    fn ordering(&self) -> Option<&crate::consume::OrderBy> {
        self.handler.ordering()
    }

    fn batch_limits(&self) -> Option<(usize, Duration)> {
        self.handler.batch_limits()
    }

    fn handle(&self, m: &Message) -> HandlerResult {
        self.sweep();
        let key = key_of(&self.key, m)?;
        match self.claim(&key)? {
            Claim::Duplicate => self.duplicates.absorbed(&key, m),
            Claim::InProgress => Ok(Outcome::in_progress(self.in_progress_delay)),
            Claim::Claimed(token) => {
                let (result, orphans) =
                    orphans::watch(|| catch_unwind(AssertUnwindSafe(|| self.handler.handle(m))));
                let orphans = orphans.into_iter().map(|end| (end, Some(0))).collect();
                self.settle(key, token, accepted(&result), orphans);
                match result {
                    Ok(r) => r,
                    Err(panic) => resume_unwind(panic),
                }
            }
        }
    }

    /// Each message claimed on its own, as in [`handle`](Self::handle); the claimed ones
    /// handed to the inner handler's `handle_batch` in one call; each claim then confirmed or
    /// given back by its own message's result. A key twice in one batch: the second message
    /// is in progress.
    fn handle_batch(&self, messages: &[&Message]) -> Vec<std::thread::Result<HandlerResult>> {
        self.sweep();
        let mut results: Vec<Option<std::thread::Result<HandlerResult>>> =
            messages.iter().map(|_| None).collect();
        let mut claimed: Vec<(usize, String, ClaimToken)> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (i, m) in messages.iter().enumerate() {
            let answer = match key_of(&self.key, m) {
                Err(e) => Err(e),
                Ok(key) if !seen.insert(key.clone()) => {
                    Ok(Outcome::in_progress(self.in_progress_delay))
                }
                Ok(key) => match self.claim(&key) {
                    Err(e) => Err(e.into()),
                    Ok(Claim::Duplicate) => self.duplicates.absorbed(&key, m),
                    Ok(Claim::InProgress) => Ok(Outcome::in_progress(self.in_progress_delay)),
                    Ok(Claim::Claimed(token)) => {
                        claimed.push((i, key, token));
                        continue;
                    }
                },
            };
            results[i] = Some(Ok(answer));
        }
        if !claimed.is_empty() {
            let to_run: Vec<&Message> = claimed.iter().map(|(i, ..)| messages[*i]).collect();
            let (ran, orphans) = orphans::watch(|| {
                catch_unwind(AssertUnwindSafe(|| self.handler.handle_batch(&to_run)))
            });
            let of = |place: Option<usize>| -> Vec<(Arc<End>, Option<usize>)> {
                orphans.iter().map(|end| (end.clone(), place)).collect()
            };
            match ran {
                Ok(ran) if ran.len() == claimed.len() => {
                    for (j, ((i, key, token), result)) in claimed.into_iter().zip(ran).enumerate() {
                        self.settle(key, token, accepted(&result), of(Some(j)));
                        results[i] = Some(result);
                    }
                }
                Ok(ran) => {
                    let wrong = format!(
                        "the batch handler returned {} results for {} messages",
                        ran.len(),
                        claimed.len()
                    );
                    for (i, key, token) in claimed {
                        self.settle(key, token, false, of(None));
                        results[i] = Some(Ok(Err(wrong.clone().into())));
                    }
                }
                Err(panic) => {
                    for (_, key, token) in claimed {
                        self.settle(key, token, false, of(None));
                    }
                    resume_unwind(panic);
                }
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Ok(Err("no result for the message".into()))))
            .collect()
    }
}
