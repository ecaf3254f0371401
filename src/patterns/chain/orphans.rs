//! How the deadline tells the idempotency layer around it that a handler it gave up on still
//! runs: the idempotency layer [`watch`]es the call to the handler inside it; a deadline that
//! overruns on that thread reports its orphan's [`End`] ([`overran`]), and the idempotency
//! layer holds the message's claim until the orphan has ended (then confirms it if the orphan
//! accepted, else gives it back) instead of giving it back while the orphan still works, which
//! would let the retry run beside it. Whatever order the chain's layers are in.

use std::cell::RefCell;
use std::sync::Arc;

use parking_lot::Mutex;

thread_local! {
    /// The watches open on this thread, innermost last.
    static WATCHES: RefCell<Vec<Vec<Arc<End>>>> = const { RefCell::new(Vec::new()) };
}

/// The end of an orphaned handler: each message's accept or not, once it has ended (and the
/// orphans it saw further in have ended too).
#[derive(Default)]
pub(crate) struct End {
    state: Mutex<EndState>,
}

#[derive(Default)]
struct EndState {
    accepted: Option<Vec<bool>>,
    further: Vec<Arc<End>>,
}

impl End {
    pub(crate) fn finish(&self, accepted: Vec<bool>, further: Vec<Arc<End>>) {
        let mut state = self.state.lock();
        state.accepted = Some(accepted);
        state.further = further;
    }

    /// Each message's accept or not (in the order the orphan was given them), once it and
    /// every orphan it saw have ended; `None` while one still runs.
    pub(crate) fn ended(&self) -> Option<Vec<bool>> {
        let state = self.state.lock();
        let accepted = state.accepted.clone()?;
        state
            .further
            .iter()
            .all(|end| end.ended().is_some())
            .then_some(accepted)
    }
}

/// Runs `f` with a watch open on this thread: its result and the orphans reported meanwhile
/// (also passed on to a watch around this one).
pub(crate) fn watch<T>(f: impl FnOnce() -> T) -> (T, Vec<Arc<End>>) {
    /// Closes the watch also when `f` panics.
    struct Open;
    impl Drop for Open {
        fn drop(&mut self) {
            WATCHES.with(|w| {
                let mut w = w.borrow_mut();
                if let Some(seen) = w.pop() {
                    if let Some(around) = w.last_mut() {
                        around.extend(seen);
                    }
                }
            });
        }
    }
    WATCHES.with(|w| w.borrow_mut().push(Vec::new()));
    let open = Open;
    let result = f();
    let seen = WATCHES.with(|w| w.borrow().last().cloned().unwrap_or_default());
    drop(open);
    (result, seen)
}

/// Reports an orphan to the innermost watch on this thread (none: nobody waits for it).
pub(crate) fn overran(end: Arc<End>) {
    WATCHES.with(|w| {
        if let Some(watch) = w.borrow_mut().last_mut() {
            watch.push(end);
        }
    });
}
