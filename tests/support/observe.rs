//! Observers the tests share.

use std::sync::Mutex;

use acemq_amqp::observe::Observer;
use acemq_amqp::observe::Settlement;

/// The `copy_failed` settlements the observer hears, with their error text.
#[derive(Default)]
pub struct CopyFailures(pub Mutex<Vec<String>>);

impl Observer for CopyFailures {
    fn settled(&self, s: &Settlement<'_>) {
        if s.outcome == "copy_failed" {
            self.0
                .lock()
                .unwrap()
                .push(s.error.unwrap_or_default().to_string());
        }
    }
}
