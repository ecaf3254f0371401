//! The broker clock (`Instant::now()` plus an offset the testing helper advances) and the one
//! thread per broker (`acemq-memory-clock`, started lazily) that expires queue heads: it waits
//! on a condvar for the earliest head deadline and exits when nothing is pending.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::state::{Broker, State};

impl Broker {
    /// After a change: a thread for the earliest head deadline if none runs, woken if one does.
    pub(super) fn wake_clock(self: &Arc<Self>, st: &mut State) {
        if st.next_deadline().is_none() {
            return;
        }
        if st.clock_running {
            self.clock.notify_all();
            return;
        }
        st.clock_running = true;
        let broker = self.clone();
        let started = std::thread::Builder::new()
            .name("acemq-memory-clock".into())
            .spawn(move || broker.run_clock());
        if started.is_err() {
            st.clock_running = false;
        }
    }

    fn run_clock(self: Arc<Self>) {
        let mut st = self.state.lock();
        loop {
            let queues: Vec<String> = st.queues.keys().cloned().collect();
            for q in queues {
                st.mark(&q);
            }
            st.settle();
            let Some(deadline) = st.next_deadline() else {
                st.clock_running = false;
                return;
            };
            // The deadline is on the broker clock; the wait is on the real one.
            let real = deadline.checked_sub(st.offset).unwrap_or_else(Instant::now);
            if real > Instant::now() {
                self.clock.wait_until(&mut st, real);
            }
        }
    }

    /// Moves the broker clock forward: what is due by then expires at once.
    pub(super) fn advance(self: &Arc<Self>, by: Duration) {
        self.with(|st| {
            st.offset += by;
            let queues: Vec<String> = st.queues.keys().cloned().collect();
            for q in queues {
                st.mark(&q);
            }
        });
        self.clock.notify_all();
    }
}
