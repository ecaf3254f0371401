//! A broker-wide memory alarm (`rabbitmqctl set_vm_memory_high_watermark`), raised for a test
//! and always lowered again: when the guard is dropped (on panic too) and, should the test get
//! stuck (a call with no deadline, often what such a test looks for), after [`ALARM_AT_MOST`]
//! anyway, from a watchdog thread — an alarm left on stalls every client of the broker.

use std::time::Duration;

use super::rabbitmqctl;

/// The longest an alarm stays on, whatever the test does.
pub const ALARM_AT_MOST: Duration = Duration::from_secs(40);

/// Restores the broker's memory watermark when dropped (or after [`ALARM_AT_MOST`]). Holds an
/// exclusive lock on a file while the alarm is on, so that two alarm tests (of any binary, or
/// of two checkouts testing against the same broker) take turns instead of restoring each
/// other's alarm.
pub struct Watermark {
    disarm: Option<crossbeam_channel::Sender<()>>,
    watchdog: Option<std::thread::JoinHandle<()>>,
    _lock: std::fs::File,
}

fn set_watermark(value: &str) {
    let _ = super::rabbitmqctl_command()
        .args(["set_vm_memory_high_watermark", value])
        .output();
}

/// The file the memory-alarm tests lock exclusively while they raise the alarm on the one broker
/// the tests share (another binary, or another checkout on the machine); a test that must not
/// run under the alarm holds a shared lock on it.
pub fn lock_file() -> std::fs::File {
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(std::env::temp_dir().join("acemq-memory-alarm.lock"))
        .expect("the memory alarm's lock file")
}

impl Watermark {
    /// Raises the alarm (a watermark of 0.0001), once no other alarm test holds it.
    pub fn alarm() -> Watermark {
        let lock = lock_file();
        lock.lock().expect("the memory alarm's lock");
        let out = rabbitmqctl(&["eval", "vm_memory_monitor:get_vm_memory_high_watermark()."]);
        let mut previous = out.trim().to_string();
        let value: f64 = previous
            .parse()
            .unwrap_or_else(|_| panic!("the current watermark: {previous:?}"));
        if value < 0.01 {
            // An alarm left behind by a run that was killed: restore the major's default
            // (RabbitMQ 3.x: 0.4; 4.x: 0.6).
            previous = if super::broker_major() >= 4 {
                "0.6"
            } else {
                "0.4"
            }
            .into();
        }
        let (disarm, disarmed) = crossbeam_channel::bounded::<()>(0);
        let watchdog = std::thread::spawn(move || {
            // Ends at the drop (disconnected) or after ALARM_AT_MOST: either way, restored.
            let _ = disarmed.recv_timeout(ALARM_AT_MOST);
            set_watermark(&previous);
        });
        rabbitmqctl(&["set_vm_memory_high_watermark", "0.0001"]);
        Watermark {
            disarm: Some(disarm),
            watchdog: Some(watchdog),
            _lock: lock,
        }
    }
}

impl Drop for Watermark {
    /// Restores the watermark (through the watchdog, which it wakes and joins) before the lock
    /// is let go.
    fn drop(&mut self) {
        drop(self.disarm.take());
        if let Some(w) = self.watchdog.take() {
            let _ = w.join();
        }
    }
}
